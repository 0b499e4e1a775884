"""Host CPU contention (issue 14): the collector samples each rank's CPU run / run-queue wait per step
boundary (rank{R}.cpu_sched.json, a summary in its rank manifest), ingest makes them the cpu_sched table, host_cpu.sql the per-step and per-rank wait, the
report a caveat and a finding's evidence. A real 2-rank gloo DDP run; the shipped traces (recorded
without samples) give no rows; a malformed samples file is one clear line naming it."""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from conftest import TRACES, snapshot

from traceanalyzer.collect.cpu_sched import COLUMNS

RUN = "hostcpu"
#: Kineto's clock and time.time_ns() agree to well under this (steps last tens of ms)
CLOCK_SLACK_NS = 2_000_000


@pytest.fixture(scope="module")
def recorded(ddp2_recorded, tmp_path_factory):
    """The shared real 2-rank DDP run (conftest.ddp2_recorded) and a store of it."""
    import traceanalyzer as ta
    store = tmp_path_factory.mktemp("hostcpu") / "store"
    ta.ingest([ddp2_recorded], store, run=RUN, progress=False, workers=1)
    return ddp2_recorded, store


def _samples(folder: Path, rank: int) -> dict:
    return json.loads((folder / f"rank{rank}.cpu_sched.json").read_text())


