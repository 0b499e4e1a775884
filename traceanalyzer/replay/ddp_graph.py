"""The DDP step model's graph for the one simulator (``replay.simulate.Simulator``): buckets as
nodes, instead of a simulator of its own (until session 13: a fluid loop in ddp.py; this graph
reproduces its predictions to 0.01 ms on the shipped 25 <-> 4 MB pair).

Per step, every rank is a lane released at its backward start: one node per backward piece (the
compute up to the next gradient, ``ddp._RankStep.work``), a zero-length *resume* node, and the
rest of the step after the optimizer starts (``post``). The process group's buckets are a lane of
their own (gloo runs them one after the other): bucket k waits for its last gradient on every rank
(overlap on) or, overlap off, for the end of every rank's backward and the host's copy of its bytes
(a node before it). Each rank's resume node waits for the last bucket, with the run's resume gap as
the edge's lag (it can be negative: on a shared core the runloop thread records a collective's end
after the main thread resumed), and for its own backward: max(backward end, last bucket + gap).

Shared core (gloo: a rank's compute and the transfers share its core; ``share`` of ``CORE_SHARE``):
while a transfer is in flight, a backward piece runs at 1 - share/2 of its speed and so does the
transfer while any rank computes. A DAG replay has fixed durations, so the durations are solved by
a fixed point: replay, stretch each piece by share/2 x its overlap with the transfers in flight
(and each transfer by its overlap with compute), replay again, until no node moves by more than
``FIXED_POINT_TOL_NS`` (at most ``FIXED_POINT_ITERATIONS``). With share 0 it is one replay.
"""
from __future__ import annotations

import numpy as np

from .graph import merge_intervals
from .graph.model import OP, POST
from .graph.synthetic import GraphSpec
from .simulate import Simulator

#: the shared-core durations are iterated until no node changes by more than this (ns) ...
FIXED_POINT_TOL_NS = 1_000
#: ... or this many replays (each is one Simulator.run on a few hundred nodes)
FIXED_POINT_ITERATIONS = 50


def _overlap(lo: np.ndarray, hi: np.ndarray, iv: np.ndarray) -> np.ndarray:
    """Per interval [lo, hi): its overlap with the union of the intervals ``iv`` (n x 2)."""
    if not len(iv) or not len(lo):
        return np.zeros(len(lo))
    m = merge_intervals(np.asarray(iv, dtype=np.int64))
    return np.clip(np.minimum(hi[:, None], m[None, :, 1]) - np.maximum(lo[:, None], m[None, :, 0]), 0, None).sum(axis=1)


