"""The one benchmark harness: what every script in benchmarks/ measures the same way.

- ``timed()``: wall and CPU seconds of a block in this process;
- ``run_child()``: a command in its own process (its own session), with wall and CPU seconds and
  the peak RSS of the child (``wait4``'s ``ru_maxrss``) and of its whole process tree (polled by
  ``TreeWatcher``, which also kills the tree over a memory limit or a timeout), and the result the
  child printed on a ``@@RESULT@@`` line (``emit_result``);
- ``RssPoller``: the peak RSS of this process between two points (``ru_maxrss`` cannot be reset);
- ``ratio()``: a time as a multiple of a baseline measured in the same run (targets are ratios,
  never absolute times: the machine is shared);
- ``machine_info()`` / ``machine_line()`` / ``git_state()`` / ``versions()``: what ran where;
- ``append_results()``: a section appended to ``benchmarks/RESULTS.md``.

Scripts import it as ``import harness`` (benchmarks/ is on ``sys.path`` when a script runs).
"""
from __future__ import annotations

import json
import os
import platform
import resource
import signal
import subprocess
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "RESULTS.md"
RESULT_TAG = "@@RESULT@@"


# -- this process -----------------------------------------------------------------------------

@dataclass
class Timing:
    wall_s: float = 0.0
    cpu_s: float = 0.0


@contextmanager
def timed():
    """``with timed() as t: ...`` then ``t.wall_s``, ``t.cpu_s`` (this process's user + system time)."""
    t = Timing()
    w0, c0 = time.perf_counter(), time.process_time()
    try:
        yield t
    finally:
        t.wall_s, t.cpu_s = time.perf_counter() - w0, time.process_time() - c0


def proc_status_kb(field: str, pid: int | str = "self") -> int:
    """A ``/proc/PID/status`` field in KiB (VmRSS, VmHWM); 0 when absent."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def rusage_kb() -> dict:
    """Peak RSS (KiB on Linux) of this process and of its waited-for children."""
    return {"self_maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            "children_maxrss_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}


class RssPoller(threading.Thread):
    """Peak VmRSS of this process between mark() and peak_kb() (ru_maxrss cannot be reset)."""

    def __init__(self, interval: float = 0.02):
        super().__init__(daemon=True)
        self.interval = interval
        self._peak = 0
        self._halt = threading.Event()
        self.start()

    def run(self) -> None:
        while not self._halt.is_set():
            self._peak = max(self._peak, proc_status_kb("VmRSS"))
            self._halt.wait(self.interval)

    def mark(self) -> None:
        self._peak = proc_status_kb("VmRSS")

    def peak_kb(self) -> int:
        return max(self._peak, proc_status_kb("VmRSS"))

    def stop(self) -> None:
        self._halt.set()
        self.join()


def emit_result(res: dict) -> None:
    """The child's side of ``run_child``: its result as one tagged JSON line on stdout."""
    res.update(rusage_kb())
    print(RESULT_TAG + json.dumps(res, default=str), flush=True)


# -- a child process and its tree ---------------------------------------------------------------

def _children(pid: int) -> list[int]:
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as fh:
                    out.extend(int(x) for x in fh.read().split())
            except OSError:
                pass
    except OSError:
        pass
    return out


def _status_kb(pid: int) -> tuple[int, int] | None:
    hwm, rss = proc_status_kb("VmHWM", pid), proc_status_kb("VmRSS", pid)
    return None if not (hwm or rss) else (hwm, rss)


class TreeWatcher(threading.Thread):
    """Polls a process tree: per-process VmHWM, max total RSS; kills it over a limit."""

    def __init__(self, root: int, limit_kb: int | None, interval: float = 0.05):
        super().__init__(daemon=True)
        self.root = root
        self.limit_kb = limit_kb
        self.interval = interval
        self.hwm: dict[int, int] = {}
        self.max_total_kb = 0
        self.max_live_workers = 0
        self.killed = False
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            pids = [self.root]
            i = 0
            while i < len(pids):
                pids.extend(_children(pids[i]))
                i += 1
            total = 0
            for pid in pids:
                st = _status_kb(pid)
                if st is None:
                    continue
                hwm, rss = st
                if hwm > self.hwm.get(pid, 0):
                    self.hwm[pid] = hwm
                total += rss
            self.max_live_workers = max(self.max_live_workers, len(pids) - 1)
            self.max_total_kb = max(self.max_total_kb, total)
            if self.limit_kb and total > self.limit_kb and not self.killed:
                self.killed = True
                try:
                    os.killpg(self.root, signal.SIGKILL)
                except OSError:
                    pass
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def worker_peak_kb(self) -> int:
        return max((v for p, v in self.hwm.items() if p != self.root), default=0)


