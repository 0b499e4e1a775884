"""How long this rank's threads waited for a CPU core, sampled at every step boundary.

A rank whose threads were runnable but waited on a run queue (other ranks, data-loader workers or
other jobs on its cores) looks exactly like a slow rank in a Kineto trace. Linux keeps, per thread,
``/proc/self/task/<tid>/schedstat`` = ``run_ns wait_ns timeslices``: the time it ran on a CPU and
the time it was runnable but waited for one (cumulative, since the thread started). The collector
reads them once at entry and once per ``Collector.step()``; sample ``k`` is taken at the ``k``-th
``step()`` call (``k = 0``: at entry), so the interval between samples ``k`` and ``k + 1`` is the
loop's iteration ``k``, the span of ``ProfilerStep#k`` in the trace.

Each sample: epoch ns (``time.time_ns()``), the step index, the process's run / wait ns summed over
its threads (each thread's last value is kept after it exits, so the sums never decrease), and the
calling (main) thread's own run / wait ns. Once per rank: the usable cores
(``len(os.sched_getaffinity(0))``) and ``os.cpu_count()``. The samples go into their own compact
file, ``rank{R}.cpu_sched.json`` (:meth:`Sampler.write`: one line, not the indented manifest, which
ingest reads once per trace); the rank manifest gets a summary (key ``cpu_sched``:
:meth:`Sampler.summary`: the file, how many samples, why none, what sampling cost).

Never raises: on a platform without ``/proc/.../schedstat`` (macOS, a kernel without schedstats)
there are no samples and the manifest says why (``unavailable``).
"""
from __future__ import annotations

import json
import os
import socket
import time

#: The columns of each sample (the manifest stores one list of these per sample).
COLUMNS = ("ts_ns", "step", "proc_run_ns", "proc_wait_ns", "main_run_ns", "main_wait_ns", "n_threads", "sample_ns")
#: Samples kept per rank: beyond this (a long job), sampling stops and the manifest says so
#: (``truncated``); 100,000 samples are ~9 MB of JSON.
MAX_SAMPLES = 100_000
_TASKS = "/proc/self/task"


def _read(path: str) -> tuple[int, int] | None:
    """(run_ns, wait_ns) of one schedstat file; None when it is gone (the thread exited)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fields = os.read(fd, 128).split()
    finally:
        os.close(fd)
    return int(fields[0]), int(fields[1])


class Sampler:
    """Takes the samples of one rank (see the module doc)."""

    def __init__(self):
        self.samples: list[list[int]] = []
        self.cost_ns = 0                  # wall time spent sampling, summed (what it costs the loop)
        self.cost_cpu_ns = 0              # CPU time of it (the wall time less any wait for a core)
        self.truncated = False
        self._threads: dict[int, tuple[int, int]] = {}   # tid -> its last (run_ns, wait_ns)
        self.unavailable: str | None = None
        try:
            self.cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):   # not Linux
            self.cores = None
        self.cpu_count = os.cpu_count()
        if not os.path.exists(f"{_TASKS}/{os.getpid()}/schedstat"):
            self.unavailable = ("no /proc/self/task/<tid>/schedstat on this platform (Linux with schedstats "
                                "only): CPU wait not sampled")

    def sample(self, step: int) -> None:
        """One sample at step boundary ``step``; any failure stops sampling (and says why), never raises."""
        if self.unavailable is not None:
            return
        if len(self.samples) >= MAX_SAMPLES:
            self.truncated = True
            return
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        try:
            ts_ns = time.time_ns()
            main = _read("/proc/thread-self/schedstat")
            for name in os.listdir(_TASKS):
                got = _read(f"{_TASKS}/{name}/schedstat")
                if got is not None:
                    self._threads[int(name)] = got
            if main is None:
                raise OSError("/proc/thread-self/schedstat unreadable")
            run_ns = sum(r for r, _ in self._threads.values())
            wait_ns = sum(w for _, w in self._threads.values())
            row = [ts_ns, int(step), run_ns, wait_ns, main[0], main[1], len(self._threads), 0]
            self.samples.append(row)
        except Exception as exc:  # noqa: BLE001 - sampling must never break the training loop
            self.unavailable = f"CPU wait sampling stopped: {type(exc).__name__}: {exc}"
            row = None
        took = time.perf_counter_ns() - t0
        if row is not None:
            row[-1] = took   # sample_ns: the wall time this sample took
        self.cost_ns += took
        self.cost_cpu_ns += time.thread_time_ns() - c0

    def to_dict(self, rank: int) -> dict:
        """What :meth:`write` writes: the samples and what they are."""
        return {"rank": rank, "host": socket.gethostname(), "pid": os.getpid(), "columns": list(COLUMNS),
                "samples": self.samples, "cores": self.cores, "cpu_count": self.cpu_count}

    def write(self, path, rank: int) -> bool:
        """Write the samples (compact JSON, then rename: a reader never sees half a file); False
        when there are none (nothing written)."""
        if not self.samples:
            return False
        tmp = f"{path}.tmp"
        with open(tmp, "w") as fh:
            json.dump(self.to_dict(rank), fh, separators=(",", ":"))
        os.replace(tmp, path)
        return True

    def summary(self, file: str | None) -> dict:
        """The rank manifest's ``cpu_sched`` entry."""
        return {"file": file, "n_samples": len(self.samples), "cores": self.cores, "cpu_count": self.cpu_count,
                "unavailable": self.unavailable, "truncated": self.truncated, "cost_ns": self.cost_ns,
                "cost_cpu_ns": self.cost_cpu_ns}
