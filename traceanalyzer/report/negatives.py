"""What was looked for and not found, with the thresholds, so a clean run says so (the report's
"not found" lines), and the note for a rank whose extra compute is not extra work."""
from __future__ import annotations

import pandas as pd

from ..analyses.params import default
from .findings import EXPOSED_COMM_MIN_PCT, exposed_comm_per_step, routing_estimates, routing_min_pct
from .load import RunData
from .record import Finding, ms


def _same_work_ranks(data: RunData) -> list[int]:
    """Ranks above the imbalance thresholds that the analysis found ran the same work as their peers."""
    im = data.r("imbalance")
    if im.empty or "same_work" not in im:
        return []
    same = im["above_thresholds"].fillna(False).astype(bool) & im["same_work"].fillna(False).astype(bool)
    return sorted(int(r) for r in im.loc[same, "rank"])


def _same_work_note(data: RunData, rank: int) -> str:
    """The line the report gives for a rank whose extra compute is not extra work."""
    row = data.r("imbalance").set_index("rank").loc[rank]
    return (f"Rank {rank} computes {float(row['ratio_to_mean']):.2f}x the mean of its peers but runs the same operations "
            f"on the same input shapes: they ran slower (its core: slower, shared or busy with its own threads), not more work, so not an imbalance (a straggler if its peers "
            f"wait for it at least {float(data.params.get('straggler_min_delay_pct', default('straggler_min_delay_pct'))):g}% "
            f"of a step).")


def negatives(data: RunData, findings: list[Finding]) -> list[str]:
    """What was looked for and not found, with the thresholds, so a clean run says so."""
    p = data.params
    kinds = {k for f in findings for k in [f.kind] + f.also}
    out = []
    if "straggler" not in kinds and "slow_host" in kinds:
        out.append("No straggler of the job's own: every rank its peers waited for ran the same work on a slower or "
                   "shared host (the slow-host finding).")
    elif "straggler" not in kinds:
        out.append(f"No straggler found: no rank cost its peers at least {p.get('straggler_min_delay_pct', 10.0):g}% "
                   f"of a step while being at least {p.get('straggler_min_excess_pct', 10.0):g}% of a step slower in a phase "
                   f"or waiting that much longer for a CPU core.")
    if "imbalance" not in kinds:
        out.append(f"No imbalance found: no rank computes at least {p.get('imbalance_min_ratio', 1.1):g}x the mean "
                   f"of the ranks with an excess of at least {p.get('imbalance_min_excess_pct', 5.0):g}% of a step.")
    out += [_same_work_note(data, r) for r in _same_work_ranks(data) if r not in {f.rank for f in findings}]
    out += _routing_notes(data, findings)
    if not data.r("pipeline_shape").empty and "slow_stage" not in kinds:
        out.append(f"No slow pipeline stage found: no stage's own time exceeds the others' by at least "
                   f"{p.get('slow_stage_min_excess_pct', 10.0):g}% of a step.")
    if "exposed_comm" not in kinds:
        line = (f"No exposed communication worth overlapping: no data-parallel collectives issued after the backward "
                f"pass that overlap could hide for at least {EXPOSED_COMM_MIN_PCT:g}% of a step.")
        per = exposed_comm_per_step(data)
        if not per.empty and per["exposed_ns"].median() > 0:
            line += (f" Exposed communication is {ms(per['exposed_ns'].median())} per step and rank (median; waiting for "
                     f"peers {ms(per['wait_ns'].median())}): communication outlasting the compute it runs beside, or "
                     f"needed by the compute right after it (all_to_all) -- faster communication, not more overlap, "
                     f"would shorten it.")
        ov = data.r("overlap")
        if not ov.empty and ov["overlap_pct"].isna().all():
            line += " Its overlap with compute: unknown (an op timeline records no kernels)."
        out.append(line)
    return out


def _routing_notes(data: RunData, findings: list[Finding]) -> list[str]:
    """A rank whose all_to_all traffic is skewed past ``routing_min_ratio`` but whose balancing would
    save less than the finding threshold: said, with both numbers, not reported as a finding."""
    named = {f.rank for f in findings}
    est = routing_estimates(data)
    min_pct = routing_min_pct(data)
    return [f"Rank {int(r.rank)} gets {r.ratio:.2f}x the mean all_to_all traffic (MoE routing skew), but balancing it "
            f"would save {ms(r.rec_ns)} per step ({_pct(r.rec_pct)}; a finding needs {min_pct:g}%): "
            f"not worth acting on."
            for r in est.itertuples() if int(r.rank) not in named and not r.rec_pct >= min_pct]


def _pct(pct: float) -> str:
    return "its share of the step unknown" if pd.isna(pct) else f"{pct:.1f}% of the step"
