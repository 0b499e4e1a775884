"""Chrome/Perfetto export: every stored event, exact times, strict nesting per track (what
Perfetto's JSON importer needs), and the findings as overlay tracks."""
from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from decimal import Decimal

import pytest
from conftest import TRACES, load_raw

import traceanalyzer as ta
from traceanalyzer.export.trace import (
    OVERLAY_PID,
    PID_STRIDE,
    export_trace,
    validate_nesting,
    write_trace,
)

PP = "pp_1f1b_4rank_slow2"


@pytest.fixture(scope="module")
def store(shipped_store):
    return shipped_store


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


# -- flow arrows ---------------------------------------------------------------------------------

def _flows(doc):
    """(cat, id) -> {'s': event, 'f': event}"""
    out = {}
    for e in doc["traceEvents"]:
        if e["ph"] in ("s", "f"):
            out.setdefault((e["cat"], e["id"]), {})[e["ph"]] = e
    return out


def _slice_at(doc, end):
    """The innermost complete slice of the flow end's track that contains its time."""
    ts = Decimal(str(end["ts"]))
    inside = [e for e in doc["traceEvents"] if e["ph"] == "X" and (e["pid"], e["tid"]) == (end["pid"], end["tid"])
              and Decimal(str(e["ts"])) <= ts < Decimal(str(e["ts"])) + max(Decimal(str(e["dur"])), Decimal("0.001"))]
    return min(inside, key=lambda e: Decimal(str(e["dur"])))


