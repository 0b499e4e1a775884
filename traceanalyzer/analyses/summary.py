"""``traceanalyzer info``: what a store holds, per run and per rank."""
from __future__ import annotations

import os

import pandas as pd

from ..store import open_store

_PER_RANK = """
WITH ev AS (
    SELECT run, rank, count(*) AS events,
           count(*) FILTER (WHERE kind IN ('compute_kernel', 'comm_kernel')) AS kernels,
           count(*) FILTER (WHERE kind = 'comm_kernel') AS comm_kernels
    FROM events GROUP BY run, rank),
st AS (SELECT run, rank, count(*) AS steps, min(step) AS first_step, max(step) AS last_step,
              median(dur_ns) / 1e6 AS median_step_ms
       FROM steps GROUP BY run, rank),
co AS (SELECT run, rank, count(*) FILTER (WHERE NOT is_p2p) AS collectives,
              count(*) FILTER (WHERE is_p2p) AS p2p,
              -- unknown is unknown: a rank with any op of unknown size (no record_shapes) has unknown bytes
              count(*) FILTER (WHERE in_bytes IS NULL AND op IS DISTINCT FROM 'barrier') AS size_unknown,
              count(*) FILTER (WHERE pg_name IS NULL AND NOT is_p2p) AS group_unknown,
              CASE WHEN size_unknown = 0 THEN sum(in_bytes) END AS comm_bytes
       FROM comms GROUP BY run, rank),
rk AS (SELECT run, rank, count(*) AS windows, any_value(host) AS host, any_value(backend) AS backend,
              any_value(device) AS device, any_value(world_size) AS world_size,
              min(start_ts_ns) AS start_ts_ns, max(end_ts_ns) AS end_ts_ns, sum(n_skipped) AS skipped
       FROM ranks GROUP BY run, rank)
SELECT rk.run, rk.rank, rk.windows, rk.host, rk.backend, rk.device, rk.world_size,
       coalesce(st.steps, 0) AS steps, st.first_step, st.last_step, st.median_step_ms,
       ev.events, ev.kernels, ev.comm_kernels, coalesce(co.collectives, 0) AS collectives,
       coalesce(co.p2p, 0) AS p2p,
       CASE WHEN co.rank IS NULL THEN 0 ELSE co.comm_bytes END AS comm_bytes,
       coalesce(co.size_unknown, 0) AS size_unknown, coalesce(co.group_unknown, 0) AS group_unknown, rk.skipped,
       (rk.end_ts_ns - rk.start_ts_ns) / 1e9 AS span_s
FROM rk LEFT JOIN ev USING (run, rank) LEFT JOIN st USING (run, rank) LEFT JOIN co USING (run, rank)
ORDER BY rk.run, rk.rank
"""


def info(store: str | os.PathLike) -> pd.DataFrame:
    """One row per (run, rank): windows, steps, events, kernels, collectives, bytes, time span."""
    con = open_store(store)
    try:
        df = con.sql(_PER_RANK).df()
        from . import prepare
        prepare(con, modules=("clock_offsets",))  # what the analyses do with each rank's clock
        off = con.sql("SELECT run, rank, estimated_offset_ns, applied AS clock_offset_applied, offset_ns AS clock_offset_ns "
                      "FROM clock_offsets").df()
        return df.merge(off, on=["run", "rank"], how="left")
    finally:
        con.close()


def format_info(df: pd.DataFrame, store: str) -> str:
    if df.empty:
        return f"{store}: empty store"
    lines = [f"store {store}"]
    for run, g in df.groupby("run", sort=True):
        span = g["span_s"].max()
        lines.append(f"run '{run}': {len(g)} rank(s), world size {_first(g['world_size'])}, backend {_first(g['backend'])}, "
                     f"device {_first(g['device'])}, {int(g['windows'].sum())} trace file(s), "
                     f"{int(g['events'].sum()):,} events, {int(g['kernels'].sum()):,} kernels, "
                     f"{int(g['collectives'].sum()):,} collectives, {int(g['p2p'].sum()):,} p2p ops, time span {span:.3f} s")
        cols = ["rank", "windows", "steps", "first_step", "last_step", "median_step_ms", "events", "kernels",
                "collectives", "p2p", "comm_bytes", "skipped"]
        table = g[cols].astype({"skipped": "int64"})
        table["comm_bytes"] = [_count_or_na(v) for v in g["comm_bytes"]]
        lines.append(table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
        for col, what, why in (("size_unknown", "message size", "recorded without record_shapes?"),
                               ("group_unknown", "process group", "no Flight Recorder dump and no group in the trace")):
            n = int(g[col].sum())
            if n:
                lines.append(f"note: {n:,} communication op(s) with unknown {what} ({why}); comm_bytes "
                             "n/a where any size is unknown" if col == "size_unknown" else
                             f"note: {n:,} collective(s) with unknown {what} ({why})")
        if "clock_offset_ns" in g:
            from .clocks import clock_note
            offs = g[g["estimated_offset_ns"].notna()].rename(columns={"clock_offset_applied": "applied",
                                                                        "clock_offset_ns": "offset_ns"})
            lines.append(clock_note(offs, g["median_step_ms"].median() * 1e6, g["host"].nunique()))
    return "\n".join(lines)


def _count_or_na(value) -> str:
    """An integer count, or 'n/a' when unknown (NULL): unknown is never shown as 0."""
    return "n/a" if value is None or pd.isna(value) else f"{int(value)}"


def _first(series):
    values = [v for v in series.dropna().unique()]
    return values[0] if len(values) == 1 else ("/".join(map(str, values)) if values else "?")
