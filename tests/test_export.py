"""Chrome/Perfetto export: every stored event, exact times, strict nesting per track (what
Perfetto's JSON importer needs), and the findings as overlay tracks."""
from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from decimal import Decimal

import pytest

import traceanalyzer as ta
from traceanalyzer.export import OVERLAY_PID, PID_STRIDE, export_trace, validate_nesting, write_trace

from conftest import TRACES, load_raw
from test_report import shipped_store

PP = "pp_1f1b_4rank_slow2"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return shipped_store(tmp_path_factory)


@pytest.fixture(scope="module")
def pp_doc(store):
    return export_trace(store, run=PP)  # every rank, with the overlays


def _names(doc, kind):
    """(pid, tid) -> name of the process_name / thread_name metadata."""
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == kind}


def test_raw_pipeline_trace_breaks_the_nesting_rule():
    """The profiler's own trace: gloo:send starts inside c10d::send (which issued it) and runs on
    after it returns; Perfetto's JSON importer would drop it."""
    bad = validate_nesting(load_raw(TRACES / PP / "rank1.window0.pt.trace.json.gz"))
    assert any("'gloo:send'" in b and "'c10d::send'" in b for b in bad)


def test_export_nests_on_every_track_and_keeps_every_event(store, pp_doc, tmp_path):
    assert validate_nesting(pp_doc) == []
    con = ta.open(store)
    stored = dict(con.execute("SELECT rank, count(*) FROM events WHERE run = $run GROUP BY rank", {"run": PP}).fetchall())
    got = Counter(e["pid"] // PID_STRIDE for e in pp_doc["traceEvents"]
                  if e["ph"] in ("X", "i") and e["pid"] % PID_STRIDE != OVERLAY_PID)
    assert dict(got) == stored
    # the gloo:send spans left their caller's track for a track of their own on the same thread
    threads = _names(pp_doc, "thread_name")
    sends = [e for e in pp_doc["traceEvents"] if e.get("name") == "gloo:send"]
    callers = {(e["pid"], e["tid"]) for e in pp_doc["traceEvents"] if e.get("name") == "c10d::send"}
    moved = [e for e in sends if (e["pid"], e["tid"]) not in callers]
    assert moved and all("overlapping spans" in threads[(e["pid"], e["tid"])] for e in moved)
    # the file says the same: parsed as floats (as Perfetto does) or exactly
    path = write_trace(pp_doc, tmp_path / "pp.json.gz")
    text = gzip.open(path, "rt").read()
    assert validate_nesting(json.loads(text)) == [] and validate_nesting(json.loads(text, parse_float=Decimal)) == []
    assert re.search(r'"ts":\d+\.\d{3},', text) and not re.search(r'"ts":\d+\.\d{4}', text)


def test_overlays_show_the_slow_stage(pp_doc):
    """Stage 2 sleeps 10 ms per micro-batch forward: on its findings track that is 'other' idle time
    (its own delay), while the other stages show stalls waiting on a peer."""
    procs = _names(pp_doc, "process_name")
    threads = _names(pp_doc, "thread_name")
    assert procs[(2 * PID_STRIDE + OVERLAY_PID, 0)] == "rank 2: findings"
    per = Counter()
    for e in pp_doc["traceEvents"]:
        if e["ph"] == "X" and e["pid"] % PID_STRIDE == OVERLAY_PID:
            per[(e["pid"] // PID_STRIDE, threads[(e["pid"], e["tid"])].split(" (")[0], e["name"].split(" (")[0])] += float(e["dur"])
    other = {r: per[(r, "pipeline bubbles", "bubble: other")] for r in range(4)}
    assert max(other, key=other.get) == 2 and other[2] > 3 * 8 * 10_000 * 0.8  # 3 steps x 8 x 10 ms, in us
    assert all(per[(r, "pipeline bubbles", "bubble: stall")] > 0 for r in (0, 1, 3))
    assert {k[1] for k in per} >= {"pipeline bubbles", "exposed communication", "critical path"}


def test_cli_export_straggler_waits_and_exact_round_trip(store, run_cli, tmp_path):
    """ddp_gloo_4rank_slow2: the other ranks' 'waiting for a late peer' track names rank 2. One rank
    without overlays, ingested again, gives back exactly the stored events (ts_ns, dur_ns)."""
    run = "ddp_gloo_4rank_slow2"
    code, out, err = run_cli("export", store, "--run", run, "--all-ranks", "-o", tmp_path / "all.json")
    assert code == 0, err
    doc = json.loads((tmp_path / "all.json").read_text())
    assert validate_nesting(doc) == []
    waits = Counter(e["name"] for e in doc["traceEvents"] if e.get("name", "").startswith("waiting for rank"))
    assert waits.most_common(1)[0][0] == "waiting for rank 2"

    code, _, err = run_cli("export", store, "--run", run, "--rank", "1", "--no-overlays", "-o", tmp_path / "in" / "rank1.json")
    assert code == 0, err
    ta.ingest([tmp_path / "in" / "rank1.json"], tmp_path / "again", run="again", progress=False)
    q = "SELECT name, ph, ts_ns, dur_ns FROM events WHERE {} ORDER BY ALL"
    want = ta.open(store).execute(q.format("run = 'ddp_gloo_4rank_slow2' AND rank = 1")).fetchall()
    got = ta.open(tmp_path / "again").execute(q.format("true")).fetchall()
    assert got == want


def test_cli_export_needs_a_rank(store, run_cli, tmp_path):
    code, _, err = run_cli("export", store, "--run", PP, "-o", tmp_path / "x.json")
    assert code == 2 and "--rank" in err
    code, _, err = run_cli("export", store, "--rank", "0", "-o", tmp_path / "x.json")
    assert code == 2 and "--run" in err
