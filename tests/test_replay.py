"""Replay (what-if): identity fidelity on the committed traces, the direction and size of
"idealise the slow rank", the OSDI'25 straggler metric, plans and their errors.

Bounds asserted (what the first slice achieves, with a margin): identity-replay error median and
P90 <= 0.1 % on every run (it is 0 by construction: per-node latencies are fitted so the recorded
start is reproduced; it checks the graph is consistent, not that predictions are right).
"""
from __future__ import annotations

import json

import pytest
from conftest import EXTERNAL, TRACES, ingest_runs

RUNS = ["ddp_gloo_2rank", "ddp_gloo_4rank", "ddp_gloo_4rank_slow2", "pp_1f1b_4rank", "pp_1f1b_4rank_slow2"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return ingest_runs(tmp_path_factory, "replay", RUNS, dlrm=True)


@pytest.fixture(scope="module")
def graphs(store):
    import traceanalyzer as ta
    from traceanalyzer import replay
    con = ta.open(str(store))
    runs = RUNS + (["dlrm"] if (EXTERNAL / "param_dlrm_8rank").exists() else [])
    return {run: replay.build_graph(con, run) for run in runs}


def test_identity_error_bounds(graphs):
    from traceanalyzer import replay
    for run, g in graphs.items():
        e = replay.error_summary(replay.identity(g))
        assert e["n"] > 0, run
        assert e["median"] <= 0.001 and e["p90"] <= 0.001, (run, e)


def test_idealise_slow_rank_ddp(graphs):
    from traceanalyzer import replay
    g = graphs["ddp_gloo_4rank_slow2"]
    r = replay.what_if(g, {"actions": [{"action": "idealize", "ranks": [2]}]})
    drop_ms = -r.steps.groupby("rank")["delta_ns"].mean() / 1e6
    # rank 2 sleeps 20 ms per step; the mean over ranks keeps ~5 ms of it: expect 10-25 ms on every rank
    assert ((drop_ms > 10) & (drop_ms < 25)).all(), drop_ms.to_dict()
    assert r.identity_error["median"] <= 0.001


def test_straggler_metric(graphs):
    from traceanalyzer import replay
    m = replay.straggler_metrics(graphs["ddp_gloo_4rank_slow2"])
    assert m["S"] > 1.3   # measured 1.46: rank 2 sleeps 20 ms in a ~30 ms step
    assert abs(m["waste"] - (1 - 1 / m["S"])) < 1e-9
    sw = m["per_rank"].set_index("rank")["S_w"]
    assert sw.idxmax() == 2 and sw[2] > 1.3, sw.to_dict()
    # the worst 3 % of 4 ranks is one rank: rank 2, and idealising it recovers most of the slowdown
    assert m["top_ranks"] == [2] and m["top_ranks_recovered"] > 0.8, m["top_ranks_recovered"]
    # the sleep runs inside the workload's user annotation: that op type carries the slowdown
    st = m["per_op_type"].set_index("op_type")["S_t"]
    assert st.idxmax() == "annotation" and st["annotation"] > 1.2, st.to_dict()
    assert not m["last_stage_ranks"]   # not a pipeline


def test_straggler_metric_pipeline_last_stage(graphs):
    from traceanalyzer import replay
    m = replay.straggler_metrics(graphs["pp_1f1b_4rank_slow2"])
    assert m["top_ranks"] == [2] and m["top_ranks_recovered"] > 0.6   # measured 0.76
    # the slow stage is stage 2, not the last: fixing the last stage alone recovers almost nothing
    assert m["last_stage_ranks"] == [3] and m["last_stage_recovered"] < 0.1


def test_straggler_metric_clean_runs_near_one(graphs):
    """Clean runs: S < 1.1 (the OSDI'25 straggler threshold) on the 2-rank run (one rank per core);
    the 4-rank run shares 2 cores between 4 ranks (and their gloo threads), whose scheduling noise
    is real slowdown: measured S = 1.15 there, well under the slow run's 1.55."""
    from traceanalyzer import replay
    assert replay.straggler_metrics(graphs["ddp_gloo_2rank"])["S"] < 1.1
    s4 = replay.straggler_metrics(graphs["ddp_gloo_4rank"])["S"]
    assert s4 < 1.2 and s4 < replay.straggler_metrics(graphs["ddp_gloo_4rank_slow2"])["S"] - 0.2


def test_breakdown_delta(graphs):
    from traceanalyzer import replay
    r = replay.what_if(graphs["ddp_gloo_4rank_slow2"], {"actions": [{"action": "idealize", "ranks": [2]}]})
    bd = r.breakdown_delta().set_index("rank")
    # rank 2's own work shrinks (its 20 ms sleep becomes the mean over ranks, ~5 ms); the others
    # do the same work and only wait less: their step shrinks, their work does not change
    own = bd.loc[2, "cpu_ops_delta_ns"] + bd.loc[2, "host_gaps_delta_ns"]
    assert own < -10e6, own
    assert (bd["step_time_delta_ns"] < -10e6).all(), bd["step_time_delta_ns"].to_dict()
    for rank in (0, 1, 3):
        assert bd.loc[rank, "cpu_ops_delta_ns"] == 0 and bd.loc[rank, "host_gaps_delta_ns"] == 0
    ident = replay.breakdown(r.graph, r.identity_schedule)
    merged = ident.merge(r.steps, on=["rank", "step"])
    assert (merged["step_time"] == merged["identity_ns"]).all()


def test_scale_plans_direction(graphs):
    from traceanalyzer import replay
    g = graphs["pp_1f1b_4rank"]
    fast = replay.what_if(g, {"actions": [{"action": "scale", "ops": "*", "factor": 0.5}]})
    assert (fast.steps["delta_ns"] < 0).all()
    slow_comm = replay.what_if(g, {"actions": [{"action": "scale_comm", "factor": 2.0}]})
    assert (slow_comm.steps["delta_ns"] >= 0).all() and slow_comm.steps["delta_ns"].sum() > 0
    same = replay.what_if(g, {"actions": [{"action": "scale", "ops": "*", "factor": 1}]})
    assert (same.steps["delta_ns"] == 0).all()
    from traceanalyzer import TraceAnalyzerError
    with pytest.raises(TraceAnalyzerError, match="matches no operation"):   # a silent no-op is an error
        replay.what_if(g, {"actions": [{"action": "scale", "ops": "no-such-op", "factor": 3}]})


def test_cli_replay_and_chrome_trace(store, tmp_path, run_cli):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"name": "fix2", "actions": [{"action": "idealize", "ranks": [2]}]}))
    out = tmp_path / "pred.json"
    code, stdout, err = run_cli("replay", store, "--run", "ddp_gloo_4rank_slow2", "--plan", plan, "--chrome-trace", out)
    assert code == 0, err
    assert "identity-replay error median" in stdout and "predicted" in stdout
    doc = json.loads(out.read_text())
    assert sum(e["ph"] == "X" for e in doc["traceEvents"]) > 100


