"""The job's shape, as the report's summary states it: ranks, process groups, steps, the
pipeline layout when one is detected, and the step time of every rank."""
from __future__ import annotations

import pandas as pd

from .load import RunData


def _none_if_na(v):
    return None if v is None or (not isinstance(v, (list, tuple)) and pd.isna(v)) else v


def job_shape(data: RunData) -> dict:
    """Plain values (JSON-ready): what ran, on how many ranks, for how many steps."""
    ph = data.r("phases")
    r = data.ranks
    shape = {
        "run": data.run,
        "ranks": [int(x) for x in r["rank"]],
        "world_size": _none_if_na(int(r["world_size"].max())) if r["world_size"].notna().any() else None,
        "backend": _none_if_na(r["backend"].dropna().iloc[0]) if r["backend"].notna().any() else None,
        "devices": sorted({str(d) for d in r["device"].dropna()}),
        "hosts": sorted({str(h) for h in r["host"].dropna() if str(h)}),
        "process_groups": [{"pg_name": g.pg_name, "pg_desc": g.pg_desc,
                            "size": None if pd.isna(g.pg_size) else int(g.pg_size),
                            "ranks": [int(x) for x in g.pg_ranks] if g.pg_ranks is not None else None}
                           for g in data.groups.itertuples()],
        "steps": sorted(int(s) for s in ph["step"].dropna().unique()) if not ph.empty else [],
        "pipeline": None,
    }
    sh = data.r("pipeline_shape")
    if not sh.empty:
        s = sh.iloc[0]
        bub = data.r("pipeline_bubbles")
        stages = (bub.groupby("stage")["rank"].first().astype(int).to_dict() if not bub.empty else {})
        # PP x DP: one pipeline per connected component of the p2p graph (its smallest rank is its id)
        pipelines = ({int(pid): {int(k): int(v) for k, v in g.groupby("stage")["rank"].first().items()}
                      for pid, g in bub.groupby("pipeline_id")} if not bub.empty and "pipeline_id" in bub else {})
        if pipelines:
            stages = pipelines[min(pipelines)]
        shape["pipeline"] = {"stages": int(s.n_stages), "stages_per_rank": int(s.stages_per_rank),
                             "microbatches": float(s.microbatches), "schedule": s.schedule,
                             "theoretical_bubble_pct": float(s.theoretical_bubble_pct),
                             "measured_bubble_pct": float(bub["bubble_pct"].median()) if not bub.empty else None,
                             "stage_to_rank": {int(k): v for k, v in stages.items()},
                             "pipelines": pipelines or {0: {int(k): v for k, v in stages.items()}}}
    from ..analyses.clocks import clock_note
    ph_steps = ph["step_ns"].median() if not ph.empty else None
    shape["clocks"] = clock_note(data.r("clock_offsets"), ph_steps, len(shape["hosts"]) or None)
    cp = data.r("critical_path_summary")
    if not cp.empty:  # saved by a full `analyze` only (see load.REQUIRED)
        top = cp.groupby(["rank", "label"])["path_ns"].sum().sort_values(ascending=False)
        shape["critical_path"] = [{"rank": int(r), "label": lab, "pct": float(100.0 * v / top.sum())}
                                  for (r, lab), v in top.head(3).items()]
    return shape


def step_times(data: RunData) -> pd.DataFrame:
    """Per rank: median, min and max step time (ns) and its compute per step (median, ns)."""
    ph = data.r("phases")
    if ph.empty:
        return pd.DataFrame(columns=["rank", "steps", "median_ns", "min_ns", "max_ns", "compute_ns"])
    out = ph.groupby("rank")["step_ns"].agg(steps="count", median_ns="median", min_ns="min", max_ns="max")
    tb = data.r("temporal_breakdown")
    tb = tb[tb["step"].notna()] if not tb.empty else tb
    out["compute_ns"] = tb.groupby("rank")["compute_ns"].median() if not tb.empty else float("nan")
    return out.reset_index()
