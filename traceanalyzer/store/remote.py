"""A store on an object store (``s3://bucket/prefix``): the same tables and manifest, another commit.

Layout (relative to the store URL)::

    _store/manifest-000000000007.json                     one manifest per generation (the commit points)
    <table>/run=R/rank=K/window_id=W/part-G-<uuid>.parquet  one object per table and trace
    _results/<analysis>/<run>.G-<uuid>.parquet             saved analysis results

An object store has no rename, but a PUT is atomic and, with ``If-None-Match: *``, conditional.
A writer parses and stages locally (a temporary folder), uploads every table under a new,
never-reused name (``part-G-<uuid>``), then commits by creating manifest generation G+1 *only if
it does not exist yet*: of two writers that read generation G, one creates G+1 and the other gets
a one-line StoreError (nothing of it is listed; run it again). Readers take the highest
generation. An ingest killed or failing before its commit leaves at most unlisted objects, which
no reader reads and the next writer's garbage collection removes once they are older than
:data:`GC_GRACE_S`; a younger one may belong to a writer still uploading, since there is no lock:
the conditional create replaces it. Old manifests are kept: they are small, and a writer that
read an old generation must still find its successor taken.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path

from ..errors import StoreError
from .location import Remote

MANIFESTS = "_store"
_MANIFEST_RE = re.compile(r"^_store/manifest-(\d{12})\.json$")
#: A remote store whose listed files total at most this many bytes is read from local copies,
#: downloaded in parallel when it is opened (DuckDB reads local Parquet about ten times faster than
#: through fsspec's Python file objects, and an analysis reads every table several times); a
#: bigger one is read in place, through the same fsspec filesystem registered on the connection.
LOCAL_COPY_MAX_BYTES = 2 * 2**30
#: Unlisted objects younger than this (seconds) are left alone by garbage collection: without a
#: lock, one may belong to an ingest that is still uploading. A killed ingest's leftovers go with
#: the first write after it.
GC_GRACE_S = 3600


def manifest_name(generation: int) -> str:
    return f"{MANIFESTS}/manifest-{generation:012d}.json"


def latest(remote: Remote) -> tuple[int, dict] | None:
    """(generation, manifest document) of the newest commit; None when there is none."""
    gens = sorted(int(m.group(1)) for rel in remote.listing(MANIFESTS) if (m := _MANIFEST_RE.match(rel)))
    if not gens:
        return None
    rel = manifest_name(gens[-1])
    try:
        doc = json.loads(remote.read(rel))
    except ValueError as exc:
        raise StoreError(f"{remote.url_of(rel)}: unreadable store manifest ({exc})") from None
    return gens[-1], doc


def read_doc(remote: Remote) -> dict | None:
    """The newest manifest document; None for an empty prefix (a new store); StoreError when the
    prefix holds other things (not a store)."""
    remote.check_reachable()
    found = latest(remote)
    if found is not None:
        gen, doc = found
        return dict(doc, generation=gen)  # the object's name is the generation
    if remote.listing():
        raise StoreError(f"{remote.url}: not a traceanalyzer store (no {MANIFESTS}/manifest-*.json) and not empty; "
                         "choose another --store")
    return None


def commit(remote: Remote, manifest) -> bool:
    """Create generation ``manifest.generation``, only if no writer created it first; False if one did."""
    return remote.create(manifest_name(manifest.generation), manifest.to_json().encode())


def write_manifest(remote: Remote, manifest) -> None:
    """The commit: create generation ``manifest.generation``, only if no writer created it first."""
    if not commit(remote, manifest):
        raise StoreError(f"{remote.url}: another writer committed generation {manifest.generation} first; "
                         "nothing of this write is listed: run it again")


def place(remote: Remote, staged: dict[str, str], partition: dict[str, str], part: str) -> dict[str, str]:
    """Upload staged Parquet files (table -> local path) as ``<partition>/part-<part>-<uuid>.parquet``;
    returns table -> the name relative to the store, for the manifest (which the caller commits)."""
    files = {table: f"{partition[table]}/part-{part}-{uuid.uuid4().hex[:16]}.parquet" for table in staged}
    remote.upload({staged[table]: rel for table, rel in files.items()})
    return files


def put_table(remote: Remote, table, stem: str) -> str:
    """Write one Arrow table as a new object ``<stem>-<uuid>.parquet``; returns its name."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    rel = f"{stem}-{uuid.uuid4().hex[:16]}.parquet"
    buf = pa.BufferOutputStream()
    pq.write_table(table, buf, compression="zstd", row_group_size=256 * 1024)
    remote.write(rel, buf.getvalue().to_pybytes())
    return rel


def readable(remote: Remote, rels: list[str]) -> tuple[dict[str, str], str | None]:
    """Where DuckDB reads each listed file (rel -> local path or URL), and the temporary folder of
    the local copies (None: read in place). A copy never goes stale: an object is never
    rewritten under the same name."""
    have = remote.listing() if rels else {}
    if not rels or sum(have.get(rel, {}).get("size") or 0 for rel in rels) > LOCAL_COPY_MAX_BYTES:
        return {rel: remote.url_of(rel) for rel in rels}, None
    folder = tempfile.mkdtemp(prefix="traceanalyzer-copy-")
    local = {rel: os.path.join(folder, rel) for rel in rels}
    try:
        remote.download(local)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return local, folder


def new_staging() -> Path:
    """A local folder for the worker processes' Parquet files (uploaded at the commit)."""
    return Path(tempfile.mkdtemp(prefix="traceanalyzer-staging-"))


def unlisted(remote: Remote, live: set[str], grace_s: float | None = None) -> list[str]:
    """Objects of the store that no manifest lists and that are older than ``grace_s`` seconds
    (default :data:`GC_GRACE_S`): the leftovers of a killed or failed write. Manifests are never
    unlisted."""
    grace_s = GC_GRACE_S if grace_s is None else grace_s
    now = _dt.datetime.now(_dt.timezone.utc)
    return sorted(rel for rel, info in remote.listing().items()
                  if rel not in live and not rel.startswith(MANIFESTS + "/")
                  and (now - _modified(info)).total_seconds() >= grace_s)


def collect_garbage(remote: Remote, live: set[str], grace_s: float | None = None) -> list[str]:
    """Delete the :func:`unlisted` objects; returns their names. Best effort: the commit is done,
    so a failure here is left for the next writer."""
    try:
        old = unlisted(remote, live, grace_s)
        remote.delete(old)
    except StoreError:
        return []
    return old


def _modified(info: dict) -> _dt.datetime:
    when = info.get("LastModified") or info.get("mtime") or info.get("last_modified")
    if isinstance(when, (int, float)):
        return _dt.datetime.fromtimestamp(when, _dt.timezone.utc)
    if isinstance(when, _dt.datetime):
        return when if when.tzinfo else when.replace(tzinfo=_dt.timezone.utc)
    return _dt.datetime.now(_dt.timezone.utc)  # unknown age: treated as young, never deleted


def problems(remote: Remote, rels: list[str]) -> dict[str, str]:
    """rel -> what is wrong, for listed objects that are missing or too small for Parquet: one
    listing, no read (an object is written whole or not at all, so it cannot be half written)."""
    have = remote.listing()
    out = {}
    for rel in rels:
        if rel not in have:
            out[rel] = "missing"
        elif (have[rel].get("size") or 0) < 12:
            out[rel] = "truncated"
    return out