def run_child(cmd: list[str], log_path: Path | None = None, limit_gb: float | None = None,
              timeout_s: float | None = None, cwd: Path | None = None, env: dict | None = None,
              expect_result: bool = False) -> dict:
    """Run ``cmd`` in its own session; stderr to ``log_path`` (or discarded). Returns ``ok``, the
    child's ``@@RESULT@@`` dict (if it printed one) merged with wall_seconds, cpu_seconds (the
    child and its waited-for children, user + system), child_maxrss_kb, max_tree_rss_kb,
    polled_peak_kb (the child), polled_worker_peak_kb, max_live_descendants, returncode, stdout;
    on failure (non-zero exit, timeout, memory limit, or no result line when ``expect_result``)
    ``ok`` False, ``error`` and ``log_tail``."""
    env = dict(os.environ if env is None else env)
    env.setdefault("PYTHONHASHSEED", "0")
    t0 = time.perf_counter()
    timed_out = False
    log = open(log_path, "w") if log_path is not None else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True,
                                env=env, cwd=None if cwd is None else str(cwd))
        w = TreeWatcher(proc.pid, int(limit_gb * 1024 * 1024) if limit_gb else None)
        w.start()
        out_chunks: list[str] = []
        reader = threading.Thread(target=lambda: out_chunks.append(proc.stdout.read()), daemon=True)
        reader.start()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:     # wait4: the child's own CPU time and peak RSS
            pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if deadline is not None and time.monotonic() > deadline and not timed_out:
                timed_out = True
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.01)
        proc.returncode = os.waitstatus_to_exitcode(status)
        reader.join()
        w.stop()
    finally:
        if log_path is not None:
            log.close()
    out = "".join(out_chunks)
    res = None
    for line in out.splitlines():
        if line.startswith(RESULT_TAG):
            res = json.loads(line[len(RESULT_TAG):])
    common = {"wall_seconds": time.perf_counter() - t0, "cpu_seconds": ru.ru_utime + ru.ru_stime,
              "child_maxrss_kb": ru.ru_maxrss, "max_tree_rss_kb": w.max_total_kb,
              "polled_peak_kb": w.hwm.get(proc.pid, 0), "polled_worker_peak_kb": w.worker_peak_kb(),
              "max_live_descendants": w.max_live_workers, "returncode": proc.returncode, "stdout": out}
    if (res is None and expect_result) or proc.returncode != 0 or timed_out or w.killed:
        err = (f"timed out after {timeout_s:g} s" if timed_out else
               "killed: process tree exceeded memory limit" if w.killed else f"exit code {proc.returncode}")
        tail = log_path.read_text(errors="replace")[-3000:] if log_path is not None else ""
        return {**(res or {}), "ok": False, "error": err, "log_tail": tail, **common}
    return {**(res or {}), "ok": True, **common}


# -- same-run ratios ------------------------------------------------------------------------------

def ratio(x: float | None, base: float | None) -> float | None:
    """``x`` as a multiple of ``base`` measured in the same run; None (unknown) without a base."""
    if x is None or not base:
        return None
    return x / base


def best_of(fn, repeat: int = 3):
    """The fastest of ``repeat`` calls of ``fn()`` (a dict with ``wall_seconds``)."""
    runs = [fn() for _ in range(repeat)]
    return min(runs, key=lambda r: r.get("wall_seconds", float("inf")))


# -- what ran where -------------------------------------------------------------------------------

def git_state() -> dict:
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "traceanalyzer"],
                               capture_output=True, text=True).stdout.strip()
        return {"head": head, "traceanalyzer_dirty": bool(dirty)}
    except OSError:
        return {}


def machine_info() -> dict:
    info = {"loadavg": [round(x, 2) for x in os.getloadavg()], "cores": os.cpu_count(),
            "platform": platform.platform(), "python": platform.python_version()}
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    info["mem_total_gib"] = round(int(line.split()[1]) / 1024 / 1024, 1)
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return info


def machine_line(info: dict | None = None) -> str:
    """One line for RESULTS.md: cores, CPU, memory, load, Python, commit."""
    m = info or machine_info()
    g = git_state()
    return (f"{m.get('cores')} cores ({m.get('cpu', 'cpu unknown')}), {m.get('mem_total_gib', '?')} GiB, "
            f"load {'/'.join(str(x) for x in m['loadavg'])}, Python {m['python']}, "
            f"commit {g.get('head', '?')}{' (dirty)' if g.get('traceanalyzer_dirty') else ''}")


def versions(names) -> dict:
    from importlib import metadata
    out = {}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except Exception:  # noqa: BLE001 - not installed
            out[n] = None
    return out


def fmt_bytes(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def append_results(text: str, path: Path = RESULTS) -> None:
    """Append a section (Markdown, as written) to RESULTS.md."""
    with open(path, "a") as fh:
        fh.write(text)