@pytest.mark.parametrize("text", ['{"actions": [{"action": "scal"}]}', "{not json", '{"actions": []}',
                                  '{"actions": [{"action": "scale", "factor": -1}]}',
                                  '{"actions": [{"action": "idealize", "ranks": "two"}]}',
                                  '{"actions": [{"action": "idealize", "rank": [2]}]}',
                                  '{"actions": [{"action": "idealize", "ranks": [2], "reference": "mean"}]}',
                                  '{"actions": [{"action": "scale_comm", "bandwidth": 0}]}',
                                  '{"actions": [{"action": "ddp", "bucket_mb": 4}, {"action": "scale", "factor": 2}]}',
                                  '{"actions": [{"action": "pipeline", "microbatches": 2.5}]}',
                                  '{"actions": [{"action": "ddp", "overlap": "yes"}]}',
                                  '{"actions": [{"action": "pipeline", "microbatches": 8}]}'])
def test_bad_plan_one_line_error(store, tmp_path, run_cli, text):
    plan = tmp_path / "bad.json"
    plan.write_text(text)
    code, stdout, err = run_cli("replay", store, "--run", "ddp_gloo_4rank", "--plan", plan)
    assert code == 2
    assert err.startswith("traceanalyzer: error: ") and err.count("\n") == 1, err