@pytest.mark.launch
@pytest.mark.parametrize("rank", range(2))
def test_samples_are_cumulative_and_bound_each_profiler_step(recorded, rank):
    folder, _ = recorded
    cs = _samples(folder, rank)
    summary = json.loads((folder / f"rank{rank}.manifest.json").read_text())["cpu_sched"]
    assert summary["file"] == f"rank{rank}.cpu_sched.json" and summary["n_samples"] == len(cs["samples"])
    assert summary["unavailable"] is None and not summary["truncated"] and summary["cost_cpu_ns"] > 0
    assert cs["rank"] == rank and 1 <= cs["cores"] <= cs["cpu_count"]
    rows = [dict(zip(cs["columns"], s)) for s in cs["samples"]]
    steps = json.loads((folder / "manifest.json").read_text())["ground_truth"]["steps"]
    assert [r["step"] for r in rows] == list(range(steps + 1))      # entry + one per step() call
    for a, b in zip(rows, rows[1:]):
        assert b["ts_ns"] > a["ts_ns"]
        for k in ("proc_run_ns", "proc_wait_ns", "main_run_ns", "main_wait_ns", "n_threads"):
            assert b[k] >= a[k], k                               # cumulative: never decreases
        wall = b["ts_ns"] - a["ts_ns"]
        assert 0 <= b["main_wait_ns"] - a["main_wait_ns"] <= wall   # one thread waits at most the step
    # ProfilerStep#N runs from sample N to sample N+1 (the sample precedes prof.step()'s close of the step)
    trace = json.load(gzip.open(next(folder.glob(f"rank{rank}.window*.pt.trace.json.gz")), "rt"))
    base = int(trace.get("baseTimeNanoseconds", 0))
    spans = [(int(e["name"].split("#")[1]), base + round(float(e["ts"]) * 1000), round(float(e["dur"]) * 1000))
             for e in trace["traceEvents"] if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")]
    assert spans
    for n, start, dur in spans:
        assert rows[n]["ts_ns"] - CLOCK_SLACK_NS <= start < rows[n + 1]["ts_ns"] <= start + dur + CLOCK_SLACK_NS, n


@pytest.mark.launch
def test_ingest_and_analysis(recorded):
    import traceanalyzer as ta
    from traceanalyzer.analyses import connect, prepare
    folder, store = recorded
    con = ta.open(store)
    n = {r: len(_samples(folder, r)["samples"]) for r in range(2)}
    got = dict(con.execute("SELECT rank, count(*) FROM cpu_sched WHERE run = $r GROUP BY rank", {"r": RUN}).fetchall())
    assert got == n
    con = connect(store)
    prepare(con, views=["host_cpu_ranks"])
    steps = con.execute("SELECT rank, step, step_ns, wait_ns, wait_pct, in_trace FROM host_cpu_steps ORDER BY rank, step").df()
    assert steps.groupby("rank").size().to_dict() == {r: k - 1 for r, k in n.items()}
    assert (steps["wait_ns"] >= 0).all() and (steps["wait_ns"] <= steps["step_ns"]).all()
    assert steps["in_trace"].sum() == 2 * 3                    # the window's 3 active steps on each rank
    ranks = con.execute("SELECT * FROM host_cpu_ranks ORDER BY rank").df()
    assert list(ranks["rank"]) == [0, 1] and (ranks["steps"] == 3).all() and (ranks["ranks_on_host"] == 2).all()
    traced = steps[steps["in_trace"]].groupby("rank")["wait_ns"].median()
    assert ranks["wait_ns_per_step"].tolist() == pytest.approx(traced.tolist())
    assert ranks["peers_wait_ns_per_step"].tolist() == pytest.approx(traced.tolist()[::-1])   # the other rank's


@pytest.mark.launch
def test_traces_named_one_by_one_bring_their_rank_manifest(recorded, tmp_path):
    import traceanalyzer as ta
    folder, _ = recorded
    report = ta.ingest(sorted(folder.glob("rank*.window*.pt.trace.json.gz")), tmp_path / "s", run="x", workers=1)
    assert "2 CPU wait record(s)" in report.summary()   # rank{R}.cpu_sched.json beside each trace
    got = ta.open(tmp_path / "s").execute("SELECT rank, count(*) FROM cpu_sched GROUP BY rank ORDER BY rank").fetchall()
    assert got == [(r, len(_samples(folder, r)["samples"])) for r in range(2)]


@pytest.mark.launch
def test_report_caveat_and_evidence_follow_the_threshold(recorded):
    from traceanalyzer.analyses.results import analyze
    from traceanalyzer.report.build import build_report
    _, store = recorded
    for pct, expect in ((0.0, True), (100.0, False)):    # every rank waits >= 0 %, none 100 % of its step
        analyze(store, run=RUN, only=None if expect else ["host_cpu"], host_cpu_wait_min_pct=pct)
        rr = build_report(store, run=RUN, figures=False, replay=False).runs[0]
        lines = [c for c in rr.caveats if c.startswith("Ranks waited for a CPU core")]
        assert bool(lines) == expect, rr.caveats
        if expect:
            assert "2 ranks on" in lines[0] and "per-rank timings include that contention" in lines[0]
        for f in rr.findings:
            if f.rank is not None and f.kind in ("straggler", "imbalance", "slow_stage"):
                assert f.cpu_wait_ns_per_step is not None and f.cpu_wait_ns_per_step >= 0
                assert any(e.startswith("waited for a CPU core") and "vs its peers' median" in e for e in f.evidence)


def test_no_samples_no_rows_no_caveat(shipped_store):
    """A shipped trace recorded without samples: no rows (unknown), no caveat, no evidence."""
    import traceanalyzer as ta
    from traceanalyzer.report.build import build_report
    assert ta.open(shipped_store).execute("SELECT count(*) FROM cpu_sched WHERE run = 'ddp_gloo_4rank_slow2'").fetchone()[0] == 0
    rr = build_report(shipped_store, run="ddp_gloo_4rank_slow2", figures=False, replay=False).runs[0]
    assert rr.findings and not any("CPU core" in c for c in rr.caveats)
    assert all(f.cpu_wait_ns_per_step is None and not any("CPU core" in e for e in f.evidence) for f in rr.findings)


_OK = {"rank": 1, "host": "h", "pid": 7, "columns": list(COLUMNS), "cores": 1, "cpu_count": 2}


@pytest.mark.parametrize("entry, needle", [
    (dict(_OK, columns=["ts_ns"], samples=[[1]]), "'columns' must list"),
    (dict(_OK, columns=None, samples="oops"), "'columns' must list"),
    ("not an object", "expected an object"),
    ("{truncated", "not readable JSON"),
    (dict(_OK, rank=0, samples=[]), "it says rank 0, its name rank 1"),
    (dict(_OK, samples=[[1, 0, 2]]), "sample 0 is [1, 0, 2]"),
    # cumulative counters that decrease: not what the collector writes
    (dict(_OK, samples=[[10, 0, 5, 9, 5, 9, 3, 1], [20, 1, 6, 8, 6, 8, 3, 1]]), "goes back"),
])
def test_malformed_samples_are_one_line_naming_the_file(run_cli, tmp_path, entry, needle):
    folder = tmp_path / "run"
    shutil.copytree(TRACES / "ddp_gloo_2rank", folder)
    bad = folder / "rank1.cpu_sched.json"
    bad.write_text(entry if isinstance(entry, str) and entry.startswith("{") else json.dumps(entry))
    store = tmp_path / "store"
    before = snapshot(store)
    code, _, err = run_cli("ingest", folder, "--store", store, "--quiet")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code != 0 and len(lines) == 1, err
    assert "rank1.cpu_sched.json" in lines[0] and needle in lines[0], lines[0]
    assert snapshot(store) == before


def test_no_schedstat_means_no_samples_and_says_why(monkeypatch, tmp_path):
    from traceanalyzer.collect import cpu_sched
    monkeypatch.setattr(cpu_sched, "_TASKS", "/nonexistent/task")
    s = cpu_sched.Sampler()
    s.sample(0)
    s.sample(1)
    assert not s.write(tmp_path / "rank0.cpu_sched.json", 0) and not (tmp_path / "rank0.cpu_sched.json").exists()
    m = s.summary(None)
    assert m["n_samples"] == 0 and m["file"] is None and "schedstat" in m["unavailable"]


def test_slow_host_counts_the_wait_of_the_rank_s_other_threads():
    """The numbers of a clean 2-rank DDP recording beside two busy loops (session 20), taken as the
    waits its host caused: rank 0's training thread ran 1.85 ms more CPU and waited 1.0 ms more for
    a core per step than rank 1's -- 43 % of its 6.6 ms slower backward, under the 60 % that makes
    a slow host -- while its process's threads (gloo's runloop threads run its all_reduce) waited
    7.71 ms more. With that wait the host covers the lateness: a slow host, not a straggler. Without
    the process's wait (a manifest from before it was kept) the rule is the training thread's alone."""
    import pandas as pd

    from traceanalyzer.report.hosts import slow_hosts
    from traceanalyzer.report.record import Finding
    host = pd.DataFrame({"rank": [0, 1], "run_ns_per_step": [8.38e6, 6.53e6], "peers_run_ns_per_step": [6.53e6, 8.38e6],
                         "host_wait_ns_per_step": [5.75e6, 4.75e6], "peers_host_wait_ns_per_step": [4.75e6, 5.75e6],
                         "host_proc_wait_ns_per_step": [21.96e6, 14.25e6], "peers_host_proc_wait_ns_per_step": [14.25e6, 21.96e6]})
    tables = {"imbalance": pd.DataFrame({"rank": [0, 1], "same_work": [True, True]}),
              "stragglers": pd.DataFrame({"rank": [0], "phase_excess_ns_per_step": [6.6e6]})}

    class Data:
        params: dict = {}

        def r(self, name):
            return tables[name]

    for proc, kind in ((True, "slow_host"), (False, "straggler")):
        tables["host_cpu"] = host if proc else host.drop(columns=["host_proc_wait_ns_per_step", "peers_host_proc_wait_ns_per_step"])
        f = Finding(kind="straggler", title="Straggler: rank 0", recoverable_ns_per_step=2.8e6, recoverable_pct=14.0,
                    summary="", rank=0)
        slow_hosts(Data(), [f])
        assert f.kind == kind, proc
        if proc:   # (1.85 + 7.71) / 6.6
            assert "+7.71 ms" in f.evidence[0] and "cover 145%" in f.evidence[0], f.evidence


def test_a_slow_stage_its_wait_for_a_core_explains_is_a_slow_host():
    """A clean 2 x 2 PP x DP recording (session 20): stage 1 on rank 3 spent 2.13 ms more of its own
    time per step than the other stages -- a slow stage by the threshold -- while its threads waited
    6.91 ms per step for a core against its peers' 0.63: its host, not its stage. A slow stage whose
    rank waited no longer than its peers (a sleep: a sleeping rank gives its core away) stays one."""
    import pandas as pd

    from traceanalyzer.report.hosts import slow_hosts
    from traceanalyzer.report.record import Finding
    host = pd.DataFrame({"rank": [1, 3], "run_ns_per_step": [3.9e6, 6.24e6], "peers_run_ns_per_step": [3.9e6, 3.89e6],
                         "host_wait_ns_per_step": [0.6e6, 6.91e6], "peers_host_wait_ns_per_step": [0.63e6, 0.63e6]})
    tables = {"host_cpu": host, "imbalance": pd.DataFrame(), "stragglers": pd.DataFrame()}

    class Data:
        params: dict = {}

        def r(self, name):
            return tables[name]

    found = [Finding(kind="slow_stage", title="Slow pipeline stage: stage 1 (rank 3)", recoverable_ns_per_step=2.13e6,
                     recoverable_pct=12.8, summary="", rank=3, stage=1),
             Finding(kind="slow_stage", title="Slow pipeline stage: stage 1 (rank 1)", recoverable_ns_per_step=2.13e6,
                     recoverable_pct=12.8, summary="", rank=1, stage=1)]
    slow_hosts(Data(), found)
    assert [f.kind for f in found] == ["slow_host", "slow_stage"]
    assert "extra wait for a core (+6.28 ms)" in found[0].evidence[0] and "as pipeline stage 1" in found[0].evidence[0]


def test_a_rank_slow_over_every_phase_its_core_wait_shows_is_found(tmp_path):
    """traces/fsdp_gloo_2rank_noisy1 (a real FSDP recording, a noisy neighbour on rank 1's core):
    rank 1 costs its peer ~15 ms a step (21 % of it), but the slowdown is spread over its phases and
    its gloo threads -- its largest phase excess is under the 10 % of a step that makes a rank slow
    on its own -- while its threads waited ~50 ms a step longer for a core than rank 0's. That wait
    is the evidence it was slow on its own (a rank that only waits for a peer sleeps, it does not
    wait for a core): a straggler of the analyses, a slow host of the report. Before the rule, the
    run had no finding at all."""
    import traceanalyzer as ta
    from traceanalyzer.analyses import connect, prepare
    from traceanalyzer.report.build import build_report
    store = tmp_path / "s"
    ta.ingest([str(TRACES / "fsdp_gloo_2rank_noisy1")], str(store), progress=False)
    con = connect(str(store))
    try:
        prepare(con, views=["straggler_candidates"])
        c = con.execute("SELECT rank, delay_pct, phase_excess_pct, host_wait_excess_pct FROM straggler_candidates "
                        "ORDER BY rank").df().set_index("rank")
    finally:
        con.close()
    assert c.loc[1, "delay_pct"] > 15 and c.loc[1, "phase_excess_pct"] < 10 < c.loc[1, "host_wait_excess_pct"], c
    assert c.loc[0, "delay_pct"] < 10, c          # its peer, the victim, is no candidate
    rr = build_report(str(store), figures=False).runs[0]
    first = rr.findings[0]
    assert (first.kind, first.rank) == ("slow_host", 1), [(f.kind, f.rank) for f in rr.findings]
    assert not any(f.rank == 0 for f in rr.findings)
    assert any("extra wait for a core" in e and "its host" in e for e in first.evidence), first.evidence


def test_a_straggler_found_by_its_wait_for_a_core_is_a_slow_host_whatever_its_work():
    """A clean 2-rank MoE recording of the accuracy corpus (session 21, moe2_r2): rank 1 cost its
    peer 2.90 ms a step (14.6 %) with no phase of its own slower (+0.02 ms) -- the analyses found it
    by its threads' extra wait for a core (+3.17 ms a step) -- and ran 2.5 ms more CPU, its tokens
    being routed differently (not the same work). The wait is all the evidence there is of it being
    slow on its own: a slow host, never a straggler of the job (a false finding on a clean run)."""
    import pandas as pd

    from traceanalyzer.report.hosts import slow_hosts
    from traceanalyzer.report.record import Finding
    host = pd.DataFrame({"rank": [0, 1], "run_ns_per_step": [12.54e6, 15.01e6], "peers_run_ns_per_step": [15.01e6, 12.54e6],
                         "host_wait_ns_per_step": [0.53e6, 1.29e6], "peers_host_wait_ns_per_step": [1.29e6, 0.53e6],
                         "host_proc_wait_ns_per_step": [3.65e6, 6.82e6], "peers_host_proc_wait_ns_per_step": [6.82e6, 3.65e6]})
    tables = {"host_cpu": host, "imbalance": pd.DataFrame({"rank": [0, 1], "same_work": [False, False]}),
              "stragglers": pd.DataFrame({"rank": [1], "delay_ns_per_step": [2.90e6], "delay_pct": [14.6],
                                          "phase_excess_ns_per_step": [0.02e6], "phase_excess_pct": [0.1]})}

    class Data:
        params: dict = {}

        def r(self, name):
            return tables[name]

    f = Finding(kind="straggler", title="Straggler: rank 1", recoverable_ns_per_step=3.11e6, recoverable_pct=15.7,
                summary="", rank=1)
    slow_hosts(Data(), [f])
    assert f.kind == "slow_host"
    assert "extra wait for a core (+3.17 ms)" in f.evidence[0] and "no phase of its own 10%" in f.evidence[0]
    # the same rank with a phase of its own 10 % of the step slower (a sleep): its work differs, stays
    tables["stragglers"]["phase_excess_ns_per_step"] = 2.5e6
    tables["stragglers"]["phase_excess_pct"] = 12.6     # of its 19.9 ms step
    f = Finding(kind="straggler", title="Straggler: rank 1", recoverable_ns_per_step=3.11e6, recoverable_pct=15.7,
                summary="", rank=1)
    slow_hosts(Data(), [f])
    assert f.kind == "straggler"


def test_a_rank_busy_in_its_own_code_is_a_straggler_not_a_slow_host(tmp_path):
    """traces/ddp_gloo_2rank_spin1 (a real 2-rank DDP recording, one rank per core): rank 1
    busy-waits 10 ms in every forward (``--slow-spin``: its own untraced code on the training thread,
    as Python-side preprocessing or logging on one rank is). It ran ~11 ms more CPU per step than
    rank 0 and its process's threads waited ~10 ms more for its core -- behind its own busy training
    thread -- which covered its slower forward, so it was called a slow host (its host blamed for its
    own code). Its operations, the same as its peer's, took only ~5 ms longer: the rest of its extra
    CPU ran outside every traced operation. A straggler, with that as evidence."""
    import traceanalyzer as ta
    from traceanalyzer.report.build import build_report
    store = tmp_path / "s"
    ta.ingest([str(TRACES / "ddp_gloo_2rank_spin1")], str(store), progress=False)
    rr = build_report(str(store), figures=False).runs[0]
    assert [(f.kind, f.rank) for f in rr.findings] == [("straggler", 1)], [(f.kind, f.rank) for f in rr.findings]
    own = [e for e in rr.findings[0].evidence if "outside its traced operations" in e]
    assert own and "not its host" in own[0], rr.findings[0].evidence
    assert 8.0 <= rr.findings[0].recoverable_ns_per_step / 1e6 <= 13.0     # 10 ms a step injected


def test_a_late_rank_keeping_its_own_threads_waiting_is_no_slow_host(tmp_path):
    """traces/ddp_gloo_2rank_slow1_selfwait (a real 2-rank DDP recording of the accuracy corpus, one
    rank per core): rank 1 sleeps 10 ms in every forward. Its process's threads waited ~11 ms more
    per step for its core than rank 0's: arriving late, its gloo runloop threads run its all_reduces
    at once, beside its training thread's backward, where rank 0's ran while its training thread
    sat idle. Counted as its host's, that wait covered its slower forward and the sleep was reported
    as a slow host (session 27). It waited behind its own threads, on a core its process left idle
    ~10 ms a step (the sleep): the waits its host can have caused (host_cpu.sql) are ~4 ms: a straggler."""
    import traceanalyzer as ta
    from traceanalyzer.analyses import connect, prepare
    from traceanalyzer.report.build import build_report
    store = tmp_path / "s"
    ta.ingest([str(TRACES / "ddp_gloo_2rank_slow1_selfwait")], str(store), progress=False)
    con = connect(str(store))
    try:
        prepare(con, views=["host_cpu_ranks"])
        h = con.execute("SELECT * FROM host_cpu_ranks ORDER BY rank").df().set_index("rank")
    finally:
        con.close()
    raw = h.loc[1, "proc_wait_ns_per_step"] - h.loc[1, "peers_proc_wait_ns_per_step"]
    own = h.loc[1, "host_proc_wait_ns_per_step"] - h.loc[1, "peers_host_proc_wait_ns_per_step"]
    assert raw > 9e6 and own < 5e6, h        # most of its extra wait was behind its own threads
    assert (h["host_wait_ns_per_step"] <= h["wait_ns_per_step"]).all()
    assert (h["host_proc_wait_ns_per_step"] <= h["proc_wait_ns_per_step"]).all()
    rr = build_report(str(store), figures=False).runs[0]
    assert [(f.kind, f.rank) for f in rr.findings] == [("straggler", 1)], [(f.kind, f.rank) for f in rr.findings]