def test_pipeline_export_has_send_recv_and_recorded_flows(store, pp_doc):
    """Every send of the 4-stage 1F1B run -> its receive on the neighbouring stage: 3 steps x 8
    micro-batches x 3 stage links x 2 (activations forward, gradients backward) = 144 arrows, each
    from a gloo:send slice of rank r to a gloo:recv slice of rank r +- 1. The recorded forward ->
    backward flows (Kineto 'fwdbwd') are all there too, bound to slices of their thread."""
    from traceanalyzer.export.flows import validate_flows
    assert validate_flows(pp_doc) == [] and validate_nesting(pp_doc) == []
    fl = _flows(pp_doc)
    p2p = [f for (cat, _), f in fl.items() if cat == "p2p"]
    assert len(p2p) == 144
    for f in p2p:
        src, dst = _slice_at(pp_doc, f["s"]), _slice_at(pp_doc, f["f"])
        assert (src["name"], dst["name"]) == ("gloo:send", "gloo:recv")
        assert f["s"]["bp"] == f["f"]["bp"] == "e"
        assert abs(f["s"]["pid"] // PID_STRIDE - f["f"]["pid"] // PID_STRIDE) == 1
    n_stored = ta.open(store).execute("SELECT count(*) FROM flows WHERE run = $run AND ph = 's'", {"run": PP}).fetchone()[0]
    assert sum(cat == "fwdbwd" for cat, _ in fl) == n_stored == 384


def test_straggler_export_has_last_arriver_to_waiter_arrows(store):
    """ddp_gloo_4rank_slow2: one arrow per (collective, waiting peer), from the last arriver's
    gloo:all_reduce slice to the end of the peer's 'waiting for rank K' slice, K = the source's rank.
    Rank 2 (the straggler) is the source of most of them."""
    from traceanalyzer.export.flows import validate_flows
    doc = export_trace(store, run="ddp_gloo_4rank_slow2")
    assert validate_flows(doc) == [] and validate_nesting(doc) == []
    waits = [f for (cat, _), f in _flows(doc).items() if cat == "collective wait"]
    con = ta.open(store)
    from traceanalyzer.analyses import prepare
    prepare(con)
    n = con.execute("""SELECT count(*) FROM collective_ranks r JOIN collective_instances i USING (run, pg, seq)
                       WHERE r.run = 'ddp_gloo_4rank_slow2' AND r.wait_ns > 0 AND i.last_arriver <> r.rank""").fetchone()[0]
    assert len(waits) == n > 0
    sources = Counter()
    for f in waits:
        src, dst = _slice_at(doc, f["s"]), _slice_at(doc, f["f"])
        k = f["s"]["pid"] // PID_STRIDE
        sources[k] += 1
        assert src["name"].startswith("gloo:") and dst["name"] == f"waiting for rank {k}"
        assert f["f"]["pid"] % PID_STRIDE == OVERLAY_PID and f["f"]["pid"] // PID_STRIDE != k
    assert sources.most_common(1)[0][0] == 2
    plain = export_trace(store, run="ddp_gloo_4rank_slow2", overlays=False, flows=False)
    assert not [e for e in plain["traceEvents"] if e["ph"] in ("s", "f")]


def test_gpu_export_has_launch_to_kernel_flows(tmp_path):
    """A real GPU trace (PARAM DLRM, rank 0, V100, NCCL): the recorded 'ac2g' flows become arrows
    from the CUDA launch (cudaLaunchKernel, ...) to the kernel it launched, on the GPU stream;
    the launch and the kernel carry the same correlation id."""
    from conftest import EXTERNAL, need_external

    from traceanalyzer.export.flows import validate_flows
    need_external()
    src = sorted((EXTERNAL / "param_dlrm_8rank").glob("worker0_*.json.gz"))[0]
    ta.ingest([src], tmp_path / "store", run="dlrm", progress=False, workers=1)
    doc = export_trace(tmp_path / "store", run="dlrm", rank=0)
    assert validate_flows(doc) == [] and validate_nesting(doc) == []
    ac2g = [f for (cat, _), f in _flows(doc).items() if cat == "ac2g"]
    n_stored = ta.open(tmp_path / "store").execute("SELECT count(*) FROM flows WHERE cat = 'ac2g' AND ph = 's'").fetchone()[0]
    assert len(ac2g) == n_stored > 100
    for f in ac2g:
        launch, kernel = _slice_at(doc, f["s"]), _slice_at(doc, f["f"])
        assert launch["cat"] == "cuda_runtime" and kernel["cat"] in ("kernel", "gpu_memcpy", "gpu_memset")
        assert launch["args"]["correlation"] == kernel["args"]["correlation"]


def test_export_with_the_predicted_timeline_beside(tmp_path, run_cli):
    """--replay-plan adds, per exported rank, a process with the replay's predicted timeline (here:
    rank 2 of the slow DDP run idealised), on the same clock as the measured events; it nests, and
    the predicted rank-2 work is shorter than the measured one."""
    import traceanalyzer as ta
    from traceanalyzer.export.trace import REPLAY_PID_BASE, validate_nesting
    store = tmp_path / "s"
    ta.ingest([str(TRACES / "ddp_gloo_4rank_slow2")], str(store), run="slow2", progress=False)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"name": "fix2", "actions": [{"action": "idealize", "ranks": [2]}]}))
    out = tmp_path / "r2.json"
    code, stdout, err = run_cli("export", store, "--rank", "2", "-o", out, "--replay-plan", plan)
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert validate_nesting(doc) == []
    pred = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e["pid"] == REPLAY_PID_BASE + 2]
    meas = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e["pid"] < REPLAY_PID_BASE]
    assert len(pred) > 100
    span = lambda evs: max(float(e["ts"]) + float(e["dur"]) for e in evs) - min(float(e["ts"]) for e in evs)
    assert abs(min(float(e["ts"]) for e in pred) - min(float(e["ts"]) for e in meas)) < 50_000   # same clock (us)
    assert span(pred) < span(meas) - 10 * 1000 * 3   # >= 10 ms per step less over the 8 steps (measured ~15)
    r = doc["otherData"]["replay"]
    assert r["job_step_ns"]["predicted"] < r["job_step_ns"]["identity"] and r["identity_error"]["median"] == 0
    bad = tmp_path / "pp.json"
    bad.write_text(json.dumps({"actions": [{"action": "pipeline", "microbatches": 8}]}))
    code, _, err = run_cli("export", store, "--rank", "2", "-o", tmp_path / "x.json", "--replay-plan", bad)
    assert code == 2 and "regenerates the step" in err
