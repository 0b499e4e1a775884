"""Issue 18 part 3: the store lock, with real processes. Processes that find the same stale lock
(its process gone) at the same instant take it one after the other, never two at once; a process
that judged a lock stale does not remove the lock another process took meanwhile."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from traceanalyzer.errors import StoreError
from traceanalyzer.store import files as st
from traceanalyzer.store import lockfile

ROOT = Path(__file__).resolve().parents[1]
PROCESSES = 6
ROUNDS = 12

_CHILD = r"""
import sys, time
from pathlib import Path
from traceanalyzer.store.files import locked
store, folder, me, rounds = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
for r in range(rounds):
    (folder / f"ready-{r}-{me}").touch()
    go = folder / f"go-{r}"
    while not go.exists():
        time.sleep(0.0005)                      # every process leaves within a fraction of a ms
    with locked(store, wait_s=60):
        t0 = time.monotonic_ns()
        time.sleep(0.01)
        t1 = time.monotonic_ns()
    (folder / f"tmp-{me}").write_text(f"{t0} {t1}")
    (folder / f"tmp-{me}").replace(folder / f"held-{r}-{me}")   # whole when it appears
"""


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _wait_for(paths: list[Path], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, f"timed out waiting for {[p.name for p in paths if not p.exists()]}"
        time.sleep(0.005)


def test_processes_breaking_one_stale_lock_hold_it_one_at_a_time(tmp_path):
    store, folder = tmp_path / "store", tmp_path / "sync"
    store.mkdir()
    folder.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, str(store), str(folder), str(i), str(ROUNDS)], env=env,
                              stderr=subprocess.PIPE, text=True) for i in range(PROCESSES)]
    try:
        both = []
        for r in range(ROUNDS):
            _wait_for([folder / f"ready-{r}-{i}" for i in range(PROCESSES)])
            assert not (store / st.LOCK).exists()
            (store / st.LOCK).write_text(f"{socket.gethostname()}:{_dead_pid()}")   # left by a process now gone
            (folder / f"go-{r}").touch()
            _wait_for([folder / f"held-{r}-{i}" for i in range(PROCESSES)])
            held = sorted(tuple(map(int, (folder / f"held-{r}-{i}").read_text().split())) for i in range(PROCESSES))
            both += [r for a, b in zip(held, held[1:]) if b[0] < a[1]]
    except BaseException:
        for p in procs:
            p.kill()
        raise
    finally:
        for p in procs:
            _, err = p.communicate(timeout=60)
            assert p.returncode == 0 or p.returncode == -9, err[-2000:]
    assert not both, f"two processes held the lock at once in rounds {both} of {ROUNDS}"
    assert not (store / st.LOCK).exists() and not list(store.iterdir())   # no temporary lock file left


def test_a_lock_judged_stale_then_taken_by_another_process_is_not_removed(tmp_path):
    """The interleaving that made two holders: this process finds a dead process's lock; another
    process removes it and takes the lock; this process's take-over must leave that lock alone."""
    store = tmp_path / "store"
    store.mkdir()
    lock = store / st.LOCK
    dead = _dead_pid()
    lock.write_text(f"{socket.gethostname()}:{dead}")
    found, judged = lockfile.identity(lock), st.lock_owner(lock)
    assert judged == (socket.gethostname(), dead) and not st.owner_alive(*judged)
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(store), str(tmp_path / "holding")],
                              env=dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")),
                              stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for([tmp_path / "holding"])
        taken = lock.read_text()
        assert taken == f"{socket.gethostname()}:{holder.pid}"
        lockfile.break_stale(lock, found, lambda: st.lock_owner(lock) == judged and not st.owner_alive(*judged))
        assert lock.read_text() == taken               # the live holder's lock is still there
        with pytest.raises(StoreError, match=f"pid {holder.pid}"):
            with st.locked(store):
                pass
    finally:
        _, err = holder.communicate("", timeout=60)
    assert holder.returncode == 0, err[-2000:]
    assert not lock.exists()


_HOLDER = r"""
import sys
from pathlib import Path
from traceanalyzer.store.files import locked
with locked(Path(sys.argv[1])):               # takes over the dead process's lock
    Path(sys.argv[2]).touch()
    sys.stdin.read()                          # held until the test closes stdin
"""


def test_a_live_lock_is_refused_and_kept(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    with st.locked(store):
        text = (store / st.LOCK).read_text()
        assert text == f"{socket.gethostname()}:{os.getpid()}"
        with pytest.raises(StoreError, match="another process"):
            with st.locked(store):
                pass
        assert (store / st.LOCK).read_text() == text
    assert not (store / st.LOCK).exists()
