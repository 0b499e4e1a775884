"""Replay: trace-driven simulation of a recorded run under alternative plans (what-if).

    g = replay.build_graph("store", run="ddp4")      # dependency graph from the store
    ident = replay.identity(g)                        # per rank and step: measured, simulated, error
    res = replay.what_if(g, {"actions": [{"action": "idealize", "ranks": [2]}]})
    replay.straggler_metrics(g)                       # OSDI'25: T, T_ideal, S, waste, S_w per rank

Every what-if result carries the identity-replay error of the same trace beside it (METRICS.md,
"Replay fidelity"). Modules: graph (build), simulate (replay), plans (what-if actions), chrome
(the predicted timeline as a Chrome/Perfetto trace).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .graph import GAP, KERNEL, OP, POST, Graph, build_graph
from .plans import STRUCTURAL, apply_plan, load_plan, typical_durations  # noqa: F401 (STRUCTURAL: used by the CLI)
from .simulate import Schedule, Simulator, job_step_ns, simulate, step_times

__all__ = ["Graph", "build_graph", "Simulator", "Schedule", "simulate", "step_times", "identity", "what_if",
           "WhatIf", "straggler_metrics", "load_plan", "apply_plan", "typical_durations", "error_summary", "breakdown",
           "run_plan", "job_step_ns", "run", "ReplayRun"]

#: classes of the per-step breakdown (node kinds summed per rank and step of a schedule)
BREAKDOWN = {"cpu_ops": [OP], "gpu_ops": [KERNEL], "comm": [POST], "host_gaps": [GAP]}


def breakdown(g: Graph, sched: Schedule) -> pd.DataFrame:
    """Per (rank, step) of a schedule: the step time (``step_time``) and the time of each class
    (``BREAKDOWN``: CPU ops, GPU ops, communication after the last arrival, host gaps) that starts
    inside the rank's step window. Several lanes run at once, so the classes can add up to more than
    the step time; what the step time holds beyond the main thread's work is waiting."""
    st = step_times(g, sched)
    rows = []
    for rank, s in st.groupby("rank"):
        m = g.rank == rank
        idx = np.flatnonzero(m)
        t = sched.start[idx]
        s = s.sort_values("sim_start_ns")
        k = np.searchsorted(s["sim_start_ns"].to_numpy(), t, side="right") - 1
        ok = k >= 0
        ends = s["sim_end_ns"].to_numpy()
        ok[ok] &= t[ok] < ends[k[ok]]
        d = (sched.end[idx] - sched.start[idx])[ok]
        kind = g.kind[idx][ok]
        step = s["step"].to_numpy()[k[ok]]
        for cls, kinds in BREAKDOWN.items():
            sel = np.isin(kind, kinds)
            tot = pd.Series(d[sel]).groupby(step[sel]).sum()
            for stp in s["step"]:
                rows.append((int(rank), int(stp), cls, int(tot.get(stp, 0))))
    out = pd.DataFrame(rows, columns=["rank", "step", "class", "ns"])
    out = out.pivot_table(index=["rank", "step"], columns="class", values="ns", aggfunc="sum").reset_index()
    out.columns.name = None
    return out.merge(st[["rank", "step", "simulated_ns"]].rename(columns={"simulated_ns": "step_time"}),
                     on=["rank", "step"])


def _sim(g: Graph, sim: Simulator | None) -> Simulator:
    return sim if sim is not None else Simulator(g)


def _identity_steps(g: Graph, sched: Schedule) -> pd.DataFrame:
    """Per (rank, step) of the identity schedule: measured_ns, simulated_ns, error."""
    st = step_times(g, sched)
    st["error"] = (st["simulated_ns"] - st["measured_ns"]).abs() / st["measured_ns"]
    return st[["rank", "step", "measured_ns", "simulated_ns", "error"]].sort_values(["step", "rank"]).reset_index(drop=True)


def identity(g: Graph, sim: Simulator | None = None) -> pd.DataFrame:
    """Identity replay per (rank, step): measured_ns, simulated_ns, error (|sim - meas| / meas)."""
    return _identity_steps(g, _sim(g, sim).run())


def error_summary(ident: pd.DataFrame) -> dict:
    """Median and P90 of the identity error (fractions) over every (rank, step)."""
    e = ident["error"]
    return {"median": float(e.median()), "p90": float(e.quantile(0.9)), "max": float(e.max()), "n": int(len(e))}


@dataclass
class WhatIf:
    plan: dict
    steps: pd.DataFrame        # rank, step, measured_ns, identity_ns, predicted_ns, delta_ns, identity_error
    schedule: Schedule
    durations: np.ndarray
    identity_error: dict

    identity_schedule: Schedule | None = None
    graph: Graph | None = None

    def job_step_ns(self, column: str = "predicted_ns") -> float:
        """Job step time: ``job_step_ns`` of the column."""
        return job_step_ns(self.steps, column)

    def breakdown_delta(self) -> pd.DataFrame:
        """Per rank, mean over steps: each breakdown class (ns) in the identity replay, the
        prediction, and the difference (predicted - identity)."""
        a = breakdown(self.graph, self.identity_schedule).groupby("rank").mean().drop(columns="step")
        b = breakdown(self.graph, self.schedule).groupby("rank").mean().drop(columns="step")
        out = pd.concat({"identity": a, "predicted": b, "delta": b - a}, axis=1)
        out.columns = [f"{c}_{w}_ns" for w, c in out.columns]
        return out.reset_index()


