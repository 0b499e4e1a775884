"""What a finding is: the :class:`Finding` record, its kinds, their titles and precedence, and how
its durations read (:func:`ms`). The analyses' findings are made in :mod:`.findings`, the host's
part in :mod:`.hosts`."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import pandas as pd

#: Finding kinds that name a slow rank (what a what-if idealises, what slows the step).
RANK_KINDS = ("straggler", "slow_host", "imbalance", "slow_stage")

#: Which cause wins when one rank is flagged by several analyses (higher = more specific).
SPECIFICITY = {"straggler": 0, "imbalance": 1, "slow_stage": 2}

TITLES = {"straggler": "Straggler", "slow_host": "Slow host", "imbalance": "Imbalance", "slow_stage": "Slow pipeline stage",
           "exposed_comm": "Exposed communication", "structural": "Structural imbalance"}


@dataclass
class Finding:
    """One ranked finding. Every string may contain text from the trace: escape it when rendering."""
    kind: str                          # straggler, imbalance, slow_stage, exposed_comm
    title: str
    recoverable_ns_per_step: float
    recoverable_pct: float             # of the median step time
    summary: str
    rank: int | None = None
    stage: int | None = None
    evidence: list[str] = field(default_factory=list)
    evidence_rows: list[dict] = field(default_factory=list)   # a small table (exposed intervals, ...)
    also: list[str] = field(default_factory=list)             # kinds merged into this one
    recoverable_source: str = "estimate"   # "replay" (a what-if's saving, see whatif.py) or "estimate" (the analyses')
    estimate_ns_per_step: float | None = None   # the analyses' estimate, when replay replaced it
    replay: dict | None = None             # the what-if (status, plan, ranks, saving_ns_per_step, identity_error, ...)
    where: dict = field(default_factory=dict)   # rank, stage, phase, annotation, op, step (None: unknown); where.py
    where_text: str = ""                   # the same in words: 'rank 2, forward phase, in the range slow_rank_delay'
    how_much: str = ""                     # '15.60 ms per step (38.6% of the median step)'
    cpu_wait_ns_per_step: float | None = None   # its rank's wait for a CPU core per step (host_cpu); None: unknown

    def to_dict(self) -> dict:
        return asdict(self)


def ms(ns) -> str:
    return "unknown" if ns is None or pd.isna(ns) else f"{ns / 1e6:.2f} ms"
