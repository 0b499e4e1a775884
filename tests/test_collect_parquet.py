"""Collectors record into Parquet: each rank converts its own windows into the store's parts
(``RUN/parquet/rank=R/window=W/``) and ``ingest`` only validates and commits them; and the light
collector (``profile(op_timeline=True)``) records every rank's op timeline from the loop itself."""
from __future__ import annotations

import gzip
import json
import logging
import os
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import ROOT

import traceanalyzer as ta


def _tables(store: Path) -> dict:
    """Every per-trace table of a store, by (run, rank, window, table)."""
    doc = json.loads((store / "_store.json").read_text())
    return {(t["run"], t["rank"], t["window_id"], name): pq.read_table(store / path)
            for t in doc["traces"] for name, path in t["files"].items()}


def _assert_same(a: Path, b: Path) -> None:
    ta_, tb = _tables(a), _tables(b)
    assert sorted(ta_) == sorted(tb)
    for key in ta_:
        assert ta_[key].num_rows == tb[key].num_rows, key
        assert ta_[key].equals(tb[key]), key   # table by table, row for row, column for column


def _used_parts(store: Path, run_dir: Path) -> bool:
    """The store's events files are the collector's parts (hard links: the same inode)."""
    doc = json.loads((store / "_store.json").read_text())
    inodes = {os.stat(store / t["files"]["events"]).st_ino for t in doc["traces"]}
    return inodes == {os.stat(p).st_ino for p in run_dir.glob("parquet/rank=*/window=*/events.parquet")}


# --- converter processes on a shipped collector run (no torch needed) ---------------------------

def test_converter_keep_json_false_parts_alone_ingest_the_same(tmp_path):
    from traceanalyzer.collect.parquet import Converter
    src = ROOT / "traces" / "ddp_gloo_2rank"
    run = tmp_path / "r"
    shutil.copytree(src, run)
    for rank in (0, 1):      # as profile() does: windows converted while the FR dump is not written yet
        fr = run / f"rank{rank}.fr.json"
        hidden = fr.rename(tmp_path / fr.name)
        conv = Converter(rank, keep_json=False)
        conv.start(run / f"rank{rank}.window0.pt.trace.json.gz")
        conv.jobs[0][1].wait()
        hidden.rename(fr)   # ... then written at exit, and the parts' comms get it
        assert conv.finish(fr) == [run / "parquet" / f"rank={rank}" / "window=0"]
    assert not list(run.glob("*.pt.trace.json.gz"))   # keep_json=False: the parts are the trace now
    assert json.loads((run / "parquet/rank=1/window=0/summary.json").read_text())["fr"] == "rank1.fr.json"
    ta.ingest([run], tmp_path / "parts", run="r")
    assert _used_parts(tmp_path / "parts", run)
    ta.ingest([src], tmp_path / "json", run="r")
    a, b = _tables(tmp_path / "parts"), _tables(tmp_path / "json")
    for key in a:   # only where the trace was read from differs
        if key[3] == "ranks":
            a[key], b[key] = a[key].drop_columns(["trace_file"]), b[key].drop_columns(["trace_file"])
        assert a[key].equals(b[key]), key
    # damaged parts with no JSON to fall back on: one line naming the folder, store unchanged
    (run / "parquet/rank=0/window=0/comms.parquet").write_bytes(b"not parquet")
    with pytest.raises(ta.TraceInputError, match=r"rank=0.window=0: damaged pre-built Parquet parts and no JSON"):
        ta.ingest([run], tmp_path / "parts", run="r2")
    assert len(json.loads((tmp_path / "parts/_store.json").read_text())["traces"]) == 2


# --- real torchrun jobs ---------------------------------------------------------------------------

torch = pytest.importorskip("torch", reason="torch (the 'collect' extra) is needed to run workloads")
from launch_util import launch  # noqa: E402


@pytest.fixture
def ddp_run(ddp2_recorded, tmp_path):
    """A copy (the tests move and damage files) of the session's real 2-rank DDP run
    (conftest.ddp2_recorded: the collector's defaults, so JSON traces and each rank's Parquet parts),
    rather than a torchrun job of its own."""
    run = tmp_path / "cp"
    shutil.copytree(ddp2_recorded, run)
    return run


def test_collector_parts_equal_what_ingest_makes_from_the_json(ddp_run, tmp_path):
    parts = sorted(p.relative_to(ddp_run).as_posix() for p in ddp_run.glob("parquet/rank=*/window=*"))
    assert parts == ["parquet/rank=0/window=0", "parquet/rank=1/window=0"]
    assert not list(ddp_run.glob("parquet/*.convert.log"))   # no conversion failed
    manifest = json.loads((ddp_run / "rank1.manifest.json").read_text())
    assert manifest["files"]["parquet"] == ["parquet/rank=1/window=0"]
    # the FR dump is written at exit, after the window: the parts' comms were rebuilt with it
    assert json.loads((ddp_run / "parquet/rank=0/window=0/summary.json").read_text())["fr"] == "rank0.fr.json"
    report = ta.ingest([ddp_run], tmp_path / "with_parts")
    assert "warning" not in report.summary() and _used_parts(tmp_path / "with_parts", ddp_run)
    assert report.n_events > 1000
    # the same folder with its parts moved away: ingest parses the JSON into a second store
    moved = tmp_path / "json_only"
    moved.mkdir()
    shutil.move(str(ddp_run / "parquet"), str(moved / "parquet"))
    try:
        ta.ingest([ddp_run], tmp_path / "from_json")
    finally:
        shutil.move(str(moved / "parquet"), str(ddp_run / "parquet"))
    assert not _used_parts(tmp_path / "from_json", ddp_run)
    _assert_same(tmp_path / "with_parts", tmp_path / "from_json")
    s = ta.open(tmp_path / "with_parts")
    assert s.execute("SELECT count(*) FROM comms WHERE pg_source = 'flight_recorder'").fetchone()[0] > 0


