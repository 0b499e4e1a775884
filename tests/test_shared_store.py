"""A store on a shared file system (NFS, Lustre): the local code path, with a lock that says
which host holds it, since a process of another host cannot be checked from here."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from conftest import TRACES

import traceanalyzer as ta
from traceanalyzer.errors import StoreError
from traceanalyzer.store import files as st
from traceanalyzer.store.check import check_store


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_lock_of_another_host_is_never_taken_over(tmp_path, run_cli):
    store = tmp_path / "store"
    ta.ingest([TRACES / "ddp_gloo_2rank"], store, progress=False)
    before = (store / st.MANIFEST).read_text()
    (store / st.LOCK).write_text(f"other-node-17:{_dead_pid()}")      # its pid means nothing here
    with pytest.raises(StoreError, match=r"another process \(pid \d+ on other-node-17: an ingest, an analyze's commit or an rm\)"):
        ta.ingest([TRACES / "ddp_gloo_4rank"], store, progress=False)
    assert (store / st.MANIFEST).read_text() == before and (store / st.LOCK).exists()
    assert not check_store(store).stale_lock                            # nor called stale by check
    (store / st.LOCK).write_text(f"{socket.gethostname()}:{_dead_pid()}")   # this host's, dead: stale
    assert check_store(store).stale_lock
    ta.ingest([TRACES / "ddp_gloo_4rank"], store, progress=False)       # taken over
    assert not (store / st.LOCK).exists()
    code, out, err = run_cli("info", store)
    assert code == 0 and "ddp_gloo_4rank" in out and "ddp_gloo_2rank" in out


def test_lock_names_this_host(tmp_path):
    with st.locked(tmp_path):
        host, pid = st.lock_owner(tmp_path / st.LOCK)
    assert (host, pid) == (socket.gethostname(), os.getpid())
