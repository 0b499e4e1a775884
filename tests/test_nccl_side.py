"""The NCCL side of the collectors: Flight Recorder dumps (JSON and pickle), NCCL debug logs, the
NCCL Inspector and example profiler plugins; each into its table, joined to the profiler's comms.

Real torch 2.13 output: the gloo FR dumps in traces/ and the dumps made here in a subprocess.
From documentation only (no GPU here): the fixtures in tests/fixtures/ (see their README)."""
from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT, TRACES, snapshot

import traceanalyzer as ta
from traceanalyzer.errors import TraceInputError
from traceanalyzer.ingest.flight_recorder import fr_tables, read_fr_dump
from traceanalyzer.ingest.nccl.logs import read_nccl_log
from traceanalyzer.ingest.nccl.plugins import read_inspector, read_profiler_dump

FIX = ROOT / "tests" / "fixtures"
REAL_FR = sorted(p for p in TRACES.glob("*/rank*.fr.json")
                 if json.loads((p.parent / "manifest.json").read_text())["backend"] == "gloo")



@pytest.fixture
def store(tmp_path):
    s = tmp_path / "store"
    ta.ingest([TRACES / "ddp_gloo_2rank"], s, run="good")
    return s


def expect_error(run_cli, store: Path, args, *needles) -> str:
    before = snapshot(store)
    code, out, err = run_cli("ingest", *args, "--store", store, "--quiet")
    lines = [l for l in err.splitlines() if l.strip()]
    assert code != 0 and len(lines) == 1, err
    for needle in needles:
        assert str(needle) in lines[0], lines[0]
    assert snapshot(store) == before
    return lines[0]


def as_pickle(doc: dict) -> bytes:
    """What torch's _dump_fr_trace() pickles: the same dict, process groups as tuples."""
    doc = json.loads(json.dumps(doc))
    for e in doc.get("entries", []):
        e["process_group"] = tuple(e["process_group"])
    return pickle.dumps(doc, protocol=2)


# -- Flight Recorder ---------------------------------------------------------------------------

