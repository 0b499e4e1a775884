"""Joining the NCCL side to the profiler's collectives: nccl_comm_map and comms_nccl.

The profiler side is real: rank 0 of a 2-rank DDP job (HTA's nccl_parser_config trace, NCCL 2.17.1,
process group "0", ProfilerStep#4-#6: 21 collectives). The NCCL log, Inspector and profiler-plugin
files in tests/fixtures/nccl_join/ are written from the documented formats to describe that job
(make_fixture.py there says how); no GPU here, so the formats are checked only against fixtures."""
from __future__ import annotations

import re

from conftest import EXTERNAL, ROOT, need_external

import traceanalyzer as ta
from traceanalyzer import schema as S
from traceanalyzer.analyses.nccl_join import comm_map
from traceanalyzer.ingest.nccl.logs import read_nccl_log

FIX = ROOT / "tests" / "fixtures" / "nccl_join"
TRACE = EXTERNAL / "hta" / "nccl_parser_config.json.gz"
LOGS = [FIX / "rank0.nccl.log", FIX / "rank1.nccl.log"]
PLUGINS = [FIX / "gpu-node-pid2910249.log", FIX / "nccl_prof_rank0-gpu-node-2910392.txt"]
WORLD0 = "0x55f1c2a3b4d0"  # rank 0's world communicator (the log's comm pointer)


def mapping(con):
    return {(r["rank"], r["source"], r["nccl_comm"]): r for r in con.sql("SELECT * FROM nccl_comm_map").df().to_dict("records")}


def test_torch_comm_lines_name_the_process_group():
    log = read_nccl_log(FIX / "rank0.nccl.log").table.to_pandas()
    assert log.groupby("comm")[["torch_pg_name", "torch_pg_desc"]].first().to_dict("index") == {
        WORLD0: {"torch_pg_name": "0", "torch_pg_desc": "default_pg"},
        "0x55f1c2c0e5a0": {"torch_pg_name": "1", "torch_pg_desc": "metrics"}}
    assert read_nccl_log(FIX / "rank0.nccl.log").skipped == {}  # torch's lines are not garbage
    assert read_nccl_log(FIX / "rank1.nccl.log").table.to_pandas()["torch_pg_name"].isna().all()


def test_older_torch_prefix(tmp_path):
    """torch < 2.4 wrote '[PG 0 (default_pg) Rank 5]' (glog line as in a real job log)."""
    p = tmp_path / "rank5.nccl.log"
    p.write_text("I0527 15:16:57.738664 58629 ProcessGroupNCCL.cpp:2183] [PG 0 (default_pg) Rank 5] ProcessGroupNCCL "
                 "created ncclComm_ 0x555b8d27b370 on CUDA device: \n"
                 "h:58629:58629 [5] NCCL INFO AllReduce: opCount 0 sendbuff 0x1 recvbuff 0x1 count 4 datatype 7 op 0 "
                 "root 0 comm 0x555b8d27b370 [nranks=8] stream 0x2\n")
    row = read_nccl_log(p).table.to_pylist()[0]
    assert (row["torch_pg_name"], row["torch_pg_desc"]) == ("0", "default_pg")


