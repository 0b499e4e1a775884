"""The on-disk store: Hive-partitioned Parquet plus one manifest, and DuckDB views over it.

Layout::

    STORE/_store.json                                    the manifest (the commit point)
    STORE/<table>/run=R/rank=K/window_id=W/part-G.parquet   one file per table and trace
    STORE/<table>/run=R/rank=K/part-G-N.parquet             per-process inputs (FR dumps, NCCL logs)

Atomicity: new files are written and moved into place first; they only become part of the store
when the manifest, which lists every live file, is replaced in one ``os.replace``. An ingest
killed at any point therefore leaves the previous store intact; files it left behind are not
listed, never read, and removed by the next ingest. A lock file keeps two ingests apart.

A store can also be a URL (``s3://bucket/prefix``, :mod:`.location`): the functions here then hand
over to :mod:`.remote`, whose commit point is a new manifest object per generation.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import time
import uuid
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from .. import __version__
from .. import schema as S
from ..errors import StoreError
from . import lockfile
from .location import Remote
from .location import location as _location

MANIFEST = "_store.json"
LOCK = "_store.lock"
FORMAT = "traceanalyzer-store"
#: A local store whose listed table files total at most this many bytes (a few 4-rank runs of some
#: 10 k events) is queried on one DuckDB thread: its queries are planning and fixed costs, which a
#: second thread does not share but pays for in scheduling (0.15 CPU s of an ``analyze``'s ~1 s of
#: SQL on the shipped 4-rank pipeline run, benchmarks/small_runs.py).
ONE_THREAD_MAX_BYTES = 8 << 20

_DUCK_TYPES = {"int64": "BIGINT", "int32": "INTEGER", "string": "VARCHAR", "bool": "BOOLEAN",
               "double": "DOUBLE", "list<item: int32>": "INTEGER[]"}


@dataclass
class Manifest:
    schema_version: str = S.SCHEMA_VERSION
    generation: int = 0
    #: one entry per trace: run, rank, window, trace_file, start_ts_ns, end_ts_ns, files {table: relpath}
    traces: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    #: one entry per per-process input (FR dump, NCCL log, ...): run, rank, kind, source_file, files, counts
    sidecars: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "schema_version": self.schema_version, "writer": f"traceanalyzer {__version__}",
                           "generation": self.generation, "traces": self.traces, "sidecars": self.sidecars,
                           **self.extra}, separators=(",", ":"))   # (compact: the C encoder, ~10x faster)

    def files(self, table: str) -> list[str]:
        return [t["files"][table] for t in self.traces + self.sidecars if table in t["files"]]


def location(store) -> Path | Remote:
    """A Path for a local (or shared-filesystem) store, a :class:`Remote` for a URL (``s3://...``)."""
    return _location(store)


def read_manifest(store: Path | Remote) -> Manifest:
    if isinstance(store, Remote):
        from . import remote
        doc = remote.read_doc(store)
        return Manifest() if doc is None else _from_doc(doc, store.url_of(remote.manifest_name(doc["generation"])), store)
    path = store / MANIFEST
    if not path.exists():
        if store.exists() and any(not p.name.startswith((".", "_store")) for p in store.iterdir()):
            raise StoreError(f"{store}: not a traceanalyzer store (no {MANIFEST}) and not empty; choose another --store")
        return Manifest()
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise StoreError(f"{path}: unreadable store manifest ({exc})") from None
    return _from_doc(doc, path, store)


def _from_doc(doc: dict, path, store) -> Manifest:
    if doc.get("format") != FORMAT:
        raise StoreError(f"{path}: not a traceanalyzer store manifest")
    version = str(doc.get("schema_version", "?"))
    if version.split(".")[0] != S.SCHEMA_VERSION.split(".")[0]:
        raise StoreError(f"{store}: written with store schema {version} ({doc.get('writer', '?')}); this traceanalyzer "
                         f"reads schema {S.SCHEMA_VERSION}: re-ingest the traces into a new store")
    known = {"format", "schema_version", "writer", "generation", "traces", "sidecars"}
    return Manifest(version, int(doc.get("generation", 0)), list(doc.get("traces", [])),
                    {k: v for k, v in doc.items() if k not in known}, list(doc.get("sidecars", [])))


def write_manifest(store: Path | Remote, manifest: Manifest) -> None:
    if isinstance(store, Remote):
        from .remote import write_manifest as commit
        return commit(store, manifest)
    tmp = store / f".{MANIFEST}.{uuid.uuid4().hex}.tmp"
    try:
        tmp.write_text(manifest.to_json())
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, store / MANIFEST)  # the commit point
    except OSError as exc:  # disk full, read-only: the old manifest stands
        tmp.unlink(missing_ok=True)
        raise StoreError(f"{store}: cannot write the store manifest ({exc.strerror or exc}); "
                         "the store is unchanged") from None


