"""Deterministic replay of a Graph: every node starts when its predecessors are done and its lane
is free; each lane keeps its recorded order.

Why chains: most nodes (CPU work between two dependency points, a stream's kernels launched long
ahead) depend only on their lane predecessor. Such a node cannot change its lane neighbour's
relative position, so a maximal run of them behind a *head* node (one with a cross-lane edge, a
release time or a fitted lane lag) is simulated as one segment: the head's start is computed event
by event in topological order (a loop over heads only, compiled by numba where it is installed:
_jit.py), the members' times by one vectorised cumulative sum. The result is the same as a
node-by-node discrete-event sweep with FIFO lanes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._jit import sweep_kernel
from .graph import NO_REL, Graph


@dataclass
class Schedule:
    """Simulated start/end per node (ns, on the recorded clock)."""
    start: np.ndarray
    end: np.ndarray


class Simulator:
    """Precomputes the segment structure of a graph once; ``run(dur)`` replays any durations."""

    def __init__(self, graph: Graph):
        g = graph
        n = g.n
        if len(g.src):
            first_edge = np.minimum(g.ptr[:-1], len(g.src) - 1)    # (clipped: nodes without edges are heads)
            only_lane = np.diff(g.ptr) == 1
            only_lane &= g.is_lane_edge[first_edge]
            only_lane &= g.lag[first_edge] == 0
            only_lane &= g.rel == NO_REL
            # a chain member's lane predecessor is the node just before it (lanes are contiguous)
            only_lane[1:] &= g.src[first_edge[1:]] == np.arange(n - 1)
        else:
            only_lane = np.zeros(n, bool)
        if n:
            only_lane[0] = False
        self.is_head = ~only_lane
        self.seg_of = np.cumsum(self.is_head) - 1
        self.heads = np.flatnonzero(self.is_head)
        self.graph = g
        order_heads = g.order[self.is_head[g.order]]
        self._h_seg = self.seg_of[order_heads]
        self._h_a = g.ptr[order_heads]
        self._h_b = g.ptr[order_heads + 1]
        self._h_rel = g.rel[order_heads]
        self._e_seg = self.seg_of[g.src]
        self._e_src = np.asarray(g.src, dtype=np.int64)
        self._e_lag = np.asarray(g.lag, dtype=np.int64)
        self._lists = None       # the same as Python lists, for the loop without numba (made once)

    @property
    def n_heads(self) -> int:
        return len(self.heads)

    def run(self, dur: np.ndarray | None = None) -> Schedule:
        g = self.graph
        dur = g.dur if dur is None else np.asarray(dur, dtype=np.int64)
        cs = np.cumsum(dur)
        base = cs[self.heads] - dur[self.heads]
        off = cs - base[self.seg_of]     # end offset of each node from its segment's start
        kernel = sweep_kernel(len(dur))
        if kernel is not None:
            seg_start = np.zeros(len(self.heads), dtype=np.int64)
            kernel(self._h_seg, self._h_a, self._h_b, self._h_rel, self._e_seg, self._e_src, self._e_lag, off,
                   seg_start)
        else:
            seg_start = self._sweep_python(off.tolist())
        end = seg_start[self.seg_of] + off
        return Schedule(start=end - dur, end=end)

    def _sweep_python(self, off: list) -> np.ndarray:
        if self._lists is None:
            self._lists = [a.tolist() for a in (self._h_seg, self._h_a, self._h_b, self._h_rel,
                                                 self._e_seg, self._e_src, self._e_lag)]
        h_seg, h_a, h_b, h_rel, e_seg, e_src, e_lag = self._lists
        seg_start = [0] * len(self.heads)
        for s, a, b, t in zip(h_seg, h_a, h_b, h_rel):
            for e in range(a, b):
                v = seg_start[e_seg[e]] + off[e_src[e]] + e_lag[e]
                if v > t:
                    t = v
            seg_start[s] = t
        return np.asarray(seg_start, dtype=np.int64)


def simulate(graph: Graph, dur: np.ndarray | None = None) -> Schedule:
    """One replay (builds a Simulator; keep one yourself to replay many plans)."""
    return Simulator(graph).run(dur)


def step_times(graph: Graph, sched: Schedule):
    """Simulated step time per (rank, step) beside the recorded one."""
    st = graph.steps.copy()
    t0 = np.where(st["start_uses_end"], sched.end[st["start_node"]], sched.start[st["start_node"]])
    t1 = np.where(st["end_uses_end"], sched.end[st["end_node"]], sched.start[st["end_node"]])
    if "gpu_nodes" in st:   # the GPU work the step launched may end after the CPU left the step
        tail = np.array([sched.end[n].max() if len(n) else np.iinfo(np.int64).min for n in st["gpu_nodes"]],
                        dtype=np.int64)
        t1 = np.maximum(t1, tail)
    st["simulated_ns"] = t1 - t0
    st["sim_start_ns"], st["sim_end_ns"] = t0, t1
    return st


def job_step_ns(steps, column: str) -> float:
    """Job step time: per rank the mean over its steps (its window's span / steps: a rank's steps
    are contiguous, so work that a change moves across a step boundary cancels out), then the
    slowest rank. The mean over steps of the per-step maximum would count boundary jitter as time."""
    return float(steps.groupby("rank")[column].mean().max())