def test_gpu_changes_reach_the_step_dlrm(graphs):
    """DLRM (8 ranks, NCCL): ~1.1 ms of kernels and ~0.2 ms of NCCL kernels per rank in a ~20 ms
    CPU-bound step. Slowing the GPU a little changes little; once the GPU work exceeds the CPU's the
    step follows it (the step ends when the GPU work it launched ends, and syncs/stream waits link
    the streams to the host)."""
    from traceanalyzer import replay
    if "dlrm" not in graphs:
        pytest.skip("external DLRM trace not found")
    g = graphs["dlrm"]

    def job(plan):
        return replay.what_if(g, {"actions": [plan]}).job_step_ns() / 1e6

    base = job({"action": "scale", "ops": "*", "factor": 1})
    k2, k40 = (job({"action": "scale", "categories": ["compute_kernel"], "factor": f}) for f in (2, 40))
    assert base <= k2 < base * 1.1            # 2x of 1 ms of kernels: hidden behind the CPU
    assert k40 > base + 20, (base, k40)       # 40x: ~44 ms of kernels, the GPU now sets the step
    c100 = job({"action": "scale_comm", "factor": 100})
    assert c100 > base + 5, (base, c100)      # NCCL kernels ~20 ms: the stream waits bring them in


def test_scale_comm_by_bandwidth_uses_the_alpha_beta_fit(graphs):
    """ddp_gloo_4rank: every all_reduce moves the same 1 MB bucket sizes, so the fit has no alpha
    (one size: not identifiable) and all of a transfer is the beta term: 2x bandwidth = half the
    transfer, exactly like a factor of 0.5; latency alone then changes nothing."""
    from traceanalyzer import replay
    g = graphs["ddp_gloo_4rank"]
    bw = replay.what_if(g, {"actions": [{"action": "scale_comm", "bandwidth": 2.0}]})
    half = replay.what_if(g, {"actions": [{"action": "scale_comm", "factor": 0.5}]})
    assert g.alphabeta.table.set_index("op").loc["all_reduce", "alpha_ns"] == 0
    assert abs(bw.job_step_ns() - half.job_step_ns()) <= 0.01 * half.job_step_ns()
    assert bw.job_step_ns() < bw.job_step_ns("identity_ns")
    slow = replay.what_if(g, {"actions": [{"action": "scale_comm", "bandwidth": 0.5}]})
    assert slow.job_step_ns() > slow.job_step_ns("identity_ns") * 1.2
    lat = replay.what_if(g, {"actions": [{"action": "scale_comm", "latency": 0.1}]})
    assert lat.job_step_ns() == lat.job_step_ns("identity_ns")


def test_structural_plans_through_run_plan_and_cli(tmp_path, run_cli):
    """The pipeline and ddp actions go to their models (replay.pipeline / replay.ddp) through
    run_plan and the CLI; results carry the identity model error and a Chrome trace."""
    import traceanalyzer as ta
    from traceanalyzer import replay
    st = tmp_path / "s"
    for run in ("pp_1f1b_2rank_m4", "ddp_gloo_2rank_big_b25"):
        ta.ingest([str(TRACES / run)], str(st), run=run, progress=False)
    r = replay.run_plan(str(st), {"actions": [{"action": "pipeline", "microbatches": 8}]}, run="pp_1f1b_2rank_m4")
    assert r.job_step_ns() > 1.5 * r.job_step_ns("identity_ns")        # twice the micro-batches
    assert r.identity_error["median"] < 0.05
    plan = tmp_path / "b4.json"
    plan.write_text(json.dumps({"actions": [{"action": "ddp", "bucket_mb": 4}]}))
    out = tmp_path / "b4.trace.json"
    code, stdout, err = run_cli("replay", st, "--run", "ddp_gloo_2rank_big_b25", "--plan", plan, "--chrome-trace", out)
    assert code == 0, err
    assert "(ddp model): identity model error" in stdout and "predicted" in stdout
    assert sum(e["ph"] == "X" for e in json.loads(out.read_text())["traceEvents"]) > 10
    code, _, err = run_cli("replay", st, "--run", "ddp_gloo_2rank_big_b25", "--plan", plan, "--straggler-metrics")
    assert code == 2 and "--straggler-metrics goes with duration plans" in err