def writable(store: Path) -> bool:
    """Can this process write the store (results, lock)? False on a read-only store."""
    if isinstance(store, Remote):
        return True  # known only by trying: a refused write is one StoreError line
    return os.access(store, os.W_OK | os.X_OK)


def _is_trace_name(p: Path) -> bool:
    """A Kineto trace or a Flight Recorder dump, by its name (what ingest looks for)."""
    return p.name.endswith((".trace.json", ".json.gz", ".fr.json", ".fr.pkl")) or p.name.startswith("nccl_trace_rank_")


def has_manifest(store: Path | Remote) -> bool:
    """Has ``store`` been committed to at least once?"""
    if isinstance(store, Remote):
        from .remote import latest
        store.check_reachable()
        return latest(store) is not None
    return (store / MANIFEST).exists()


def not_a_store(store: Path | Remote) -> str:
    """Why ``store`` is not a store, naming what the path is (a file, a trace folder, ...) and what to do."""
    if isinstance(store, Remote):
        return (f"{store}: no traceanalyzer store here (no _store/manifest-*.json); create one with "
                f"`traceanalyzer ingest TRACES --store {store}`")
    if store.is_file():
        what = "a trace file" if _is_trace_name(store) else "a file"
        return (f"{store}: this is {what}, not a store (a store is a folder with {MANIFEST}); "
                + (f"ingest it first: `traceanalyzer ingest {store} --store STORE_FOLDER`" if _is_trace_name(store)
                   else "give the store folder that `traceanalyzer ingest ... --store FOLDER` created"))
    if store.is_dir():
        traces = next((p for p in store.rglob("*") if p.is_file() and _is_trace_name(p)), None)
        if traces is not None:
            return (f"{store}: this is a trace folder (e.g. {traces.name}), not a store (no {MANIFEST}); ingest it "
                    f"first: `traceanalyzer ingest {store} --store STORE_FOLDER`, then use STORE_FOLDER")
        return (f"{store}: this folder is not a store (no {MANIFEST}); create one with "
                f"`traceanalyzer ingest TRACES --store {store}`")
    return f"{store}: no such store folder; create one with `traceanalyzer ingest TRACES --store {store}`"


def check_writable(store: Path | Remote) -> None:
    if isinstance(store, Remote):
        return store.check_reachable()
    if store.exists() and not store.is_dir():
        raise StoreError(f"{store}: this is a file, not a folder; the store is a folder: choose another --store path")
    try:
        store.mkdir(parents=True, exist_ok=True)
        probe = store / f".write-test-{uuid.uuid4().hex}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise StoreError(f"{store}: cannot write the store ({exc.strerror or exc})") from None


@contextmanager
def locked(store: Path, wait_s: float = 0):
    """Exclusive write access to the store; a lock left by a dead process is taken over, one a
    live process holds is waited for up to ``wait_s`` seconds. A remote store has no lock: its
    commit is a conditional create (:mod:`.remote`)."""
    if isinstance(store, Remote):
        yield
        return
    lock = store / LOCK
    deadline, pause, stale = time.monotonic() + wait_s, 0.02, 0
    while True:
        try:
            if lockfile.create(lock):  # the lock appears with its owner written in it
                break
        except OSError as exc:
            raise StoreError(f"{store}: cannot take the store lock {lock} ({exc.strerror or exc})") from None
        found = lockfile.identity(lock)
        host, pid = lock_owner(lock)
        if not pid and stale < 50:  # left empty by an older writer or a full disk (or written this instant)
            stale += 1
            time.sleep(0.01)
            continue
        if owner_alive(host, pid):
            if time.monotonic() < deadline:
                time.sleep(pause)
                pause = min(0.5, pause * 1.5)
                continue
            on = f" on {host}" if host and host != socket.gethostname() else ""
            waited = f" (waited {wait_s:g} s)" if wait_s else ""
            raise StoreError(f"{store}: another process (pid {pid}{on}: an ingest, an analyze's commit or an rm) "
                             f"is writing this store{waited}; wait for it, or remove {lock} if that process is "
                             f"gone") from None
        # its process is gone: removed by one process at a time, if still that same stale file
        lockfile.break_stale(lock, found, lambda: lock_owner(lock) == (host, pid) and not owner_alive(host, pid))
    try:
        yield
    finally:
        lockfile.release(lock)