def simulate_step(ranks: list, work: list, ends: list, bbytes: np.ndarray, cost: np.ndarray, overlap: bool,
                  host_ns_per_byte: float, share: float, fin_gap: float, run: str = "ddp"):
    """One step of every rank (``ddp._RankStep``) on the graph. Returns (per rank: backward end,
    resume, predicted step end; per bucket (start, end) of its transfer), times relative to the
    earliest rank's step start, and the number of replays."""
    t0 = min(x.start for x in ranks)
    g = GraphSpec(run)
    pieces, resume, post = [], [], []
    for x, w in zip(ranks, work):
        lane = g.lane(x.rank, int(x.bw0 - t0))
        pieces.append([g.node(lane, int(round(v))) for v in w])
        resume.append(g.node(lane, 0))
        post.append(g.node(lane, int(x.post)))
    comm_lane = g.lane(-1, int(min(x.bw0 for x in ranks) - t0))
    transfers, copies = [], []
    for k, e in enumerate(ends):
        if overlap:
            tr = g.node(comm_lane, int(round(cost[k])), kind=POST)
            for p in pieces:
                g.edge(p[e], tr)
        else:
            cp = g.node(comm_lane, int(round(host_ns_per_byte * bbytes[k])), kind=OP)
            copies.append(cp)
            if k == 0:
                for p in pieces:
                    g.edge(p[-1], cp)
            tr = g.node(comm_lane, int(round(cost[k])), kind=POST)
        transfers.append(tr)
    for r in resume:
        g.edge(transfers[-1], r)
    graph, new = g.build("ddp what-if")
    # the resume gap: a lag on the edge last transfer -> resume (CSR: the incoming edges of each node)
    last = new[transfers[-1]]
    for r in resume:
        d = new[r]
        e = graph.ptr[d] + int(np.flatnonzero(graph.src[graph.ptr[d]:graph.ptr[d + 1]] == last)[0])
        graph.lag[e] = int(round(fin_gap))
    sim = Simulator(graph)
    base = graph.dur.copy()
    piece_idx = np.concatenate([new[np.asarray(p, dtype=np.int64)] for p in pieces])
    tr_idx = new[np.asarray(transfers, dtype=np.int64)]
    dur, iters = base.copy(), 0
    while True:
        sched = sim.run(dur)
        iters += 1
        if not share or iters >= FIXED_POINT_ITERATIONS:
            break
        s, e = sched.start, sched.end
        nxt = base.copy()
        nxt[piece_idx] += np.round(share / 2 * _overlap(s[piece_idx], e[piece_idx],
                                                        np.c_[s[tr_idx], e[tr_idx]])).astype(np.int64)
        nxt[tr_idx] += np.round(share / 2 * _overlap(s[tr_idx], e[tr_idx],
                                                     np.c_[s[piece_idx], e[piece_idx]])).astype(np.int64)
        moved = np.abs(nxt - dur).max() if len(dur) else 0
        dur = (dur + nxt) // 2     # damped: a piece that stops overlapping must not flip back and forth
        if moved <= FIXED_POINT_TOL_NS:
            sched = sim.run(dur)
            break
    bw_end = [float(sched.end[new[p[-1]]]) for p in pieces]
    fin = [float(sched.end[new[r]]) for r in resume]
    pred_end = [float(sched.end[new[p]]) for p in post]
    comm = [(float(sched.start[new[t]]), float(sched.end[new[t]])) for t in transfers]
    return bw_end, fin, pred_end, comm, iters


def simulate(rs: list, cap_mb: float, first_mb: float, overlap: bool, n: int, ab, overlap_rec: bool,
             host_ns_per_byte: float, share: float, fin_gap: float, timeline: list | None):
    """Predicted step time per (rank, step) under one setting (bucket caps, overlap, ``n`` ranks
    for the alpha-beta cost), the buckets (index, bytes, cost); appends to ``timeline`` if given."""
    from .ddp import MIB, assign_buckets
    res, buckets = {}, []
    for step in sorted({x.step for x in rs}):
        ranks = [x for x in rs if x.step == step]
        work = []
        for x in ranks:
            w = x.work.copy()
            if overlap_rec and not overlap:   # no_sync(): no DDP copies into buckets during backward
                rec = np.maximum(np.diff(np.concatenate([[0], x.ready])), 1)
                w = np.maximum(w - x.copy * (w / rec), 0)
            work.append(w)
        sizes = ranks[0].sizes
        ends = assign_buckets(sizes, cap_mb * MIB, first_mb * MIB)
        starts = [0] + [e + 1 for e in ends[:-1]]
        bbytes = np.array([sizes[a:b + 1].sum() for a, b in zip(starts, ends)])
        cost = np.asarray(ab.time_ns("all_reduce", bbytes, n), dtype=float)
        t0 = min(x.start for x in ranks)
        bw_end, fin, pred_end, comm, _ = simulate_step(ranks, work, ends, bbytes, cost, overlap, host_ns_per_byte,
                                                       float(share), fin_gap)
        if not buckets:
            buckets = list(zip(range(len(ends)), bbytes, cost))
        for x, be, f, pe in zip(ranks, bw_end, fin, pred_end):
            res[(x.rank, step)] = pe - (x.start - t0)
            if timeline is not None:
                timeline += [(x.rank, "compute", "before backward", x.start, x.bw0),
                             (x.rank, "compute", "backward", x.bw0, be + t0),
                             (x.rank, "compute", "wait for buckets", be + t0, f + t0),
                             (x.rank, "compute", "optimizer and rest", f + t0, pe + t0)]
                timeline += [(x.rank, "comm", f"all_reduce bucket {k} ({bbytes[k] / MIB:.2f} MiB)", s + t0, e + t0)
                             for k, (s, e) in enumerate(comm)]
    return res, buckets
