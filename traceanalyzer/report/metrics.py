"""Headline numbers of a run, and ``--fail-on`` thresholds over them (for CI).

Each metric is one number per run, defined here once (the JSON report carries them under
``metrics``; docs/metrics.md defines every number of every output beside them). A metric that does not apply to a run (``bubble_pct`` without a pipeline) is None, and
a threshold on it never fails.
"""
from __future__ import annotations

import operator
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..errors import TraceAnalyzerError
from .findings import exposed_comm_per_step, median_step_ns
from .load import RunData
from .record import RANK_KINDS, Finding

#: The what-if slowdown is capped here: a "recoverable" time close to the whole step would divide by ~0.
_MAX_SLOWDOWN_PCT = 10_000.0

#: name -> meaning (the help of --fail-on, and the JSON report's documentation).
METRICS = {
    "step_ms": "median step time (median over steps of the median over ranks), ms",
    "slowdown_pct": "how much longer the median step is than without the rank findings (stragglers, imbalance, slow "
                    "stages): 100 x W / (median step - W), W their recoverable time per step summed (not the replay's "
                    "S = T / T_ideal; see docs/metrics.md)",
    "straggler_pct": "largest recoverable time of a finding that involves a straggler, % of the step (0: none)",
    "slow_host_pct": "largest recoverable time of a slow-host finding (a straggler its host's extra CPU time and wait for a "
                     "core explain), % of the step (0: none)",
    "imbalance_pct": "largest recoverable time of a finding that involves an imbalanced rank, % of the step (0: none)",
    "slow_stage_pct": "largest recoverable time of a slow pipeline stage finding, % of the step (0: none; "
                      "none without a pipeline)",
    "compute_spread_pct": "how much more the busiest rank computes than the mean of the ranks, % (100 x (max/mean - 1))",
    "exposed_comm_pct": "exposed communication (no compute running), mean over ranks, % of the step",
    "exposed_comm_recoverable_pct": "what overlapping it could save (waits and pipeline stalls excluded), % of the step",
    "overlap_pct": "share of communication overlapped with compute, mean over ranks, %",
    "bubble_pct": "measured pipeline bubble (idle share of the step), median over stages and steps, %",
    "recoverable_pct": "recoverable time of all findings together, % of the step",
    "findings": "number of findings",
}

def _f(v) -> float | None:
    return None if v is None or pd.isna(v) else float(v)


def _largest(findings: list[Finding], kind: str) -> float:
    """Largest recoverable % of the findings of ``kind``, merged ones included (0 when none)."""
    return max([f.recoverable_pct for f in findings if kind in [f.kind] + f.also] or [0.0])


def run_metrics(data: RunData, findings: list[Finding]) -> dict:
    step_ns = median_step_ns(data)
    pct = (lambda ns: 100.0 * ns / step_ns) if step_ns and not np.isnan(step_ns) else (lambda ns: None)
    waste = sum(f.recoverable_ns_per_step for f in findings if f.kind in RANK_KINDS)
    slowdown = None
    if step_ns and not np.isnan(step_ns):
        ideal = step_ns - waste
        slowdown = _MAX_SLOWDOWN_PCT if ideal <= 0 else min(100.0 * (step_ns / ideal - 1.0), _MAX_SLOWDOWN_PCT)
    im = data.r("imbalance")
    exp = exposed_comm_per_step(data)
    ov, bub = data.r("overlap"), data.r("pipeline_bubbles")
    return {
        "step_ms": _f(step_ns / 1e6) if step_ns else None,
        "slowdown_pct": _f(slowdown),
        "straggler_pct": _largest(findings, "straggler"),
        "slow_host_pct": _largest(findings, "slow_host"),
        "imbalance_pct": _largest(findings, "imbalance"),
        "slow_stage_pct": _largest(findings, "slow_stage") if not data.r("pipeline_shape").empty else None,
        "compute_spread_pct": _f(100.0 * (im["ratio_to_mean"].max() - 1.0)) if not im.empty else None,
        "exposed_comm_pct": _f(pct(exp["exposed_ns"].median())) if not exp.empty else None,
        "exposed_comm_recoverable_pct": _f(pct(exp["recoverable_ns"].median())) if not exp.empty else None,
        "overlap_pct": _f(ov["overlap_pct"].mean()) if not ov.empty else None,
        "bubble_pct": _f(bub["bubble_pct"].median()) if not bub.empty else None,
        "recoverable_pct": float(sum(f.recoverable_pct for f in findings if not np.isnan(f.recoverable_pct))),
        "findings": len(findings),
    }


# -- --fail-on ----------------------------------------------------------------------------------

_OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt, "==": operator.eq}
_RULE = re.compile(r"^\s*([a-z_]+)\s*(>=|<=|==|>|<)\s*(-?[0-9.]+(?:e-?[0-9]+)?)\s*$")


@dataclass(frozen=True)
class Threshold:
    key: str
    op: str
    value: float

    def __str__(self) -> str:
        return f"{self.key}{self.op}{self.value:g}"


def parse_fail_on(rules: list[str]) -> list[Threshold]:
    """``KEY>VALUE`` (also >=, <, <=, ==) with KEY one of :data:`METRICS`."""
    out = []
    for rule in rules:
        m = _RULE.match(rule)
        if not m:
            raise TraceAnalyzerError(f"--fail-on {rule!r}: expected KEY>VALUE (or >=, <, <=, ==), e.g. slowdown_pct>10")
        if m.group(1) not in METRICS:
            raise TraceAnalyzerError(f"--fail-on {rule!r}: unknown key {m.group(1)}; known: {', '.join(METRICS)}")
        out.append(Threshold(m.group(1), m.group(2), float(m.group(3))))
    return out


def check(metrics_by_run: dict[str, dict], thresholds: list[Threshold]) -> list[str]:
    """One line per threshold crossed, naming the run, the metric, its value and the rule."""
    failures = []
    for run, metrics in metrics_by_run.items():
        for t in thresholds:
            v = metrics.get(t.key)
            if v is not None and _OPS[t.op](v, t.value):
                failures.append(f"run '{run}': {t.key} = {v:.1f} ({t})")
    return failures