def lock_owner(lock: Path) -> tuple[str | None, int]:
    """(host, pid) written in a lock file: ``host:pid`` (``pid`` alone from older writers; 0 when
    unreadable or empty)."""
    try:
        host, _, pid = lock.read_text().strip().rpartition(":")
        return host or None, int(pid or 0)
    except (OSError, ValueError):
        return None, 0


def owner_alive(host: str | None, pid: int) -> bool:
    """Is the lock's process alive? A process of another host (a store on a shared file system)
    cannot be checked from here: it counts as alive, and the user removes its lock if it is gone."""
    if host and host != socket.gethostname():
        return True
    return bool(pid) and _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def partition_dir_run(run: str) -> str:
    """A run's folder in a table's folder."""
    return f"run={run}"


def partition_dir(table: str, run: str, rank: int, window_id: int | None = None) -> str:
    """Folder of a table's files for one trace file, or (window_id None) for one process."""
    if window_id is None:
        return f"{table}/{partition_dir_run(run)}/rank={rank}"
    return f"{table}/{partition_dir_run(run)}/rank={rank}/window_id={window_id}"


def place(store: Path, staged: dict[str, str], run: str, rank: int, part: str,
          window_id: int | None = None) -> dict[str, str]:
    """Move staged Parquet files (table -> path) into their partitions as ``part-<part>.parquet``;
    returns table -> the path relative to the store, for the manifest (which the caller commits)."""
    if isinstance(store, Remote):
        from .remote import place as upload
        return upload(store, staged, {t: partition_dir(t, run, rank, window_id) for t in staged}, part)
    files = {}
    for table, path in staged.items():
        rel = f"{partition_dir(table, run, rank, window_id)}/part-{part}.parquet"
        (store / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, store / rel)
        files[table] = rel
    return files


def summary_files(manifest: Manifest) -> set[str]:
    """The per-rank summary files the manifest lists (:mod:`traceanalyzer.analyses.summaries`; the
    replay graph's pieces, :mod:`traceanalyzer.replay.graph.pieces`)."""
    return ({f for r in manifest.extra.get("summaries", {}).values() for fs in r.get("files", {}).values() for f in fs}
            | {f for r in manifest.extra.get("replay_graph", {}).values() for c in r.get("chunks", [])
               for f in c.get("files", {}).values()})


def run_folders_exist(store: Path | Remote, run: str) -> bool:
    """Whether any table folder of run ``run`` is in a local store (before an ingest places its
    files: where none is, nothing of the run can be left over to collect)."""
    return isinstance(store, Remote) or any((store / table / partition_dir_run(run)).exists() for table in S.TABLES)


def collect_garbage(store: Path, manifest: Manifest, run: str | None = None, sweep_run: bool = True) -> None:
    """Remove files no manifest lists (left by an ingest that was killed) and old staging dirs.
    With ``run`` (an ingest of that run) only that run's table folders are swept (not even those
    when ``sweep_run`` is false: the ingest found none of them, :func:`run_folders_exist`; a walk of
    8,192 ranks' 57 k files costs ~18 s), plus the retired files whose keep time is up: an ingest
    then costs the same in a store of 1 run or 1,000 (``check --repair`` sweeps everything)."""
    from .writers import listed, retained
    kept = retained(manifest)  # unlisted by a recent commit: a reader may hold them
    if run is not None and not isinstance(store, Remote):
        live = listed(manifest) | kept
        for table in S.TABLES if sweep_run else ():
            _sweep(store, f"{table}/{partition_dir_run(run)}", live, rmdir=True)
        for rel in set(manifest.extra.get("retired", {})) - live:
            (store / rel).unlink(missing_ok=True)
        _collect_leftovers(store)
        return
    live = {f for t in manifest.traces + manifest.sidecars for f in t["files"].values()} | kept
    summaries = summary_files(manifest) | kept
    if isinstance(store, Remote):
        from .remote import collect_garbage as collect
        collect(store, live | summaries
                | {f for r in manifest.extra.get("results", {}).values() for f in r.get("files", {}).values()})
        return
    for table in S.TABLES:
        _sweep(store, table, live, rmdir=True)
    _sweep(store, "_results", {f for r in manifest.extra.get("results", {}).values()
                               for f in r.get("files", {}).values()} | kept)
    _sweep(store, "_summaries", summaries)   # per-rank summaries no longer current
    _collect_leftovers(store)


