"""The SQL analyses on real traces, with numbers a person can check by hand (or recomputed here
independently from the raw JSON)."""
from __future__ import annotations

import json

import pandas as pd
import pytest
from conftest import EXTERNAL, TRACES, load_raw, need_external

import traceanalyzer as ta
from traceanalyzer import analyses
from traceanalyzer import schema as S
from traceanalyzer.analyses.critical_path import critical_path_summary


@pytest.fixture(scope="module")
def dlrm(tmp_path_factory):
    need_external()
    store = tmp_path_factory.mktemp("dlrm") / "s"
    ta.ingest([EXTERNAL / "param_dlrm_8rank"], store, run="dlrm")
    return store


@pytest.fixture(scope="module")
def slow2(tmp_path_factory):
    store = tmp_path_factory.mktemp("slow2") / "s"
    ta.ingest([TRACES / "ddp_gloo_4rank_slow2"], store, run="slow2")
    return store


def _union(intervals):
    out = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return out


def _length(intervals):
    return sum(hi - lo for lo, hi in intervals)


def _intersection(a, b):
    total, i, j = 0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def test_overlap_equals_interval_arithmetic_on_the_raw_trace(dlrm):
    """DLRM, 8 ranks: NCCL kernels as communication, the rest as compute, merged per step (kernels
    launched inside ProfilerStep#10, and those launched before it); overlap = |comm ∩ compute| / |comm|,
    recomputed here in plain Python from the raw JSON."""
    got = analyses.overlap(dlrm).set_index("rank")
    assert sorted(got.index) == list(range(8))  # every rank, never a rank-0 default
    for path in sorted((EXTERNAL / "param_dlrm_8rank").glob("*.json.gz")):
        raw = load_raw(path)
        rank = raw["distributedInfo"]["rank"]
        ev = raw["traceEvents"]
        step = next(e for e in ev if e.get("name") == "ProfilerStep#10")
        lo, hi = step["ts"], step["ts"] + step["dur"]
        launched = {e["args"]["correlation"] for e in ev if e.get("cat") == "cuda_runtime"
                    and "correlation" in e.get("args", {}) and lo <= e["ts"] < hi}
        kernels = [e for e in ev if e.get("cat") == "kernel"]
        inter = comm_len = 0
        for in_step in (True, False):  # kernels launched in the step, and the warm-up before it
            group = [k for k in kernels if (k["args"].get("correlation") in launched) == in_step]
            comm = _union([(k["ts"], k["ts"] + k["dur"]) for k in group if "nccl" in k["name"].lower()])
            comp = _union([(k["ts"], k["ts"] + k["dur"]) for k in group if "nccl" not in k["name"].lower()])
            inter, comm_len = inter + _intersection(comm, comp), comm_len + _length(comm)
        want = 100.0 * inter / comm_len
        assert got.loc[rank, "overlap_pct"] == pytest.approx(want, abs=1e-6)
        assert got.loc[rank, "comm_ns"] == comm_len * 1000  # µs integers in this file -> exact ns


def test_temporal_breakdown_partitions_the_span(dlrm):
    tb = analyses.temporal_breakdown(dlrm)
    # one row per rank for ProfilerStep#10, plus the warm-up before it on ranks 1 and 3 (step NULL)
    assert len(tb[tb["step"] == 10]) == 8 and sorted(tb[tb["step"].isna()]["rank"]) == [1, 3]
    parts = tb["compute_ns"] + tb["comm_ns"] + tb["memory_ns"] + tb["idle_ns"]
    assert (parts == tb["span_ns"]).all()
    assert (tb[["compute_pct", "comm_pct", "memory_pct", "idle_pct"]].sum(axis=1).round(6) == 100).all()


