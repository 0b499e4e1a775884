"""Data-parallel what-ifs (replay.ddp) and the alpha-beta model (replay.alphabeta) on real gloo runs.

Bounds asserted, and why they are loose:
* identity error (the step model with the recorded settings vs the measured steps): on the
  0.8 M-param runs (steps of 5-14 ms, 1 MB buckets whose transfers vary 0.2-17 ms for the same
  bytes) the model, which gives every bucket of a size one cost, misses single steps by a median
  ~27 % (P90 ~50 %); on the 28 MB-gradient runs (steps of ~60 ms, recorded on a quiet machine)
  median ~9 %, P90 13-21 % (the shared-core share CORE_SHARE = 0.5 is a prior, not fitted).
* bucket 25 -> 4 MB vs the real 4 MB run: on the shipped pair the prediction is 20 % high
  (68 vs 57 ms): asserted at 40 %; fresh quiet runs are in benchmarks/RESULTS.md (replay
  validation). The bucket *layout* predicted is exact.
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from conftest import TRACES, ingest_runs

RUNS = ["ddp_gloo_2rank", "ddp_gloo_2rank_nooverlap", "ddp_gloo_2rank_big_b25", "ddp_gloo_2rank_big_b4",
        "pp_1f1b_4rank"]
MIB = 2 ** 20


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return ingest_runs(tmp_path_factory, "replay_ddp", RUNS)


@pytest.fixture(scope="module")
def con(store):
    import traceanalyzer as ta
    return ta.open(str(store))


@pytest.fixture(scope="module")
def b25_to_b4(con):
    from traceanalyzer.replay import ddp
    return ddp.predict(con, "ddp_gloo_2rank_big_b25", bucket_mb=4)


def test_identity_error_is_a_real_model_error(con):
    from traceanalyzer.replay import ddp
    bounds = {"ddp_gloo_2rank": (0.30, 0.60), "ddp_gloo_2rank_big_b25": (0.10, 0.15),
              "ddp_gloo_2rank_big_b4": (0.11, 0.25)}
    for run, (med, p90) in bounds.items():
        r = ddp.predict(con, run)
        e = r.identity_error
        assert e["n"] == len(r.steps) > 0
        assert e["median"] <= med and e["p90"] <= p90, (run, e)
        assert e["median"] > 0.001, (run, e)   # not 0 by construction: costs are fitted, not replayed
        assert (r.steps["delta_ns"] == 0).all()   # nothing changed: prediction = identity
        assert list(r.steps.columns) == ["rank", "step", "measured_ns", "identity_ns", "predicted_ns",
                                         "delta_ns", "identity_error"]


def test_recorded_settings_from_manifest(con):
    from traceanalyzer.replay import ddp
    r = ddp.predict(con, "ddp_gloo_2rank_big_b25")
    assert r.settings["recorded"] == {"bucket_mb": 25.0, "first_bucket_mb": 25.0, "overlap": True, "dp": 2}
    assert not r.settings["bucket_mb_inferred"]
    # the model's bucketing of the recorded gradients = the buckets DDP really made:
    # the last Linear + 7 hidden layers (4,239,400 + 6 x 4,198,400 bytes) >= 25 MiB, then the first layer
    b = r.buckets
    assert b[b.scenario == "recorded"]["bytes"].tolist() == [29429800, 266240]
    assert b[b.scenario == "identity"]["bytes"].tolist() == [29429800, 266240]
    assert ddp.predict(con, "ddp_gloo_2rank_nooverlap").settings["recorded"]["overlap"] is False


def test_bucket_size_inferred_without_manifest(tmp_path):
    import traceanalyzer as ta
    from traceanalyzer.replay import ddp
    src = tmp_path / "b4"
    src.mkdir()
    for f in (TRACES / "ddp_gloo_2rank_big_b4").glob("rank*.window0.pt.trace.json.gz"):
        shutil.copy(f, src / f.name)
    ta.ingest([str(src)], str(tmp_path / "store"), run="b4", progress=False, workers=2)
    r = ddp.predict(str(tmp_path / "store"), "b4")
    assert r.settings["bucket_mb_inferred"]
    # the smallest closed bucket, 4,198,400 bytes, bounds the cap: the same 8 buckets come out
    assert r.settings["recorded"]["bucket_mb"] == pytest.approx(4198400 / MIB)
    assert r.buckets[r.buckets.scenario == "identity"]["bytes"].tolist() == [4239400] + [4198400] * 6 + [266240]


def test_bucket_25_to_4_vs_real_run(con, b25_to_b4):
    from traceanalyzer.replay import ddp
    real = ddp.predict(con, "ddp_gloo_2rank_big_b4")
    pred_buckets = b25_to_b4.buckets[b25_to_b4.buckets.scenario == "predicted"]["bytes"].tolist()
    real_buckets = real.buckets[real.buckets.scenario == "recorded"]["bytes"].tolist()
    assert pred_buckets == real_buckets == [4239400] + [4198400] * 6 + [266240]
    pred_ms = b25_to_b4.job_step_ns() / 1e6
    real_ms = real.job_step_ns("measured_ns") / 1e6
    assert abs(pred_ms / real_ms - 1) <= 0.40, (pred_ms, real_ms)
    # 8 buckets on the comm lane of every rank and step, in order, none before backward started
    tl = b25_to_b4.timeline
    comm = tl[tl.lane == "comm"]
    assert len(comm) == 8 * len(b25_to_b4.steps)
    assert (comm.end_ns >= comm.start_ns).all()


def test_overlap_off_vs_real_no_overlap_run(con):
    from traceanalyzer.replay import ddp
    off = ddp.predict(con, "ddp_gloo_2rank", overlap=False)
    real_off = ddp.predict(con, "ddp_gloo_2rank_nooverlap").job_step_ns("measured_ns")
    real_on = off.job_step_ns("measured_ns")
    assert real_off > real_on                              # the real runs: off is slower
    assert off.job_step_ns() > off.job_step_ns("identity_ns")   # so is the prediction
    # rough size only: predicted 8.3 ms vs the real 22.9 ms (the real run's synchronous transfers
    # and host copies cost 2.4x; the model, fitted on the overlapped run's transfers, gets 0.36 of it)
    assert 0.3 < off.job_step_ns() / real_off < 1.2, (off.job_step_ns(), real_off)
    on = ddp.predict(con, "ddp_gloo_2rank_nooverlap", overlap=True)
    assert on.job_step_ns() < on.job_step_ns("identity_ns")


def test_dp_2_to_4_rescales_comm_by_alpha_beta(con):
    from traceanalyzer.replay import ddp
    r2 = ddp.predict(con, "ddp_gloo_2rank_big_b25")
    r4 = ddp.predict(con, "ddp_gloo_2rank_big_b25", dp=4)
    a, b = r2.alphabeta.params("all_reduce")
    c2 = r2.buckets[r2.buckets.scenario == "predicted"]
    c4 = r4.buckets[r4.buckets.scenario == "predicted"]
    # ring all_reduce: 2(n-1) hops, 2(n-1)/n wire bytes per byte: n=2 -> 2 hops x1, n=4 -> 6 hops x1.5
    np.testing.assert_allclose(c2["cost_ns"], 2 * a + 1.0 * b * c2["bytes"], rtol=1e-9)
    np.testing.assert_allclose(c4["cost_ns"], 6 * a + 1.5 * b * c4["bytes"], rtol=1e-9)
    assert (c4["cost_ns"].to_numpy() > c2["cost_ns"].to_numpy()).all()
    assert r4.job_step_ns() > r2.job_step_ns()
    assert r4.settings["what_if"]["dp"] == 4


def test_alpha_beta_factors_and_fit():
    from traceanalyzer.replay import alphabeta
    assert alphabeta.wire("all_reduce", 8) == pytest.approx(1.75) and alphabeta.hops("all_reduce", 8) == 14
    assert alphabeta.wire("all_gather", 4) == pytest.approx(0.75) and alphabeta.hops("reduce_scatter", 4) == 3
    assert alphabeta.wire("send", 2) == 1 and alphabeta.hops("send", 2) == 1
    # Theil-Sen on y = 1000 + 2 x with one outlier: the exact line
    x = np.array([1e3, 2e3, 4e3, 8e3, 16e3])
    y = 1000 + 2 * x
    y[2] *= 5
    icpt, slope, ok = alphabeta._theil_sen(x, y, np.random.default_rng(0))
    assert ok and slope == pytest.approx(2.0) and icpt == pytest.approx(1000.0)
    # two transfers in flight together for their whole length: each had half the resource
    ex = alphabeta._exclusive(np.array([0, 0, 100]), np.array([10, 10, 10]))
    np.testing.assert_allclose(ex, [5, 5, 10])
    ex = alphabeta._exclusive(np.array([0]), np.array([10]), busy=np.array([[0, 4]]))
    np.testing.assert_allclose(ex, [8])   # 4 ns shared with compute count half


def test_alpha_beta_fit_on_real_run(con):
    from traceanalyzer.replay import alphabeta
    ab = alphabeta.fit(con, "ddp_gloo_2rank_big_b25", shared=False)
    t = ab.table.set_index("op").loc["all_reduce"]
    # 3 steps x 2 buckets (29,429,800 and 266,240 bytes): two sizes, so alpha and beta are identifiable
    assert t["n_instances"] == 6 and t["n_sizes"] == 2 and t["identifiable"]
    assert t["alpha_ns"] >= 0 and 0.05 < t["busbw_gbps"] < 50
    # the fit passes through the median of the big bucket's transfers (its wire bytes = bytes at n=2)
    big = ab.samples[ab.samples["bytes"] == 29429800]
    fitted = ab.time_ns("all_reduce", 29429800, 2)
    assert abs(fitted / big["transfer_ns"].median() - 1) < 0.5
    assert 0 <= t["fit_err_median"] <= t["fit_err_p90"]


def test_bad_input_one_line_errors(con):
    from traceanalyzer.errors import TraceAnalyzerError
    from traceanalyzer.replay import alphabeta, ddp
    with pytest.raises(TraceAnalyzerError, match=r"run 'pp_1f1b_4rank' has no all_reduce") as e:
        ddp.predict(con, "pp_1f1b_4rank")
    assert "\n" not in str(e.value)
    with pytest.raises(TraceAnalyzerError, match="bucket_mb must be > 0"):
        ddp.predict(con, "ddp_gloo_2rank", bucket_mb=0)
    with pytest.raises(TraceAnalyzerError, match="dp must be an integer"):
        ddp.predict(con, "ddp_gloo_2rank", dp=0)
    with pytest.raises(TraceAnalyzerError, match=r"several runs with steps \(.*\): pass --run"):
        ddp.predict(con)
    with pytest.raises(TraceAnalyzerError, match="no measured all_gather"):
        alphabeta.fit(con, "ddp_gloo_2rank").params("all_gather")