def _sweep(store: Path, folder: str, keep: set[str], rmdir: bool = False) -> None:
    """Remove the Parquet files under ``store/folder`` not in ``keep`` (paths relative to the store),
    and with ``rmdir`` the folders left empty (os.walk: pathlib's rglob costs ~5x more per file)."""
    for top, dirs, names in os.walk(store / folder, topdown=False):
        rel = Path(top).relative_to(store).as_posix()
        for name in names:
            if name.endswith(".parquet") and f"{rel}/{name}" not in keep:
                try:
                    os.unlink(os.path.join(top, name))
                except FileNotFoundError:
                    pass
        if rmdir and top != str(store / folder):
            try:
                os.rmdir(top)
            except OSError:
                pass


def collect_unlisted(store: Path, before: Manifest, after: Manifest) -> None:
    """Garbage collection scoped to one commit (``before`` -> ``after``, :func:`.writers.update`):
    remove the files ``before`` listed or retained that ``after`` neither lists nor retains, and
    the leftovers of killed writers at the store's top level. Unlike :func:`collect_garbage` it
    walks no table folder: a short commit costs the same in a store of 1 run or 1,000. (Files no
    manifest ever listed, left by a killed ingest, wait for the next ingest or ``check --repair``.)"""
    from .writers import listed, retained
    if isinstance(store, Remote):
        return collect_garbage(store, after)
    gone = (listed(before) | set(before.extra.get("retired", {}))) - listed(after) - retained(after)
    for rel in sorted(gone):
        path = store / rel
        path.unlink(missing_ok=True)
        for d in path.parents:   # its folders, once empty, up to the store
            if d == store or store not in d.parents:
                break
            try:
                d.rmdir()
            except OSError:
                break
    _collect_leftovers(store)


def _collect_leftovers(store: Path) -> None:
    """Staging and work folders and temporary files killed writers left at the store's top level."""
    from .writers import WORK, work_owner_alive
    for staging in store.glob(".staging-*"):  # we hold the lock: no other ingest is staging
        shutil.rmtree(staging, ignore_errors=True)
    for work in store.glob(f"{WORK}*"):  # staged without the lock: only once its process is gone
        if not work_owner_alive(work):
            shutil.rmtree(work, ignore_errors=True)
    for tmp in [*store.glob(f".{MANIFEST}.*.tmp"), *store.glob(".write-test-*")]:  # left by a killed writer
        tmp.unlink(missing_ok=True)


# -- reading ---------------------------------------------------------------------------------

def _empty_select(table: S.Table) -> str:
    cols = [f"NULL::{S.PARTITION_KEYS[k]} AS {k}" for k in table.partition]
    cols += [f"NULL::{_DUCK_TYPES[str(c.type)]} AS \"{c.name}\"" for c in table.columns]
    return f"SELECT {', '.join(cols)} WHERE false"


def _sql_list(paths: list[str]) -> str:
    return "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"


