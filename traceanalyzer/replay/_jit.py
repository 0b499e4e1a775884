"""The simulator's one sequential loop, compiled with numba when it is installed.

A replay is a max-plus sweep over the graph's heads in topological order: each head starts at
the latest of its release time and its predecessors' ends (plus the fitted lag). That loop cannot
be vectorised (every head may depend on the one before), so in plain Python it costs about 0.4 us
per edge: 1.7 s for the 4 M-node, 128-rank graph of benchmarks/RESULTS.md, and the straggler
metrics replay the graph once per rank. numba (the ``fast`` extra) compiles it to machine code;
without numba, or with ``TRACEANALYZER_NO_NUMBA=1``, the same loop runs in Python and gives the
same integers (tests/test_replay_jit.py compares the two on every shipped run).
"""
from __future__ import annotations

import os

_KERNEL = None     # the compiled sweep, once built; False: numba is not available / switched off


def sweep_kernel():
    """The compiled head sweep, or None where numba is missing or switched off."""
    global _KERNEL
    if os.environ.get("TRACEANALYZER_NO_NUMBA", "") not in ("", "0"):
        return None
    if _KERNEL is None:
        try:
            import numba
        except Exception:  # noqa: BLE001 - missing, or built for another numpy: the Python loop
            _KERNEL = False
        else:
            _KERNEL = numba.njit(cache=True, nogil=True)(_sweep)
    return _KERNEL or None


def _sweep(h_seg, h_a, h_b, h_rel, e_seg, e_src, e_lag, off, seg_start):
    """seg_start[h_seg[i]] = max(h_rel[i], max over edges e in [h_a[i], h_b[i]) of
    seg_start[e_seg[e]] + off[e_src[e]] + e_lag[e]), heads taken in the given (topological) order."""
    for i in range(len(h_seg)):
        t = h_rel[i]
        for e in range(h_a[i], h_b[i]):
            v = seg_start[e_seg[e]] + off[e_src[e]] + e_lag[e]
            if v > t:
                t = v
        seg_start[h_seg[i]] = t
