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

from .graph import Graph, build_graph
from .plans import apply_plan, load_plan, typical_durations
from .simulate import Schedule, Simulator, simulate, step_times

__all__ = ["Graph", "build_graph", "Simulator", "Schedule", "simulate", "step_times", "identity", "what_if",
           "WhatIf", "straggler_metrics", "load_plan", "apply_plan", "typical_durations", "error_summary"]


def _sim(g: Graph, sim: Simulator | None) -> Simulator:
    return sim if sim is not None else Simulator(g)


def identity(g: Graph, sim: Simulator | None = None) -> pd.DataFrame:
    """Identity replay per (rank, step): measured_ns, simulated_ns, error (|sim - meas| / meas)."""
    st = step_times(g, _sim(g, sim).run())
    st["error"] = (st["simulated_ns"] - st["measured_ns"]).abs() / st["measured_ns"]
    return st[["rank", "step", "measured_ns", "simulated_ns", "error"]].sort_values(["step", "rank"]).reset_index(drop=True)


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

    def job_step_ns(self, column: str = "predicted_ns") -> float:
        """Job step time: per step the slowest rank, averaged over steps."""
        return float(self.steps.groupby("step")[column].max().mean())


def what_if(g: Graph, plan, sim: Simulator | None = None, typical: np.ndarray | None = None) -> WhatIf:
    """Replay ``plan`` (dict, JSON text path) and compare with the identity replay."""
    plan = load_plan(plan)
    sim = _sim(g, sim)
    ident = identity(g, sim)
    dur = apply_plan(g, plan, typical=typical)
    sched = sim.run(dur)
    pred = step_times(g, sched)[["rank", "step", "simulated_ns"]].rename(columns={"simulated_ns": "predicted_ns"})
    steps = ident.rename(columns={"simulated_ns": "identity_ns", "error": "identity_error"}).merge(pred, on=["rank", "step"])
    steps["delta_ns"] = steps["predicted_ns"] - steps["identity_ns"]
    steps = steps[["rank", "step", "measured_ns", "identity_ns", "predicted_ns", "delta_ns", "identity_error"]]
    return WhatIf(plan=plan, steps=steps, schedule=sched, durations=dur, identity_error=error_summary(ident))


def straggler_metrics(g: Graph, sim: Simulator | None = None) -> dict:
    """OSDI'25 what-if metrics: T (identity), T_ideal (everything typical), S = T / T_ideal,
    waste = 1 - 1/S, and per rank S_w = T_ideal^(-w) / T_ideal (all ranks idealised but w)."""
    sim = _sim(g, sim)
    typ = typical_durations(g)
    base = what_if(g, {"actions": [{"action": "idealize", "ranks": "all"}]}, sim=sim, typical=typ)
    T = base.job_step_ns("identity_ns")
    T_ideal = base.job_step_ns()
    ranks = sorted(int(r) for r in np.unique(g.rank[g.rank >= 0]))
    per_rank = []
    for w in ranks:
        others = [r for r in ranks if r != w]
        if not others:
            continue
        r = what_if(g, {"actions": [{"action": "idealize", "ranks": others}]}, sim=sim, typical=typ)
        per_rank.append({"rank": w, "T_ideal_minus_w_ns": r.job_step_ns(), "S_w": r.job_step_ns() / T_ideal})
    S = T / T_ideal if T_ideal > 0 else float("nan")
    return {"run": g.run, "T_ns": T, "T_ideal_ns": T_ideal, "S": S, "waste": 1 - 1 / S if S > 0 else float("nan"),
            "per_rank": pd.DataFrame(per_rank), "identity_error": base.identity_error}
