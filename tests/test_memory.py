"""_memory.array_workspace: inside, freed arrays stay in the process for reuse (no page faults for
the next array of that size); after the outermost block, the memory goes back to the system and
numpy's huge-page advice is what it was."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from traceanalyzer import _memory

pytestmark = pytest.mark.skipif(_memory._LIBC is None or not sys.platform.startswith("linux"),
                                reason="glibc only (elsewhere array_workspace leaves malloc alone)")


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096 / 2 ** 20


def _faults() -> int:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def test_freed_memory_is_reused_inside_and_returned_after():
    n = 200 * 2 ** 20 // 8                       # 200 MB of int64
    setter = _memory._setter()
    before_hp = setter(True) if setter else None   # numpy's advice on, to see it restored
    with _memory.array_workspace():
        with _memory.array_workspace():          # nested: counts once
            a = np.ones(n, dtype=np.int64)
            del a
        f0 = _faults()
        b = np.ones(n, dtype=np.int64)           # reuses the freed pages: (almost) no faults
        reuse_faults = _faults() - f0
        del b
        inside = _rss_mb()
    after = _rss_mb()
    assert reuse_faults < 5_000, reuse_faults    # 200 MB fresh would be 51 k faults of 4 KiB
    assert inside - after > 150, (inside, after)  # the trim at the end handed the 200 MB back
    if setter:
        assert setter(False) is True              # the advice was restored to what it was
    try:
        f0 = _faults()
        c = np.ones(n, dtype=np.int64)           # outside (4 KiB pages): glibc's defaults, fresh pages again
        assert _faults() - f0 > 40_000
        del c
    finally:
        if setter:
            setter(before_hp)
