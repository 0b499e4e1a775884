"""Critical path of a step across ranks, through the collectives that synchronise them.

HTA's critical path stays inside one rank. Across ranks the question is: which chain of work,
hopping between ranks at synchronisation points, decided when the step ended? We walk it backwards:

1. start on the rank whose step ended last, at its step end;
2. on the current rank, find the latest collective whose last arrival is before the current time
   (the last moment this rank had to wait for someone); the time from that last arrival to the
   current time is the rank's own work and lies on the path;
3. jump to that collective's last arriver, at its arrival time: it is the one the others waited
   for, so the path continues on it; repeat from 2;
4. when no earlier collective exists, the path runs back to the start of the step on that rank.

Each piece of the path is split by what the rank was doing (compute / comm / memory / idle, from
activity.sql's labelled segments), so the result says how much of the step's critical path was
compute on which rank, exposed communication, or idle waiting for the host.
"""
from __future__ import annotations

import bisect

import numpy as np
import pandas as pd

from . import _connect, prepare

_COLS = ["run", "step", "hop", "rank", "lo_ns", "hi_ns", "dur_ns", "via_pg", "via_seq"]


def critical_path(store_or_con, run: str | None = None, step: int | None = None, **params) -> pd.DataFrame:
    """The cross-rank critical path of each step (or of ``step``): one row per hop (a stretch of
    one rank's own time), latest first (hop 0 ends the step)."""
    con = prepare(_connect(store_or_con), **params)
    where, args = _where(run, step)
    steps = con.execute(f"""SELECT run, rank, step, step_start_ns, step_end_ns FROM step_phases WHERE true {where}""", args).df()
    coll = con.execute(f"""SELECT run, step, pg, seq, rank, arrival_ns, last_arrival_ns FROM collective_ranks
                           WHERE n_ranks > 1 AND step IS NOT NULL {where}""", args).df()
    last = con.execute(f"""SELECT run, step, pg, seq, last_arriver FROM collective_instances
                           WHERE n_ranks > 1 AND step IS NOT NULL {where}""", args).df()
    rows = []
    coll_by_step = {k: g for k, g in coll.groupby(["run", "step"], sort=False)}
    last_by_step = {k: g.set_index(["pg", "seq"])["last_arriver"] for k, g in last.groupby(["run", "step"], sort=False)}
    for (run_name, step_no), st in steps.groupby(["run", "step"], sort=True):
        c = coll_by_step.get((run_name, step_no), coll.iloc[0:0])
        l = last_by_step.get((run_name, step_no), pd.Series(dtype="int64"))
        rows += _walk(run_name, int(step_no), st.set_index("rank"), c, l)
    return pd.DataFrame(rows, columns=_COLS)


def _where(run, step):
    where, args = "", {}
    if run is not None:
        where += " AND run = $run"
        args["run"] = run
    if step is not None:
        where += " AND step = $step"
        args["step"] = step
    return where, args


def _walk(run: str, step: int, st: pd.DataFrame, coll: pd.DataFrame, last_arriver: pd.Series) -> list[dict]:
    # per rank: its collectives sorted by last arrival (the moments it was released)
    by_rank = {}
    for rank, g in coll.groupby("rank"):
        g = g.sort_values("last_arrival_ns")
        by_rank[rank] = (g["last_arrival_ns"].to_numpy(), g[["pg", "seq"]].to_numpy(), g["arrival_ns"].to_numpy())
    arrival = {(pg, int(seq), int(r)): int(a) for pg, seq, r, a in
               zip(coll["pg"], coll["seq"], coll["rank"], coll["arrival_ns"])}
    last_arriver = {(pg, int(seq)): int(r) for (pg, seq), r in last_arriver.items()}
    rank = int(st["step_end_ns"].idxmax())
    t = int(st.loc[rank, "step_end_ns"])
    rows, hop, seen = [], 0, set()
    while True:
        releases, keys, _ = by_rank.get(rank, (np.array([]), np.empty((0, 2)), np.array([])))
        i = bisect.bisect_right(releases, t) - 1
        # skip collectives where this rank did not wait (it arrived last itself): keep walking back
        while i >= 0 and last_arriver.get((keys[i][0], int(keys[i][1])), rank) == rank:
            i -= 1
        start = int(st.loc[rank, "step_start_ns"]) if rank in st.index else t
        if i < 0 or (rank, i) in seen:
            rows.append(dict(run=run, step=step, hop=hop, rank=rank, lo_ns=min(start, t), hi_ns=t,
                             dur_ns=max(t - start, 0), via_pg=None, via_seq=None))
            return rows
        seen.add((rank, i))
        release = int(releases[i])
        pg, seq = keys[i]
        rows.append(dict(run=run, step=step, hop=hop, rank=rank, lo_ns=release, hi_ns=t, dur_ns=t - release,
                         via_pg=pg, via_seq=int(seq)))
        hop += 1
        nxt = last_arriver[(pg, int(seq))]
        rank, t = nxt, arrival.get((pg, int(seq), nxt), release)


def critical_path_summary(store_or_con, run: str | None = None, step: int | None = None,
                          path: pd.DataFrame | None = None, **params) -> pd.DataFrame:
    """Time on each step's critical path per rank and activity (compute/comm/memory/idle);
    ``path`` is critical_path()'s result when the caller already has it."""
    con = prepare(_connect(store_or_con), **params) if path is None else _connect(store_or_con)
    if path is None:
        path = critical_path(con, run=run, step=step)
    if path.empty:
        return pd.DataFrame(columns=["run", "step", "rank", "label", "path_ns", "path_pct"])
    con.register("_cp_path", path)
    df = con.execute("""
        WITH seg AS (
            SELECT p.run, p.step, p.rank, a.label,
                   sum(greatest(least(a.hi_ns, p.hi_ns) - greatest(a.lo_ns, p.lo_ns), 0)) AS ns
            FROM _cp_path p JOIN activity_segments a
              ON a.run = p.run AND a.rank = p.rank AND a.step = p.step  -- one step's segments never overlap
             AND a.lo_ns < p.hi_ns AND a.hi_ns > p.lo_ns
            GROUP BY ALL),
        total AS (SELECT run, step, sum(dur_ns) AS path_ns FROM _cp_path GROUP BY ALL),
        covered AS (SELECT run, step, rank, sum(ns) AS ns FROM seg GROUP BY ALL),
        own AS (SELECT run, step, rank, sum(dur_ns) AS ns FROM _cp_path GROUP BY ALL)
        SELECT run, step, rank, label, ns AS path_ns FROM seg
        UNION ALL  -- path time with no recorded activity on that rank at all: host-side idle
        SELECT o.run, o.step, o.rank, 'idle', o.ns - coalesce(c.ns, 0) FROM own o
        LEFT JOIN covered c USING (run, step, rank) WHERE o.ns - coalesce(c.ns, 0) > 0
    """).df()
    con.unregister("_cp_path")
    df = df.groupby(["run", "step", "rank", "label"], as_index=False)["path_ns"].sum()
    totals = path.groupby(["run", "step"])["dur_ns"].sum()
    df["path_pct"] = [100.0 * v / totals.loc[(r, s)] if totals.loc[(r, s)] else 0.0
                      for r, s, v in zip(df["run"], df["step"], df["path_ns"])]
    return df.sort_values(["run", "step", "path_ns"], ascending=[True, True, False]).reset_index(drop=True)
