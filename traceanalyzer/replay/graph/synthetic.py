"""Graphs that a structural plan generates (a pipeline schedule, DDP buckets), for the one
simulator (``replay.simulate.Simulator``) to run, instead of a simulator of their own.

A ``GraphSpec`` collects lanes (one per rank: nodes run in the order given, each after the one
before) and virtual nodes (no lane: a message between ranks, its duration the transfer), with edges
between any two nodes; ``build()`` lays the nodes out lane after lane, makes the incoming-edge CSR
and a topological order (an error naming the plan where it has a cycle: the plan deadlocks), and
returns a Graph whose recorded times are unknown (ms = me = 0; each lane released at its start).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ...errors import TraceAnalyzerError
from .finish import _csr, _kahn
from .model import NO_REL, OP, POST, Graph


class GraphSpec:
    def __init__(self, run: str):
        self.run = run
        self.lane_of: list[int] = []       # per node (in the order added): lane, or -1
        self.dur: list[int] = []
        self.kind: list[int] = []
        self.rank: list[int] = []
        self.release: dict[int, int] = {}  # lane -> its first node's start
        self.lane_rank: list[int] = []
        self.src: list[int] = []
        self.dst: list[int] = []

    def lane(self, rank: int, start_ns: int) -> int:
        self.lane_rank.append(rank)
        self.release[len(self.lane_rank) - 1] = int(start_ns)
        return len(self.lane_rank) - 1

    def node(self, lane: int, dur_ns: int, kind: int = OP) -> int:
        """A node at the end of ``lane`` (-1: a virtual node, e.g. a message)."""
        self.lane_of.append(lane)
        self.dur.append(int(dur_ns))
        self.kind.append(kind if lane >= 0 else POST)
        self.rank.append(self.lane_rank[lane] if lane >= 0 else -1)
        return len(self.dur) - 1

    def edge(self, src: int, dst: int) -> None:
        self.src.append(src)
        self.dst.append(dst)

    def build(self, what: str) -> tuple[Graph, np.ndarray]:
        """(the Graph, the Graph's node index of each node in the order added)."""
        lane = np.asarray(self.lane_of, dtype=np.int64)
        n = len(lane)
        # lanes first, in lane order, each in the order its nodes were added; virtual nodes last
        pos = np.lexsort((np.arange(n), np.where(lane < 0, np.iinfo(np.int64).max, lane)))
        new = np.empty(n, dtype=np.int64)
        new[pos] = np.arange(n)
        lane_g = lane[pos].astype(np.int32)
        xs, xd = new[np.asarray(self.src, dtype=np.int64)], new[np.asarray(self.dst, dtype=np.int64)]
        ptr, src, is_lane = _csr(n, lane_g, xs, xd)
        first = np.r_[True, lane_g[1:] != lane_g[:-1]] & (lane_g >= 0) if n else np.zeros(0, bool)
        rel = np.full(n, NO_REL, dtype=np.int64)
        rel[first] = [self.release[int(x)] for x in lane_g[first]]
        try:
            order = _kahn(np.arange(n, dtype=np.float64), src, np.repeat(np.arange(n), np.diff(ptr)), n)
        except TraceAnalyzerError:
            raise TraceAnalyzerError(f"{what}: the schedule deadlocks (an action waits for one that never runs); "
                                     "check the schedule and micro-batch count") from None
        zeros = np.zeros(n, dtype=np.int64)
        kind = np.asarray(self.kind, dtype=np.int8)[pos]
        g = Graph(run=self.run, ms=zeros, me=zeros.copy(), dur=np.asarray(self.dur, dtype=np.int64)[pos],
                  child=zeros.copy(), lane=lane_g,
                  rank=np.asarray(self.rank, dtype=np.int32)[pos], kind=kind, label=np.zeros(n, np.int32),
                  category=np.zeros(n, np.int32), inst=np.full(n, -1, np.int64), rel=rel, ptr=ptr, src=src,
                  lag=np.zeros(len(src), np.int64), is_lane_edge=is_lane, order=order, labels=[what],
                  categories=[what], lanes=pd.DataFrame({"lane": np.arange(len(self.lane_rank)), "rank": self.lane_rank,
                                                         "tid": -1, "is_gpu": False, "type": "plan"}),
                  steps=pd.DataFrame(), instances=pd.DataFrame())
        return g, new

