"""Pipeline what-ifs: regenerate a pipeline schedule (GPipe, 1F1B, Interleaved1F1B, any number of
micro-batches) from the per-micro-batch stage costs measured in a run, and simulate it.

    costs = pipeline.stage_costs("store", run="pp")            # what each stage spends per micro-batch
    r = pipeline.predict("store", run="pp", schedule="1f1b", microbatches=8)
    r.steps            # rank, step, measured_ns, identity_ns, predicted_ns, delta_ns, identity_error
    r.identity_error   # the same model regenerating the recorded schedule, against the measurement
    r.bubbles          # per rank: bubble fraction predicted / identity / measured, and the theory

Why a graph of its own and not the recorded one (``replay.graph.build_graph``): the recorded graph
keeps the recorded actions and their dependencies; a new schedule or micro-batch count needs actions
that never ran. So each rank becomes an ordered list of actions, F(stage, mb) and B(stage, mb), in
the order torch's schedules run them (``schedule_order``); ``simulate_schedule`` makes them a graph
(``replay.graph.synthetic``) that the replay's one simulator runs: an action starts
when its rank is ready (previous action done, plus the host's own work between actions), its input
has arrived and the sends the schedule waits for there are complete (``send_waits``):

    F(s, mb) needs the activations of F(s-1, mb), B(s, mb) the gradients of B(s+1, mb),
    B(last, mb) follows F(last, mb) (the loss) on the same rank;
    a message arrives at max(producer end, consumer ready) + p2p cost

(gloo moves a message when both the send and the receive are posted, and a send completes when the
peer has it: the "max" is why GPipe's and 1F1B's stages wait longer than a free-p2p model says;
Interleaved1F1B posts its receives ahead, so there: producer end + p2p cost).

What is measured (``stage_costs``), per rank and step, on the thread that records ProfilerStep:
* actions: the compute of one micro-batch on one stage, from its first to its last operator (the
  wait for its input is outside). GPipe and 1F1B carry no usable per-action annotation for the
  compute alone, so the thread's top-level operators are cut at the p2p ops (``c10d::send`` /
  ``c10d::recv_``) and at the switches between autograd (``autograd::engine::evaluate_function:``:
  backward) and the rest (forward); the expected order of the schedule says which stretch is which
  micro-batch (the last stage's forward holds its loss). Interleaved1F1B annotates each action
  (``PP:<stage>F<mb>``, ``PP:<stage>B<mb>``); its range opens with the wait for the receive.
* the host's own work between actions (posting p2p, small ops, and idle time while no p2p op of the
  rank was in flight: the host descheduled, Python), mean per step: ``overhead_ns``; the step's own
  work before the first action (data, zero_grad, splitting the batch: ``pre_ns``) and after the last
  (gradient scaling, optimizer: ``post_ns``). Idle time while a p2p op was in flight is waiting.
  On the first stage no op separates the pre-step work from the first forward: the forward starts
  after the operators the next stage runs before its first receive (every rank runs the same loop;
  without them it gets the median of the step's other forwards).
* p2p cost per direction: start(consumer) - max(end(producer), consumer ready) over the actions
  with an input from a neighbour; the simulation uses each step's mean (a slow step's slow
  transfers stay in it), ``p2p_ns`` is the run's median.

Identity (``identity_ns``) is this model run with the recorded schedule and micro-batch count, the
same code path and cost rules as the prediction, so its error is a real model error. A what-if with
more micro-batches than recorded gives the new ones each stage's median forward/backward of the step.
Steps run back to back as in the recorded loop, after one warm-up step (the first step's costs)
started at each rank's recorded start of the first step. Another number of model chunks per rank
(1F1B <-> Interleaved1F1B) re-cuts each rank's work evenly between its chunks
(``StageCosts.repartitioned``), one message per chunk boundary at the recorded p2p cost; the
transfers a rank posts per action beyond the recorded ones cost its host the recorded time of
posting one (``pipeline_comm``: ``.transfers``). Not modelled: ranks sharing a core (the 4-rank
traces on 2 cores: one rank's compute delays the other's, and under Interleaved1F1B the same ops
ran 30-75 % slower; ``.limits`` says so, ``pipeline_host``), the new schedule's own host work per
action (torch's Interleaved1F1B runtime spends more per action than Schedule1F1B), a different
micro-batch size, a partition other than even within a rank.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from ..errors import TraceAnalyzerError
from .pipeline_costs import StageCosts, stage_costs  # noqa: F401 (the costs: pipeline.stage_costs)
from .pipeline_schedules import SCHEDULES, schedule_order, send_waits, theoretical_bubble  # noqa: F401 (re-exported)

# -- simulation -------------------------------------------------------------------------------------

@dataclass
class PipelineWhatIf:
    """A pipeline what-if: per rank and step the measured, identity (recorded plan through the model)
    and predicted (requested plan) step times; the predicted timeline; bubble fractions."""
    plan: dict                   # schedule, microbatches, stages_per_rank (requested), recorded
    steps: pd.DataFrame          # rank, step, measured_ns, identity_ns, predicted_ns, delta_ns, identity_error
    identity_error: dict         # median, p90, max, n (fractions)
    timeline: pd.DataFrame       # rank, step, stage, name, start_ns, end_ns (predicted plan)
    bubbles: pd.DataFrame        # rank, measured/identity/predicted bubble fraction (idle / step)
    theoretical_bubble: dict     # recorded, predicted: (p-1)/(v*m+p-1)
    costs: StageCosts
    transfers: pd.DataFrame | None = None   # rank, recorded, planned (p2p ops per step), host_ns (one), added_ns (per step)
    limits: list = field(default_factory=list)   # what this prediction cannot know, one line each (pipeline_host.py)

    def job_step_ns(self, column: str = "predicted_ns") -> float:
        """Job step time (``replay.simulate.job_step_ns``: per rank the mean step, the slowest rank)."""
        from .simulate import job_step_ns
        return job_step_ns(self.steps, column)

    @property
    def run(self) -> str:
        return self.costs.run

    def chrome_trace(self, name: str = "pipeline what-if") -> dict:
        """The predicted timeline as a Chrome/Perfetto trace (one process per rank, µs)."""
        from .chrome import timeline_chrome
        doc = timeline_chrome(self.timeline, self.costs.run, name=name)
        doc["otherData"]["plan"] = self.plan
        return doc


def _plan_costs(c: StageCosts, step, order: dict):
    """Per rank: [(stage, kind, mb, cost_ns)] for one step under ``order`` (recorded costs for the
    recorded micro-batches, the step's per-stage median for new ones), and pre/post/overhead."""
    a = c.actions[c.actions["step"] == step]
    cost = {(s, k, mb): int(x) for s, k, mb, x in zip(a["stage"], a["kind"], a["mb"], a["cost_ns"])}
    med = a.groupby(["stage", "kind"])["cost_ns"].median().to_dict()
    out = {}
    for pos, acts in order.items():
        out[pos] = [(s, k, mb, cost.get((s, k, mb), int(med.get((s, k), 0)))) for s, k, mb in acts]
    return out


def simulate_schedule(c: StageCosts, order: dict, steps: list, schedule: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run ``order`` (rank position -> actions) for a warm-up step and then ``steps``, back to back,
    as a graph (graph/synthetic.py) that the replay's simulator runs. Each rank is a lane: per step
    its host work before the actions, then per action its overhead and its compute, then its host
    work after. A compute starts when its rank is ready (the overhead before it is done), its input
    has arrived and the sends it waits for (``send_waits``) are complete. A message (activations
    to stage + 1, gradients to stage - 1) is a node of its own lasting the step's p2p cost, after
    the producer's compute and the consumer being ready (a rendezvous; Interleaved1F1B posts its
    receives ahead, so there after the producer alone). Returns (per rank and step: start_ns,
    end_ns, own_ns, sim_ns) and the timeline (rank, step, stage, name, start_ns, end_ns)."""
    from .graph.synthetic import GraphSpec
    from .simulate import Simulator
    n_stages = c.n_ranks * c.stages_per_rank
    last = n_stages - 1
    early_recv = schedule == "interleaved1f1b"
    srow = c.steps.set_index(["rank", "step"])
    plan = [("warmup", steps[0])] + [(s, s) for s in steps]
    lat = {(label, k): c.p2p_step_ns(st, k) for label, st in plan for k in ("F", "B")}
    spec = GraphSpec(c.run)
    ready, compute = {}, {}          # action (label, stage, kind, mb) -> its overhead node, its compute node
    waits_of, own_forward = [], []   # (node, label, messages it waits for); (last stage's forward, its backward)
    step_nodes, own, timeline = [], {}, []
    for pos in order:
        rank = c.ranks[pos]
        lane = spec.lane(rank, int(srow.loc[(rank, steps[0]), "start_ns"]))
        before, post_waits = send_waits(schedule, order[pos], n_stages)
        for label, st in plan:
            w = srow.loc[(rank, st)]
            acts = _plan_costs(c, st, {pos: order[pos]})[pos]
            pre = spec.node(lane, int(w["pre_ns"]))
            own[(pos, label)] = int(w["pre_ns"]) + int(w["post_ns"])
            for i, (s, k, mb, dur) in enumerate(acts):
                ovh = int(w["overhead_ns"]) if i else 0
                key = (label, s, k, mb)
                ready[key] = spec.node(lane, ovh)
                compute[key] = spec.node(lane, dur)
                own[(pos, label)] += dur + ovh
                timeline.append((rank, label, s, f"{k}{mb}", compute[key]))
                waits_of.append((compute[key], label, before[i]))
                if k == "B" and s == last:
                    own_forward.append(((label, s, "F", mb), compute[key]))
                elif not (k == "F" and s == 0):
                    waits_of.append((compute[key], label, [(k, s - 1 if k == "F" else s + 1, mb)]))
            post = spec.node(lane, int(w["post_ns"]))
            waits_of.append((post, label, post_waits))
            step_nodes.append((rank, label, pos, pre, post))
    msgs = {}

    def message(label, k, s, mb):
        """The node of the message produced by (label, s, k, mb): created once."""
        key = (label, s, k, mb)
        if key not in msgs:
            consumer = (label, s + 1, "F", mb) if k == "F" else (label, s - 1, "B", mb)
            if key not in compute or consumer not in ready:
                raise TraceAnalyzerError("pipeline what-if: the schedule deadlocks (an action waits for one that "
                                         "never runs); check the schedule and micro-batch count")
            msgs[key] = m = spec.node(-1, lat[(label, k)])
            spec.edge(compute[key], m)
            if not early_recv:
                spec.edge(ready[consumer], m)
        return msgs[key]

    for node, label, ms in waits_of:
        for k, s, mb in ms:
            spec.edge(message(label, k, s, mb), node)
    for prod, node in own_forward:
        if prod not in compute:
            raise TraceAnalyzerError("pipeline what-if: the schedule deadlocks (an action waits for one that "
                                     "never runs); check the schedule and micro-batch count")
        spec.edge(compute[prod], node)
    g, new = spec.build("pipeline what-if")
    sched = Simulator(g).run()
    start, end = sched.start[new], sched.end[new]
    rows = [(rank, label, int(start[pre]), int(end[post]), own[(pos, label)])
            for rank, label, pos, pre, post in step_nodes if label != "warmup"]
    st = pd.DataFrame(rows, columns=["rank", "step", "start_ns", "end_ns", "own_ns"])
    st["sim_ns"] = st["end_ns"] - st["start_ns"]
    tl = pd.DataFrame([(r, label, s, name, int(start[x]), int(end[x])) for r, label, s, name, x in timeline],
                      columns=["rank", "step", "stage", "name", "start_ns", "end_ns"])
    tl = tl[tl["step"] != "warmup"].astype({"step": "int64"}).sort_values(["start_ns", "rank"], kind="stable")
    return st, tl.reset_index(drop=True)


def _with_transfers(cn: StageCosts, c: StageCosts, rec: dict, new: dict) -> tuple[StageCosts, pd.DataFrame]:
    """``cn`` with each rank's work between actions changed by the host cost of the transfers the
    new plan posts per gap beyond the recorded ones (replay/pipeline_comm.py), and per rank the
    transfers per step (recorded, planned), the host cost of one and what the plan adds per step."""
    from dataclasses import replace

    from .pipeline_comm import overhead_delta_ns, transfers_per_step
    n_rec = transfers_per_step(rec, c.n_ranks, c.stages_per_rank)
    n_new = transfers_per_step(new, cn.n_ranks, cn.stages_per_rank)
    delta = overhead_delta_ns(c.p2p_host_ns, c.ranks, {q: (n_rec[q], len(rec[q])) for q in rec},
                              {q: (n_new[q], len(new[q])) for q in new})
    table = pd.DataFrame([(r, n_rec[q], n_new[q], c.p2p_host_ns.get(r), delta[r] * max(len(new[q]) - 1, 0))
                          for q, r in enumerate(c.ranks)], columns=["rank", "recorded", "planned", "host_ns", "added_ns"])
    if not any(delta.values()):
        return cn, table
    steps = cn.steps.copy()
    steps["overhead_ns"] = (steps["overhead_ns"] + steps["rank"].map(delta).fillna(0)).clip(lower=0).astype("int64")
    return replace(cn, steps=steps), table


def _limits(store_or_con, c: StageCosts, sched: str, m: int, v: int) -> list:
    """The stated limits of a plan on this run (replay/pipeline_host.py): CPU-only ranks sharing a host."""
    changed = (sched, m, v) != (c.schedule, c.microbatches, c.stages_per_rank)
    if not changed or store_or_con is None:
        return []
    from ..analyses import connect
    from .pipeline_host import shared_host_limits
    return shared_host_limits(connect(store_or_con), c.run, c.steps, changed)


def predict(store_or_con, run: str | None = None, schedule: str | None = None, microbatches: int | None = None,
            stages_per_rank: int | None = None, costs: StageCosts | None = None) -> PipelineWhatIf:
    """Predict the run's step time under another schedule and/or micro-batch count (same micro-batch
    size), beside the identity (the recorded plan through the same model) and the measurement."""
    if costs is None and store_or_con is not None:
        from ..analyses import connect
        store_or_con = connect(store_or_con)     # one connection for the costs and the limits
    c = costs if costs is not None else stage_costs(store_or_con, run)
    sched = schedule or c.schedule
    m = int(c.microbatches if microbatches is None else microbatches)
    v = int(stages_per_rank if stages_per_rank is not None else (c.stages_per_rank if sched == c.schedule else 1))
    per_step = c.steps.groupby("step")["rank"].nunique()
    steps = sorted(per_step.index[per_step == c.n_ranks])    # steps every pipeline rank recorded
    if not steps:
        raise TraceAnalyzerError(f"pipeline what-if: run '{c.run}' has no step recorded on all {c.n_ranks} pipeline ranks")
    rec = schedule_order(c.schedule, c.n_ranks, c.microbatches, c.stages_per_rank)
    new = schedule_order(sched, c.n_ranks, m, v)
    # another number of model chunks per rank: the same work re-cut (StageCosts.repartitioned)
    cn = c if v == c.stages_per_rank else c.repartitioned(v)
    cn, transfers = _with_transfers(cn, c, rec, new)
    ident, _ = simulate_schedule(c, rec, steps, c.schedule)
    pred, tl = simulate_schedule(cn, new, steps, sched)
    out = c.steps[["rank", "step", "measured_ns", "own_ns"]].rename(columns={"own_ns": "measured_own_ns"})
    out = out.merge(ident[["rank", "step", "sim_ns", "own_ns"]].rename(columns={"sim_ns": "identity_ns", "own_ns": "identity_own_ns"}),
                    on=["rank", "step"])
    out = out.merge(pred[["rank", "step", "sim_ns", "own_ns"]].rename(columns={"sim_ns": "predicted_ns", "own_ns": "predicted_own_ns"}),
                    on=["rank", "step"])
    out["delta_ns"] = out["predicted_ns"] - out["identity_ns"]
    out["identity_error"] = (out["identity_ns"] - out["measured_ns"]).abs() / out["measured_ns"]
    bub = pd.DataFrame({"rank": out["rank"],
                        "measured": 1 - out["measured_own_ns"] / out["measured_ns"],
                        "identity": 1 - out["identity_own_ns"] / out["identity_ns"],
                        "predicted": 1 - out["predicted_own_ns"] / out["predicted_ns"]}).groupby("rank").mean().reset_index()
    e = out["identity_error"]
    steps_df = out[["rank", "step", "measured_ns", "identity_ns", "predicted_ns", "delta_ns", "identity_error"]]
    return PipelineWhatIf(
        plan={"schedule": sched, "microbatches": m, "stages_per_rank": v,
              "recorded": {"schedule": c.schedule, "microbatches": c.microbatches, "stages_per_rank": c.stages_per_rank}},
        steps=steps_df.sort_values(["step", "rank"]).reset_index(drop=True),
        identity_error={"median": float(e.median()), "p90": float(e.quantile(0.9)), "max": float(e.max()), "n": int(len(e))},
        timeline=tl, bubbles=bub,
        theoretical_bubble={"recorded": theoretical_bubble(c.n_ranks, c.microbatches, c.stages_per_rank),
                            "predicted": theoretical_bubble(c.n_ranks, m, v)},
        costs=c, transfers=transfers, limits=_limits(store_or_con, c, sched, m, v))
