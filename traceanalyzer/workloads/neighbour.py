"""A noisy neighbour: a process that shares one rank's CPU core and burns part of it.

The injected *host* fault (``--noisy-rank R --noisy-pct P``): rank R's core is shared with a process
that is busy P % of every period, as a data-loader worker, a logging agent or another job pinned to
the same core would be. Rank R runs the same work as its peers, only slower and with waits for its
core: the analyzer should report a slow host (its extra CPU time and wait for a core, from the
collector's CPU samples), not a straggler of the job. The neighbour inherits the rank's pinned core
(affinity is inherited) and exits with the rank, or as soon as the rank's process is gone.
"""
from __future__ import annotations

import argparse
import atexit
import os
import subprocess
import sys

PERIOD_S = 0.002   # short against a step, so every phase of the step loses the same share

_LOOP = """
import os, time, sys
parent, busy, period = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
while os.getppid() == parent:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < busy * period:
        pass
    time.sleep((1.0 - busy) * period)
"""


def pct_arg(text: str) -> float:
    """``--noisy-pct``: a share of the core in (0, 100], refused by argparse on every rank."""
    value = float(text)
    if not 0 < value <= 100:
        raise argparse.ArgumentTypeError(f"must be in (0, 100], got {text}")
    return value


def start(busy_pct: float) -> subprocess.Popen:
    """Start the neighbour on this process's cores, busy ``busy_pct`` % of the time; it is
    stopped when this process exits."""
    proc = subprocess.Popen([sys.executable, "-c", _LOOP, str(os.getpid()), str(busy_pct / 100.0), str(PERIOD_S)],
                            stdin=subprocess.DEVNULL)
    atexit.register(proc.kill)
    return proc
