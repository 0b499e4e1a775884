"""What the analyses did with the ranks' clocks, in one line (``info`` and the report say it).

The offsets are estimated and applied by ``sql/clock_offsets.sql``; an applied offset longer
than the median step is called out: the clocks disagreed by more than a step, which no real
clock drift does within a job -- a trace's ``baseTimeNanoseconds`` was off (a shifted or
hand-edited trace). The analyses still run on the aligned clock, so their findings hold.
"""
from __future__ import annotations

import pandas as pd


def clock_note(offsets: pd.DataFrame, median_step_ns: float | None, n_hosts: int | None = None) -> str:
    """``offsets``: one run's rows of the clock_offsets analysis (rank, estimated_offset_ns, applied, offset_ns)."""
    if offsets is None or offsets.empty:
        return "clock offsets: unknown (n/a: no collective seen on two ranks); none applied"
    applied = offsets[offsets["applied"].fillna(False).astype(bool)]
    if applied.empty:
        largest = offsets["estimated_offset_ns"].abs().max()
        where = "one host" if n_hosts == 1 else "not evident"
        return f"clock offsets: not applied ({where}; largest estimate {largest / 1e6:,.3f} ms)"
    parts = [f"rank {int(r.rank)} {r.offset_ns / 1e6:+,.3f} ms" for r in applied.sort_values("rank").itertuples()]
    line = "clock offsets applied" + (" (one host)" if n_hosts == 1 else "") + ": " + ", ".join(parts)
    worst = applied["offset_ns"].abs().max()
    if median_step_ns and median_step_ns == median_step_ns and worst > median_step_ns:
        line += (f"; more than a step ({median_step_ns / 1e6:,.3f} ms): a trace's clock (baseTimeNanoseconds) was "
                 "off, the analyses use the aligned clock")
    return line
