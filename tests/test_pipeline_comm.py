"""The transfers of a pipeline plan (replay/pipeline_comm.py) on real 2-rank gloo pipeline runs
(traces/README.md): the p2p ops a schedule posts per rank and step, counted from the schedule,
against the ops the real 1F1B and Interleaved1F1B runs recorded; the host cost of one transfer
measured in the recorded run; and the 1F1B -> Interleaved1F1B plan paying its extra transfers at
that cost (a plan that ignored it would predict the same step with and without it).
"""
from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import TRACES

RUNS = ["pp_1f1b_2rank_m4", "pp_interleaved_2rank_m4"]
_P2P = "regexp_matches(name, '^c10d::(send|recv_)')"


@pytest.fixture(scope="module")
def con(tmp_path_factory):
    import traceanalyzer as ta
    d = tmp_path_factory.mktemp("pipecomm") / "store"
    for run in RUNS:
        ta.ingest([str(TRACES / run)], str(d), run=run, progress=False, workers=1)  # small traces: no pool (conftest.ingest_runs)
    return ta.open(str(d))


@pytest.fixture(scope="module")
def costs(con):
    from traceanalyzer.replay import pipeline
    return pipeline.stage_costs(con, "pp_1f1b_2rank_m4")


def _recorded_transfers(con, run) -> dict:
    """Per rank, the p2p ops it posted per step (the same in every step)."""
    rows = con.sql(f"""SELECT rank, count(*) AS n FROM events WHERE run = '{run}' AND step IS NOT NULL AND {_P2P}
                       GROUP BY rank, step""").fetchall()
    per_rank = {}
    for rank, n in rows:
        per_rank.setdefault(int(rank), set()).add(int(n))
    assert all(len(v) == 1 for v in per_rank.values()), per_rank
    return {r: v.pop() for r, v in per_rank.items()}


def test_transfers_counted_by_hand():
    from traceanalyzer.replay.pipeline_comm import transfers_per_step
    from traceanalyzer.replay.pipeline_schedules import schedule_order
    # 1F1B, 2 ranks: per micro-batch rank 0 sends activations and receives gradients, rank 1 the reverse
    assert transfers_per_step(schedule_order("1f1b", 2, 4), 2, 1) == {0: 8, 1: 8}
    # 2 chunks per rank: rank 0 holds stages 0 and 2, so per micro-batch 2 (stage 0) + 4 (stage 2)
    assert transfers_per_step(schedule_order("interleaved1f1b", 2, 4, 2), 2, 2) == {0: 24, 1: 24}
    # 4 ranks, 8 micro-batches: the end ranks go from 1 to 1.5 transfers per action, the middle stay at 2
    assert transfers_per_step(schedule_order("1f1b", 4, 8), 4, 1) == {0: 16, 1: 32, 2: 32, 3: 16}
    assert transfers_per_step(schedule_order("interleaved1f1b", 4, 8, 2), 4, 2) == {0: 48, 1: 64, 2: 64, 3: 48}
    assert transfers_per_step(schedule_order("gpipe", 1, 4), 1, 1) == {0: 0}


@pytest.mark.parametrize("run,schedule,v", [("pp_1f1b_2rank_m4", "1f1b", 1),
                                            ("pp_interleaved_2rank_m4", "interleaved1f1b", 2)])
def test_counts_match_the_recorded_ops(con, run, schedule, v):
    from traceanalyzer.replay.pipeline_comm import transfers_per_step
    from traceanalyzer.replay.pipeline_schedules import schedule_order
    assert _recorded_transfers(con, run) == transfers_per_step(schedule_order(schedule, 2, 4, v), 2, v)


def test_host_cost_is_the_recorded_ops_median(con, costs):
    med = dict(con.sql(f"""SELECT rank, median(dur_ns) FROM events WHERE run = 'pp_1f1b_2rank_m4'
                           AND step IS NOT NULL AND {_P2P} GROUP BY rank""").fetchall())
    assert set(costs.p2p_host_ns) == {0, 1}
    for rank, ns in costs.p2p_host_ns.items():
        assert abs(ns - med[rank]) <= 1
        assert 1_000 < ns < 5_000_000          # a gloo post: microseconds, not the transfer's wait


def test_interleaved_plan_pays_its_extra_transfers(con, costs):
    from traceanalyzer.replay import pipeline
    plan = {"schedule": "interleaved1f1b", "microbatches": 4, "stages_per_rank": 2}
    r = pipeline.predict(con, "pp_1f1b_2rank_m4", costs=costs, **plan)
    free = pipeline.predict(con, "pp_1f1b_2rank_m4", costs=replace(costs, p2p_host_ns={}), **plan)
    t = r.transfers.set_index("rank")
    assert t["recorded"].to_dict() == {0: 8, 1: 8} and t["planned"].to_dict() == {0: 24, 1: 24}
    # per gap between two of the 16 actions: 24/15 transfers instead of 8/7, at the rank's host cost
    for rank in (0, 1):
        per_gap = round((24 / 15 - 8 / 7) * costs.p2p_host_ns[rank])
        assert t.loc[rank, "added_ns"] == per_gap * 15
    assert (free.transfers["added_ns"] == 0).all()
    # the pipeline's step runs through both ranks' work between actions: the step grows by about
    # what the plan adds (neither nothing nor more than both ranks' additions)
    grown = r.job_step_ns() - free.job_step_ns()
    assert 0.3 * t["added_ns"].max() < grown < 1.5 * t["added_ns"].sum()
    # the same plan on the recorded schedule adds nothing
    same = pipeline.predict(con, "pp_1f1b_2rank_m4", costs=costs)
    assert (same.transfers["added_ns"] == 0).all()


def test_shared_host_is_a_stated_limit(con, costs):
    """Both ranks of the shipped run are CPU-only on one host: a plan that changes the schedule says
    what it cannot know, with how many ranks were busy at once (their own work over the step)."""
    from traceanalyzer.replay import pipeline
    from traceanalyzer.replay.pipeline_host import busy_at_once
    r = pipeline.predict(con, "pp_1f1b_2rank_m4", costs=costs, schedule="interleaved1f1b", stages_per_rank=2)
    busy = busy_at_once(costs.steps, [0, 1])
    s = costs.steps
    by_hand = (s.groupby("step")["own_ns"].sum() / s.groupby("step")["measured_ns"].mean()).mean()
    assert busy == pytest.approx(by_hand) and 0 < busy <= 2
    assert len(r.limits) == 1 and f"2 CPU-only ranks share host vm, {busy:.1f} of them busy at once" in r.limits[0]
    assert pipeline.predict(con, "pp_1f1b_2rank_m4", costs=costs).limits == []   # the recorded plan
