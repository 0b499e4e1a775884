"""The same-work rule is the imbalance analysis's (analyses/sql/work.sql, issue 14), not the report's:
a rank above imbalance.sql's thresholds that ran the same compute ops on the same input shapes as
its peers has a slower host, not more work, and its ``imbalance`` row says so (``same_work``) and is
no finding -- in ``analyze``, a notebook's ``ta.open(store).analyze()``, the saved ``result_imbalance``
table and the text ``analyze`` prints, not only in the report. Real shipped runs; one copy of a
clean run with one recorded shape changed on one rank."""
from __future__ import annotations

import gzip
import json
import shutil

import pytest
from conftest import TRACES, ingest_runs

import traceanalyzer as ta

#: a clean DDP run whose rank 0 computes 1.11x the mean (a busier core), the 2x-batch run, a run
#: recorded without shapes, and a pipeline with two replicas (peers: the replicas of a stage)
RUNS = ("ddp_gloo_2rank", "ddp_gloo_2rank_imb1", "ddp_gloo_2rank_noshapes", "pp_1f1b_2x2_dp")
#: thresholds low enough that a rank of each run is above them
LOW = {"imbalance_min_ratio": 1.05, "imbalance_min_excess_pct": 1.0}
CHANGED = "ddp_gloo_2rank_one_shape_changed"


def _change_one_shape(dest):
    """traces/ddp_gloo_2rank with the recorded shapes of one aten::mm of rank 1 (in a step) changed."""
    shutil.copytree(TRACES / "ddp_gloo_2rank", dest)
    f = dest / "rank1.window0.pt.trace.json.gz"
    raw = json.loads(gzip.open(f, "rt").read())
    mm = next(e for e in raw["traceEvents"] if e.get("name") == "aten::mm" and e.get("args", {}).get("Input Dims")
              and e["ts"] > next(s["ts"] for s in raw["traceEvents"] if s.get("name", "").startswith("ProfilerStep#")))
    mm["args"]["Input Dims"] = [[d + 1 for d in dims] for dims in mm["args"]["Input Dims"]]
    with gzip.open(f, "wt") as fh:
        json.dump(raw, fh)
    return dest


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = ingest_runs(tmp_path_factory, "same_work", RUNS, workers=1)
    ta.ingest([str(_change_one_shape(tmp_path_factory.mktemp("changed") / "run"))], str(d), run=CHANGED,
              progress=False, workers=1)
    return d


def test_the_imbalance_analysis_carries_the_same_work_verdict(store):
    with ta.open(store) as s:
        res = s.analyze(only=["imbalance"], **LOW)["imbalance"]     # the map/reduce path (summaries)
        saved = s.sql("SELECT * FROM result_imbalance ORDER BY run, rank").df()
    im = res.set_index(["run", "rank"])
    above = {k for k, v in im["above_thresholds"].items() if v}
    assert {("ddp_gloo_2rank", 0), ("ddp_gloo_2rank_imb1", 1), ("ddp_gloo_2rank_noshapes", 1),
            ("pp_1f1b_2x2_dp", 1)} <= above
    # the same ops on the same shapes: a slower host, no finding (every rank of the run: the same work)
    assert im.loc["ddp_gloo_2rank", "same_work"].tolist() == [True, True]
    assert not im.loc["ddp_gloo_2rank", "is_finding"].any()
    # a pipeline's ranks are compared with the replicas of their stage (stages differ by design)
    assert im.loc["pp_1f1b_2x2_dp", "same_work"].tolist() == [True] * 4
    assert not im.loc["pp_1f1b_2x2_dp", "is_finding"].any()
    # the 2x batch: bigger shapes, more work -- an imbalance
    assert im.loc["ddp_gloo_2rank_imb1", "same_work"].tolist() == [False, False]
    assert im.loc[("ddp_gloo_2rank_imb1", 1), "is_finding"]
    # one aten::mm of one step on rank 1 with other shapes: not the same work
    assert im.loc[CHANGED, "same_work"].tolist() == [False, False]
    assert im.loc[(CHANGED, 0), "is_finding"]
    # no shapes recorded: unknown (NULL, not false), the finding stands on its times
    assert im.loc["ddp_gloo_2rank_noshapes", "same_work"].isna().all()
    assert im.loc[("ddp_gloo_2rank_noshapes", 1), "is_finding"]
    # saved as computed; the one-connection path (no summaries) agrees
    assert saved[["run", "rank", "same_work", "is_finding"]].equals(
        res.sort_values(["run", "rank"])[["run", "rank", "same_work", "is_finding"]].reset_index(drop=True))
    from traceanalyzer.analyses import connect
    from traceanalyzer.analyses.results import compute
    con = connect(str(store))
    try:
        one = compute(con, only=["imbalance"], **LOW)["imbalance"]
    finally:
        con.close()
    assert one.set_index(["run", "rank"])["same_work"].sort_index().equals(im["same_work"].sort_index())


def test_analyze_prints_the_verdict(store, run_cli):
    code, out, _ = run_cli("analyze", store, "--run", "ddp_gloo_2rank", "--only", "imbalance",
                           "--set", "imbalance_min_excess_pct=4")
    assert code == 0
    assert "imbalance: none" in out and "rank 0 computes 1.1" in out and "they ran slower (its core: slower, shared or busy with its own threads), not more work" in out
