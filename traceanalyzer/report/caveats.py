"""Caveats: what the report cannot know or had to correct, said once per run above its findings.

Unknown is shown as unknown: a message size the trace does not record (no ``record_shapes``) or a
process group neither the trace nor a Flight Recorder dump names is NULL in the store, ``n/a`` in
tables, and a caveat here, so that a reader does not take a missing number for a zero. A CPU/GPU
clock offset found by the launch statistics (``launch_stats.clock_offset_reason``) is said here too.
"""
from __future__ import annotations

import pandas as pd

_COUNTS = """
SELECT count(*) FILTER (WHERE op IS DISTINCT FROM 'barrier') AS sized_ops,
       count(*) FILTER (WHERE in_bytes IS NULL AND op IS DISTINCT FROM 'barrier') AS size_unknown,
       count(*) FILTER (WHERE NOT is_p2p) AS collectives,
       count(*) FILTER (WHERE pg_name IS NULL AND NOT is_p2p) AS group_unknown,
       list(DISTINCT rank ORDER BY rank) FILTER (WHERE in_bytes IS NULL AND op IS DISTINCT FROM 'barrier') AS size_ranks,
       list(DISTINCT rank ORDER BY rank) FILTER (WHERE pg_name IS NULL AND NOT is_p2p) AS group_ranks
FROM comms WHERE run = $run
"""


def run_caveats(con, run: str, launch_stats: pd.DataFrame | None = None) -> list[str]:
    """One line per caveat of ``run`` (empty when the report knows everything it shows)."""
    out: list[str] = []
    c = con.execute(_COUNTS, {"run": run}).df().iloc[0]
    if c["size_unknown"]:
        out.append(f"Message sizes unknown for {int(c['size_unknown']):,} of {int(c['sized_ops']):,} communication ops "
                   f"(rank(s) {_ranks(c['size_ranks'])}; the trace was recorded without record_shapes?): their bytes and "
                   "bandwidth are n/a, not 0, and size-based checks leave them out.")
    if c["group_unknown"]:
        out.append(f"Process group unknown for {int(c['group_unknown']):,} of {int(c['collectives']):,} collectives "
                   f"(rank(s) {_ranks(c['group_ranks'])}; no Flight Recorder dump, and the trace names none): they are "
                   "matched across ranks by order only.")
    if launch_stats is not None and "clock_offset_reason" in launch_stats:
        for r in launch_stats[launch_stats["clock_offset_reason"].notna()].itertuples():
            out.append(f"Rank {int(r.rank)}: {r.clock_offset_reason}. Corrected by it, the median launch delay "
                       f"is {r.corrected_median_launch_delay_ns / 1e3:.1f} us; GPU times compared with CPU times on this "
                       "rank are off by that much.")
    return out


def _ranks(values) -> str:
    from ..ingest.batch import format_ranges
    return format_ranges([int(v) for v in (values if values is not None else [])])


def shared_host_caveat(ranks: pd.DataFrame, replayed: bool) -> list[str]:
    """What-ifs of a CPU-only run with several ranks on one host: the ranks share its cores, so a
    rank's slowdown changes its core-mates' speed (a sleeping rank leaves them its core; a busy one
    takes it), and the idle ranks' transfers run faster while they wait. The replay keeps every
    rank's recorded durations and cannot know that: on 4-8 ranks on 2 cores, "idealise the culprit"
    missed the clean re-run by up to ~30 % for this reason alone (``benchmarks/accuracy.py``'s
    contention check). Said only when the report shows a what-if (``replayed``)."""
    from ..replay.pipeline_host import shared_cpu_hosts
    shared = shared_cpu_hosts(ranks) if replayed else {}
    if not shared:
        return []
    where = ", ".join(f"{len(r)} on {h or 'an unnamed host'}" for h, r in shared.items())
    return [f"Ranks share a host's CPUs with no accelerator ({where}): one rank's slowdown speeds up or slows its "
            "core-mates, which the what-ifs (replayed with every rank's recorded durations) cannot know; on 4-8 ranks "
            "on 2 cores they missed real re-runs by up to ~30 % for this alone."]


def host_cpu_caveat(host_cpu: pd.DataFrame | None) -> list[str]:
    """Ranks that waited for a CPU core (the collector's schedstat samples, ``host_cpu`` result;
    ``contended``: at least ``host_cpu_wait_min_pct`` of the step, median): one line per host, since
    every per-rank time of the report (compute, phases, who arrived last) includes that wait. None
    for a run recorded without samples (unknown, not 0) or whose ranks did not wait."""
    if host_cpu is None or host_cpu.empty:
        return []
    out = []
    for host, g in host_cpu.sort_values("rank").groupby("host", dropna=False, sort=True):
        hit = g[g["contended"].fillna(False).astype(bool)]
        if hit.empty:
            continue
        cpus = g["cpu_count"].dropna()
        cores = f"{int(cpus.max())} cores" if len(cpus) else "n/a cores"
        where = f"{len(g)} rank{'s' if len(g) > 1 else ''} on {cores} of host {host if isinstance(host, str) and host else 'n/a'}"
        usable = g["cores"].dropna()
        if len(usable) and len(cpus) and usable.max() < cpus.max():
            where += f", each allowed {' or '.join(str(n) for n in sorted(set(usable.astype(int))))}"
        line = (f"Ranks waited for a CPU core {g['wait_pct'].median():.1f} % of their step (median; {where}): per-rank "
                "timings include that contention")
        if len(hit) < len(g):
            line += " (waited most: " + ", ".join(f"rank {int(r.rank)} {r.wait_pct:.1f} %" for r in hit.itertuples()) + ")"
        out.append(line + ".")
    return out
