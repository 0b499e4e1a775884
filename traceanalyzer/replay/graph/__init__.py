"""The replay dependency graph: traced operations with measured durations, and what each waits for.

Why this shape: a replay must (1) reproduce the recorded timeline when nothing changes and
(2) move work in a believable way when durations change. So every lane (a CPU thread, a GPU
stream, a gloo runloop thread) is a FIFO sequence of nodes in recorded order, and a node starts
when its lane predecessor and all its cross-lane predecessors are done:

    start[i] = max(rel[i], max over incoming edges e (end[src[e]] + lag[e])),  end = start + dur

The lane predecessor is an ordinary edge. ``lag`` holds what the graph cannot explain (launch
latency, gloo dispatch latency): it is fitted per node so that the recorded start is reproduced,
on the binding constraint only (a kernel queued behind a busy stream keeps no latency).

Nodes:
* CPU threads: the top-level work (merged intervals of the thread's events, ProfilerStep excluded)
  cut at every point where a dependency leaves or enters (launch ends, collective enqueues, sync
  calls); the gaps between are GAP nodes, so identity replay reproduces the host's own idle time.
  Where the thread visibly waits (a sync call, a gap that ends right after a collective completes,
  a gloo send/recv span waiting for its peer), the waiting part becomes a WAIT node of duration 0
  and the rest of the work depends on what it waited for.
* GPU streams: every kernel / memcpy / memset, with an edge from its launch (correlation id);
  ``cudaStreamWaitEvent`` adds an edge from the last op launched on another stream.
* Communication (collectives by (pg, seq), p2p by (pg, src, dst, tag, p2p_seq)): on each member
  the execution span is split into ARRIVE (0 ns, at its recorded start) and POST (from the last
  member's arrival to its own end); a virtual SYNC node joins the arrivals. So a collective starts
  when its last member arrives and lasts its transfer time (min end - max arrival, METRICS.md) plus
  the member's own tail.

How it is built: DuckDB does the joins, sorts and group-bys over the store's views, one stage per
module, each a few SQL statements over TEMP tables of the build's own (dropped when it ends):
load.py (events, communication instances, launches, each thread's top-level work), lanes.py (waits,
the cut points of the CPU lanes, the node table), edges.py (the cross-lane edges), finish.py (numpy:
the edge CSR, the fitted lags, a topological order, the steps). model.py holds the Graph record
and the named thresholds.
"""
from __future__ import annotations

import time

import numpy as np
import pandas as pd

from ...store.runs import resolve_run
from .._jit import warm_up
from .edges import make_edges
from .finish import finish
from .lanes import make_lanes
from .load import Scratch, load
from .model import (
    ARRIVE,
    BLOCKING_SYNC_NAME,
    CROSS_THREAD_MIN_GAP_NS,
    GAP,
    GAP_WAIT_MAX_TAIL_NS,
    KERNEL,
    KIND_NAMES,
    LAZY_P2P_TRANSFER_QUANTILE,
    NO_REL,
    OP,
    PIPELINE_VIEWS,
    POST,
    STREAM_WAIT_NAME,
    SYNC,
    WAIT,
    Graph,
    merge_intervals,
)

__all__ = ["ARRIVE", "GAP", "KERNEL", "KIND_NAMES", "NO_REL", "OP", "PIPELINE_VIEWS", "POST", "SYNC", "WAIT",
           "Graph", "build_graph", "merge_intervals"]


def build_graph(store_or_con, run: str | None = None, dask=None, n_workers: int = 1, con=None) -> Graph:
    """Build the replay graph of one run from a store (all ranks). Given a store (a folder or an
    object store's URL), the graph is stitched from per-rank pieces (pieces.py), read from the store
    when saved there by an earlier build of the same data and code, else built per chunk of ranks
    (on the executor: ``dask`` / ``n_workers`` as ``analyze`` takes them) and saved; ``con``, a
    connection over that store already open (a Session's), is used for the run-wide tables instead
    of a new one. Given a connection instead of a store, the graph is built over the whole run's
    events on that one connection (the same graph)."""
    from ...analyses import bind_views, connect
    use_pieces = not hasattr(store_or_con, "execute")
    con = connect(store_or_con) if con is None else con
    # the graph needs the clock offsets (clock_offsets.sql) and, for a pipeline, its stages. Binding
    # every analysis view costs seconds on a big store, so a pipeline binds only PIPELINE_VIEWS, and a
    # connection that has them is used as it is
    have = {v for (v,) in con.execute("SELECT view_name FROM duckdb_views() WHERE temporary").fetchall()}
    bind_views(con, ["clock_offsets", "clock_alignment"])
    run = resolve_run(con, run, where="replay", table="steps", what="runs with steps")
    if use_pieces:
        from .pieces import build as build_pieces
        g = build_pieces(store_or_con, con, run, _params(run), dask=dask, n_workers=n_workers,
                         stages=lambda: _stages(con, run, have))
    else:
        g = _build(con, run)
        g.stages = _stages(con, run, have)
    g.source = con
    return g


def _stages(con, run: str, have: set) -> pd.DataFrame | None:
    """The pipeline stages of ``run`` (rank, stage; no rows: not a pipeline; None: no pipeline views)."""
    from ...analyses import prepare
    empty = pd.DataFrame({"rank": np.zeros(0, np.int32), "stage": np.zeros(0, np.int64)})
    if "pipeline_stages" not in have:
        # pipeline_stages only has rows for runs with sends (the first send orders the stages)
        (sends,) = con.execute("SELECT count(*) FROM comms WHERE run = $run AND op = 'send'", {"run": run}).fetchall()[0]
        if not sends:
            return empty
        prepare(con, modules=PIPELINE_VIEWS)
    try:
        return con.execute("SELECT rank, stage FROM pipeline_stages WHERE run = $run ORDER BY stage, rank",
                           {"run": run}).df()
    except Exception:  # noqa: BLE001 - no pipeline views: not a pipeline
        return None


def _params(run: str) -> dict:
    """The build's SQL parameters (the named thresholds, the node kinds)."""
    return {"run": run, "tail_ns": GAP_WAIT_MAX_TAIL_NS, "min_gap_ns": CROSS_THREAD_MIN_GAP_NS,
            "sync_name": BLOCKING_SYNC_NAME, "transfer_q": LAZY_P2P_TRANSFER_QUANTILE, "stream_wait": STREAM_WAIT_NAME,
            "OP": OP, "GAP": GAP, "KERNEL": KERNEL, "ARRIVE": ARRIVE, "POST": POST, "SYNC": SYNC}


def _build(con, run: str) -> Graph:
    t0 = time.perf_counter()
    (events,) = con.execute("SELECT count(*) FROM events WHERE run = $run", {"run": run}).fetchone()
    warm_up(events)  # numba loads its kernels in a thread while DuckDB works (not for a small run)
    s = Scratch(con, _params(run))
    phases = {}
    try:
        for name, step in (("load", load), ("lanes", make_lanes), ("edges", make_edges)):
            t = time.perf_counter()
            out = step(s)
            phases[name] = round(time.perf_counter() - t, 3)
        t = time.perf_counter()
        g = finish(s, *out)
        phases["finish"] = round(time.perf_counter() - t, 3)
    finally:
        s.close()
    # load_s: reading the store (the events, comms and steps tables); build_s: the rest
    g.stats.update(load_s=phases["load"], build_s=time.perf_counter() - t0 - phases["load"], phases_s=phases)
    return g