def test_kernel_breakdown_counts_every_kernel(dlrm):
    con = ta.open(dlrm)
    analyses.prepare(con)
    per_rank = dict(con.execute("SELECT rank, sum(count) FROM kernel_breakdown GROUP BY rank").fetchall())
    raw_counts = {}
    for path in sorted((EXTERNAL / "param_dlrm_8rank").glob("*.json.gz")):
        raw = load_raw(path)
        raw_counts[raw["distributedInfo"]["rank"]] = sum(
            1 for e in raw["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e.get("dur", 0) > 0)
    assert per_rank == raw_counts
    # ranks 1 and 3 run more kernels (MANIFEST.md) -- visible in the breakdown
    top = sorted(per_rank, key=per_rank.get)[-2:]
    assert set(top) == {1, 3}


def test_collectives_join_and_measure_the_slow_rank(slow2):
    c = analyses.collectives(slow2)
    assert len(c) == 32 and c["complete"].all() and (c["n_ranks"] == 4).all()  # 8 steps x 4 buckets
    # rank 2 sleeps 20 ms in every forward: it is the last to arrive at the first bucket of every step
    first_of_step = c.sort_values("seq").groupby("step").head(1)
    assert set(first_of_step["last_arriver"]) == {2}
    assert (first_of_step["arrival_skew_ns"] > 15e6).all()
    assert ((c["transfer_ns"] >= 0) & (c["total_wait_ns"] >= 0)).all()
    # busbw = algbw x 2(n-1)/n for all_reduce with n = 4
    ok = c[c["transfer_ns"] > 0]
    assert (ok["busbw_gbps"] / ok["algbw_gbps"]).round(9).eq(1.5).all()


def test_straggler_is_found_with_its_phase_and_cost(slow2):
    s = analyses.stragglers(slow2)
    assert list(s["rank"]) == [2]
    top = s.iloc[0]
    assert top["rank_order"] == 1 and top["phase"] == "forward" and top["pattern"] == "persistent"
    # the injected 20 ms per forward, seen as its excess over the other ranks' forward
    assert 18e6 < top["phase_excess_ns_per_step"] < 23e6
    assert top["delay_pct"] > 10
    # the sleep is not annotated itself: the innermost named range holding it is DDP's forward
    assert top["annotation"] == "DistributedDataParallel.forward"
    assert 18e6 < top["annotation_excess_ns_per_step"] < 23e6


def test_phases_cover_the_step(slow2):
    p = analyses.phases(slow2)
    assert len(p) == 32  # 4 ranks x 8 steps
    total = p["forward_ns"] + p["backward_ns"] + p["sync_ns"] + p["optimizer_ns"]
    assert (total == p["step_ns"]).all()
    assert (p[p["rank"] == 2]["forward_ns"] > 20e6).all()


def test_exposed_intervals_add_up_to_exposed_time(slow2):
    con = ta.open(slow2)
    analyses.prepare(con)
    a = dict(con.execute("SELECT rank, sum(exposed_ns) FROM exposed_intervals GROUP BY rank").fetchall())
    b = dict(con.execute("SELECT rank, sum(exposed_ns) FROM overlap_steps GROUP BY rank").fetchall())
    assert a == b
    top = analyses.exposed_comm(slow2).iloc[0]
    assert top["op"] == "all_reduce" and top["bytes"] > 0 and top["compute_before"]


def test_analyze_saves_versioned_results_and_prints_json(run_cli, slow2, tmp_path):
    code, out, err = run_cli("analyze", slow2)
    assert code == 0, err
    assert "straggler #1: rank 2" in out
    manifest = json.loads((slow2 / "_store.json").read_text())
    saved = manifest["results"]
    assert set(saved) == set(S.RESULTS)
    assert saved["stragglers"]["version"] == S.RESULTS_VERSION
    assert saved["stragglers"]["params"]["straggler_min_delay_pct"] == 10.0
    con = ta.open(slow2)
    assert con.execute("SELECT rank FROM result_stragglers").fetchall() == [(2,)]
    # thresholds are parameters; the saved result and its parameters follow them
    code, out, err = run_cli("analyze", slow2, "--only", "stragglers", "--set", "straggler_min_delay_pct=99", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["results"]["stragglers"] == [] and doc["parameters"]["straggler_min_delay_pct"] == 99.0
    assert doc["results_version"] == S.RESULTS_VERSION and doc["store_schema_version"] == S.SCHEMA_VERSION
    assert ta.open(slow2).execute("SELECT count(*) FROM result_stragglers").fetchone()[0] == 0


def test_json_keys_come_from_the_schema(run_cli, slow2):
    code, out, err = run_cli("analyze", slow2, "--json", "--no-save")
    doc = json.loads(out)
    assert set(doc["results"]) == set(S.RESULTS)
    for name, rows in doc["results"].items():
        for row in rows[:1]:
            assert list(row) == S.RESULTS[name].column_names


@pytest.mark.parametrize("args,needle", [(["--run", "nope"], "no run 'nope'"),
                                         (["--only", "bogus"], "unknown analysis"),
                                         (["--set", "nope=1"], "--set nope=1"),
                                         (["--set", "straggler_min_delay_pct=abc"], "takes a float")])
def test_analyze_bad_arguments(run_cli, slow2, args, needle):
    code, out, err = run_cli("analyze", slow2, *args)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_every_analysis_runs_on_every_external_trace(external_store):
    """No crash on any trace generation (CPU-only, ROCm, sampled, vLLM, DLRM): results or empty tables.
    The session's store of every external trace set, one run each (conftest.external_store; nothing
    saved into it)."""
    need_external()
    store, runs = external_store
    assert len(runs) == len(list(EXTERNAL.glob("hta/*.json.gz")) + list(EXTERNAL.glob("tracelens/*.json.gz"))) + 1
    from traceanalyzer.analyses.results import analyze
    results = analyze(store, save_results=False)
    assert set(results) == set(S.RESULTS)
    assert len(results["temporal_breakdown"]) > 0 and len(results["overlap"]) > 0


def test_critical_path_runs_through_the_slow_rank(slow2):
    """Every step's critical path crosses rank 2, and the 20 ms it slept (no recorded activity:
    idle on rank 2) lies on it."""
    cp = critical_path_summary(slow2)
    for step, g in cp.groupby("step"):
        idle2 = g[(g["rank"] == 2) & (g["label"] == "idle")]["path_ns"].sum()
        assert 18e6 < idle2 < 23e6, (step, idle2)
        assert abs(g["path_pct"].sum() - 100) < 1e-6


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    store = tmp_path_factory.mktemp("pp") / "s"
    for run in ("pp_1f1b_4rank", "pp_1f1b_4rank_slow2"):
        ta.ingest([TRACES / run], store, run=run)
    return store


def test_pipeline_shape_is_detected(pipeline):
    """4 stages, 8 micro-batches, 1F1B (no schedule annotations): (p-1)/(m+p-1) = 3/11."""
    shape = analyses.pipeline_shape(pipeline).set_index("run")
    for run in ("pp_1f1b_4rank", "pp_1f1b_4rank_slow2"):
        row = shape.loc[run]
        assert (row["n_stages"], row["stages_per_rank"], row["microbatches"], row["schedule"]) == (4, 1, 8, "1f1b")
        assert row["theoretical_bubble_pct"] == pytest.approx(100 * 3 / 11)


def test_bubbles_partition_each_step(pipeline):
    b = analyses.bubbles(pipeline)
    assert len(b) == 2 * 4 * 3  # runs x stages x steps
    parts = b["busy_ns"] + b["warmup_ns"] + b["cooldown_ns"] + b["stall_ns"] + b["other_idle_ns"]
    assert (parts == b["step_ns"]).all()
    # stage order follows the pipeline: rank s holds stage s in these runs
    assert (b["rank"] == b["stage"]).all()


def test_slow_stage_found_first_and_clean_pipeline_has_none(pipeline):
    slow = analyses.slow_stages(pipeline)
    found = slow[slow["is_finding"]]
    assert list(zip(found["run"], found["stage"], found["rank_order"])) == [("pp_1f1b_4rank_slow2", 2, 1)]
    top = found.iloc[0]
    # stage 2 sleeps 10 ms in each of its 8 micro-batch forwards: about 80 ms of its own time per step
    assert 60e6 < top["excess_ns_per_step"] < 95e6
    # the stages that waited for it charge it the most stall time
    causes = analyses.stall_causes(pipeline, run="pp_1f1b_4rank_slow2")
    assert causes.iloc[0]["rank"] == 2


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory):
    store = tmp_path_factory.mktemp("ddp") / "s"
    for run in ("ddp_gloo_2rank", "ddp_gloo_4rank", "ddp_gloo_2rank_imb1", "ddp_gloo_2rank_nooverlap"):
        ta.ingest([TRACES / run], store, run=run)
    return store


@pytest.mark.parametrize("run", ["ddp_gloo_2rank", "ddp_gloo_4rank"])
def test_clean_runs_have_no_straggler_or_imbalance_finding(ddp_runs, run):
    assert analyses.stragglers(ddp_runs, run=run).empty
    imb = analyses.imbalance(ddp_runs, run=run)
    assert len(imb) == int(run[9]) and not imb["is_finding"].any()


def test_imbalanced_rank_is_found_first(ddp_runs):
    """Rank 1 processes twice the batch: about twice the compute of rank 0 (ratio to the 2-rank
    mean about 2/1.5 = 1.33)."""
    imb = analyses.imbalance(ddp_runs, run="ddp_gloo_2rank_imb1")
    top = imb.iloc[0]
    assert top["rank"] == 1 and top["rank_order"] == 1 and bool(top["is_finding"])
    assert 1.15 < top["ratio_to_mean"] < 1.45
    assert not imb.iloc[1]["is_finding"]


def test_disabled_overlap_is_seen_as_exposed_communication(ddp_runs):
    ov = analyses.overlap(ddp_runs).set_index(["run", "rank"])
    off = ov.loc["ddp_gloo_2rank_nooverlap"]
    on = ov.loc["ddp_gloo_2rank"]
    assert (off["overlap_pct"] < 1).all()       # nothing overlapped
    assert (on["overlap_pct"] > 15).all()       # DDP's bucketed all-reduce overlaps backward
    assert off["exposed_ns"].sum() > 2 * on["exposed_ns"].sum()


@pytest.fixture(scope="module")
def pp_dp(tmp_path_factory):
    store = tmp_path_factory.mktemp("ppdp") / "s"
    ta.ingest([TRACES / "pp_1f1b_2x2_dp"], store, run="ppdp")
    return store


def test_pp_x_dp_has_one_pipeline_per_replica(pp_dp):
    """2 replicas x 2 stages (manifest layout: pipelines [[0, 1], [2, 3]]): two pipelines, each
    2 stages of 4 micro-batches, theoretical bubble (2-1)/(4+2-1) = 20 %; the p2p peers are global
    ranks of the replica even though gloo recorded them as ranks of the subgroup."""
    layout = json.loads((TRACES / "pp_1f1b_2x2_dp" / "manifest.json").read_text())["layout"]
    assert layout["pipelines"] == [[0, 1], [2, 3]] and layout["dp_groups"] == [[0, 2], [1, 3]]
    con = ta.open(pp_dp)
    peers = set(con.execute("SELECT DISTINCT src_rank, dst_rank FROM comms WHERE is_p2p").fetchall())
    assert peers == {(0, 1), (1, 0), (2, 3), (3, 2)}
    shape = analyses.pipeline_shape(pp_dp)
    assert list(shape["pipeline_id"]) == [0, 2]
    assert (shape["n_stages"] == 2).all() and (shape["microbatches"] == 4).all()
    assert list(shape["theoretical_bubble_pct"]) == pytest.approx([20.0, 20.0])
    b = analyses.bubbles(pp_dp)
    assert len(b) == 4 * 3  # ranks x steps
    stages = dict(zip(b["rank"], zip(b["pipeline_id"], b["stage"])))
    assert stages == {0: (0, 0), 1: (0, 1), 2: (2, 0), 3: (2, 1)}
    parts = b["busy_ns"] + b["warmup_ns"] + b["cooldown_ns"] + b["stall_ns"] + b["other_idle_ns"]
    assert (parts == b["step_ns"]).all()
    # stalls are charged to the rank's own pipeline partner (a receive or send waiting on it) or to
    # its data-parallel peer (waiting in the stage's gradient all_reduce for the other replica),
    # never to a rank it has no dependency on
    con = ta.open(pp_dp)
    analyses.prepare(con)
    charged = set(con.execute("SELECT DISTINCT rank, caused_by_rank FROM pipeline_idle WHERE kind = 'stall'").fetchall())
    pipeline_partners = {(0, 1), (1, 0), (2, 3), (3, 2)}
    dp_peers = {(0, 2), (2, 0), (1, 3), (3, 1)}
    assert pipeline_partners <= charged <= pipeline_partners | dp_peers


def test_pp_x_dp_slow_stage_compares_within_its_pipeline(pp_dp):
    """With 2 stages per pipeline, a stage's 'others' is exactly its partner in the same replica."""
    slow = analyses.slow_stages(pp_dp).set_index("rank")
    own = slow["own_ns_per_step"]
    for rank, partner in ((0, 1), (1, 0), (2, 3), (3, 2)):
        assert slow.loc[rank, "others_own_ns_per_step"] == own[partner]
    causes = analyses.stall_causes(pp_dp)
    assert sorted(causes.groupby("pipeline_id")["rank"].apply(sorted).tolist()) == [[0, 1], [2, 3]]
    assert sorted(causes["rank_order"]) == [1, 1, 2, 2]  # ranked within each pipeline


def test_critical_path_follows_p2p_through_the_slow_stage(pipeline):
    """pp_1f1b_4rank_slow2: stage 2 (rank 2) sleeps 10 ms in each of its 8 micro-batch forwards.
    The pipeline has no collectives: the path crosses ranks only through receives that waited for
    their send, and every step's path spends at least the 8 x 10 ms of sleep on rank 2."""
    from traceanalyzer.analyses.critical_path import critical_path
    cp = critical_path(pipeline, run="pp_1f1b_4rank_slow2")
    assert set(cp["via_op"].dropna()) == {"recv"}
    assert sorted(cp["step"].unique()) == [2, 3, 4]
    for step, g in cp.groupby("step"):
        on2 = g[g["rank"] == 2]["dur_ns"].sum()
        assert on2 >= 8 * 10e6, (step, on2)
        # the hops tile the path: each starts where the next (earlier) one hands over, never later
        assert (g["lo_ns"] <= g["hi_ns"]).all()
    summ = critical_path_summary(pipeline, run="pp_1f1b_4rank_slow2")
    idle2 = summ[(summ["rank"] == 2) & (summ["label"] == "idle")].groupby("step")["path_ns"].sum()
    assert (idle2 > 70e6).all()  # the sleeps: no recorded activity on rank 2
    top = summ.groupby("rank")["path_ns"].sum().idxmax()
    assert top == 2


def test_critical_path_is_the_same_whatever_the_batches_it_reads(pipeline, monkeypatch):
    """The walk reads the synchronisation points one step at a time from batches of rows (so the
    run's points are never all in memory): batches of 1 and 7 rows (every step boundary inside or
    at the edge of a batch) give the path of batches larger than the run."""
    from traceanalyzer.analyses import critical_path as cpm
    whole = cpm.critical_path(pipeline)
    assert whole["run"].nunique() > 1 and len(whole) > 10
    for rows in (1, 7):
        monkeypatch.setattr(cpm, "_BATCH_ROWS", rows)
        pd.testing.assert_frame_equal(cpm.critical_path(pipeline), whole)
    one = cpm.critical_path(pipeline, run="pp_1f1b_4rank_slow2", step=3)
    pd.testing.assert_frame_equal(one, whole[(whole["run"] == "pp_1f1b_4rank_slow2") & (whole["step"] == 3)]
                                  .reset_index(drop=True))


def test_straggler_excess_is_placed_in_the_user_annotation(tmp_path):
    """ddp_gloo_2rank_slow1_annotated: rank 1 sleeps 60 ms per forward inside
    record_function("slow_rank_delay"), which rank 0 never enters: the straggler's excess lies in
    that range, and its size is the median duration of the range in the raw trace."""
    ta.ingest([TRACES / "ddp_gloo_2rank_slow1_annotated"], tmp_path / "s", run="ann")
    s = analyses.stragglers(tmp_path / "s")
    assert list(s["rank"]) == [1]
    top = s.iloc[0]
    assert top["phase"] == "forward" and top["annotation"] == "slow_rank_delay"
    raw = load_raw(TRACES / "ddp_gloo_2rank_slow1_annotated" / "rank1.window0.pt.trace.json.gz")
    durs = sorted(e["dur"] for e in raw["traceEvents"] if e.get("name") == "slow_rank_delay")
    assert len(durs) == 5 and durs[0] >= 60_000  # µs: one per profiled step, each >= the 60 ms sleep
    assert top["annotation_excess_ns_per_step"] == pytest.approx(durs[2] * 1000, abs=1)  # median of 5


def _renumbered_copy(src, dst, rank, shift):
    """A copy of a shipped run where one rank's ProfilerStep#N are renamed ProfilerStep#(N+shift),
    as if that rank had started profiling at another iteration."""
    import gzip
    import re
    import shutil
    shutil.copytree(src, dst)
    path = dst / f"rank{rank}.window0.pt.trace.json.gz"
    raw = load_raw(path)
    for e in raw["traceEvents"]:
        m = re.fullmatch(r"ProfilerStep#(\d+)", e.get("name", ""))
        if m:
            e["name"] = f"ProfilerStep#{int(m.group(1)) + shift}"
    with gzip.open(path, "wt") as fh:
        json.dump(raw, fh)


#: The analyses the renumbered copies must give exactly as the original does.
ALIGNED_ANALYSES = (analyses.stragglers, analyses.collectives, analyses.phases, analyses.imbalance)


@pytest.fixture(scope="module")
def slow2_aligned(slow2):
    """ALIGNED_ANALYSES on the original slow2 store, computed once for every renumbered copy."""
    return {fn.__name__: fn(slow2) for fn in ALIGNED_ANALYSES}


@pytest.mark.parametrize("rank", [3, 0])
def test_steps_are_aligned_by_the_collectives_they_share(slow2_aligned, tmp_path, rank):
    """ddp_gloo_4rank_slow2 with one rank's steps numbered 100 higher: the alignment maps them back
    (the three ranks that agree keep their numbers), and the stragglers, collectives and phases are
    the same as on the original."""
    _renumbered_copy(TRACES / "ddp_gloo_4rank_slow2", tmp_path / "run", rank, 100)
    store = tmp_path / "s"
    ta.ingest([tmp_path / "run"], store, run="slow2")
    al = analyses.step_alignment(store)
    assert len(al) == 32
    moved = al[al["rank"] == rank]
    assert list(moved["step"]) == list(range(102, 110)) and list(moved["aligned_step"]) == list(range(2, 10))
    others = al[al["rank"] != rank]
    assert (others["step"] == others["aligned_step"]).all()
    for fn in ALIGNED_ANALYSES:
        got, want = fn(store), slow2_aligned[fn.__name__]
        assert got.equals(want), fn.__name__


def test_saved_results_of_another_version_are_not_relabelled(tmp_path, monkeypatch):
    """A table's saved entry states one results version and one set of parameters for every run's
    file it lists: saving run b under a new version must not pass run a's old file off as new (the
    report would read it instead of analysing a again); under the same version both stay listed."""
    from traceanalyzer.analyses.results import analyze
    from traceanalyzer.report.load import missing_results
    store = tmp_path / "s"
    ta.ingest([TRACES / "ddp_gloo_2rank"], store, run="a")
    ta.ingest([TRACES / "ddp_gloo_2rank_imb1"], store, run="b")
    analyze(store, run="a", only=["stragglers"])
    analyze(store, run="b", only=["stragglers"])
    files = json.loads((store / "_store.json").read_text())["results"]["stragglers"]["files"]
    assert set(files) == {"a", "b"}
    monkeypatch.setattr(S, "RESULTS_VERSION", S.RESULTS_VERSION + ".1")
    analyze(store, run="b", only=["stragglers"])
    files = json.loads((store / "_store.json").read_text())["results"]["stragglers"]["files"]
    assert set(files) == {"b"}
    assert "stragglers" in missing_results(store, ["a"])["a"] and "stragglers" not in missing_results(store, ["b"]).get("b", [])
