"""Several processes on one store (docs/concurrency.md): the short commits of ``analyze`` (its
per-rank summaries and results), the files they unlist kept for readers that listed them, and the
work folders a process stages in without the store lock.

* :func:`update`: one read-modify-commit of the manifest; under the store lock, waiting for another
  writer (local), or done again on the newer manifest when another writer took the generation (a
  remote store, which has no lock).
* :func:`retire` / :func:`retained`: a file a commit unlists is listed under ``retired`` with the
  time, and garbage collection (:func:`.files.collect_garbage`) leaves it RETIRED_KEEP_S.
* :func:`new_work_folder`: ``STORE/.work-<host>-<pid>-<id>``, collected only once that process is gone.
"""
from __future__ import annotations

import json
import os
import random
import socket
import time
import uuid
from pathlib import Path

from ..errors import StoreError
from .files import (
    Manifest,
    _from_doc,
    collect_garbage,
    collect_unlisted,
    locked,
    new_staging,
    owner_alive,
    read_manifest,
    summary_files,
    write_manifest,
)
from .location import Remote

#: Seconds a file stays in the store after a commit unlisted it (a replaced saved result or
#: per-rank summary): a reader that listed it before that commit (another ``analyze``, a report, a
#: notebook) reads it for at least this long (docs/concurrency.md). Listed in the manifest under
#: ``retired`` with the time it was unlisted; garbage collection removes it afterwards.
RETIRED_KEEP_S = 3600
#: Seconds a short commit (analyze's summaries and results, :func:`update`) waits for the store
#: lock another writer holds, before one StoreError line.
COMMIT_WAIT_S = 600
#: Tries of a commit on a remote store (no lock) that finds its generation taken by another writer.
UPDATE_TRIES = 20
#: Prefix of a work folder (``.work-<host>-<pid>-<id>``, :func:`new_work_folder`): files a
#: process stages without holding the lock; collected only once that process is gone.
WORK = ".work-"


def listed(manifest: Manifest) -> set[str]:
    """Every file the manifest lists: tables, per-process inputs, saved results, summaries."""
    return ({f for t in manifest.traces + manifest.sidecars for f in t["files"].values()}
            | {f for r in manifest.extra.get("results", {}).values() for f in r.get("files", {}).values()}
            | summary_files(manifest))


def retained(manifest: Manifest, now: float | None = None) -> set[str]:
    """The files a commit unlisted less than RETIRED_KEEP_S ago (a reader may still hold them)."""
    now = time.time() if now is None else now
    return {f for f, at in manifest.extra.get("retired", {}).items() if now - float(at) < RETIRED_KEEP_S}


def retire(before: Manifest, after: Manifest, now: float | None = None) -> None:
    """List in ``after`` (under ``retired``, with the time) the files ``before`` listed and
    ``after`` does not; drop the entries older than RETIRED_KEEP_S or listed again."""
    now = time.time() if now is None else now
    live = listed(after)
    kept = {f: at for f, at in before.extra.get("retired", {}).items() if now - float(at) < RETIRED_KEEP_S}
    kept.update({f: now for f in listed(before) - live})
    after.extra["retired"] = {f: at for f, at in sorted(kept.items()) if f not in live}
    if not after.extra["retired"]:
        del after.extra["retired"]


def update(store: Path | Remote, change, wait_s: float | None = None):
    """One short read-modify-commit of the manifest (analyze's per-rank summaries and results):
    ``change(manifest)`` edits the manifest read now, whose ``generation`` is already the new one;
    on a local store it runs under the lock (waiting up to ``wait_s``, default COMMIT_WAIT_S, for
    another writer) and may move files into place. The files the change unlists are retired
    (:func:`retire`), not deleted, then the garbage of this commit is collected (:func:`.files.collect_unlisted`). A remote store has no lock: a commit
    that finds its generation taken is done again on the newer manifest (UPDATE_TRIES times), so
    ``change`` must be safe to call again. Returns what the last ``change`` returned."""
    wait_s = COMMIT_WAIT_S if wait_s is None else wait_s
    if isinstance(store, Remote):
        from .remote import commit
        for attempt in range(UPDATE_TRIES):
            before = read_manifest(store)
            manifest = _copy(before)
            manifest.generation += 1
            out = change(manifest)
            retire(before, manifest)
            if commit(store, manifest):
                collect_garbage(store, manifest)
                return out
            time.sleep(random.uniform(0.05, 0.2) * (attempt + 1))  # another writer was first: again
        raise StoreError(f"{store}: {UPDATE_TRIES} other writers committed first; nothing of this write is listed: "
                         "run it again")
    with locked(store, wait_s):
        before = read_manifest(store)
        manifest = _copy(before)
        manifest.generation += 1
        out = change(manifest)
        retire(before, manifest)
        write_manifest(store, manifest)
        collect_unlisted(store, before, manifest)   # what this commit unlisted; no walk of the store
        return out


def _copy(manifest: Manifest) -> Manifest:
    return _from_doc(json.loads(manifest.to_json()), "", "")


def new_work_folder(store: Path | Remote) -> Path:
    """A fresh folder for files a process stages *without* the store lock (an analyze's per-rank
    summaries), named after the process (``.work-<host>-<pid>-<id>``) so that garbage collection
    leaves it alone while that process lives; a local temporary folder for a remote store."""
    if isinstance(store, Remote):
        return new_staging(store)
    work = store / f"{WORK}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    work.mkdir()
    return work


def work_owner_alive(work: Path) -> bool:
    """Is the process that made work folder ``work`` (:func:`new_work_folder`) alive?"""
    host, pid, _ = work.name[len(WORK):].rsplit("-", 2) if work.name.count("-") >= 3 else ("", "0", "")
    return owner_alive(host or None, int(pid) if pid.isdigit() else 0)
