"""Run selection in one place (store/runs.py): every command that works on one run picks it the
same way and says the same one line when it cannot (several runs, an unknown run), on a real store
of two shipped runs."""
from __future__ import annotations

import json

import pytest
from conftest import TRACES

import traceanalyzer as ta
from traceanalyzer.errors import TraceAnalyzerError
from traceanalyzer.store import files as st
from traceanalyzer.store.runs import resolve_run, select_runs, store_runs

RUNS = ("coll_gloo_2rank", "ddp_gloo_2rank")
SEVERAL = "store has several runs (coll_gloo_2rank, ddp_gloo_2rank): pass --run"
UNKNOWN = "no run 'nope': runs are coll_gloo_2rank, ddp_gloo_2rank"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = tmp_path_factory.mktemp("runs") / "store"
    for run in RUNS:
        ta.ingest([TRACES / run], s, run=run, progress=False, workers=1)
    return s


def test_resolve_run_picks_the_one_run_or_says_why_not(store, tmp_path):
    con = st.open_store(store)
    assert store_runs(con) == list(RUNS)
    assert resolve_run(con, "ddp_gloo_2rank") == "ddp_gloo_2rank"
    with pytest.raises(TraceAnalyzerError, match="^store: " + SEVERAL.replace("(", r"\(").replace(")", r"\)") + "$"):
        resolve_run(con, None)
    with pytest.raises(TraceAnalyzerError, match=f"^x: {UNKNOWN}$"):
        resolve_run(con, "nope", where="x")
    assert select_runs(con, None) == list(RUNS) and select_runs(con, "coll_gloo_2rank") == ["coll_gloo_2rank"]
    con.close()
    one = tmp_path / "one"
    ta.ingest([TRACES / "ddp_gloo_2rank"], one, run="ddp_gloo_2rank", progress=False, workers=1)
    con = st.open_store(one)
    assert resolve_run(con, None) == "ddp_gloo_2rank"   # the only run: no --run needed
    con.close()


@pytest.mark.parametrize("args", [["export", "{store}", "--all-ranks", "-o", "{tmp}/x.json"], ["analyze", "{store}", "--run", "nope"],
                                  ["report", "{store}", "--run", "nope", "-o", "{tmp}/r.html"],
                                  ["export", "{store}", "--all-ranks", "--run", "nope", "-o", "{tmp}/x.json"],
                                  ["replay", "{store}", "--plan", "{tmp}/plan.json"],
                                  ["replay", "{store}", "--run", "nope", "--plan", "{tmp}/plan.json"],
                                  ["diff", "{store}", "--run-b", "ddp_gloo_2rank"], ["rm", "{store}", "--run", "nope"]])
def test_every_command_says_the_same_line(args, store, tmp_path, run_cli):
    (tmp_path / "plan.json").write_text(json.dumps({"actions": [{"action": "idealize", "ranks": [0]}]}))
    code, out, err = run_cli(*[a.format(store=store, tmp=tmp_path) for a in args])
    assert code == 2 and err.count("\n") == 1, (out, err)
    if "nope" in args:
        assert UNKNOWN.replace("runs are", "runs with steps are" if args[0] == "replay" else "runs are") in err
    elif args[0] == "diff":
        assert SEVERAL.replace("--run", "--run-a") in err
    else:
        assert SEVERAL.replace("several runs", "several runs with steps" if args[0] == "replay" else "several runs") in err


def test_session_and_library_calls_pick_the_same_way(store):
    from traceanalyzer.analyses.diff import diff_runs
    from traceanalyzer.export.trace import export_trace
    with ta.open(store) as s:
        with pytest.raises(TraceAnalyzerError, match="several runs with steps"):
            s.replay({"actions": [{"action": "idealize", "ranks": [0]}]})
        with pytest.raises(TraceAnalyzerError, match="no run 'nope'"):
            s.graph("nope")
        with pytest.raises(TraceAnalyzerError, match=f"{UNKNOWN}$"):
            s.analysis("stragglers", run="nope")
        assert len(s.analysis("step_phases", run="ddp_gloo_2rank")) > 0
    with pytest.raises(TraceAnalyzerError, match="pass --run-a"):
        diff_runs(store)
    with pytest.raises(TraceAnalyzerError, match="pass --run$"):
        export_trace(store)