def open_store(store: str | os.PathLike, read_only_db: str | None = None, select=None, manifest: Manifest | None = None,
               checked: bool = False):
    """A DuckDB connection with one view per canonical table (plus ``runs``) over the store, the
    ``comms_fr`` and ``comms_nccl`` views, and the ``nccl_comm_map`` table (computed here, in memory,
    by :mod:`traceanalyzer.analyses.nccl_join` when the store holds NCCL logs or plugin output).
    ``select(entry) -> bool`` keeps only some traces and per-process inputs (one rank's: the
    per-rank summaries, :mod:`traceanalyzer.analyses.summaries`) and the saved results of their runs:
    the views then cost what those runs cost, whatever else the store holds. ``manifest``: the store's
    manifest as the caller read it (not read again); ``checked``: the caller's process already had the
    selected files checked (:func:`.check.healthy`) on this manifest, so they are not checked again (a
    map task of the analyses, whose driver opened the whole run: at 8,192 ranks each task's two
    connections re-read ~2,300 footers)."""
    import duckdb  # imported here: ingest workers never need it
    store = location(store)
    if isinstance(store, Path) and not (store / MANIFEST).exists():
        raise StoreError(not_a_store(store))
    manifest = read_manifest(store) if manifest is None else manifest
    if isinstance(store, Remote) and manifest.generation == 0:  # a prefix that holds nothing yet
        raise StoreError(not_a_store(store))
    from .check import healthy
    if select is not None:   # the selected traces and inputs, and their runs' saved results
        manifest = Manifest(manifest.schema_version, manifest.generation, [t for t in manifest.traces if select(t)],
                            manifest.extra, [t for t in manifest.sidecars if select(t)])
        manifest.extra = {**manifest.extra, "results": _results_of(manifest.extra.get("results", {}),
                                                                   {t.get("run") for t in manifest.traces})}
    if not checked:
        manifest = healthy(store, manifest)  # a damaged run is left out (one warning line)
    con = duckdb.connect(read_only_db or ":memory:")
    # DuckDB draws a progress bar on stdout for queries over ~2 s: it would land in front of
    # `analyze --json > file`. A setting of this connection alone (scope LOCAL), nothing global.
    # In Jupyter DuckDB refuses any change of it without ipywidgets; there the bar is a widget.
    try:
        con.execute("SET enable_progress_bar = false")
    except duckdb.InvalidInputException:
        pass
    if isinstance(store, Path) and _listed_bytes(store, manifest) <= ONE_THREAD_MAX_BYTES:
        con.execute("SET threads = 1")  # this connection's own database: nothing global changes
    where = _readable(store, manifest, con)
    for name, table in S.TABLES.items():
        files = [where(f) for f in manifest.files(name)]
        hive_types = "{" + ", ".join(f"'{k}': '{S.PARTITION_KEYS[k]}'" for k in table.partition) + "}"
        union = "" if same_columns(manifest, name) else ", union_by_name = true"
        if files:
            con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet({_sql_list(files)}, "
                        f"hive_partitioning = true, hive_types = {hive_types}{union})")
        else:
            con.execute(f"CREATE VIEW {name} AS {_empty_select(table)}")
    con.execute("""
        CREATE VIEW runs AS
        SELECT run, count(DISTINCT rank) AS n_ranks, count(*) AS n_windows, max(world_size) AS world_size,
               any_value(backend) AS backend, min(start_ts_ns) AS start_ts_ns, max(end_ts_ns) AS end_ts_ns
        FROM ranks GROUP BY run""")
    con.execute(_COMMS_FR)
    _result_views(con, where, manifest)
    return con


def same_columns(manifest: Manifest, table: str) -> bool:
    """Whether every file of ``table`` the manifest lists holds the same columns: each was written
    by an ingest that says so (its entry's ``schema``: this version's columns, exactly; tested for
    every source). Then DuckDB reads the first file's footer only, not every file's at every query
    (``union_by_name``: ~0.7 ms a file, paid by each query of the view: at 8,192 ranks ~6 s a scan).
    Entries of older versions (or without the key) may lack a newer column: read by name."""
    return all(t.get("schema") == S.SCHEMA_VERSION for t in manifest.traces + manifest.sidecars if table in t["files"])


def _results_of(saved: dict, runs: set) -> dict:
    """The saved results' entries with the files of ``runs`` only."""
    return {name: {**e, "files": {r: f for r, f in e.get("files", {}).items() if r in runs}} for name, e in saved.items()}


def _listed_bytes(store: Path, manifest: Manifest) -> int:
    """Bytes of the tables' files the manifest lists (a missing one counts as big: no guess)."""
    total = 0
    for rel in (f for t in manifest.traces + manifest.sidecars for f in t["files"].values()):
        try:
            total += (store / rel).stat().st_size
        except OSError:
            return ONE_THREAD_MAX_BYTES + 1
        if total > ONE_THREAD_MAX_BYTES:
            break
    return total


