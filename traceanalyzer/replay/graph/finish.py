"""Stage 4 of the build: the Graph record from the node table and the edges (array work).

The incoming-edge CSR (each node's lane edge first, then its cross edges by source), the lags
fitted so that the recorded start is reproduced, a topological order, and the steps (their first
and last node on the rank's main thread, and the GPU work each step launched).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ...errors import TraceAnalyzerError
from .._jit import repair_kernel
from .load import Scratch
from .model import ARRIVE, NO_REL, OP, POST, SYNC, WAIT, Graph


def _np(col) -> np.ndarray:
    return np.array(col.to_numpy(), dtype=np.int64) if len(col) else np.zeros(0, np.int64)


def _codes(col, override=None) -> tuple[np.ndarray, list]:
    """A string column as (int32 codes numbered by first appearance, their strings); ``override``
    (mask, string): the string of the masked rows. A dictionary-encoded column (the graph's pieces,
    pieces.py) is renumbered without decoding its strings: the same codes and strings."""
    if not len(col):
        return np.zeros(0, np.int32), []
    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    if pa.types.is_dictionary(col.type) and not any(c.null_count for c in chunks):
        u = pa.chunked_array(chunks, type=col.type).unify_dictionaries()
        values = u.chunk(0).dictionary.to_pylist() if u.num_chunks else []
        idx = np.concatenate([c.indices.to_numpy(zero_copy_only=False).astype(np.int64) for c in u.chunks])
        if override is not None:
            mask, s = override
            if s not in values:
                values.append(s)
            idx[mask] = values.index(s)
        used, first = np.unique(idx, return_index=True)
        order = used[np.argsort(first, kind="stable")]       # dictionary entries in order of first appearance
        remap = np.empty(len(values), np.int32)
        remap[order] = np.arange(len(order), dtype=np.int32)
        return remap[idx], [values[i] for i in order]
    if pa.types.is_dictionary(col.type):
        col = pc.cast(col, pa.string())
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if override is not None:
        col = pc.if_else(pa.array(override[0]), override[1], col)
    d = pc.dictionary_encode(pc.fill_null(col, ""))
    return d.indices.to_numpy().astype(np.int32), d.dictionary.to_pylist()


def _ranges(n, lo, hi) -> np.ndarray:
    """Node indices of every range [lo, hi) (in range order)."""
    cnt = np.maximum(hi - lo, 0)
    return np.repeat(lo - np.cumsum(cnt) + cnt, cnt) + np.arange(int(cnt.sum()))


_STEPS = """
SELECT s.rank, s.step, s.dur_ns AS measured_ns, s.start, a.base, a.np, a.k AS ks, b.k AS ke
FROM {st} s JOIN {main} m ON m.rank = s.rank
JOIN {pt} a ON a.rank = s.rank AND a.tid = m.tid AND a.t = s.start
JOIN {pt} b ON b.rank = s.rank AND b.tid = m.tid AND b.t = s."end"
ORDER BY s.rank, s.step"""

# the GPU work of each step: the GPU-lane kernels and collectives that start between the step's
# CPU start and the next step's (the CPU leaves a step as soon as it has launched its work)
_GPU_WORK = """
WITH s AS ({steps}),
g AS (SELECT n.node, n.rank, n.ms, n.me FROM {nd} n JOIN {lanes} l ON l.lane = n.lane
      WHERE l.type = 'gpu' AND n.kind IN ($KERNEL, $POST))