def test_stale_or_damaged_parts_fall_back_to_the_json_with_one_warning(ddp_run, tmp_path, caplog):
    run = tmp_path / "cp2"
    shutil.copytree(ddp_run, run)   # a copy: the parts are still valid (their signature is the JSON's content)
    ta.ingest([run], tmp_path / "ref")
    assert _used_parts(tmp_path / "ref", run)
    trace = run / "rank1.window0.pt.trace.json.gz"
    doc = json.loads(gzip.decompress(trace.read_bytes()))
    ops = [i for i, e in enumerate(doc["traceEvents"]) if e.get("cat") == "cpu_op"]
    doc["traceEvents"] = [e for i, e in enumerate(doc["traceEvents"]) if i not in set(ops[-10:])]   # edited after
    trace.write_bytes(gzip.compress(json.dumps(doc).encode()))
    damaged = run / "parquet/rank=0/window=0/events.parquet"
    damaged.unlink()   # a new file: the store's events file is a hard link to the old one
    damaged.write_bytes(b"PAR1 truncated")
    report = ta.ingest([run], tmp_path / "fallback")
    lines = [line for line in report.summary().splitlines() if "pre-built Parquet parts not used" in line]
    assert len(lines) == 2
    assert "rank1.window0.pt.trace.json.gz" in lines[1] and "the JSON changed after" in lines[1]
    assert "rank0.window0.pt.trace.json.gz" in lines[0] and "events.parquet" in lines[0]
    events = {t.rank: t.counts["events"] for t in report.traces}
    assert events[1] == ta.ingest([ddp_run], tmp_path / "orig").traces[1].counts["events"] - 10   # the edited JSON
    shutil.move(str(run / "parquet"), str(tmp_path / "aside"))
    ta.ingest([run], tmp_path / "parsed")
    _assert_same(tmp_path / "fallback", tmp_path / "parsed")   # the fallback is exactly a parse of the JSON


def test_profile_op_timeline_on_a_pipeline_ingests_and_analyses(tmp_path):
    steps, mbs = 3, 2
    result = launch(2, ["pipeline", "--run-name", "tl", "--schedule", "gpipe", "--op-timeline", "--microbatches",
                        str(mbs), "--steps", str(steps), "--slow-rank", "1", "--slow-ms", "20"], tmp_path)
    folder = result.out_dir / "tl"
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["manifest.json", "rank0.cpu_sched.json", "rank0.manifest.json", "rank0.op_timeline.parquet",
                     "rank1.cpu_sched.json", "rank1.manifest.json", "rank1.op_timeline.parquet"]
    # no profiler trace, no FR dump: the light mode (the CPU samples are taken in both modes)
    for rank in (0, 1):   # every rank wrote its own rows
        t = pq.read_table(folder / f"rank{rank}.op_timeline.parquet")
        assert set(t.column("rank").to_pylist()) == {rank} and set(t.column("pp").to_pylist()) == {rank}
        assert json.loads(t.schema.metadata[b"ground_truth"])["slow_rank"] == 1
    report = ta.ingest([folder], tmp_path / "store")
    assert sorted(t.rank for t in report.traces) == [0, 1]
    s = ta.open(tmp_path / "store")
    assert s.execute("SELECT count(DISTINCT step) FROM steps").fetchone()[0] == steps
    assert s.execute("SELECT count(*) FROM comms WHERE op = 'send'").fetchone()[0] == 2 * steps * mbs
    # one CPU sample per rank at entry and at each step boundary (collect/cpu_sched.py)
    assert s.execute("SELECT rank, count(*) FROM cpu_sched GROUP BY rank ORDER BY rank").fetchall() == \
        [(0, steps + 1), (1, steps + 1)]
    fwd = s.execute("SELECT rank, median(dur_ns) AS d FROM events WHERE name = 'forward-compute' GROUP BY rank "
                "ORDER BY rank").fetchall()
    assert fwd[1][1] >= 20_000_000 > fwd[0][1]   # the 20 ms sleep is in rank 1's forward
    compute = s.analysis("imbalance").set_index("rank")["compute_ns_per_step"]
    assert compute[1] > 10 * compute[0]   # rank 1's compute holds its 2 x 20 ms of sleep a step
    assert sorted(s.analysis("pipeline_slow_stages")["stage"]) == [0, 1]   # the stages are known from the coords


def test_ddp_op_timeline_flag_records_the_loop_phases(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    result = launch(2, ["ddp", "--run-name", "dl", "--op-timeline", "--no-overlap", "--steps", "3"], tmp_path)
    folder = result.out_dir / "dl"
    assert not list(folder.glob("*.pt.trace.json*"))
    ops = pq.read_table(folder / "rank0.op_timeline.parquet").to_pandas().groupby("op").size().to_dict()
    assert ops == {"data-load": 3, "forward-compute": 3, "backward-compute": 3, "grads-all-reduce": 3, "optimizer": 3}
    ta.ingest([folder], tmp_path / "store")
    s = ta.open(tmp_path / "store")
    groups = s.execute("SELECT pg_name, list(DISTINCT rank ORDER BY rank), count(*) FROM comms "
                       "GROUP BY pg_name").fetchall()
    assert [(g[1], g[2]) for g in groups] == [([0, 1], 6)]   # one all_reduce a step on each rank, one DP group
