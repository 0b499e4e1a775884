"""The store lock's file (used by :func:`.files.locked`): taken whole, and a stale one broken by
one process at a time.

* :func:`create`: the lock appears with its owner already written (a temporary file hard-linked
  to the lock's name, which fails when a lock exists), so no other process ever sees an empty lock
  of a live writer and takes it for a dead one's. Where the file system has no hard links: created
  empty (O_EXCL), then written, as before.
* :func:`break_stale`: a lock whose process is gone is removed only under an exclusive ``flock``
  of the store folder, after checking again, under it, that the file is still the one found stale.
  Without it, two processes that both found the same stale lock could both remove "it": the
  second one removed the lock the first had taken meanwhile, and both held the store.
  ``flock`` is released by the kernel when its process dies, so it can never be stale itself.
  Where it is not available (no ``fcntl``; a file system that refuses it) the take-over is done
  unserialised, as before (docs/concurrency.md).
"""
from __future__ import annotations

import errno
import os
import socket
import uuid
from pathlib import Path
from typing import Callable

try:
    import fcntl
except ImportError:  # not a POSIX system
    fcntl = None

#: Prefix of the temporary file a lock is written in before it is linked to its name; it starts
#: like the manifest's temporary files, so that garbage collection and ``check`` remove one that a
#: killed process left.
TMP_PREFIX = "._store.json.lock-"


def owner_text() -> str:
    """What a lock file holds: ``host:pid`` of this process."""
    return f"{socket.gethostname()}:{os.getpid()}"


def create(lock: Path) -> bool:
    """Take the lock ``lock`` if no lock file exists: True when taken, False when one exists."""
    text = owner_text().encode()
    tmp = lock.parent / f"{TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}.tmp"
    try:
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        try:
            os.write(fd, text)
        finally:
            os.close(fd)
        try:
            os.link(tmp, lock)  # atomic, and fails when the name exists
            return True
        except (FileExistsError, FileNotFoundError):  # a lock exists (or a commit collected the temporary file)
            return False
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EMLINK):
                raise
    finally:
        try:
            tmp.unlink()
        except OSError:  # never made (the error above says why), or already collected
            pass
    return _create_then_write(lock, text)  # no hard links here


def _create_then_write(lock: Path, text: bytes) -> bool:
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    try:
        os.write(fd, text)
    except OSError:
        os.close(fd)
        lock.unlink(missing_ok=True)
        raise
    os.close(fd)
    return True


def identity(lock: Path) -> tuple[int, int] | None:
    """(device, inode) of the lock file now; None when there is none."""
    try:
        st = os.stat(lock)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def break_stale(lock: Path, found: tuple[int, int] | None, still_stale: Callable[[], bool]) -> None:
    """Remove the lock file found stale (``found``: its :func:`identity` when it was judged) if,
    under the store folder's exclusive ``flock``, it is still that file and ``still_stale()``."""
    fd = _folder_lock(lock.parent)
    try:
        if identity(lock) == found and still_stale():
            lock.unlink(missing_ok=True)
    finally:
        if fd is not None:
            os.close(fd)  # releases the flock


def _folder_lock(folder: Path) -> int | None:
    if fcntl is None:
        return None
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:  # e.g. NFS without flock on folders: unserialised, as before
        os.close(fd)
        return None
    return fd


def release(lock: Path) -> None:
    """Remove the lock this process holds (and only if it is still this process's)."""
    try:
        if lock.read_text().strip() != owner_text():
            return
    except OSError:
        return
    lock.unlink(missing_ok=True)