SELECT s.rank, s.step, list(g.node ORDER BY g.node) AS nodes, max(g.me) - s.start AS tail_ns
FROM g ASOF JOIN (SELECT DISTINCT rank, step, start FROM s) s ON s.rank = g.rank AND g.ms >= s.start
GROUP BY s.rank, s.step, s.start"""


def finish(s: Scratch, edges, waits, posts) -> Graph:
    nd = s.arrow("SELECT * FROM {nd}")         # made in node order (lanes.py): read back as it is
    lanes = s.query("SELECT lane, rank, tid, is_gpu, type FROM {lanes} ORDER BY lane").df()
    st, work = step_tables(s)
    instances = s.query("SELECT inst, key, op, bytes, is_p2p, n_ranks, transfer_ns FROM {inst} ORDER BY inst").df()
    return assemble(s.params["run"], nd, (_np(edges["src"]), _np(edges["dst"])),
                    (_np(waits["first"]), _np(waits["tgt"]), _np(waits["src"])),
                    (_np(posts["lo"]), _np(posts["hi"]), _np(posts["inst"])), lanes, st, work, instances)


def step_tables(s: Scratch):
    """(each step's cut points on its rank's main thread: rank, step, measured_ns, start, base, np, ks,
    ke; the GPU work of each step: rank, step, nodes, tail_ns), as DataFrames."""
    return s.query(_STEPS).df(), s.query(_GPU_WORK.replace("{steps}", _STEPS)).df()


def assemble(run: str, nd, edges, waits, posts, lanes, st, work, instances) -> Graph:
    """The Graph from the node table ``nd`` (Arrow: node, lane, rank, ms, me, kind, label, category,
    inst, child), the cross edges (src, dst), the waits (first, tgt, src), the CPU-lane POST ranges (lo, hi,
    inst) as int64 arrays, and the lanes, step and instance tables (DataFrames)."""
    n = nd.num_rows
    node = _np(nd["node"])
    if (node != np.arange(n)).any():            # the connection did not preserve insertion order
        nd = nd.take(pa.array(np.argsort(node)))
    ms, me = _np(nd["ms"]), _np(nd["me"])
    kind = _np(nd["kind"]).astype(np.int8)
    inst = _np(nd["inst"])
    # a collective on the CPU lane: the part after its last arrival is its POST
    p_lo, p_hi, p_inst = posts[0], posts[1] + 1, posts[2]
    idx = _ranges(n, p_lo, p_hi)
    kind[idx] = POST
    inst[idx] = np.repeat(p_inst, p_hi - p_lo)
    # waits: their nodes become WAIT (duration 0) and the node after depends on what was waited for.
    # A wait inside another instance's POST wins: gloo p2p spans stay open on the caller thread
    # until the work is waited for, so a send's span holds the time its thread then waited for a
    # recv's peer to arrive -- waiting, not the send's own transfer (which a faster peer shortens)
    w_first, w_tgt, w_src = waits
    r = w_first < w_tgt
    kind[_ranges(n, w_first[r], w_tgt[r])] = WAIT
    dur = me - ms
    dur[(kind == WAIT) | (kind == ARRIVE) | (kind == SYNC)] = 0
    lane = _np(nd["lane"]).astype(np.int32)
    xs = np.concatenate([edges[0], w_src])
    xd = np.concatenate([edges[1], w_tgt])
    ptr, src, is_lane = _csr(n, lane, xs, xd)
    lag, rel = _fit_lags(ms, dur, ptr, src)
    label, labels = _codes(nd["label"])
    category, categories = _codes(nd["category"], override=(kind == WAIT, "wait"))
    child = np.minimum(_np(nd["child"]), np.maximum(dur, 0)) if "child" in nd.column_names else np.zeros(n, np.int64)
    child[kind != OP] = 0
    return Graph(run=run, ms=ms, me=me, dur=dur, child=child, lane=lane, rank=_np(nd["rank"]).astype(np.int32),
                 kind=kind, label=label, category=category, inst=inst, rel=rel, ptr=ptr, src=src, lag=lag,
                 is_lane_edge=is_lane, order=topo_order(ms, kind, src, n, is_lane, ptr), labels=labels,
                 categories=categories, lanes=lanes, steps=_steps(st, work), instances=instances)


def _csr(n, lane, xs, xd):
    """Incoming edges by destination: the lane edge first (from the node before, same lane), then
    the cross edges by source, without self loops, duplicates or repeats of the lane edge."""
    same = np.zeros(n, bool)
    if n > 1:
        same[1:] = (lane[1:] == lane[:-1]) & (lane[1:] >= 0)
    lane_prev = np.where(same, np.arange(n) - 1, -1)
    keep = (xs != xd) & (xs >= 0) & (xd >= 0)
    xs, xd = xs[keep], xd[keep]
    o = np.lexsort((xs, xd))
    xs, xd = xs[o], xd[o]
    keep = np.r_[True, (xs[1:] != xs[:-1]) | (xd[1:] != xd[:-1])] if len(xs) else np.zeros(0, bool)
    keep &= lane_prev[xd] != xs
    xs, xd = xs[keep], xd[keep]
    cnt = np.bincount(xd, minlength=n) + same
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(cnt, out=ptr[1:])
    src = np.empty(int(ptr[-1]), dtype=np.int64)
    is_lane = np.zeros(len(src), dtype=bool)
    lane_pos = ptr[:-1][same]
    src[lane_pos] = lane_prev[same]
    is_lane[lane_pos] = True
    rank_in_node = np.arange(len(xd)) - np.searchsorted(xd, xd, side="left")
    src[ptr[xd] + same[xd] + rank_in_node] = xs
    return ptr, src, is_lane


def _fit_lags(ms, dur, ptr, src):
    """Per edge, the slack between the destination's recorded start and its latest predecessor's
    recorded end: a latency after whatever binds (>= 0 on every edge, so it follows the binding
    constraint in a what-if), or, where a predecessor ended after the node started (a kernel
    starting inside its cudaLaunchKernel), the overlap, on the edges that overran it only. Nodes
    without an incoming edge start at their recorded time (``rel``)."""
    n = len(ms)
    cnt = np.diff(ptr)
    has_in = cnt > 0
    end = (ms + dur)[src]
    max_e = np.full(n, np.iinfo(np.int64).min)
    if len(src):
        max_e[has_in] = np.maximum.reduceat(end, ptr[:-1][has_in])
    start = np.repeat(ms, cnt)
    lag = start - np.repeat(max_e, cnt)
    over = lag < 0
    lag[over] = np.minimum(start[over] - end[over], 0)
    return lag, np.where(has_in, NO_REL, ms)


def _steps(st: pd.DataFrame, work: pd.DataFrame) -> pd.DataFrame:
    last = st["np"].to_numpy(np.int64) - 1
    base, ks, ke = (st[c].to_numpy(np.int64) for c in ("base", "ks", "ke"))
    out = pd.DataFrame({"rank": st["rank"].astype(np.int64), "step": st["step"].astype(np.int64),
                        "measured_ns": st["measured_ns"].astype(np.int64),
                        "start_node": base + np.where(ks < last, ks, ks - 1), "start_uses_end": ks >= last,
                        "end_node": base + np.where(ke >= last, ke - 1, ke), "end_uses_end": ke >= last})
    gpu_nodes = [np.zeros(0, np.int64)] * len(out)
    if len(work):
        where = {(r, t): i for i, (r, t) in enumerate(zip(out["rank"], out["step"]))}
        measured = out["measured_ns"].to_numpy().copy()
        for r, t, nodes, tail in zip(work["rank"], work["step"], work["nodes"], work["tail_ns"]):
            i = where[(int(r), int(t))]
            gpu_nodes[i] = np.asarray(nodes, dtype=np.int64)
            measured[i] = max(measured[i], int(tail))
        out["measured_ns"] = measured
    out["gpu_nodes"] = gpu_nodes
    return out


def topo_order(ms, kind, src, n, is_lane, ptr) -> np.ndarray:
    """A topological order: by recorded start (ties: arrivals, then waits, then SYNC, then the rest).

    Why a repair: a few edges run backwards in recorded time (a kernel that starts inside its own
    cudaLaunchKernel, clock noise between ranks), so the recorded order alone is not always
    topological. Each node gets a key (its rank in recorded order); while some edge has key[src] >=
    key[dst], the destination's key is raised just above its source's (one compiled sweep per pass,
    _jit._repair_keys, in Python without numba; violations are local, so few passes). Kahn's
    algorithm where that does not settle (a cycle: an error)."""
    prio = np.select([kind == ARRIVE, kind == WAIT, kind == SYNC], [0, 1, 2], 3).astype(np.int8)
    order = np.lexsort((prio, ms))
    if len(src) == 0:
        return order
    key = np.empty(n, dtype=np.float64)
    key[order] = np.arange(n, dtype=np.float64)
    passes = repair_kernel(n)(key, order, ptr, src, 200)
    if passes >= 0:
        return order if passes == 0 else np.argsort(key, kind="stable")
    key[order] = np.arange(n, dtype=np.float64)
    return _kahn(key, src, np.repeat(np.arange(n), np.diff(ptr)), n)


def _kahn(key, src, dst, n) -> np.ndarray:
    import heapq
    indeg = np.bincount(dst, minlength=n)
    o = np.argsort(src, kind="stable")
    out_ptr = np.searchsorted(src[o], np.arange(n + 1)).tolist()
    out_dst = dst[o].tolist()
    keyl = key.tolist()
    deg = indeg.tolist()
    heap = [(keyl[i], i) for i in np.flatnonzero(indeg == 0).tolist()]
    heapq.heapify(heap)
    out = []
    while heap:
        _, i = heapq.heappop(heap)
        out.append(i)
        for j in out_dst[out_ptr[i]:out_ptr[i + 1]]:
            deg[j] -= 1
            if deg[j] == 0:
                heapq.heappush(heap, (keyl[j], j))
    if len(out) != n:
        raise TraceAnalyzerError(f"replay: the dependency graph has a cycle ({n - len(out)} nodes unreachable)")
    return np.asarray(out, dtype=np.int64)
