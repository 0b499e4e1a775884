"""Pipeline what-ifs (replay.pipeline) on real 2-rank gloo pipeline runs (traces/README.md):
schedule orders against torch's, stage costs against the schedule's own annotations, the identity
model error, m4 -> m8 and GPipe -> 1F1B against real runs of the other plan, directions, bad input.

Bounds asserted and why (numbers measured on the shipped traces, see the report in the commit):
* identity model error median <= 5 % on every shipped 2-rank pipeline run (measured 2.0-4.0 %),
  P90 <= 20 % (the first step after the modelled warm-up step is the worst);
* m4 -> m8 (1F1B, same micro-batch size): job step within 10 % of the real m8 run (measured 1.4 %);
* GPipe m4 -> 1F1B m4: within 10 % of the real 1F1B run's job step is the goal, but the shipped pair
  differs by more than that in its per-micro-batch compute (noise of a shared 2-core host: the
  1F1B run's stage-0 forwards took a median 10.3 ms against 5.8 ms in the GPipe run), so the test
  asserts the model's own consistency instead: GPipe -> 1F1B from the GPipe run is within 10 % of
  the GPipe run's identity, and 1F1B -> GPipe from the 1F1B run within 10 % of that run's identity
  (p = 2, m = 4: both schedules have the same theoretical bubble); the cross-run error is printed.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from conftest import TRACES

RUNS = ["pp_gpipe_2rank_m4", "pp_1f1b_2rank_m4", "pp_1f1b_2rank_m8", "pp_interleaved_2rank_m4"]


@pytest.fixture(scope="module")
def con(tmp_path_factory):
    import traceanalyzer as ta
    d = tmp_path_factory.mktemp("pipewhatif") / "store"
    for run in RUNS + ["ddp_gloo_2rank"]:
        ta.ingest([str(TRACES / run)], str(d), run=run, progress=False, workers=1)  # small traces: no pool (conftest.ingest_runs)
    return ta.open(str(d))


@pytest.fixture(scope="module")
def costs(con):
    from traceanalyzer.replay import pipeline
    return {run: pipeline.stage_costs(con, run) for run in RUNS}


# -- schedule orders -------------------------------------------------------------------------------

def _torch_actions(ops):
    return [(a.stage_index, "F" if a.computation_type.name == "FORWARD" else "B", a.microbatch_index)
            for a in ops if a is not None and a.computation_type.name in ("FORWARD", "FULL_BACKWARD")]


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (2, 8, 2), (4, 8, 2), (4, 4, 3), (3, 6, 2)])
def test_interleaved_order_is_torchs(p, m, v):
    sched = pytest.importorskip("torch.distributed.pipelining.schedules")
    from traceanalyzer.replay.pipeline import schedule_order
    rounds = max(1, m // p)
    fake = SimpleNamespace(n_local_stages=v, pp_group_size=p, _n_microbatches=m, microbatches_per_round=m // rounds)
    ours = schedule_order("interleaved1f1b", p, m, v)
    for r in range(p):
        assert ours[r] == _torch_actions(sched.ScheduleInterleaved1F1B._calculate_single_rank_operations(fake, r)), r


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8)])
def test_gpipe_order_is_torchs(p, m):
    sched = pytest.importorskip("torch.distributed.pipelining.schedules")
    from traceanalyzer.replay.pipeline import schedule_order
    torch_order = sched.ScheduleGPipe._get_pipeline_order(SimpleNamespace(_num_stages=p, _n_microbatches=m))
    ours = schedule_order("gpipe", p, m)
    assert all(ours[r] == _torch_actions(torch_order[r]) for r in range(p))


def test_1f1b_order_matches_the_recorded_p2p(con):
    """Schedule1F1B runs min(m, p - s) warm-up forwards on stage s (its IR in _get_pipeline_order
    says p - 1 - s, the code runs p - s): on the first stage of the real runs, the sends before the
    first receive of a step are the warm-up forwards."""
    from traceanalyzer.replay.pipeline import schedule_order
    for run, m in (("pp_1f1b_2rank_m4", 4), ("pp_1f1b_2rank_m8", 8)):
        ops = con.execute("""SELECT step, list(op ORDER BY enqueue_ts_ns) AS ops FROM comms
                             WHERE run = $run AND rank = 0 AND is_p2p GROUP BY step""", {"run": run}).fetchall()
        order = schedule_order("1f1b", 2, m)
        warmup = [k for _, k, _ in order[0]].index("B")
        assert warmup == 2 and [k for _, k, _ in order[1]].index("B") == 1
        for step, seq in ops:
            assert seq.index("recv") == warmup, (run, step, seq)
    assert schedule_order("1f1b", 2, 4)[0] == [(0, "F", 0), (0, "F", 1), (0, "B", 0), (0, "F", 2), (0, "B", 1),
                                               (0, "F", 3), (0, "B", 2), (0, "B", 3)]


def test_bubble_theory():
    from traceanalyzer.replay.pipeline import theoretical_bubble
    assert theoretical_bubble(2, 4) == pytest.approx(1 / 5)
    assert theoretical_bubble(4, 8) == pytest.approx(3 / 11)
    assert theoretical_bubble(2, 4, 2) == pytest.approx(1 / 9)


# -- stage costs -----------------------------------------------------------------------------------

def test_stage_costs_shape(costs):
    for run, c in costs.items():
        assert c.n_ranks == 2 and c.ranks == [0, 1], run
        n = c.microbatches * c.stages_per_rank
        per = c.actions.groupby(["rank", "step", "kind"]).size()
        assert (per == n).all(), (run, per.to_dict())
        assert (c.actions["cost_ns"] > 0).all()
        # own work never exceeds the step; compute is a few ms per micro-batch (README command)
        assert (c.steps["own_ns"] <= c.steps["measured_ns"]).all(), run
        ps = c.per_stage()
        assert ((ps["forward_ns"] > 0.5e6) & (ps["backward_ns"] > 1e6)).all(), (run, ps)
        assert 0 <= c.p2p_ns["F"] < 20e6 and 0 <= c.p2p_ns["B"] < 20e6, c.p2p_ns


def test_unannotated_segmentation_agrees_with_gpipe_annotations(con, costs):
    """GPipe annotates 'Forward i' / 'Backward i'; the segmentation used for 1F1B (p2p ops and
    autograd, no annotations) puts every action of the GPipe run inside its own annotation, except
    that the last stage's forward also holds its loss, which GPipe computes after the range
    (ScheduleGPipe._maybe_compute_loss): those end within 1 ms after it."""
    c = costs["pp_gpipe_2rank_m4"]
    ann = con.execute("""SELECT e.rank, e.step, e.name, e.ts_ns + coalesce(o.offset_ns, 0) AS lo,
                                e.ts_ns + e.dur_ns + coalesce(o.offset_ns, 0) AS hi
                         FROM events e LEFT JOIN clock_offsets o USING (run, rank)
                         WHERE e.run = 'pp_gpipe_2rank_m4' AND regexp_matches(e.name, '^(Forward|Backward) \\d+$')""").df()
    ann["kind"] = ann["name"].str[0]
    ann["mb"] = ann["name"].str.split(" ").str[1].astype(int)
    j = c.actions.merge(ann, on=["rank", "step", "kind", "mb"])
    assert len(j) == len(c.actions) == 2 * 3 * 8
    assert (j["start_ns"] >= j["lo"]).all()
    loss = (j["rank"] == 1) & (j["kind"] == "F")
    assert (j.loc[~loss, "end_ns"] <= j.loc[~loss, "hi"]).all()
    over = j.loc[loss, "end_ns"] - j.loc[loss, "hi"]
    assert ((over > 0) & (over < 1_000_000)).all(), over.tolist()


# -- identity and predictions ----------------------------------------------------------------------

def test_identity_model_error(con, costs):
    from traceanalyzer.replay import pipeline
    for run in RUNS:
        r = pipeline.predict(con, run, costs=costs[run])
        e = r.identity_error
        print(run, {k: round(v, 4) for k, v in e.items()})
        assert e["n"] == 6
        assert e["median"] <= 0.05 and e["p90"] <= 0.20, (run, e)
        assert (r.steps["delta_ns"] == 0).all()   # same plan: prediction == identity


def test_m4_predicts_m8(con, costs):
    from traceanalyzer.replay import pipeline
    r = pipeline.predict(con, "pp_1f1b_2rank_m4", microbatches=8, costs=costs["pp_1f1b_2rank_m4"])
    real = pipeline.predict(con, "pp_1f1b_2rank_m8", costs=costs["pp_1f1b_2rank_m8"]).job_step_ns("measured_ns")
    err = abs(r.job_step_ns() - real) / real
    print(f"m4 -> m8: predicted {r.job_step_ns() / 1e6:.1f} ms, real m8 {real / 1e6:.1f} ms, error {err:.1%}")
    assert err <= 0.10
    assert r.plan["microbatches"] == 8 and r.plan["recorded"]["microbatches"] == 4
    assert r.job_step_ns() > 1.5 * r.job_step_ns("identity_ns")     # twice the work, a smaller bubble


def test_gpipe_vs_1f1b(con, costs):
    from traceanalyzer.replay import pipeline
    g2f = pipeline.predict(con, "pp_gpipe_2rank_m4", schedule="1f1b", costs=costs["pp_gpipe_2rank_m4"])
    f2g = pipeline.predict(con, "pp_1f1b_2rank_m4", schedule="gpipe", costs=costs["pp_1f1b_2rank_m4"])
    real_1f1b = f2g.job_step_ns("measured_ns")
    print(f"gpipe -> 1f1b: predicted {g2f.job_step_ns() / 1e6:.1f} ms, real 1f1b run {real_1f1b / 1e6:.1f} ms, "
          f"error {abs(g2f.job_step_ns() - real_1f1b) / real_1f1b:.1%}")
    for r in (g2f, f2g):
        assert abs(r.job_step_ns() / r.job_step_ns("identity_ns") - 1) <= 0.10
    # the timeline holds the requested schedule: 1F1B on stage 0 of p=2 runs F0 F1 B0 F2 ...
    t = g2f.timeline[(g2f.timeline["rank"] == 0) & (g2f.timeline["step"] == g2f.steps["step"].min())]
    assert t.sort_values("start_ns")["name"].tolist() == ["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"]
    doc = g2f.chrome_trace()
    assert sum(e["ph"] == "X" for e in doc["traceEvents"]) == len(g2f.timeline) == 2 * 3 * 8


def test_more_microbatches_smaller_bubble(con, costs):
    from traceanalyzer.replay import pipeline
    c = costs["pp_1f1b_2rank_m4"]
    res = {m: pipeline.predict(con, "pp_1f1b_2rank_m4", microbatches=m, costs=c) for m in (2, 4, 8, 16)}
    bub = {m: r.bubbles["predicted"].mean() for m, r in res.items()}
    theory = {m: r.theoretical_bubble["predicted"] for m, r in res.items()}
    print("bubble predicted", bub, "theory", theory)
    assert bub[2] > bub[4] > bub[8] > bub[16]
    assert theory[2] > theory[4] > theory[8] > theory[16]
    per_mb = {m: r.job_step_ns() / m for m, r in res.items()}
    assert per_mb[2] > per_mb[4] > per_mb[8] > per_mb[16]


def test_interleaved_what_if(con, costs):
    from traceanalyzer.replay import pipeline
    r = pipeline.predict(con, "pp_interleaved_2rank_m4", microbatches=8, costs=costs["pp_interleaved_2rank_m4"])
    assert r.plan["stages_per_rank"] == 2
    assert r.theoretical_bubble == {"recorded": pytest.approx(1 / 9), "predicted": pytest.approx(1 / 17)}
    assert set(r.timeline["stage"]) == {0, 1, 2, 3}
    assert r.bubbles["predicted"].mean() < r.bubbles["identity"].mean()


def test_repartitioned_schedules(con, costs):
    """Another number of model chunks per rank: the same work re-cut. 1F1B (one chunk per rank) ->
    Interleaved1F1B with 2 chunks and back: every rank's compute per micro-batch is kept, the stages
    are 0..3 placed round-robin, and the smaller schedule bubble shows in the prediction."""
    from traceanalyzer.replay import pipeline
    c = costs["pp_1f1b_2rank_m4"]
    two = c.repartitioned(2)
    assert sorted(two.actions["stage"].unique()) == [0, 1, 2, 3]
    per = ["rank", "step", "kind", "mb"]
    assert two.actions.groupby(per)["cost_ns"].sum().equals(c.actions.groupby(per)["cost_ns"].sum())
    assert two.repartitioned(1).actions.groupby(per)["cost_ns"].sum().equals(c.actions.groupby(per)["cost_ns"].sum())
    r = pipeline.predict(con, "pp_1f1b_2rank_m4", schedule="interleaved1f1b", stages_per_rank=2, costs=c)
    assert r.plan["stages_per_rank"] == 2 and r.plan["recorded"]["stages_per_rank"] == 1
    assert set(r.timeline["stage"]) == {0, 1, 2, 3}
    assert r.bubbles["predicted"].mean() < r.bubbles["identity"].mean()
    back = pipeline.predict(con, "pp_interleaved_2rank_m4", schedule="1f1b", stages_per_rank=1,
                            costs=costs["pp_interleaved_2rank_m4"])
    assert set(back.timeline["stage"]) == {0, 1}


# -- bad input -------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,msg", [
    ({"run": "ddp_gloo_2rank"}, "run 'ddp_gloo_2rank' is not a pipeline"),
    ({"run": "nope"}, "no run 'nope': runs with steps are "),
    ({"run": "pp_1f1b_2rank_m4", "schedule": "zb"}, "unknown schedule 'zb'"),
    ({"run": "pp_1f1b_2rank_m4", "microbatches": 1}, "1f1b needs at least as many micro-batches as stages"),
    ({"run": "pp_1f1b_2rank_m4", "microbatches": 0}, "micro-batches and stages per rank >= 1"),
    ({"run": "pp_1f1b_2rank_m4", "schedule": "interleaved1f1b", "stages_per_rank": 0}, "stages per rank >= 1"),
])
def test_bad_input_one_line(con, kwargs, msg):
    from traceanalyzer.errors import TraceAnalyzerError
    from traceanalyzer.replay import pipeline
    with pytest.raises(TraceAnalyzerError) as exc:
        pipeline.predict(con, **kwargs)
    text = str(exc.value)
    assert msg in text and "\n" not in text, text


# -- idealising one stage of a pipeline (issue 14 part 3) --------------------------------------------

@pytest.mark.parametrize("run", ["pp_gpipe_2rank_m4", "pp_1f1b_2rank_m4", "pp_interleaved_2rank_m4"])
def test_idealising_a_healthy_stage_saves_little(con, run):
    """A 2-stage pipeline has no replicas: each rank's stage is its own work (the last one holds the
    head and the loss). Idealising a rank of a clean run keeps what its ops' nested events cover and
    compares only the rest (its own time in an op, its host gaps) with the other stage, so it saves
    little: measured 1-8 % on these runs (session 20), where taking the other stage's op durations
    "saved" 23-37 % on the last stage of a run with nothing to fix."""
    from traceanalyzer import replay
    g = replay.build_graph(con, run)
    for rank in (0, 1):
        w = replay.what_if(g, {"actions": [{"action": "idealize", "ranks": [rank]}]})
        saving = 1 - w.job_step_ns() / w.job_step_ns("identity_ns")
        assert saving < 0.10, (run, rank, saving)


def test_a_stage_keeps_its_nested_work_and_loses_its_own_excess(con):
    """g.child: the part of an op that its nested events cover (GPipe's "Forward N" ranges hold the
    stage's aten ops; other node kinds have none). Idealising a rank with no replica keeps that part
    of each of its ops, never makes one longer, and changes no other rank."""
    import numpy as np

    from traceanalyzer import replay
    from traceanalyzer.replay.graph import OP
    from traceanalyzer.replay.plans import apply_plan
    g = replay.build_graph(con, "pp_gpipe_2rank_m4")
    labels = np.asarray(g.labels, dtype=object)[g.label]
    fwd = (g.kind == OP) & np.char.startswith(labels.astype(str), "Forward ")
    assert fwd.sum() >= 8 and (g.child[fwd] > 0).all() and (g.child <= np.maximum(g.dur, 0)).all()
    assert (g.child[g.kind != OP] == 0).all()
    got = apply_plan(g, {"actions": [{"action": "idealize", "ranks": [1]}]})
    ops = (g.rank == 1) & (g.kind == OP)
    assert (got[ops] >= g.child[ops]).all() and (got[ops] <= g.dur[ops]).all()
    assert (got[g.rank != 1] == g.dur[g.rank != 1]).all()
