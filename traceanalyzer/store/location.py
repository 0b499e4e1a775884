"""Where a store lives: a local folder, or a URL that fsspec knows (``s3://bucket/prefix``, ...).

:func:`location` turns what the user gave (``--store``) into a :class:`pathlib.Path` for a local
or shared-filesystem folder (today's code path, untouched, and no fsspec import) or a
:class:`Remote` for an object-store URL. A :class:`Remote` offers the few operations the store
needs (list, read, create-if-absent, upload, delete), each turning a failure (unreachable
endpoint, missing bucket, no credentials, access denied) into one :class:`~..errors.StoreError`
line that names the URL and the problem.

Credentials and the endpoint come from where the filesystem's own library looks (for ``s3://``:
boto's environment variables and config files, ``AWS_ENDPOINT_URL`` for an S3-compatible server);
this module never sets them.
"""
from __future__ import annotations

import os
import re
from contextlib import contextmanager
from pathlib import Path

from ..errors import StoreError

_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(store) -> bool:
    """A ``scheme://...`` string other than ``file://`` (a local folder)."""
    return isinstance(store, str) and bool(_URL_RE.match(store)) and not store.startswith("file://")


def location(store) -> Path | Remote:
    """The store ``store`` names: a Path (local folder, ``file://`` URL) or a :class:`Remote`."""
    if isinstance(store, Remote):
        return store
    if isinstance(store, str) and store.startswith("file://"):
        return Path(store[len("file://"):])
    if is_url(store):
        return Remote(store)
    return Path(store)


class Remote:
    """A store under a URL: an fsspec filesystem and the root (bucket/prefix) in it."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        try:
            import fsspec
            # a fresh instance: the endpoint and credentials are read now, not from an earlier store's
            self.fs, root = fsspec.core.url_to_fs(self.url, skip_instance_cache=True)
        except ImportError as exc:
            raise StoreError(f"{self.url}: a store at this URL needs the {exc.name or 'fsspec'} package "
                             "(pip install 'traceanalyzer[s3]')") from None
        except (ValueError, OSError) as exc:
            raise StoreError(f"{self.url}: not a store location ({exc})") from None
        self.root = root.rstrip("/")
        self._reached = False

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"Remote({self.url!r})"

    def __fspath__(self):  # never a local path: fail loudly where a caller would treat it as one
        raise TypeError(f"{self.url} is not a local path")

    def __truediv__(self, rel: str) -> str:
        return self.url_of(rel)

    def url_of(self, rel: str) -> str:
        """The full URL of the object ``rel`` (relative to the store), as DuckDB reads it."""
        return f"{self.url}/{rel}"

    def _key(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    @contextmanager
    def errors(self, doing: str):
        """Any failure of the filesystem inside as one StoreError line naming the URL."""
        try:
            yield
        except StoreError:
            raise
        except Exception as exc:
            raise StoreError(f"{self.url}: cannot {doing}: {_why(exc, self.root.split('/')[0])}") from None

    def listing(self, under: str = "") -> dict[str, dict]:
        """rel -> object info (``size``, ``LastModified``, ...) of every object under ``under``."""
        self.fs.invalidate_cache()  # another writer may have committed since the last listing
        with self.errors("list the store"):
            found = self.fs.find(self._key(under), detail=True)
        cut = len(self.root) + 1
        return {name[cut:]: info for name, info in found.items() if name.startswith(self.root + "/")}

    def read(self, rel: str) -> bytes:
        with self.errors(f"read {rel}"):
            return self.fs.cat_file(self._key(rel))

    def create(self, rel: str, data: bytes) -> bool:
        """Write ``rel`` only if no object has that name (one conditional PUT, If-None-Match: *);
        False when one does (another writer was first)."""
        with self.errors(f"write {rel}"):
            try:
                self.fs.pipe_file(self._key(rel), data, mode="create")
            except FileExistsError:
                return False
        return True

    def write(self, rel: str, data: bytes) -> None:
        with self.errors(f"write {rel}"):
            self.fs.pipe_file(self._key(rel), data)

    def upload(self, files: dict[str, str]) -> None:
        """Upload local files (local path -> rel), concurrently where the filesystem can."""
        if files:
            with self.errors("upload the staged tables"):
                self.fs.put(list(files), [self._key(rel) for rel in files.values()])

    def download(self, files: dict[str, str]) -> None:
        """Download objects (rel -> local path), concurrently where the filesystem can."""
        if files:
            with self.errors("download the store's tables"):
                self.fs.get([self._key(rel) for rel in files], list(files.values()))

    def delete(self, rels: list[str]) -> None:
        if rels:
            with self.errors("delete leftover objects"):
                self.fs.rm([self._key(rel) for rel in rels])

    def check_reachable(self) -> None:
        """One request (the first time): the bucket exists and these credentials may list it."""
        if self._reached:
            return
        with self.errors("reach the store"):
            self.fs.invalidate_cache()
            self.fs.ls(self.root.split("/")[0])
        self._reached = True


def _why(exc: BaseException, bucket: str) -> str:
    """What went wrong, in words, for one line."""
    name = type(exc).__name__
    text = str(exc).splitlines()[0] if str(exc) else name
    if name == "NoCredentialsError" or "credentials" in text.lower() and "not" in text.lower():
        return "no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile"
    if isinstance(exc, FileNotFoundError) and "bucket" in text.lower():
        return f"no such bucket '{bucket}'"
    if isinstance(exc, PermissionError):
        return f"access denied: check the credentials' rights on '{bucket}' ({text})"
    if "connect" in name.lower() or "connect" in text.lower() or isinstance(exc, ConnectionError):
        endpoint = os.environ.get("AWS_ENDPOINT_URL")  # read, never set
        return f"the endpoint {endpoint} does not answer" if endpoint else f"the endpoint does not answer ({text})"
    return f"{name}: {text}"