def test_log_alone_is_ambiguous_then_the_inspector_decides(tmp_path):
    need_external()
    store = tmp_path / "s"
    ta.ingest([TRACE, *LOGS], store, run="ddp")
    con = ta.open(store)
    assert con.execute("SELECT count(*), min(seq), max(seq) FROM comms WHERE pg_name = '0'").fetchall() == [(21, 0, 20)]
    m = mapping(con)
    world = m[(0, "nccl_log", WORLD0)]
    # the log has 52 collectives on this communicator: 2 at construction, 8 in step 0, 7 in each of steps 1-6;
    # the trace's 21 (steps 4-6) fit at steps 1, 2, 3 and 4 alike
    assert (world["status"], world["pg_name"], world["n_nccl_ops"], world["n_tied"]) == ("ambiguous", "0", 52, 4)
    assert "4 alignments fit process group 0 equally (offsets -31, -24, -17, -10)" in world["reason"]
    assert "no durations" in world["reason"] and world["evidence"] == "ops_sizes;torch_log;pid"
    metrics = m[(0, "nccl_log", "0x55f1c2c0e5a0")]
    assert metrics["status"] == "no_profiler_collectives" and "names process group 1" in metrics["reason"]
    assert {m[k]["status"] for k in m if k[0] == 1} == {"no_profiler_collectives"}  # rank 1: no trace published
    assert not con.execute("SELECT bool_or(nccl_log_matched) FROM comms_nccl").fetchone()[0]

    ta.ingest(PLUGINS, store, run="ddp")
    con = ta.open(store)
    m = mapping(con)
    insp, plugin, world = m[(0, "nccl_inspector", "0x3f6c1a2b9d8e7f01")], m[(0, "nccl_profiler", "4570056496503488257")], \
        m[(0, "nccl_log", WORLD0)]
    for row in (insp, plugin):  # durations tell the repeating alignments apart
        assert (row["status"], row["pg_name"], row["pos_offset"], row["n_matched"], row["score"], row["n_tied"]) == \
            ("joined", "0", -31, 21, 1.0, 4)
        assert row["evidence"] == "ops_sizes;durations;pid" and row["comm_hash"] == "0x3f6c1a2b9d8e7f01"
    assert insp["dur_error"] == 0.0 and 0 < plugin["dur_error"] < 0.01
    # the log's commId is the Inspector's id: the log takes its alignment (log collective i = coll_sn i+1)
    assert (world["status"], world["pos_offset"], world["n_matched"]) == ("joined", -31, 21)
    assert world["evidence"] == "ops_sizes;torch_log;pid;comm_hash:nccl_inspector" and "coll_sn i+1" in world["reason"]

    rows = con.execute("""SELECT seq, op, in_nelems, dur_ns, nccl_log_op_count, nccl_log_count, nccl_log_comm, inspector_sn,
                                 inspector_exec_dur_ns, inspector_algo, inspector_proto, inspector_busbw_gbs, plugin_seq_num,
                                 plugin_dur_ns FROM comms_nccl WHERE rank = 0 AND pg_name = '0' ORDER BY seq""").fetchall()
    # seq 2 = step 4's first gradient bucket: opCount 0x21 = 33 of the world communicator (2 + 8 + 3 x 7 + 2),
    # coll_sn 34, the 22nd AllReduce for the plugin (SeqNum 21); Inspector time = the kernel's 3,306,963 ns,
    # busbw = 2,049,000 x 4 B / 3.306963 ms = 2.4784 GB/s
    assert rows[2] == (2, "all_reduce", 2049000, 3306963, 33, 2049000, WORLD0, 34, 3306963, "RING", "LL", 2.478407, 21, 3326963)
    assert rows[0][:8] == (0, "broadcast", 53120, 30975, 31, 53120, WORLD0, 32)
    assert [r[4] for r in rows] == list(range(31, 52)) and [r[7] for r in rows] == list(range(32, 53))
    assert con.execute("SELECT count(*) FILTER (nccl_log_matched AND inspector_matched AND plugin_matched), count(*) "
                       "FROM comms_nccl").fetchall() == [(21, 21)]


def test_counts_contradicting_the_trace_are_not_joined(tmp_path):
    """A log of another model: every AllReduce count doubled. Only the 6 broadcasts agree."""
    need_external()
    bad = tmp_path / "logs" / "rank0.nccl.log"
    bad.parent.mkdir()
    text = (FIX / "rank0.nccl.log").read_text()
    text = re.sub(r"(AllReduce: .* count )(\d+)( .* comm 0x55f1c2a3b4d0 )", lambda x: f"{x[1]}{int(x[2]) * 2}{x[3]}", text)
    bad.write_text(text)
    store = tmp_path / "s"
    ta.ingest([TRACE, bad, PLUGINS[0]], store, run="ddp")
    con = ta.open(store)
    m = mapping(con)
    row = m[(0, "nccl_log", WORLD0)]
    assert (row["status"], row["n_matched"], row["score"]) == ("contradicted", 6, 0.2857)
    assert row["reason"] == ("torch's log names process group 0, but only 6 of 21 ops agree (op, size, group size) at offset "
                             f"{row['pos_offset']}: score 0.29 < min_score 0.9")
    assert m[(0, "nccl_inspector", "0x3f6c1a2b9d8e7f01")]["status"] == "joined"  # its counts are right
    assert con.execute("SELECT count(*) FILTER (nccl_log_matched), count(*) FILTER (inspector_matched) "
                       "FROM comms_nccl").fetchall() == [(0, 21)]
    # without torch's line nothing names the group: below the threshold
    bad.write_text("\n".join(l for l in text.splitlines() if "created ncclComm_" not in l))
    store2 = tmp_path / "s2"
    ta.ingest([TRACE, bad], store2, run="ddp")
    row = mapping(ta.open(store2))[(0, "nccl_log", WORLD0)]
    assert row["status"] == "below_threshold" and row["reason"].startswith("best: process group 0, 6 of 21 ops agree")


