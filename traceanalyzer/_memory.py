"""Big numpy work without transparent huge pages.

numpy asks the kernel for transparent huge pages on every large array (``madvise(MADV_HUGEPAGE)``).
Where the kernel's THP ``defrag`` setting is ``madvise`` (a common default), that makes each first
touch of fresh memory wait for the kernel to compact 2 MB pages. On the 2-core VM of
benchmarks/RESULTS.md a fresh 100 MB int64 array cost 0.35 s to fill instead of 0.06 s, and the
128-rank replay graph build went from 13.6 s to 8.1 s without it. So the heavy whole-array
passes (the replay graph build) run with numpy's huge-page advice off, and put it back after.
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np


def _setter():
    core = getattr(np, "_core", None) or getattr(np, "core", None)
    return getattr(getattr(core, "multiarray", None), "_set_madvise_hugepage", None)


@contextmanager
def small_pages():
    """Run the block with numpy's huge-page advice off (restored after; a no-op where numpy
    has no such switch)."""
    set_hp = _setter()
    if set_hp is None:
        yield
        return
    prev = set_hp(False)
    try:
        yield
    finally:
        set_hp(prev)
