"""The report's what-if of a slow pipeline stage idealises the flagged rank only (report/whatif.py,
issue 14). With replicas (PP x DP) a slow stage is one slow worker -- own time beyond the ranks that
hold its stage in the other replicas -- and the replay idealises it against those peers; idealising
every rank of the stage also cut the healthy replica's time of that stage, a saving the fault never
cost. Real shipped run: a 2x2 PP x DP GPipe op timeline whose stage 1 of replica 0 (rank 1) sleeps."""
from __future__ import annotations

import pytest
from conftest import ingest_runs

from traceanalyzer import replay, report

RUN = "pp_gpipe_2x2_dp_optimeline_slow1"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return ingest_runs(tmp_path_factory, "whatif_targets", (RUN,), workers=1)


def test_slow_worker_whatif_idealises_the_worker_only(store):
    rep = report.build_report(store, run=RUN, figures=False).runs[0]
    f = rep.findings[0]
    assert (f.kind, f.rank) == ("slow_stage", 1)
    sl = rep.data.r("pipeline_slow_stages")
    stage_ranks = sorted(int(r) for r in sl.loc[sl["stage"] == f.stage, "rank"])
    assert stage_ranks == [1, 3]                     # the stage has a replica: rank 3, healthy
    assert f.replay["status"] == "ok" and f.replay["ranks"] == [1]
    g = replay.build_graph(store, run=RUN)
    whole_stage = replay.what_if(g, {"actions": [{"action": "idealize", "ranks": stage_ranks}]})
    saving_stage = whole_stage.job_step_ns("identity_ns") - whole_stage.job_step_ns()
    # the worker alone, against its replica: what the report claims, and no more than the whole stage
    assert f.recoverable_ns_per_step == pytest.approx(f.replay["saving_ns_per_step"])
    assert 0 < f.replay["saving_ns_per_step"] <= saving_stage