def test_two_communicators_fitting_one_group(tmp_path):
    """A second Inspector file with the same records (another communicator id): neither can be told
    apart by its ops; only the pid of the trace's process (2910249) can."""
    need_external()
    text = PLUGINS[0].read_text().replace("0x3f6c1a2b9d8e7f01", "0x1111222233334444")
    (tmp_path / "in").mkdir()
    twin = tmp_path / "in" / "gpu-node-pid2910251.log"
    twin.write_text(text.replace('"pid":2910249', '"pid":2910251'))
    ta.ingest([TRACE, PLUGINS[0], twin], tmp_path / "s", run="ddp")
    m = mapping(ta.open(tmp_path / "s"))
    keep, other = m[(0, "nccl_inspector", "0x3f6c1a2b9d8e7f01")], m[(0, "nccl_inspector", "0x1111222233334444")]
    assert (keep["status"], other["status"]) == ("joined", "ambiguous")
    assert other["reason"] == ("communicators 0x1111222233334444, 0x3f6c1a2b9d8e7f01 all fit process group 0; "
                               "0x3f6c1a2b9d8e7f01 has the trace's pid")
    twin.write_text(text)  # same pid: nothing tells them apart
    ta.ingest([TRACE, PLUGINS[0], twin], tmp_path / "s2", run="ddp")
    m = mapping(ta.open(tmp_path / "s2"))
    assert {r["status"] for r in m.values()} == {"ambiguous"} and len(m) == 2


def test_two_process_groups(tmp_path):
    """The older fixtures (all written, none real): a 4-rank job's rank 0 trace with process groups 0
    (4 all_reduce of 1024 floats, 4 ranks) and 1 (2 all_gather of 512, 2 ranks), its NCCL log with two
    communicators (world, and a 2-rank split) and its Inspector output."""
    old = ROOT / "tests" / "fixtures"
    ta.ingest([old / "nccl_fr" / "rank0.window0.pt.trace.json", old / "nccl_logs" / "nccl_debug_rank0.txt",
               old / "nccl_plugins" / "gpu-a-pid4242.log"], tmp_path / "s", run="x")
    con = ta.open(tmp_path / "s")
    m = mapping(con)
    assert [(m[k]["pg_name"], m[k]["status"], m[k]["pos_offset"], m[k]["n_matched"]) for k in
            [(0, "nccl_log", "0x55d0c3a0e0c0"), (0, "nccl_log", "0x55d0c3b1f2a0"), (0, "nccl_inspector", "0x9d2c5e0a11f3b7c4")]] == \
        [("0", "joined", 0, 4), ("1", "joined", 0, 2), ("1", "joined", 0, 2)]
    # the Inspector has 3 of the world communicator's 4 all_reduces: they fit at 0 and 1, and its
    # times (40-42 us) are nothing like the kernels' (380 us)
    insp = m[(0, "nccl_inspector", "0x48211cb83d2f7ee3")]
    assert insp["status"] == "ambiguous" and "(offsets 0, 1)" in insp["reason"] and insp["dur_error"] > 2
    rows = con.execute("SELECT pg_name, seq, nccl_log_op_count, nccl_log_count, inspector_sn FROM comms_nccl "
                       "ORDER BY pg_name, seq").fetchall()
    # opCount 2 of the world communicator is a Send (p2p, not joined): seq 3 is opCount 3; the log's
    # last AllReduce (bfloat16, 2048, opCount 5) is in no trace window
    assert rows == [("0", 1, 0, 1024, None), ("0", 2, 1, 1024, None), ("0", 3, 3, 1024, None), ("0", 4, 4, 1024, None),
                    ("1", 1, 0, 512, 1), ("1", 2, 1, 512, 2)]


def test_thresholds_are_parameters(tmp_path):
    need_external()
    store = tmp_path / "s"
    ta.ingest([TRACE, PLUGINS[0]], store, run="ddp")
    strict = comm_map(store, dur_tiebreak_ratio=1e9)  # durations may no longer decide
    assert strict[["source", "status", "n_tied"]].values.tolist() == [["nccl_inspector", "ambiguous", 4]]
    assert "durations do not tell them apart" in strict["reason"][0]
    assert comm_map(store)["status"].tolist() == ["joined"]


def test_no_nccl_side_gives_empty_view_and_table(tmp_path):
    store = tmp_path / "s"
    ta.ingest([ROOT / "traces" / "ddp_gloo_2rank"], store, run="g")
    con = ta.open(store)
    assert con.execute("SELECT count(*) FROM nccl_comm_map").fetchone()[0] == 0
    n = con.execute("SELECT count(*) FROM comms").fetchone()[0]
    assert con.execute("SELECT count(*), bool_or(nccl_log_matched) FROM comms_nccl").fetchone() == (n, False)
    cols = [r[0] for r in con.execute("DESCRIBE comms_nccl").fetchall()]
    comms = [r[0] for r in con.execute("DESCRIBE comms").fetchall()]
    assert cols == comms + [c.name for c in S.COMMS_NCCL.columns]
    assert [r[0] for r in con.execute("DESCRIBE nccl_comm_map").fetchall()] == [c.name for c in S.NCCL_COMM_MAP.columns]
    assert "## nccl_comm_map" in S.describe() and "## comms_nccl" in S.describe()
