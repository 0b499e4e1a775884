"""Big numpy work with fewer page faults: no transparent huge-page advice, freed memory kept.

Two settings cost the 128-rank replay graph build (benchmarks/RESULTS.md) seconds on a 2-core VM,
and both only matter for passes over arrays of hundreds of MB:

* numpy asks the kernel for transparent huge pages on every large array
  (``madvise(MADV_HUGEPAGE)``). Where the kernel's THP ``defrag`` setting is ``madvise`` (a common
  default), each first touch of fresh memory then waits for the kernel to compact 2 MB pages: a
  fresh 100 MB int64 array cost 0.35 s to fill instead of 0.06 s, and the build went from 13.6 s
  to 8.1 s without it.
* glibc hands every array over 128 KiB-32 MiB back to the kernel when it is freed (``munmap``, or
  trimming the heap top), so the next array of that size faults its pages in again: about 2.8 us
  per 4 KiB page on that VM, 2.3 s of the build's kernel time. Inside the block freed memory
  stays in the process heap (``mallopt``: no mmap, no trimming) and the next array reuses it;
  on leaving, glibc's defaults come back and ``malloc_trim`` returns what is free.

``array_workspace()`` does both for the block (nested uses count once; a no-op where numpy has no
such switch or the C library is not glibc). ``TRACEANALYZER_KEEP_MALLOC=1`` leaves malloc alone.
"""
from __future__ import annotations

import ctypes
import os
import threading
from contextlib import contextmanager

import numpy as np

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4          # glibc's mallopt parameters (malloc.h)
_GLIBC_TRIM_DEFAULT, _GLIBC_MMAP_MAX_DEFAULT = 128 * 1024, 65536
_lock = threading.Lock()
_depth = 0


def _setter():
    core = getattr(np, "_core", None) or getattr(np, "core", None)
    return getattr(getattr(core, "multiarray", None), "_set_madvise_hugepage", None)


def _glibc():
    if os.environ.get("TRACEANALYZER_KEEP_MALLOC", "") not in ("", "0"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version            # glibc only (musl, macOS: leave malloc alone)
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except (OSError, AttributeError):
        return None


_LIBC = _glibc()


@contextmanager
def small_pages():
    """Only numpy's huge-page advice off for the block (restored after): for short passes that
    should not pay ``array_workspace``'s final trim (a replay)."""
    set_hp = _setter()
    if set_hp is None:
        yield
        return
    prev = set_hp(False)
    try:
        yield
    finally:
        set_hp(prev)


@contextmanager
def array_workspace():
    """Run the block with numpy's huge-page advice off and freed memory kept for reuse (see the
    module docstring); malloc's defaults come back when the last open such block ends."""
    global _depth
    with _lock:
        _depth += 1
        if _depth == 1 and _LIBC is not None:
            _LIBC.mallopt(_M_MMAP_MAX, 0)
            _LIBC.mallopt(_M_TRIM_THRESHOLD, 2 ** 31 - 1)
    try:
        with small_pages():
            yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _LIBC is not None:
                _LIBC.mallopt(_M_MMAP_MAX, _GLIBC_MMAP_MAX_DEFAULT)
                _LIBC.mallopt(_M_TRIM_THRESHOLD, _GLIBC_TRIM_DEFAULT)
                _LIBC.malloc_trim(0)
