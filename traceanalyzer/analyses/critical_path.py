"""Critical path of a step across ranks, through the collectives and the point-to-point
transfers that synchronise them.

HTA's critical path stays inside one rank. Across ranks the question is: which chain of work,
hopping between ranks at synchronisation points, decided when the step ended? We walk it backwards:

1. start on the rank whose step ended last, at its step end;
2. on the current rank, find the latest synchronisation point released before the current time
   at which this rank waited for another one:
   * a collective whose last arrival is before the current time and whose last arriver is
     another rank (collectives.sql), or
   * a receive that returned before the current time and whose send was posted after the
     receive (p2p.sql: the receiver waited for the sender, as a pipeline stage waits for the
     activations of the stage before it or the gradients of the stage after it);
   the time from that release to the current time is the rank's own work and lies on the path;
3. jump to the rank waited for (the collective's last arriver, the receive's sender) at the moment
   it arrived (its arrival at the collective, the posting of its send): the work it did before
   that decided the release, so the path continues on it; repeat from 2;
4. when no earlier synchronisation point exists, the path runs back to the start of the step on
   that rank.

All times are on the aligned clock (each rank's clock plus its applied clock_offsets.offset_ns,
as collectives.sql and p2p.sql use): with a rank's clock off by seconds, mixing the two would
put the whole path on one rank.

Each piece of the path is split by what the rank was doing (compute / comm / memory / idle, from
activity.sql's labelled segments), so the result says how much of the step's critical path was
compute on which rank, exposed communication, or idle waiting for the host.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from . import connect, prepare

_COLS = ["run", "step", "hop", "rank", "lo_ns", "hi_ns", "dur_ns", "via_op", "via_pg", "via_seq"]


#: the analysis views the walk reads
_VIEWS = ("step_phases", "collective_ranks", "collective_instances", "p2p_transfers", "activity_segments")


def critical_path(store_or_con, run: str | None = None, step: int | None = None, **params) -> pd.DataFrame:
    """The cross-rank critical path of each step (or of ``step``): one row per hop (a stretch of
    one rank's own time), latest first (hop 0 ends the step)."""
    con = prepare(connect(store_or_con), views=_VIEWS, **params)
    where, args = _where(run, step)
    # every time on the aligned clock (collective_ranks and p2p_transfers add clock_offsets already)
    steps = con.execute(f"""SELECT p.run, p.rank, p.step, p.step_start_ns + coalesce(o.offset_ns, 0) AS step_start_ns,
                                   p.step_end_ns + coalesce(o.offset_ns, 0) AS step_end_ns
                            FROM step_phases p LEFT JOIN clock_offsets o ON o.run = p.run AND o.rank = p.rank
                            WHERE true {_where(run, step, 'p.')[0]}
                            ORDER BY p.run, p.step, p.rank""", args).df()  # ties of the latest end: the lowest rank
    rows = []
    # one run at a time, its synchronisation points streamed in (step, rank, release, next arrival)
    # order (a total order: the same path whatever order the rows came in), one step's rows in
    # memory at a time: a step of thousands of ranks has millions, the run hundreds of millions
    for run_name, st_run in steps.groupby("run", sort=True):
        by_step = {int(k): v for k, v in st_run.groupby("step", sort=True)}
        paths = {}
        for step_no, sync in _sync_by_step(con, run_name, step):
            if step_no in by_step:  # (a step with no step_phases row has no end to start from)
                paths[step_no] = _walk(run_name, step_no, by_step[step_no], sync)
        for step_no, st in by_step.items():  # no synchronisation point: the path is the step
            rows += paths[step_no] if step_no in paths else _walk(run_name, step_no, st, _NO_SYNC)
    return pd.DataFrame(rows, columns=_COLS)


_SYNC_COLS = ["rank", "release_ns", "next_rank", "next_ns", "via_op", "via_pg", "via_seq"]
_NO_SYNC = pd.DataFrame({c: pd.Series(dtype="int64" if c in ("rank", "release_ns", "next_rank", "next_ns", "via_seq")
                                      else "object") for c in _SYNC_COLS})
#: rows fetched at a time from the ordered synchronisation points
_BATCH_ROWS = 1 << 17


def _sync_by_step(con, run: str, step: int | None):
    """(step, its synchronisation points sorted by rank, release, next arrival) of ``run``, in step
    order: where each rank waited (collectives it did not arrive last at, receives posted before
    their send), read in batches so that one step's rows, not the run's, are in memory."""
    where, args = _where(run, step)
    reader = con.sql(f"""
        SELECT r.step, r.rank, r.last_arrival_ns AS release_ns, i.last_arriver AS next_rank,
               l.arrival_ns AS next_ns, i.op AS via_op, r.pg AS via_pg, r.seq AS via_seq
        FROM collective_ranks r JOIN collective_instances i USING (run, pg, seq)
        JOIN collective_ranks l ON l.run = r.run AND l.pg = r.pg AND l.seq = r.seq AND l.rank = i.last_arriver
        WHERE r.n_ranks > 1 AND r.step IS NOT NULL AND i.last_arriver <> r.rank {_where(run, step, 'r.')[0]}
        UNION ALL
        SELECT step, dst_rank, recv_release_ns, src_rank, send_arrival_ns, 'recv', pg, p2p_seq
        FROM p2p_transfers WHERE step IS NOT NULL AND recv_wait_ns > 0 {where}
        ORDER BY step, rank, release_ns, next_ns, next_rank, via_pg, via_seq, via_op""", params=args
    ).to_arrow_reader(_BATCH_ROWS)
    held, held_step = [], None
    for batch in reader:
        steps = batch.column(0).to_numpy(zero_copy_only=False)
        cuts = np.flatnonzero(steps[1:] != steps[:-1]) + 1
        for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(steps)]):
            if lo == hi:
                continue
            if held and int(steps[lo]) != held_step:
                yield held_step, _frame(held)
                held = []
            held_step = int(steps[lo])
            held.append(batch.slice(lo, hi - lo))
    if held:
        yield held_step, _frame(held)