@pytest.mark.parametrize("path", REAL_FR, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_real_gloo_dumps_parse(path):
    raw = json.loads(path.read_text())
    dump = read_fr_dump(path)
    assert len(dump.entries) == len(raw.get("entries", [])) and dump.n_skipped == 0
    assert dump.backend == "gloo" and dump.pg_config_usable is False  # gloo: pg_config {"": ...}
    # torch fills the ranks of that single entry for a job with one group; with subgroups (the
    # PP x DP run creates one per pipeline and per stage) it writes "[]"
    subgroups = "dp_groups" in json.loads((path.parent / "manifest.json").read_text()).get("layout", {})
    assert dump.pg_config[0]["pg_name"] == "" and (bool(dump.pg_config[0]["ranks"]) != subgroups)
    for e in dump.entries:  # gloo records no start/end times
        assert e["time_discovered_started_ns"] is None and e["time_discovered_completed_ns"] is None
        assert e["state"] == "scheduled" and not e["is_p2p"] and e["time_created_ns"] > 1.7e18
    seqs = sorted(e["collective_seq_id"] for e in dump.entries if e["pg_name"] == "0")
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # one per collective, counted per group
    tables = fr_tables(dump)
    assert tables["fr_entries"].num_rows == len(dump.entries)
    if "dumped_by" in raw:  # the collector's JSON from the pickle dump: with the Python call stacks,
        # innermost first (in torch: c10d, or autograd for DDP's reducer hooks); on a GPU, DDP's bucket
        # all-reduces are issued from autograd's device thread (pt_autograd_N) by C++ hooks: no Python
        # stack there (a Python autograd Function's backward, as MoE's all_to_all, has one)
        for e, r in zip(dump.entries, raw["entries"]):
            if not str(r.get("thread_name", "")).startswith("pt_autograd"):
                assert e["frames"]
            assert not e["frames"] or "/torch/" in e["frames"][0]["filename"]
        assert any(e["frames"] for e in dump.entries)


def test_ingest_fills_fr_tables_and_comms_fr_join(tmp_path):
    report = ta.ingest([TRACES / "ddp_gloo_2rank"], tmp_path / "s")
    assert [(s.kind, s.rank) for s in report.sidecars] == [("flight_recorder", 0), ("flight_recorder", 1)]
    con = ta.open(tmp_path / "s")
    n = [len(json.loads((TRACES / "ddp_gloo_2rank" / f"rank{r}.fr.json").read_text())["entries"]) for r in (0, 1)]
    assert con.execute("SELECT rank, n_entries, backend, pg_config_usable FROM fr_dumps ORDER BY rank").fetchall() == \
        [(0, n[0], "gloo", False), (1, n[1], "gloo", False)]
    assert con.execute("SELECT count(*) FROM fr_entries").fetchall() == [(sum(n),)]
    joined = con.sql("SELECT * FROM comms_fr").df()
    assert len(joined) == con.execute("SELECT count(*) FROM comms WHERE NOT is_p2p").fetchone()[0] > 0
    assert joined["fr_matched"].all() and set(joined["fr_profiling_name"]) == {"gloo:all_reduce"}
    # the FR entry of each collective was created while its c10d::allreduce_ enqueue op ran
    inside = (joined["fr_time_created_ns"] >= joined["enqueue_ts_ns"]) & \
        (joined["fr_time_created_ns"] <= joined["enqueue_ts_ns"] + joined["enqueue_dur_ns"])
    assert inside.all()
    sizes = {json.loads(s)[0][0] * 4 for s in joined["fr_input_sizes"]}
    assert sizes == set(joined["in_bytes"])


def test_nccl_fixture_dumps_and_nccl_seq_join(tmp_path):
    """NCCL dumps (documented format): p2p entries, times, durations, nccl_comm_state; the
    profiler's Seq joins the FR's collective_seq_id."""
    dumps = {r: read_fr_dump(FIX / "nccl_fr" / f"rank{r}.fr.json") for r in range(4)}
    assert all(d.backend == "nccl" and d.pg_config_usable and d.comm_lib_version == "2.26.2" for d in dumps.values())
    assert {c["pg_name"]: c["ranks"] for c in dumps[0].pg_config} == {"0": [0, 1, 2, 3], "1": [0, 1]}
    p2p = [e for e in dumps[0].entries if e["is_p2p"]]
    assert [(e["profiling_name"], e["p2p_seq_id"], e["collective_seq_id"]) for e in p2p] == [("nccl:send 0->1", 1, 2)]
    last = dumps[0].entries[-1]
    assert last["state"] == "started" and last["time_discovered_completed_ns"] is None and last["duration_ns"] is None
    first = dumps[3].entries[0]  # rank 3 is torch's own JSON: 0 for a missing time, text pg_status, no frames
    assert first["duration_ns"] == 381_000 and first["frames"] is None
    assert dumps[3].pg_status["0"]["last_completed_collective"] == 4

    report = ta.ingest([FIX / "nccl_fr"], tmp_path / "s", run="nccl")
    assert len(report.traces) == 1 and len(report.sidecars) == 4
    con = ta.open(tmp_path / "s")
    rows = con.execute("""SELECT pg_name, seq, seq_source, fr_matched, fr_profiling_name, fr_state, fr_duration_ns
                          FROM comms_fr ORDER BY pg_name, seq""").fetchall()
    assert rows == [("0", s, "nccl_seq", True, "nccl:all_reduce", "completed", 381_000) for s in (1, 2, 3, 4)] + \
        [("1", s, "nccl_seq", True, "nccl:_all_gather_base", "completed", 381_000) for s in (1, 2)]
    state = json.loads(con.execute("SELECT nccl_comm_state_json FROM fr_dumps WHERE rank = 2").fetchone()[0])
    assert next(iter(state.values()))["rank"] == "2"


def test_pickle_and_json_give_the_same_rows(tmp_path):
    for r in range(4):
        doc = json.loads((FIX / "nccl_fr" / f"rank{r}.fr.json").read_text())
        pkl = tmp_path / f"rank{r}.fr.pkl"
        pkl.write_bytes(as_pickle(doc))
        a, b = read_fr_dump(FIX / "nccl_fr" / f"rank{r}.fr.json"), read_fr_dump(pkl)
        assert b.source_format == "pickle" and a.source_format == "json"
        assert fr_tables(a)["fr_entries"].equals(fr_tables(b)["fr_entries"])


def test_real_torch_pickle_dump_and_the_collector(tmp_path):
    """torch 2.13's own dumps: the pickle has stack frames and only plain data (read without
    pickle.load); torch's JSON lacks frames; the collector writes the pickle as JSON, with them."""
    pytest.importorskip("torch")
    script = textwrap.dedent(f"""
        import os, torch, torch.distributed as dist
        os.environ["TORCH_FR_BUFFER_SIZE"] = "100"
        dist.init_process_group("gloo", init_method="file://{tmp_path}/rdv", rank=0, world_size=1)
        def train_step():
            dist.all_reduce(torch.ones(8))
        train_step()
        dist.barrier()
        c10d = torch._C._distributed_c10d
        import json, time   # an entry is retired when its work is released, on another thread: wait, so both dumps agree
        t0 = time.time()
        while time.time() - t0 < 20 and not all(e.get("retired") for e in json.loads(c10d._dump_fr_trace_json())["entries"]):
            time.sleep(0.01)
        open("{tmp_path}/rank0.fr.pkl", "wb").write(c10d._dump_fr_trace())
        open("{tmp_path}/torch.json", "wb").write(c10d._dump_fr_trace_json())
        from traceanalyzer.collect.fr_dump import dump_flight_recorder
        dump_flight_recorder("{tmp_path}/rank0.fr.json")
        dist.destroy_process_group()
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=120, capture_output=True)
    pkl = read_fr_dump(tmp_path / "rank0.fr.pkl")
    ours = read_fr_dump(tmp_path / "rank0.fr.json")
    torch_json = json.loads((tmp_path / "torch.json").read_text())
    assert "frames" not in torch_json["entries"][0]
    assert [e["profiling_name"] for e in pkl.entries] == ["gloo:all_reduce", "gloo:barrier"]
    assert [e["frames"][2]["name"] for e in pkl.entries][:1] == ["train_step"]
    assert fr_tables(pkl)["fr_entries"].equals(fr_tables(ours)["fr_entries"])
    assert json.loads((tmp_path / "rank0.fr.json").read_text())["dumped_by"].startswith("traceanalyzer.collect")


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_hostile_pickle_is_refused_and_not_executed(run_cli, store, tmp_path):
    marker = tmp_path / "PWNED"
    bad = tmp_path / "dumps" / "rank0.fr.pkl"
    bad.parent.mkdir()
    bad.write_bytes(pickle.dumps({"version": "2.10", "entries": [_Evil(marker)]}))
    with pytest.raises(TraceInputError, match="unsafe pickle refused to load posix.system"):
        read_fr_dump(bad)
    line = expect_error(run_cli, store, [bad.parent, "--run", "evil"], bad, "unsafe pickle", "not executed")
    assert "posix.system" in line
    assert not marker.exists()
    # the same through STACK_GLOBAL (protocol 4) and a billion-laughs expansion
    bad.write_bytes(pickle.dumps(_Evil(marker), protocol=4))
    expect_error(run_cli, store, [bad, "--run", "evil"], "unsafe pickle")
    nested: list = [0]
    for _ in range(40):
        nested = [nested, nested]
    bad.write_bytes(pickle.dumps({"version": "2.10", "entries": nested}))
    expect_error(run_cli, store, [bad, "--run", "evil"], "refused as hostile")
    assert not marker.exists()


def test_truncated_and_malformed_dumps(run_cli, store, tmp_path):
    src = (FIX / "nccl_fr" / "rank0.fr.json").read_bytes()
    d = tmp_path / "d"
    d.mkdir()
    (d / "rank0.fr.json").write_bytes(src[: len(src) // 2])
    expect_error(run_cli, store, [d, "--run", "t"], d / "rank0.fr.json", "truncated Flight Recorder JSON dump")
    (d / "rank0.fr.json").unlink()
    (d / "rank0.fr.pkl").write_bytes(as_pickle(json.loads(src))[:-40])
    expect_error(run_cli, store, [d, "--run", "t"], d / "rank0.fr.pkl", "truncated pickle")
    (d / "rank0.fr.pkl").write_bytes(b"")
    expect_error(run_cli, store, [d, "--run", "t"], "empty Flight Recorder dump")
    (d / "rank0.fr.pkl").unlink()
    (d / "rank0.fr.json").write_text('{"traceEvents": []}')
    expect_error(run_cli, store, [d, "--run", "t"], "not a Flight Recorder dump")
    # malformed entries are skipped and counted, the rest is kept
    doc = json.loads(src)
    doc["entries"][1] = {"profiling_name": "nccl:all_reduce"}  # no process group, no seq id
    doc["entries"].append("garbage")
    (d / "rank0.fr.json").write_text(json.dumps(doc))
    report = ta.ingest([d], store, run="t")
    assert report.skipped == {"fr.malformed_entries": 2}
    con = ta.open(store)
    assert con.execute("SELECT n_entries, n_skipped FROM fr_dumps WHERE run = 't'").fetchone() == (len(doc["entries"]) - 2, 2)


def test_one_fr_dump_per_rank_and_reingest(run_cli, store, tmp_path):
    again = ta.ingest([TRACES / "ddp_gloo_2rank" / "rank0.fr.json"], store, run="good")
    assert again.sidecars == [] and again.sidecars_already_in_store == 1
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(TRACES / "ddp_gloo_4rank" / "rank0.fr.json", other / "rank0.fr.json")
    expect_error(run_cli, store, [other, "--run", "good"], "rank 0 of run 'good' already has a Flight Recorder dump")


def test_rank_manifest_disagreeing_with_the_trace(run_cli, store, tmp_path):
    """rank1.manifest.json lists the file as rank 1's, the trace's distributedInfo says rank 0."""
    d = tmp_path / "mixed"
    d.mkdir()
    shutil.copy(TRACES / "ddp_gloo_2rank" / "rank0.window0.pt.trace.json.gz", d / "rank1.window0.pt.trace.json.gz")
    manifest = json.loads((TRACES / "ddp_gloo_2rank" / "rank1.manifest.json").read_text())
    (d / "rank1.manifest.json").write_text(json.dumps(manifest))
    assert manifest["rank"] == 1 and manifest["files"]["traces"] == ["rank1.window0.pt.trace.json.gz"]
    expect_error(run_cli, store, [d, "--run", "mixed"], d / "rank1.window0.pt.trace.json.gz", "rank mismatch",
                 "rank1.manifest.json says this is rank 1's trace", "distributedInfo says rank 0")
    (d / "rank1.manifest.json").write_text("{not json")
    expect_error(run_cli, store, [d, "--run", "mixed"], "rank1.manifest.json", "unreadable rank manifest")
    (d / "rank1.manifest.json").unlink()
    assert ta.ingest([d], store, run="mixed").traces[0].rank == 0  # no manifest: the trace's own rank


# -- NCCL debug logs ---------------------------------------------------------------------------

def test_nccl_logs_parse_with_garbage_counted():
    log = read_nccl_log(FIX / "nccl_logs" / "nccl_debug_rank0.txt")
    assert (log.rank, log.rank_source) == (0, "file_name")
    assert log.skipped == {"nccl_log.garbage_lines": 3, "nccl_log.malformed_op_lines": 1}
    df = log.table.to_pandas()
    assert list(df["nccl_op"]) == ["AllReduce", "AllGather", "AllReduce", "AllGather", "Send", "AllReduce", "AllReduce",
                                   "AllReduce"]
    world = df[df["comm"] == "0x55d0c3a0e0c0"]
    assert list(world["comm_seq"]) == list(range(6)) and list(world["op_count"]) == list(range(6))
    assert set(world["comm_rank"]) == {0} and set(world["comm_id"]) == {"0x48211cb83d2f7ee3"}
    send = df[df["nccl_op"] == "Send"].iloc[0]
    assert (send["op"], send["is_p2p"], send["root"], send["recvbuff"], send["bytes"]) == ("send", True, 1, "(nil)", 1024)
    last = df.iloc[-1]  # "[%F %T] " timestamp prefix, bfloat16, avg
    assert (last["log_prefix"], last["dtype"], last["redop_name"], last["bytes"]) == ("[2026-11-29 20:01:02]", "bfloat16", "avg", 4096)
    one = read_nccl_log(FIX / "nccl_logs" / "nccl_debug_rank1.txt").table.to_pandas()
    assert list(one["op"]) == ["all_reduce"] * 4 + ["recv", "broadcast", "reduce_scatter"]
    assert one["comm_rank"].isna().all()  # COLL only: no Init COMPLETE lines
    assert one.iloc[-1]["redop_name"] == "premulsum" and one.iloc[-1]["dtype"] == "float16"
    rccl = read_nccl_log(FIX / "nccl_logs" / "rccl_job.nccl.log")
    assert (rccl.rank, rccl.rank_source, rccl.table.num_rows) == (2, "log_globalrank", 3)


def test_nccl_log_ingest_options_and_rank_sources(run_cli, store, tmp_path):
    code, out, err = run_cli("ingest", FIX / "nccl_logs", "--store", store, "--run", "logs", "--quiet")
    assert code == 0, err
    assert "3 NCCL log(s) (18 ops)" in out and "nccl_log.garbage_lines=3" in out
    con = ta.open(store)
    assert con.execute("SELECT rank, count(*) FROM nccl_log_ops WHERE run = 'logs' GROUP BY rank ORDER BY rank").fetchall() == \
        [(0, 8), (1, 7), (2, 3)]
    # any file name through --nccl-log; the rank then from the world communicator's Init COMPLETE line
    odd = tmp_path / "stderr-of-job.out"
    shutil.copy(FIX / "nccl_logs" / "nccl_debug_rank0.txt", odd)
    code, out, err = run_cli("ingest", "--nccl-log", odd, "--store", store, "--run", "odd", "--quiet")
    assert code == 0, err
    ranks = ta.open(store).execute("SELECT DISTINCT rank FROM nccl_log_ops WHERE run = 'odd'").fetchall()
    assert ranks == [(0,)]
    # no rank anywhere: a clear error, then --rank
    norank = tmp_path / "job.nccl.log"
    norank.write_text((FIX / "nccl_logs" / "nccl_debug_rank1.txt").read_text())
    expect_error(run_cli, store, [norank, "--run", "nr"], norank, "cannot tell the rank", "--rank")
    code, out, err = run_cli("ingest", norank, "--store", store, "--run", "nr", "--rank", "5", "--quiet")
    assert code == 0, err
    not_nccl = tmp_path / "notes.nccl.log"
    not_nccl.write_text("hello\nworld\n")
    expect_error(run_cli, store, [not_nccl, "--run", "nn"], not_nccl, "not an NCCL debug log")


# -- NCCL profiler plugins -----------------------------------------------------------------------

def test_inspector_v43_and_v42():
    a = read_inspector(FIX / "nccl_plugins" / "gpu-a-pid4242.log")
    assert (a.rank, a.rank_source, a.skipped) == (0, "inspector_header", {"inspector.bad_lines": 1})
    df = a.table.to_pandas()
    assert list(zip(df["kind"], df["op"], df["sn"])) == [("coll", "all_reduce", 1), ("coll", "all_reduce", 2),
                                                         ("p2p", "send", 1), ("coll", "all_reduce", 3),
                                                         ("coll", "all_gather", 1), ("coll", "all_gather", 2)]
    assert set(df["format_version"]) == {"v4.3"} and df.iloc[0]["exec_dur_ns"] == 42_000
    assert df.iloc[4]["comm_name"] == "tp" and df.iloc[4]["comm_nranks"] == 2
    b = read_inspector(FIX / "nccl_plugins" / "gpu-a-pid4243.log")
    assert (b.rank, b.table.num_rows, b.skipped) == (1, 4, {})


def test_profiler_plugin_dump():
    p = read_profiler_dump(FIX / "nccl_plugins" / "nccl_prof_rank0-gpu-a-4301.txt")
    assert p.rank == 0 and p.counts == {"nccl_profiler_events": 10, "repaired_lines": 1}
    assert p.skipped == {"profiler_plugin.bad_lines": 1}
    df = p.table.to_pandas()
    coll = df[df["cat"] == "COLL"]
    assert list(coll["seq_num"]) == [0, 1] and list(coll["dur_ns"]) == [42_500, 42_500]
    assert set(coll["comm_hash"]) == {"12715772615376301750"}  # above int64: kept as text
    api = df[(df["cat"] == "P2P_API")].iloc[0]  # the unquoted ncclFloat32 / 0x... line, repaired
    assert api["datatype"] == "ncclFloat32" and json.loads(api["args_json"])["Stream"] == "0x55d0c39f8e70"


def test_plugin_outputs_ingest(tmp_path):
    report = ta.ingest([FIX / "nccl_plugins"], tmp_path / "s", run="plugins")
    assert sorted((s.kind, s.rank) for s in report.sidecars) == [("nccl_inspector", 0), ("nccl_inspector", 1),
                                                                 ("nccl_profiler", 0)]
    con = ta.open(tmp_path / "s")
    assert con.execute("SELECT count(*) FROM nccl_inspector_ops").fetchone()[0] == 10
    assert con.execute("SELECT count(*) FROM nccl_profiler_events").fetchone()[0] == 10
    files = [p for p in (tmp_path / "s").rglob("*.parquet") if "nccl_inspector_ops" in p.parts]
    assert files and all(p.parent.name.startswith("rank=") for p in files)  # (run, rank) partitions only


def test_schema_declares_the_new_tables():
    from traceanalyzer import schema as S
    for name in ("fr_dumps", "fr_entries", "nccl_log_ops", "nccl_inspector_ops", "nccl_profiler_events"):
        assert S.TABLES[name].partition == ("run", "rank")
    text = S.describe()
    assert "## comms_fr" in text and "## fr_entries" in text
