"""The report as one JSON document (for bots and CI): the same content as the HTML, no figures."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from .build import Report
from .metrics import METRICS


def _plain(v):
    """JSON-safe: numpy scalars to Python, NaN to null (JSON has no NaN)."""
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, np.ndarray)):
        return [_plain(x) for x in v]
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return None if math.isnan(v) or math.isinf(v) else float(v)
    if v is pd.NA or v is pd.NaT:
        return None
    return v


def report_dict(report: Report) -> dict:
    runs = []
    for rr in report.runs:
        st = rr.step_times
        runs.append({
            "run": rr.run,
            "shape": rr.shape,
            "step_time_per_rank": [{"rank": int(r.rank), "steps": int(r.steps), "median_ms": r.median_ns / 1e6,
                                    "min_ms": r.min_ns / 1e6, "max_ms": r.max_ns / 1e6,
                                    "compute_ms": r.compute_ns / 1e6} for r in st.itertuples()],
            "findings": [dict(f.to_dict(), order=i) for i, f in enumerate(rr.findings, start=1)],
            "not_found": rr.negatives,
            "caveats": rr.caveats,
            "replay": rr.replay.to_dict(),
            "metrics": rr.metrics,
            "parameters": rr.data.params if rr.data is not None else {},
            "figures": [{"name": f.name, "title": f.title} for f in rr.figures],
            "figure_errors": rr.figure_errors,
        })
    return _plain({**report.versions, "created": report.created, "store": report.store,
                   "metric_definitions": METRICS, "runs": runs})


def to_json(report: Report) -> str:
    return json.dumps(report_dict(report), indent=1)
