"""ta.open(store): one object for notebooks -- runs, analyses (DataFrames or lazy relations), analyze,
replay, report, export -- and the DuckDB connection's own methods, on a real shipped run."""
from __future__ import annotations

import gzip
import json

import pytest
from conftest import TRACES

import traceanalyzer as ta


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("session") / "store"
    ta.ingest([TRACES / "ddp_gloo_4rank_slow2"], d, run="ddp4_slow2")
    return d


def test_one_object_does_what_a_notebook_needs(store, tmp_path):
    s = ta.open(store)
    assert list(s.runs["run"]) == ["ddp4_slow2"] and int(s.runs["n_ranks"][0]) == 4
    stragglers = s.analysis("stragglers", run="ddp4_slow2")
    assert list(stragglers["rank"]) == [2]                      # the injected straggler, alone
    rel = s.analysis("stragglers", as_relation=True)            # lazy: composes with more SQL
    assert rel.filter("rank = 2").aggregate("count(*)").fetchall()[0][0] == 1
    assert s.execute("SELECT count(DISTINCT rank) FROM comms").fetchone()[0] == 4      # the connection's own
    assert set(s.analyses()) >= {"stragglers", "overlap", "critical_path"}
    per_step = s.analysis("straggler_steps", run="ddp4_slow2")   # any view an SQL module defines
    assert per_step.groupby("rank")["delay_ns"].median().idxmax() == 2
    m = s.straggler_metrics()
    assert m["S"] > 1.1 and int(m["per_rank"].sort_values("S_w").iloc[-1]["rank"]) == 2
    res = s.replay({"actions": [{"action": "idealize", "ranks": [2]}]})
    assert res.job_step_ns() < res.job_step_ns("measured_ns")    # removing the straggler's delay helps
    s.analyze()
    assert s.execute("SELECT count(*) FROM result_stragglers").fetchone()[0] == 1   # saved, and visible at once
    rep = s.report(tmp_path / "r.json", replay=False)
    assert rep.runs[0].findings[0].kind == "straggler"
    assert json.loads((tmp_path / "r.json").read_text())["runs"][0]["run"] == "ddp4_slow2"
    out = s.export(tmp_path / "t.json", rank=2)
    assert json.loads(out.read_text())["traceEvents"]
    s.close()


def test_unknown_analysis_is_one_line(store):
    with ta.open(store) as s, pytest.raises(ta.TraceAnalyzerError, match="unknown analysis: nope"):
        s.analysis("nope")


def test_what_the_notebooks_take_from_the_session(store, tmp_path):
    """The measured job step (the replay's definition), the --fail-on check of a report, and
    Perfetto's nesting rule on an exported file: what the notebooks need beyond analyses."""
    with ta.open(store) as s:
        res = s.replay({"actions": [{"action": "idealize", "ranks": [2]}]}, run="ddp4_slow2")
        assert s.job_step_ns("ddp4_slow2") == pytest.approx(res.job_step_ns("measured_ns"))
        assert s.job_step_ns("ddp4_slow2") > 20e6          # the 20 ms sleep is in every step
        assert s.job_step_ns("no_such_run") is None         # unknown, not 0
        rep = s.report(run="ddp4_slow2", replay=False)
        broken = s.failures(rep, ["slowdown_pct>10"])
        assert len(broken) == 1 and "slowdown_pct" in broken[0]
        assert s.failures(rep, ["slowdown_pct>99"]) == []
        out = s.export(tmp_path / "t.json.gz", rank=2)
        assert s.validate_nesting(out) == []
        doc = json.loads(gzip.open(out, "rt").read())
        x = next(e for e in doc["traceEvents"] if e.get("ph") == "X" and float(e["dur"]) > 1)
        outlives = dict(x, name="outlives", ts=float(x["ts"]) + float(x["dur"]) / 2, dur=float(x["dur"]))
        doc["traceEvents"].append(outlives)                 # starts inside x, ends after it: Perfetto drops it
        bad = s.validate_nesting(doc)
        assert len(bad) == 1 and "'outlives'" in bad[0]