def _typical_by_pandas(g, ref_ranks):
    """The compute part of typical_durations written the direct way (pandas groupby + merge, as
    the first version of plans.py did): mean over the reference ranks of the same operation."""
    import numpy as np
    import pandas as pd

    from traceanalyzer.replay.graph import GAP
    lanes = g.lanes.sort_values(["rank", "type", "tid"])
    lanes["ordinal"] = lanes.groupby(["rank", "type"]).cumcount()
    lane_key = np.full(int(g.lane.max()) + 2, -1)
    lane_key[lanes["lane"].to_numpy()] = pd.factorize(lanes["type"] + ":" + lanes["ordinal"].astype(str))[0]
    name = g.label.astype(np.int64)
    nxt = np.r_[name[1:], -1]
    same_lane = np.r_[(g.lane[1:] == g.lane[:-1]) & (g.lane[:-1] >= 0), False]
    name = np.where((g.kind == GAP) & same_lane, nxt, name)
    df = pd.DataFrame({"lane": lane_key[g.lane], "label": name, "kind": g.kind, "dur": g.dur, "rank": g.rank})
    df["occ"] = df.groupby(["rank", "lane", "label", "kind"]).cumcount()
    key = ["lane", "label", "kind", "occ"]
    ref = df[df["rank"].isin(ref_ranks)].groupby(key)["dur"].mean().rename("typ")
    typ = df[key].merge(ref, left_on=key, right_index=True, how="left")["typ"].to_numpy()
    return np.rint(typ).astype(np.float64)   # NaN: no reference rank ran this exact operation


def test_typical_durations_match_direct_groupby(graphs):
    """typical_durations keys operations once per graph (g.cache) and averages with bincount; on
    compute nodes it equals the direct pandas groupby for all ranks and for 'every rank but one'
    (the default reference of a subset), whatever the order of the calls."""
    import numpy as np

    from traceanalyzer.replay import typical_durations
    from traceanalyzer.replay.graph import KERNEL, OP
    for run in ("ddp_gloo_4rank_slow2", "pp_1f1b_4rank_slow2", "dlrm"):
        if run not in graphs:
            continue
        g = graphs[run]
        g.cache.clear()
        ranks = sorted(set(g.rank[g.rank >= 0].tolist()))
        comp = np.isin(g.kind, [OP, KERNEL])
        for left_out in (2, None, 1):
            ref = [r for r in ranks if r != left_out]
            mask = np.isin(np.arange(max(ranks) + 1), ref)
            got = typical_durations(g, None if left_out is None else mask, roles=False)
            want = _typical_by_pandas(g, ref)
            exact = comp & ~np.isnan(want)   # the others fall back to coarser keys (plans._operation_keys)
            np.testing.assert_array_equal(got[exact], want[exact].astype(np.int64), err_msg=f"{run} without {left_out}")
            assert (got[comp] != g.dur[comp]).sum() > 10, run     # it does change durations
        assert "operation_keys" in g.cache


def test_clock_offsets_applied_only_where_the_views_apply_them(store):
    """The builder reads the clock offsets only where clock_alignment says they apply (runs over
    several hosts, or align_clocks='always'); with 'always' every rank's nodes move by its offset."""
    import numpy as np

    import traceanalyzer as ta
    from traceanalyzer import replay
    con = ta.open(str(store))
    run = "ddp_gloo_4rank_slow2"
    con.execute("SET VARIABLE align_clocks = 'never'")
    g0 = replay.build_graph(con, run)
    con.execute("SET VARIABLE align_clocks = 'always'")
    g1 = replay.build_graph(con, run)
    off = dict(con.execute("SELECT rank, offset_ns FROM clock_offsets WHERE run = $run", {"run": run}).fetchall())
    assert any(off.values())                      # real offsets (µs of clock noise between processes)
    for r, o in off.items():
        # the first node of each rank's main CPU lane: its recorded start, moved by the offset
        lane = int(g0.lanes.loc[(g0.lanes["rank"] == r) & (g0.lanes["type"] == "cpu"), "lane"].iloc[0])
        a, b = np.flatnonzero(g0.lane == lane)[0], np.flatnonzero(g1.lane == lane)[0]
        assert int(g1.ms[b]) - int(g0.ms[a]) == o, (r, o)
    con.execute("SET VARIABLE align_clocks = 'auto'")    # one host: nothing applied
    g2 = replay.build_graph(con, run)
    assert np.array_equal(g2.ms, g0.ms)
