"""Where a finding is and how much it costs, in words every output uses the same way.

Each finding names **where** (rank, pipeline stage, phase, the innermost named range
``record_function`` that holds the excess, op) and **how much** (ms per step and % of the run's
median step -- the one denominator of every percentage in the report, stated once per run, see
``docs/metrics.md``). The analyses already found the location (``result_stragglers.annotation``,
``imbalance_ops``, ``exposed_comm``); this module only reads it back into the finding, so the
text of ``analyze``, the report (HTML, Markdown, JSON) and ``diff`` say the same thing.

Unknown is said as unknown, with why ("no named range recorded"), never as NaN or <NA>.
"""
from __future__ import annotations

import pandas as pd

#: Longest op / range name kept in a one-line location (CUDA kernel names run to hundreds of
#: characters); the result tables keep them whole.
MAX_NAME_CHARS = 80


def known(v) -> bool:
    """False for None, NaN, NA and empty strings."""
    if v is None:
        return False
    try:
        if pd.isna(v):
            return False
    except (TypeError, ValueError):
        pass
    return str(v) != ""


def text(v, unknown: str = "unknown") -> str:
    """``v`` as text, or ``unknown`` (never 'nan' or '<NA>')."""
    return str(v) if known(v) else unknown


def short(name, limit: int = MAX_NAME_CHARS) -> str:
    name = str(name)
    return name if len(name) <= limit else name[:limit - 1] + "…"


def ms(ns) -> str:
    return f"{ns / 1e6:.2f} ms" if known(ns) else "unknown"


def how_much(ns, step_ns) -> str:
    """'15.60 ms per step (38.6% of the median step)': the one way a cost is written."""
    if not known(ns):
        return "unknown per step"
    pct = f" ({100.0 * ns / step_ns:.1f}% of the median step)" if known(step_ns) and step_ns else \
        " (% of the step unknown: no step time recorded)"
    return f"{ms(ns)} per step{pct}"


def denominator(step_ns) -> str:
    """The sentence that states the denominator once per run."""
    if not known(step_ns) or not step_ns:
        return "No step time was recorded (no ProfilerStep ranges): percentages of the step are unknown."
    return (f"Median step {ms(step_ns)} (median over steps of the median over ranks); every '% of the step' "
            f"below is of this time.")


def _row(df: pd.DataFrame, **match) -> dict | None:
    if df is None or df.empty:
        return None
    sel = df
    for k, v in match.items():
        if k not in sel:
            return None
        sel = sel[sel[k] == v]
    return sel.iloc[0].to_dict() if len(sel) else None


def locate(data, f) -> dict:
    """The location of finding ``f`` of run ``data``: rank, stage, phase, annotation, op, step (None
    when unknown) and ``annotation_note`` (why the named range is unknown)."""
    where = {"rank": f.rank, "stage": f.stage, "phase": None, "annotation": None, "op": None, "step": None,
             "annotation_note": None}
    if f.kind == "exposed_comm":
        r = f.evidence_rows[0] if f.evidence_rows else None
        if r:
            where.update(rank=r.get("rank"), step=r.get("step"), op=r.get("op"))
        return where
    s = _row(data.r("stragglers"), rank=f.rank) if f.rank is not None else None
    if s:
        where["phase"] = s.get("phase") if known(s.get("phase")) else None
        if known(s.get("annotation")):
            where["annotation"] = s["annotation"]
        else:
            where["annotation_note"] = "no named range (record_function) recorded in that phase"
    ops = data.r("imbalance_ops")
    if f.rank is not None and ops is not None and not ops.empty:
        mine = ops[(ops["max_rank"] == f.rank) & (ops["category"] == "compute")]
        if len(mine) and f.kind in ("imbalance", "slow_stage"):
            where["op"] = mine.iloc[0]["name"]
    return where


def where_text(where: dict) -> str:
    """'rank 2, forward phase, in the range DistributedDataParallel.forward' (only what is known)."""
    parts = []
    if known(where.get("stage")):
        parts.append(f"stage {int(where['stage'])} (rank {int(where['rank'])})" if known(where.get("rank"))
                     else f"stage {int(where['stage'])}")
    elif known(where.get("rank")):
        parts.append(f"rank {int(where['rank'])}")
    if known(where.get("step")):
        parts.append(f"step {int(where['step'])}")
    if known(where.get("phase")):
        parts.append(f"{where['phase']} phase")
    if known(where.get("annotation")):
        parts.append(f"in the range {short(where['annotation'])}")
    elif where.get("annotation_note") and known(where.get("phase")):
        parts.append(f"named range unknown ({where['annotation_note']})")
    if known(where.get("op")):
        parts.append(f"op {short(where['op'])}")
    return ", ".join(parts) if parts else "the whole run (no single rank)"


def annotate(data, findings, step_ns) -> None:
    """Fill ``where``, ``where_text`` and ``how_much`` of every finding (in place)."""
    for f in findings:
        f.where = locate(data, f)
        f.where_text = where_text(f.where)
        f.how_much = how_much(f.recoverable_ns_per_step, step_ns)