def _readable(store: Path | Remote, manifest: Manifest, con):
    """rel -> the path (or URL) DuckDB reads that listed file at: in the store folder; for a
    remote store a local copy, removed with the connection (:func:`.remote.readable`), or the URL
    read through the store's fsspec filesystem."""
    if not isinstance(store, Remote):
        return lambda rel: str(store / rel)
    from .remote import readable
    results = [f for r in manifest.extra.get("results", {}).values() for f in r.get("files", {}).values()]
    where, folder = readable(store, [f for t in manifest.traces + manifest.sidecars
                                     for f in t["files"].values()] + results)
    if folder is None:
        con.register_filesystem(store.fs)
    else:
        weakref.finalize(con, shutil.rmtree, folder, True)
    return where.__getitem__


def _result_views(con, where, manifest: Manifest) -> None:
    """``result_<analysis>`` views over what ``traceanalyzer analyze`` saved (empty when not run)."""
    saved = manifest.extra.get("results", {})
    # S.RESULTS: the analyses registered in this process (traceanalyzer.analyses.registry); results
    # saved by an analysis registered elsewhere are views too
    for name in dict.fromkeys(list(S.RESULTS) + list(saved)):
        files = [where(f) for f in saved.get(name, {}).get("files", {}).values()]
        table = S.RESULTS.get(name)
        if files:
            con.execute(f"CREATE VIEW result_{name} AS SELECT * FROM read_parquet({_sql_list(files)}, union_by_name = true)")
        elif table is not None:
            cols = ", ".join(f"NULL::{_DUCK_TYPES[str(c.type)]} AS \"{c.name}\"" for c in table.columns)
            con.execute(f"CREATE VIEW result_{name} AS SELECT {cols} WHERE false")


#: comms joined to their Flight Recorder entry (columns declared in schema.COMMS_FR).
_COMMS_FR = """
    CREATE VIEW comms_fr AS
    WITH fr AS (
        SELECT run, rank, pg_name, collective_seq_id, record_id, profiling_name, state, time_created_ns,
               time_discovered_started_ns, time_discovered_completed_ns, duration_ns, input_sizes, frames_json,
               count(*) OVER (PARTITION BY run, rank, pg_name, collective_seq_id) AS n_entries
        FROM fr_entries WHERE NOT is_p2p
        QUALIFY row_number() OVER (PARTITION BY run, rank, pg_name, collective_seq_id
                                   ORDER BY op_id DESC, record_id DESC) = 1)
    SELECT c.*, fr.record_id IS NOT NULL AS fr_matched, coalesce(fr.n_entries, 0) AS fr_n_entries,
           fr.record_id AS fr_record_id, fr.profiling_name AS fr_profiling_name, fr.state AS fr_state,
           fr.time_created_ns AS fr_time_created_ns, fr.time_discovered_started_ns AS fr_started_ns,
           fr.time_discovered_completed_ns AS fr_completed_ns, fr.duration_ns AS fr_duration_ns,
           fr.input_sizes AS fr_input_sizes, fr.frames_json AS fr_frames_json
    FROM comms c LEFT JOIN fr
      ON fr.run = c.run AND fr.rank = c.rank AND fr.pg_name = c.pg_name AND fr.collective_seq_id = c.seq
    WHERE NOT c.is_p2p AND c.seq_source IN ('flight_recorder', 'nccl_seq')"""


def new_staging(store: Path | Remote) -> Path:
    """A fresh folder for an ingest's staged Parquet files: inside a local store (same file system:
    moving them into place is a rename), a local temporary folder for a remote one (uploaded)."""
    if isinstance(store, Remote):
        from .remote import new_staging as local_tmp
        return local_tmp()
    staging = store / f".staging-{uuid.uuid4().hex}"
    staging.mkdir()
    return staging


def put_table(store: Path | Remote, table: pa.Table, stem: str) -> str:
    """Write ``table`` as a new file of the store named after ``stem``; returns its name relative
    to the store (for the manifest, which the caller commits)."""
    if isinstance(store, Remote):
        from .remote import put_table as upload
        return upload(store, table, stem)
    rel = f"{stem}.parquet"
    (store / rel).parent.mkdir(parents=True, exist_ok=True)
    write_table(table, store / rel)
    return rel


def write_table(table: pa.Table, path: Path) -> None:
    import pyarrow.parquet as pq
    pq.write_table(table, path, compression="zstd", row_group_size=256 * 1024)
