"""The replay's sequential loops, compiled with numba when it is installed.

A replay is a max-plus sweep over the graph's heads in topological order: each head starts at
the latest of its release time and its predecessors' ends (plus the fitted lag). That loop cannot
be vectorised (every head may depend on the one before), so in plain Python it costs about 0.4 us
per edge: 1.7 s for the 4 M-node, 128-rank graph of benchmarks/RESULTS.md, and the straggler
metrics replay the graph once per rank. numba (the ``fast`` extra) compiles it to machine code;
without numba, or with ``TRACEANALYZER_NO_NUMBA=1``, the same loop runs in Python and gives the
same integers (tests/test_replay_graph.py compares the two on shipped runs). The topological
order's key repair (graph/finish.py topo_order) is the other sequential sweep compiled the same
way (the same loop in Python without numba).
"""
from __future__ import annotations

import os
import threading

import numpy as np

#: Graphs with fewer nodes than this are replayed by the plain-Python loops unless numba is already
#: loaded in the process: importing numba and loading the cached kernels costs about 0.9 s of CPU
#: (0.55 s wall) in every process, while in Python the key repair costs ~1.6 us per node and pass
#: and a replay ~0.2 us per node (2-core VM): below this size Python is cheaper for a build and a
#: few what-ifs (a 4-rank shipped run's report: ~1 s less CPU). The results are the same integers
#: either way (tests/test_replay_graph.py).
JIT_MIN_NODES = 100_000

_COMPILED: dict = {}   # name -> the compiled function, or False where numba is not available
_LOCK = threading.RLock()
_WARM: list = []       # the thread that warms the kernels up (at most one per process)


def _off() -> bool:
    return os.environ.get("TRACEANALYZER_NO_NUMBA", "") not in ("", "0")


def _python_is_cheaper(name: str, n_nodes: int | None) -> bool:
    """A graph of ``n_nodes`` (None: unknown, taken as large) is below JIT_MIN_NODES and kernel
    ``name`` is not compiled in this process yet."""
    return n_nodes is not None and n_nodes < JIT_MIN_NODES and not _COMPILED.get(name)


def warm_up(n_nodes: int | None = None):
    """Start loading numba and the compiled kernels in a background thread (once per process),
    unless a graph of ``n_nodes`` (or fewer: the run's event count is an upper bound) is small
    enough for the Python loops (JIT_MIN_NODES).

    Why: importing numba and loading a kernel from its on-disk cache take about 0.55 s, the same
    in every process. graph.build_graph calls this first, so the loading runs while DuckDB reads
    the store (DuckDB works without the GIL); the kernels' first use then finds them ready."""
    if _off() or _python_is_cheaper("_sweep", n_nodes):
        return
    with _LOCK:
        if _WARM:
            return
        t = threading.Thread(target=_load_kernels, name="traceanalyzer-numba-warm-up", daemon=True)
        _WARM.append(t)
    t.start()


def _load_kernels():
    try:
        repair, sweep = _compiled(_repair_keys), _compiled(_sweep)
        i = np.zeros(0, np.int64)
        if repair is not None:
            repair(np.zeros(1), np.zeros(1, np.int64), np.zeros(2, np.int64), i, 1)
        if sweep is not None:
            sweep(i, i, i, i, i, i, i, i, i)
    except Exception:  # noqa: BLE001 - a failure shows again (and is handled) where the kernel is used
        pass


def _compiled(fn):
    """``fn`` compiled by numba (cached on disk), or None where numba is missing or switched off."""
    if _off():
        return None
    name = fn.__name__
    with _LOCK:                     # the warm-up thread and the caller: one import, one dispatcher
        if name not in _COMPILED:
            try:
                import numba
            except Exception:  # noqa: BLE001 - missing, or built for another numpy: the Python/numpy path
                _COMPILED[name] = False
            else:
                try:
                    _COMPILED[name] = numba.njit(cache=True, nogil=True)(fn)
                except RuntimeError:   # no writable cache location: compile in each process instead
                    _COMPILED[name] = numba.njit(nogil=True)(fn)
        return _COMPILED[name] or None


def sweep_kernel(n_nodes: int | None = None):
    """The compiled head sweep, or None where numba is missing or switched off, or the graph has
    ``n_nodes`` < JIT_MIN_NODES and numba is not loaded yet (the Python loop is cheaper)."""
    return None if _python_is_cheaper("_sweep", n_nodes) else _compiled(_sweep)


def repair_kernel(n_nodes: int | None = None):
    """The topological-key repair (graph/finish.py topo_order): compiled, else (no numba, or a
    small graph, as for :func:`sweep_kernel`) the same loop in Python."""
    if _python_is_cheaper("_repair_keys", n_nodes):
        return _repair_keys
    return _compiled(_repair_keys) or _repair_keys


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


def _repair_keys(key, order, ptr, src, max_passes):
    """Raise key[d] to key[s] + 2^-8 wherever an in-edge s -> d has key[s] >= key[d], visiting the
    nodes in ``order`` (the recorded order, so most sources come first), pass after pass until a
    pass changes nothing. Returns the number of passes that changed a key, or -1 when
    ``max_passes`` did not settle it (a cycle, or a very long chain of backward edges)."""
    eps = 0.5 ** 8
    for it in range(max_passes):
        changed = False
        for i in range(len(order)):
            d = order[i]
            kd = key[d]
            for e in range(ptr[d], ptr[d + 1]):
                ks = key[src[e]]
                if ks >= kd:
                    kd = ks + eps
                    changed = True
            key[d] = kd
        if not changed:
            return it
    return -1