def _frame(batches) -> pd.DataFrame:
    return pa.Table.from_batches(batches).drop_columns(["step"]).to_pandas()


def _where(run, step, prefix: str = ""):
    where, args = "", {}
    if run is not None:
        where += f" AND {prefix}run = $run"
        args["run"] = run
    if step is not None:
        where += f" AND {prefix}step = $step"
        args["step"] = step
    return where, args


def _walk(run: str, step: int, st: pd.DataFrame, sync: pd.DataFrame) -> list[dict]:
    """The path of one step; ``sync`` sorted by (rank, release_ns, next_ns)."""
    ranks_of = sync["rank"].to_numpy(np.int64)
    release, nxt = sync["release_ns"].to_numpy(np.int64), sync["next_ns"].to_numpy(np.int64)
    next_rank = sync["next_rank"].to_numpy(np.int64)
    uniq, first = np.unique(ranks_of, return_index=True)
    bounds = dict(zip(uniq.tolist(), zip(first.tolist(), np.r_[first[1:], len(ranks_of)].tolist())))
    start_of = dict(zip(st["rank"].astype("int64").tolist(), st["step_start_ns"].astype("int64").tolist()))
    end_ns = st["step_end_ns"].to_numpy()
    rank = int(st["rank"].iloc[int(np.argmax(end_ns))])   # first rank with the latest end (as idxmax)
    t = int(end_ns.max())
    rows, hop, seen = [], 0, set()
    while True:
        lo, hi = bounds.get(rank, (0, 0))
        i = int(np.searchsorted(release[lo:hi], t, "right")) - 1
        start = start_of.get(rank, t)
        if i < 0 or (rank, i) in seen:
            rows.append(dict(run=run, step=step, hop=hop, rank=rank, lo_ns=min(start, t), hi_ns=t,
                             dur_ns=max(t - start, 0), via_op=None, via_pg=None, via_seq=None))
            return rows
        seen.add((rank, i))
        x = sync.iloc[lo + i]
        x_release = int(release[lo + i])
        rows.append(dict(run=run, step=step, hop=hop, rank=rank, lo_ns=x_release, hi_ns=t, dur_ns=t - x_release,
                         via_op=x["via_op"], via_pg=str(x["via_pg"]), via_seq=int(x["via_seq"])))
        hop += 1
        rank, t = int(next_rank[lo + i]), min(int(nxt[lo + i]), x_release)


def critical_path_summary(store_or_con, run: str | None = None, step: int | None = None,
                          path: pd.DataFrame | None = None, **params) -> pd.DataFrame:
    """Time on each step's critical path per rank and activity (compute/comm/memory/idle);
    ``path`` is critical_path()'s result when the caller already has it."""
    con = prepare(connect(store_or_con), views=_VIEWS, **params) if path is None else connect(store_or_con)
    if path is None:
        path = critical_path(con, run=run, step=step)
    if path.empty:
        return pd.DataFrame(columns=["run", "step", "rank", "label", "path_ns", "path_pct"])
    con.register("_cp_path", path)
    # the path's ranks as a constant filter: the saved segments' row groups of other ranks are skipped
    # by their statistics (at 8,192 ranks a join alone read every rank's segments)
    ranks = ", ".join(str(int(r)) for r in sorted(set(path["rank"])))
    df = con.execute(f"""
        WITH seg AS (
            SELECT p.run, p.step, p.rank, a.label,
                   sum(greatest(least(a.hi_ns, p.hi_ns) - greatest(a.lo_ns, p.lo_ns), 0)) AS ns
            FROM _cp_path p JOIN (  -- the segments on the path's aligned clock
                SELECT a.* REPLACE (a.lo_ns + coalesce(o.offset_ns, 0) AS lo_ns, a.hi_ns + coalesce(o.offset_ns, 0) AS hi_ns)
                FROM activity_segments a LEFT JOIN clock_offsets o ON o.run = a.run AND o.rank = a.rank
                WHERE a.rank IN ({ranks})) a
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
    return df.sort_values(["run", "step", "path_ns", "rank", "label"],
                          ascending=[True, True, False, True, True]).reset_index(drop=True)