def what_if(g: Graph, plan, sim: Simulator | None = None, typical: np.ndarray | None = None) -> WhatIf:
    """Replay ``plan`` (dict, JSON text path) and compare with the identity replay."""
    plan = load_plan(plan)
    sim = _sim(g, sim)
    ident_sched = sim.run()
    ident = _identity_steps(g, ident_sched)
    dur = apply_plan(g, plan, typical=typical)
    sched = sim.run(dur)
    pred = step_times(g, sched)[["rank", "step", "simulated_ns"]].rename(columns={"simulated_ns": "predicted_ns"})
    steps = ident.rename(columns={"simulated_ns": "identity_ns", "error": "identity_error"}).merge(pred, on=["rank", "step"])
    steps["delta_ns"] = steps["predicted_ns"] - steps["identity_ns"]
    steps = steps[["rank", "step", "measured_ns", "identity_ns", "predicted_ns", "delta_ns", "identity_error"]]
    return WhatIf(plan=plan, steps=steps, schedule=sched, durations=dur, identity_error=error_summary(ident),
                  identity_schedule=ident_sched, graph=g)


def run_plan(store_or_con, plan, run: str | None = None):
    """Any plan on a store: duration plans replay the run's dependency graph (``what_if``: a
    ``WhatIf``); a structural plan (``pipeline``, ``ddp``) regenerates the step with its model
    (``replay.pipeline.predict`` / ``replay.ddp.predict``). Every result has ``.steps`` (rank, step,
    measured_ns, identity_ns, predicted_ns, delta_ns, identity_error), ``.identity_error`` and
    ``.job_step_ns(column)``."""
    plan = load_plan(plan)
    a = plan["actions"][0]
    args = {k: v for k, v in a.items() if k != "action"}
    if a["action"] == "pipeline":
        from . import pipeline
        return pipeline.predict(store_or_con, run, **args)
    if a["action"] == "ddp":
        from . import ddp
        return ddp.predict(store_or_con, run, **args)
    return what_if(build_graph(store_or_con, run=run), plan)


def op_types(g: Graph) -> pd.Series:
    """Per node, its op type for S_t: the communication op (all_reduce, send, ...) for
    communication, else the event category (cpu_op, kernel, gpu_memcpy, ..., gap)."""
    cat = np.asarray(g.categories, dtype=object)[g.category]
    lab = np.asarray(g.labels, dtype=object)[g.label]
    return pd.Series(np.where(g.kind == POST, lab, cat))


def straggler_metrics(g: Graph, sim: Simulator | None = None, top_pct: float = 3.0) -> dict:
    """OSDI'25 what-if metrics (METRICS.md): T (identity), T_ideal (everything typical),
    S = T / T_ideal, waste = 1 - 1/S; per rank S_w = T_ideal^(-w) / T_ideal (all ranks idealised
    but w); per op type S_t = T_ideal^(-t) / T_ideal (every op idealised but those of type t,
    ``op_types``); and the share of the slowdown T - T_ideal that idealising only the worst
    ``top_pct`` % of ranks (by S_w, at least one) recovers, and only the last pipeline stage's ranks
    (pipelines only)."""
    sim = _sim(g, sim)
    typ = typical_durations(g)
    ident = _identity_steps(g, sim.run())
    T = job_step_ns(ident, "simulated_ns")

    def job(dur) -> float:
        return job_step_ns(step_times(g, sim.run(dur)), "simulated_ns")

    def idealised(mask) -> np.ndarray:
        dur = g.dur.copy()
        dur[mask] = typ[mask]
        return dur

    T_ideal = job(typ)
    ranks = sorted(int(r) for r in np.unique(g.rank[g.rank >= 0]))
    per_rank = []
    if len(ranks) > 1:
        for w in ranks:
            t = job(idealised(g.rank != w))
            per_rank.append({"rank": w, "T_ideal_minus_w_ns": t, "S_w": t / T_ideal})
    types = op_types(g).to_numpy()
    per_type = []
    for t in sorted(set(types[g.rank >= 0]) - {"wait", "sync", "comm"}):
        m = types == t
        if not (typ[m] != g.dur[m]).any():
            continue   # idealising this type changes nothing: S_t = 1 by definition
        tt = job(idealised(~m))
        per_type.append({"op_type": t, "T_ideal_minus_t_ns": tt, "S_t": tt / T_ideal})
    per_rank_df = pd.DataFrame(per_rank, columns=["rank", "T_ideal_minus_w_ns", "S_w"])
    slowdown = T - T_ideal
    out = {"run": g.run, "T_ns": T, "T_ideal_ns": T_ideal, "S": T / T_ideal if T_ideal > 0 else float("nan"),
           "per_rank": per_rank_df,
           "per_op_type": pd.DataFrame(per_type, columns=["op_type", "T_ideal_minus_t_ns", "S_t"]),
           "identity_error": error_summary(ident)}
    out["waste"] = 1 - 1 / out["S"] if out["S"] > 0 else float("nan")
    k = max(1, int(np.ceil(len(ranks) * top_pct / 100)))
    worst = per_rank_df.nlargest(k, "S_w")["rank"].tolist() if len(per_rank_df) else ranks[:1]
    t_fix = job(idealised(np.isin(g.rank, worst)))
    out["top_ranks"] = worst
    out["top_ranks_recovered"] = (T - t_fix) / slowdown if slowdown > 0 else float("nan")
    out["last_stage_ranks"], out["last_stage_recovered"] = [], float("nan")
    if g.stages is not None and len(g.stages):
        last = g.stages[g.stages["stage"] == g.stages["stage"].max()]["rank"].astype(int).tolist()
        t_last = job(idealised(np.isin(g.rank, last)))
        out["last_stage_ranks"] = last
        out["last_stage_recovered"] = (T - t_last) / slowdown if slowdown > 0 else float("nan")
    return out


from .job import ReplayRun, run  # noqa: E402 (the replay job builds on what_if and straggler_metrics above)
