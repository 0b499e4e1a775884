"""The shipped GPU runs (traces/*_cuda_*, recorded on one H200 with traces/record_gpu.sh): they ingest
with their kernels and copies, NCCL's own files join the profiler's collectives, the analyses find
the injected faults, and the replay follows work across threads and through gloo's CUDA staging.

What the runs are (traces/README.md): gloo ranks sharing the one GPU (NCCL refuses two ranks on one
GPU), and NCCL with world size 1 (its debug log, Flight Recorder with timing, record_param_comms).
The numbers asserted were read from the raw files (counted in the log, the FR JSON) or are the
faults the manifests record.
"""
from __future__ import annotations

import argparse
import json
import re

import pytest
from conftest import TRACES

RUNS = ["ddp_gloo_cuda_2rank", "ddp_gloo_cuda_2rank_slow1", "ddp_gloo_cuda_4rank", "ddp_nccl_cuda_1rank",
        "moe_gloo_cuda_2rank_skew"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    import traceanalyzer as ta
    d = tmp_path_factory.mktemp("gpu") / "store"
    for run in RUNS:
        ta.ingest([str(TRACES / run)], str(d), run=run, workers=1)
    return d


@pytest.fixture(scope="module")
def con(store):
    import traceanalyzer as ta
    from traceanalyzer import analyses
    c = ta.open(str(store))
    analyses.prepare(c)
    return c


def test_cli_text_cuts_kernel_names(store, run_cli):
    """CUDA kernel names run to hundreds of characters; a line of the text summary cuts them."""
    code, out, _ = run_cli("analyze", store, "--run", "ddp_gloo_cuda_2rank", "--no-save")
    exposed = [line for line in out.splitlines() if "exposed #" in line]
    assert code == 0 and exposed and all(len(line) < 220 and line.endswith("…") for line in exposed), exposed


def test_manifests_say_gpu_and_backend():
    for run in RUNS:
        m = json.loads((TRACES / run / "manifest.json").read_text())
        assert m["ground_truth"]["device"] == "cuda", run
        assert m["backend"] == ("nccl" if "nccl" in run else "gloo"), run
        assert m["nccl_version"] and m["cuda_version"], run   # CUDA builds report both
        for r in range(m["world_size"]):
            part = json.loads((TRACES / run / f"rank{r}.manifest.json").read_text())
            assert part["device"] == "cuda:0", (run, r)       # every rank shares the one GPU


def test_kernels_copies_and_streams(con):
    df = con.execute("""SELECT run, rank, count(*) FILTER (WHERE kind = 'compute_kernel') AS kernels,
                               count(*) FILTER (WHERE kind = 'memcpy') AS memcpys,
                               count(DISTINCT tid) FILTER (WHERE is_gpu) AS streams
                        FROM events GROUP BY ALL""").df()
    assert set(df["run"]) == set(RUNS) and (df["kernels"] > 100).all() and (df["memcpys"] > 0).all(), df
    gloo = df[df["run"].str.contains("gloo")]
    assert (gloo["streams"] >= 2).all(), gloo   # compute stream + gloo's staging stream
    # the launch -> kernel link (correlation) holds for every kernel launched inside the window; the
    # only kernels without their launch (2, in the 4-rank run) were launched before the window
    # opened and ran in its first microseconds, outside every ProfilerStep
    orphans = con.execute("""SELECT count(*), count(*) FILTER (WHERE step IS NOT NULL) FROM events k
                             WHERE k.kind = 'compute_kernel' AND NOT EXISTS (
                               SELECT 1 FROM events l WHERE l.run = k.run AND l.rank = k.rank AND NOT l.is_gpu
                                 AND l.correlation = k.correlation)""").fetchone()
    assert orphans[0] <= 4 and orphans[1] == 0, orphans


def test_gloo_collectives_join_across_ranks(con):
    df = con.execute("""SELECT run, count(*) AS n, min(n_ranks) AS lo, max(n_ranks) AS hi FROM (
                          SELECT run, pg_name, seq, count(DISTINCT rank) AS n_ranks FROM comms
                          WHERE NOT is_p2p AND run LIKE '%gloo%' GROUP BY ALL) GROUP BY run""").df()
    world = {"ddp_gloo_cuda_2rank": 2, "ddp_gloo_cuda_2rank_slow1": 2, "ddp_gloo_cuda_4rank": 4,
             "moe_gloo_cuda_2rank_skew": 2}
    for r in df.itertuples():
        assert r.lo == r.hi == world[r.run], r
    # the FR gave every gloo collective its group and sequence id
    assert con.execute("SELECT count(*) FROM comms WHERE run LIKE '%gloo%' AND NOT is_p2p "
                       "AND seq_source <> 'flight_recorder'").fetchone()[0] == 0


def test_nccl_log_real_lines():
    """NCCL 2.28.9's own COLL lines: every collective line is parsed (with nranks=1 NCCL prints
    opCount 0 on all of them); nothing skipped."""
    from traceanalyzer.ingest.nccl.logs import read_nccl_log
    path = next((TRACES / "ddp_nccl_cuda_1rank").glob("nccl_debug.*.log"))
    text = path.read_text()
    coll = re.findall(r"NCCL INFO (AllReduce|Broadcast|AllGather|ReduceScatter|Reduce): opCount", text)
    log = read_nccl_log(path)
    assert log.table.num_rows == len(coll) == 47 and log.rank == 0 and not any(log.skipped.values()), log.skipped
    t = log.table.to_pydict()
    assert set(t["op_count"]) == {0} and set(t["nranks"]) == {1}


def test_nccl_flight_recorder_and_log_join(con):
    """torch 2.11's NCCL trace has no sequence number: the FR entry created inside each
    record_param_comms span gives it (16..39: the window holds steps 2-4 of 0-5), and the FR's
    full history anchors the debug log, whose steps repeat (offsets -23, -15, -7 fit equally)."""
    c = con.execute("SELECT seq, seq_source, fr_matched, fr_state, fr_duration_ns FROM comms_fr "
                    "WHERE run = 'ddp_nccl_cuda_1rank' ORDER BY seq").df()
    assert list(c["seq"]) == list(range(16, 40)) and set(c["seq_source"]) == {"flight_recorder"}
    assert c["fr_matched"].all() and set(c["fr_state"]) == {"completed"} and (c["fr_duration_ns"] > 0).all()
    m = con.execute("SELECT status, pos_offset, evidence FROM nccl_comm_map WHERE run = 'ddp_nccl_cuda_1rank'").df()
    assert len(m) == 1 and m["status"][0] == "joined" and m["pos_offset"][0] == -15, m.T
    assert "flight_recorder" in m["evidence"][0]
    j = con.execute("SELECT count(*), count(*) FILTER (WHERE nccl_log_matched AND nccl_log_count = in_nelems) "
                    "FROM comms_nccl WHERE run = 'ddp_nccl_cuda_1rank'").fetchone()
    assert j == (24, 24)
    # the FR dump kept the stack frames (from the pickle dumps, not torch's JSON): every entry issued
    # from Python has them; DDP's bucket all_reduces come from autograd's thread (pt_autograd_0),
    # which has no Python stack
    fr = json.loads((TRACES / "ddp_nccl_cuda_1rank" / "rank0.fr.json").read_text())
    assert len(fr["entries"]) == 47
    assert all(bool(e["frames"]) == (e["thread_name"] != "pt_autograd_0") for e in fr["entries"])


def test_analyses_find_the_faults(con):
    from traceanalyzer import analyses
    s = analyses.stragglers(con)
    assert set(s["run"]) == {"ddp_gloo_cuda_2rank_slow1"}, s      # the clean runs have none
    top = s.iloc[0]
    # rank 1 sleeps 20 ms in every forward (manifest); the analysis sees it in the forward phase
    assert top["rank"] == 1 and top["phase"] == "forward" and 15e6 < top["phase_excess_ns_per_step"] < 30e6
    a = analyses.all_to_all_balance(con)
    hot = a[a["is_finding"]]
    assert list(hot["run"]) == ["moe_gloo_cuda_2rank_skew"] and hot["rank"].iloc[0] == 1   # --skew 4: rank 1's expert
    o = analyses.overlap(con).set_index("run")
    # gloo on CUDA: the comm is the CPU execution span; NCCL on one rank transfers nothing
    assert o.drop(index="ddp_nccl_cuda_1rank")["overlap_pct"].notna().all(), o
    assert o.loc[["ddp_nccl_cuda_1rank"], "overlap_pct"].isna().all(), o


def test_replay_identity_and_slow_rank(con):
    from traceanalyzer import replay
    for run in RUNS:
        e = replay.error_summary(replay.identity(replay.build_graph(con, run)))
        assert e["n"] > 0 and e["median"] <= 0.001 and e["p90"] <= 0.001, (run, e)
    g = replay.build_graph(con, "ddp_gloo_cuda_2rank_slow1")
    w = replay.what_if(g, {"actions": [{"action": "idealize", "ranks": [1]}]})
    drop_ms = -w.steps.groupby("rank")["delta_ns"].mean() / 1e6
    # On the GPU the backward runs on autograd's device thread and gloo stages each bucket through
    # host copies on its own stream; without the cross-thread waits and the runloop-launch edges
    # rank 0's predicted step did not move at all (0.0 ms) and rank 1's moved 5.9 ms.
    assert (drop_ms > 8).all() and (drop_ms < 25).all(), drop_ms.to_dict()


def test_workload_refusals():
    from traceanalyzer.workloads import common, pipeline
    args = argparse.Namespace(backend="nccl", device="cpu")
    with pytest.raises(SystemExit, match="needs --device cuda"):
        common.device_of(args)
    p = argparse.Namespace(backend="gloo", device="cuda", slow_rank=None, imbalance_rank=None,
                           imbalance_factor=2.0, dp=1, stages_per_rank=1, schedule="1f1b", slow_stage=None)
    with pytest.raises(SystemExit, match="needs --backend nccl"):
        pipeline._check(p, 2)


def test_merge_flight_recorder_dumps():
    """A process with NCCL and gloo groups has entries in both recorders: one document, entries in
    creation order, record ids renumbered so that they stay monotonic."""
    from traceanalyzer.collect.fr_dump import merge_dumps
    nccl = {"version": "2.10", "pg_config": {"0": {"name": "0"}}, "pg_status": {},
            "entries": [{"record_id": 0, "time_created_ns": 30}, {"record_id": 1, "time_created_ns": 10}]}
    gloo = {"version": "2.10", "pg_config": {"1": {"name": "1"}}, "pg_status": {},
            "entries": [{"record_id": 0, "time_created_ns": 20}]}
    m = merge_dumps([("_dump_nccl_trace", nccl), ("_dump_fr_trace", gloo)])
    assert [e["time_created_ns"] for e in m["entries"]] == [10, 20, 30]
    assert [e["record_id"] for e in m["entries"]] == [0, 1, 2]
    assert set(m["pg_config"]) == {"0", "1"} and "_dump_nccl_trace" in m["dumped_by"]
