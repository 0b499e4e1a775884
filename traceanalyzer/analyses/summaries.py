"""Per-rank summaries: the rank-local analysis views computed one rank at a time (map), saved in
the store, and read by the cross-rank views (reduce) instead of all the run's events.

The SQL modules declare the scope of their views (:mod:`.modules`): ``-- scope: rank`` views
depend on one rank's data only, given the ``-- scope: align`` views (step alignment, clock
offsets), which are cross-rank but read only ``comms``, ``steps`` and ``ranks``. So, per run:

1. **align**: one connection over the run computes the ``align`` views (no ``events`` read);
2. **map**: one task per chunk of consecutive ranks (:func:`rank_chunks`: up to 16 MB of events
   Parquet; on the executor: inline, a process pool or Dask) opens the store with those ranks'
   files only, takes the ``align`` views as given, computes the ``rank`` views and writes those the
   cross-rank views or the results read (:func:`saved_views`) as Parquet;
3. **commit**: the files go to ``STORE/_summaries/<view>/run=R/rank=K[-L]/part-G.parquet`` (the align
   views: ``.../run=R/rank=all/``) and are listed in the manifest under ``summaries`` with a key;
4. **reduce**: :func:`attach` puts a view over the union of the saved files in place of each saved
   view (:func:`.modules.provide`), so the cross-rank modules read them and never rebuild them
   from ``events``.

The key of a run's summaries covers its data (the files the manifest lists for it), the analysis
parameters, the SQL of every module and the package version: any change makes the next
``analyze`` compute them again (the old files are then garbage). Memory of a map task is that of
one rank; the reduce reads compact per-rank tables (plus ``comms``), not events, with its DuckDB
memory capped (:func:`limit_memory`: it spills above :data:`REDUCE_MEMORY_BYTES`).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import uuid
from pathlib import Path

from .. import __version__
from ..store import files as st
from ..store import writers
from . import modules as M

#: bump when the layout of the saved summaries changes (part of the key)
FORMAT = 5  # 3: _imbalance_ops_rank saved (imbalance_ops' per-rank part); 4: _pipeline_gaps, _pipeline_p2p_islands;
#   5: _activity_steps, _activity_ops (was _imbalance_ops_rank) for the reduce's imbalance and work views
#: the events Parquet one map task reads at most (bytes; a larger rank is a task of its own)
MAP_TASK_EVENTS_BYTES = 16 << 20
#: ranks per map task where the events' sizes are not known (a store on object storage)
MAP_TASK_RANKS = 16
#: manifest key of the summaries
ENTRY = "summaries"
#: folder of the summaries in the store
FOLDER = "_summaries"
#: DuckDB memory of the driver's connections (align, reduce; bytes): above it, their operators and
#: temporary tables spill to a work folder of the store (:func:`limit_memory`), so the driver's
#: memory does not grow with the rank count (issue 18). The driver's peak is at most about this plus
#: ~0.3 GB (with 256 MiB: 0.44 / 0.49 / 0.55 GB at 128 / 512 / 1,024 ranks; 0.51 / 1.34 / 2.57 GB
#: without a cap). 1 GiB since session 29: at 8,192 op-timeline ranks, 256 MiB made `p2p_transfers`
#: spill (165 s wall against 115 under 1 GiB) and ran out of memory (a retry with the cap doubled);
#: the map's processes are gone by the reduce, so the run's peak stays that of the map. A setting of
#: that connection's own database, never process-global; 0: no cap (DuckDB's default, 80 % of RAM).
REDUCE_MEMORY_BYTES = 1 << 30
#: public rank views the map does not save: ``activity_intervals`` has a row per operation and no view
#: of the reduce reads it (they read its sums per step and per op, ``_activity_steps`` and
#: ``_activity_ops``); writing it cost ~4 % of analyze at 2,048 op-timeline ranks. A query of it after
#: analyze computes it from the events (:func:`attach` leaves it a view over them). A view the reduce
#: reads is saved anyway.
NOT_SAVED = ("activity_intervals",)
#: canonical tables and views of a store connection (what a view may read besides other views)
_IDENT_RE = re.compile(r"\b([A-Za-z_]\w*)\b")


# -- what is saved --------------------------------------------------------------------------------

def reads() -> dict[str, set[str]]:
    """View -> the views and macros its SQL names (comments left out), for every module's view."""
    import duckdb
    own, con, out = M.owner(), duckdb.connect(), {}
    for mod in M.modules().values():
        for statement in con.extract_statements(mod.text):
            q = statement.query
            m = re.search(r"CREATE OR REPLACE TEMP (?:VIEW|MACRO|TABLE)\s+(\w+)", q)
            if m:
                body = re.sub(r"--[^\n]*", "", q[m.end():])
                out[m.group(1)] = (set(_IDENT_RE.findall(body)) & set(own)) - {m.group(1)}
    con.close()
    return out


def names_read(view: str) -> set[str]:
    """Every identifier view ``view``'s SQL names (to check what canonical tables it reads)."""
    return set(_IDENT_RE.findall(re.sub(r"--[^\n]*", "", M.select_of(view))))


def saved_views() -> list[str]:
    """The rank views a map task saves: public ones (no leading '_') and those a view of another
    scope reads; private views only other rank views read stay in the task, as do the public views
    of :data:`NOT_SAVED`."""
    rank = M.scoped("rank")
    scope = {v: sc for m in M.modules().values() for v, sc in m.scopes}
    readers: dict[str, set[str]] = {}
    for view, deps in reads().items():
        for dep in deps:
            readers.setdefault(dep, set()).add(view)
    return [v for v in rank if (not v.startswith("_") and v not in NOT_SAVED)
            or any(scope.get(r) not in ("rank", "peers") for r in readers.get(v, ()) if r in M.owner())]


# -- keys -----------------------------------------------------------------------------------------

def _entries(manifest, run: str, rank=None) -> list[dict]:
    return [t for t in manifest.traces + manifest.sidecars
            if t.get("run") == run and (rank is None or t.get("rank") == rank)]


def key(manifest, run: str, params: dict) -> str:
    """What a run's summaries were computed from: its files, the parameters, the SQL, the version."""
    files = sorted(f for t in _entries(manifest, run) for f in t["files"].values())
    sql = {name: m.text for name, m in sorted(M.modules().items())}
    doc = json.dumps([FORMAT, __version__, files, sorted(params.items()), sql], default=str)
    return hashlib.sha256(doc.encode()).hexdigest()[:32]


def chunk_label(ranks: list[int]) -> str:
    """A chunk's name in paths: its rank, or its first and last rank."""
    return str(ranks[0]) if len(ranks) == 1 else f"{ranks[0]}-{ranks[-1]}"


def ranks_of(manifest, run: str) -> list[int]:
    return sorted({t["rank"] for t in manifest.traces if t.get("run") == run})


# -- writing and reading Parquet with the views' own types ----------------------------------------

def _types(con, view: str) -> list[list[str]]:
    return [[name, typ] for name, typ, *_ in con.execute(f"DESCRIBE {view}").fetchall()]


def _write(con, view: str, path: Path) -> list[list[str]]:
    """Write ``view`` to ``path``; returns its columns and types. HUGEINT (sums: counts, ns), which
    Parquet would turn into DOUBLE, is stored as BIGINT (DECIMAL(38,0) when a value does not fit) and
    cast back when read: no value changes. Snappy, not zstd: the summaries are a cache the reduce
    reads once, and their writes were ~20 % of a map task at 1,024 op-timeline ranks (zstd and
    DECIMAL: 1.74 CPU s for one task's 3 M segments; snappy and BIGINT 0.88, files 1.7x larger)."""
    import duckdb
    types = _types(con, view)
    for wide in ("BIGINT", "DECIMAL(38,0)"):
        cols = ", ".join(f'CAST("{c}" AS {wide}) AS "{c}"' if t == "HUGEINT" else f'"{c}"' for c, t in types)
        try:
            con.execute(f"COPY (SELECT {cols} FROM {view}) TO '{sql_quote(str(path))}' (FORMAT parquet, COMPRESSION snappy)")
            return types
        except duckdb.ConversionException:   # a sum past BIGINT
            if wide != "BIGINT" or not any(t == "HUGEINT" for _, t in types):
                raise
    return types


def sql_quote(s: str) -> str:
    """``s`` inside a SQL string literal (a path, a run name): its single quotes doubled."""
    return s.replace("'", "''")


def select(paths: list[str], types: list[list[str]]) -> str:
    """SQL reading the union of ``paths`` with the columns and types a view had."""
    cols = ", ".join(f'CAST("{c}" AS {t}) AS "{c}"' for c, t in types)
    files = "[" + ", ".join(f"'{sql_quote(p)}'" for p in paths) + "]"
    return f"SELECT {cols} FROM read_parquet({files}, hive_partitioning = false)"


# -- the tasks ------------------------------------------------------------------------------------

def open_run(store: str, run: str, ranks: list[int] | None = None, manifest=None, checked: bool = False):
    """A store connection over run ``run``'s files (those of ``ranks`` when given); ``manifest`` and
    ``checked`` as :func:`~traceanalyzer.store.files.open_store` takes them."""
    keep = None if ranks is None else set(ranks)
    return st.open_store(store, select=lambda t: t.get("run") == run and (keep is None or t.get("rank") in keep),
                         manifest=manifest, checked=checked)


def rank_chunks(loc, manifest, run: str, n_workers: int = 1) -> list[list[int]]:
    """The run's ranks cut into the map's tasks: consecutive ranks up to MAP_TASK_EVENTS_BYTES of
    events Parquet together (a larger rank is a task of its own), MAP_TASK_RANKS where the sizes are
    not known (an object store), and at most an even share of the ranks per worker. Why not one task
    per rank: each task pays a connection and the binding of the rank views (~0.3 s), which at
    thousands of small ranks (an op timeline) is most of the work; memory stays that of a few ranks."""
    ranks = ranks_of(manifest, run)
    cap = max(1, -(-len(ranks) // max(1, n_workers)))     # ceil(ranks / workers): every worker gets work
    if not isinstance(loc, Path):
        step = max(1, min(MAP_TASK_RANKS, cap))
        return [ranks[i:i + step] for i in range(0, len(ranks), step)]
    size: dict[int, int] = {}
    for t in manifest.traces:
        f = t["files"].get("events") if t.get("run") == run else None
        if f:
            try:
                size[t["rank"]] = size.get(t["rank"], 0) + (loc / f).stat().st_size
            except OSError:
                size[t["rank"]] = size.get(t["rank"], 0) + MAP_TASK_EVENTS_BYTES
    chunks, cur, total = [], [], 0
    for r in ranks:
        if cur and (total + size.get(r, 0) > MAP_TASK_EVENTS_BYTES or len(cur) >= cap):
            chunks.append(cur)
            cur, total = [], 0
        cur.append(r)
        total += size.get(r, 0)
    return chunks + ([cur] if cur else [])


def map_plan(loc, manifest, run: str, n_workers: int | None) -> tuple[list[list[int]], int | None]:
    """The run's map tasks (:func:`rank_chunks`) and the local pool's processes for them. ``n_workers``
    None: one per CPU when the run's events make more than one task (over MAP_TASK_EVENTS_BYTES), else
    the map runs in this process (a pool's start costs more than a small run's map: no fixed cost on
    small inputs); as ingest chooses its own."""
    if n_workers is not None:
        return rank_chunks(loc, manifest, run, n_workers), n_workers
    chunks = rank_chunks(loc, manifest, run, 1)
    workers = max(1, min(os.cpu_count() or 1, len(chunks)))
    return (rank_chunks(loc, manifest, run, workers) if workers > 1 else chunks), workers


def map_threads(workers: int, dask) -> int | None:
    """DuckDB threads per map task: the CPUs shared out among the local pool's ``workers`` processes
    (at least one), which all run at once; None (DuckDB's default, one per CPU) for a single process
    or a Dask cluster (whose workers' machines are not known here). Why: with two processes on two
    CPUs, each task's DuckDB running two threads spent ~12 % more CPU on its parallel operators
    (165-rank op-timeline tasks: 13.0 -> 11.5 s wall for two at once), with no gain in wall time."""
    if dask is not None or workers <= 1:
        return None
    return max(1, (os.cpu_count() or 1) // workers)


def align_task(store: str, run: str, params: dict, out: str) -> dict:
    """Compute the run's ``align`` views; returns {view: (path, types)}. Runs in the driver and reads
    every rank's ``comms``: its memory is capped like the reduce's (:func:`limit_memory`)."""
    from . import prepare
    con = open_run(store, run)
    Path(out).mkdir(parents=True, exist_ok=True)
    try:
        views = M.scoped("align")
        limit_memory(con, store)
        under_cap(con, lambda: prepare(con, views=views, **params))
        return {v: (str(Path(out) / f"{v}.parquet"), _write(con, v, Path(out) / f"{v}.parquet")) for v in views}
    finally:
        con.close()


def map_task(store: str, run: str, ranks: list[int], params: dict, align: dict, out: str, views: list[str],
             threads: int | None = None) -> dict:
    """Compute the saved views of ``ranks`` (a chunk, ``rank_chunks``) from their own files and the
    run's ``align`` views; returns {view: (path, types)}. Runs in a worker: its memory is that of the
    chunk's ranks. ``threads``: DuckDB threads of the task's connections (default: DuckDB's, one per
    CPU), see :func:`map_threads`. The store's manifest is read once for the task's connections, and
    their files are not checked again: the driver's align connection checked the whole run's."""
    manifest = st.read_manifest(st.location(store))
    con = _task_connection(store, run, ranks, params, align, threads, manifest)
    try:
        _provide_peer_sends(con, store, run, ranks, params, align, threads, manifest)
        # the modules' cross-rank views are the reduce's; `peers` views not provided are made (empty)
        M.bind(con, M.modules_for(views), scopes=("rank", "peers"))
        folder = Path(out) / f"rank={chunk_label(ranks)}"
        folder.mkdir(parents=True, exist_ok=True)
        return {v: (str(folder / f"{v}.parquet"), _write(con, v, folder / f"{v}.parquet")) for v in views}
    finally:
        con.close()


def _task_connection(store: str, run: str, ranks: list[int], params: dict, align: dict, threads: int | None = None,
                     manifest=None):
    """A connection over ``ranks``' files with the analysis parameters set and the ``align`` views
    provided: their rows of these ranks, read once into a table (a rank view joins its own rank's
    rows only; the whole run's file read at every join cost ~5 % of a map task at 8,192 ranks)."""
    from . import prepare
    con = open_run(store, run, ranks, manifest, checked=manifest is not None)
    try:
        if threads:
            con.execute(f"SET threads = {int(threads)}")  # this connection's own database
        prepare(con, modules=[], **params)
        mine = ", ".join(str(int(r)) for r in sorted(set(ranks)))
        for view, (path, types) in align.items():
            where = f" WHERE run = '{sql_quote(run)}'" + (f" AND rank IN ({mine})" if any(c == "rank" for c, *_ in types) else "")
            con.execute(f"CREATE OR REPLACE TEMP TABLE _ta_align_{view} AS {select([path], types)}{where}")
            M.provide(con, view, f"SELECT * FROM _ta_align_{view}")
    except BaseException:
        con.close()
        raise
    return con


def _provide_peer_sends(con, store: str, run: str, ranks: list[int], params: dict, align: dict,
                        threads: int | None = None, manifest=None) -> None:
    """Provide ``_p2p_peer_sends`` in a map task's connection ``con``: the sends that ranks outside
    the chunk made to its ranks' receives, read from those ranks' own files (``_p2p_calls`` over
    them), so that ``p2p_transfers`` is made per receiver in the map, as the other rank views are
    (at 8,192 op-timeline ranks the reduce's join of every receive with its send took 88-115 s)."""
    chunk = set(ranks)
    peers = [r for (r,) in con.execute(
        "SELECT DISTINCT src_rank FROM comms WHERE is_p2p AND op = 'recv' AND src_rank IS NOT NULL "
        "AND rank = dst_rank ORDER BY src_rank").fetchall() if r not in chunk]
    if not peers:
        return   # made empty by bind
    pcon = _task_connection(store, run, peers, params, align, threads, manifest)
    try:
        sends = pcon.sql(f"SELECT * FROM ({M.select_of('_p2p_calls')}) WHERE op = 'send' "
                         f"AND dst_rank IN ({', '.join(map(str, sorted(chunk)))})").arrow().read_all()
    finally:
        pcon.close()
    con.register("_ta_peer_sends", sends)
    M.provide(con, "_p2p_peer_sends", "SELECT * FROM _ta_peer_sends")


# -- the driver -----------------------------------------------------------------------------------

def current(store, runs: list[str], params: dict, manifest=None) -> list[str]:
    """The runs among ``runs`` whose saved summaries (in ``manifest``, default: the store's now)
    match their data, parameters and code (and, in a local store, whose files are whole: a damaged
    one is computed again, not read)."""
    loc = st.location(store)
    manifest = st.read_manifest(loc) if manifest is None else manifest
    saved = manifest.extra.get(ENTRY, {})
    return [r for r in runs if saved.get(r, {}).get("key") == key(manifest, r, params) and _whole(loc, saved[r])]


def _whole(loc, entry: dict) -> bool:
    """Are a run's saved summary files whole (local store: their footers; remote: written whole)?"""
    from ..store.check import file_problem
    return not (isinstance(loc, Path) and any(file_problem(loc / f) for fs in entry["files"].values() for f in fs))


def ensure(store, runs: list[str], params: dict, dask=None, n_workers: int | None = 1, progress=None) -> list[str]:
    """Compute and save the summaries of the runs among ``runs`` that have none current (align,
    then the map on the executor; ``n_workers`` None: :func:`map_plan` chooses); returns the runs
    computed now."""
    from ..errors import TraceAnalyzerError
    from ..ingest.executor import open_executor
    loc = st.location(store)
    todo = [r for r in runs if r not in current(store, runs, params)]
    if not todo:
        return []
    manifest = st.read_manifest(loc)
    where = str(loc.resolve()) if isinstance(loc, Path) else str(store)  # a cluster's workers: absolute paths
    views = saved_views()
    staging = Path(writers.new_work_folder(loc)).resolve()  # no lock held: left alone while this process lives
    try:
        made = {}
        for run in todo:
            if progress:
                progress(f"summaries of run {run}: {len(ranks_of(manifest, run))} ranks")
            align = align_task(where, run, params, str(staging / f"run-{run}"))
            chunks, workers = map_plan(loc, manifest, run, n_workers)
            threads = map_threads(workers, dask)
            calls = [(where, run, c, params, align, str(staging / f"run-{run}"), views, threads) for c in chunks]
            per_rank = {}
            with open_executor(dask, n_workers=workers, n_tasks=len(calls)) as ex:
                for i, result, failure in ex.map_unordered(map_task, calls,
                                                           [f"summary-{run}-{chunk_label(c)}" for c in chunks]):
                    if failure:
                        raise TraceAnalyzerError(f"summaries of run {run}, ranks {chunk_label(chunks[i])}: {failure}")
                    per_rank[chunks[i][0]] = (chunk_label(chunks[i]), result)
            made[run] = (key(manifest, run, params), align, per_rank)
        _commit(loc, made)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return todo


def forget(store, runs: list[str] | None = None) -> None:
    """Drop the saved summaries of ``runs`` (default: all) from the store (their files are collected)."""
    def drop(manifest):
        saved = manifest.extra.get(ENTRY, {})
        for run in list(saved) if runs is None else runs:
            saved.pop(run, None)
    writers.update(st.location(store), drop)  # their files are retired: a reader may still hold them


def place_file(loc, path: str, rel_dir: str, part: str) -> str:
    """Move (local store) or upload (remote) staged file ``path`` to ``rel_dir/part-<part>...parquet``
    of store ``loc``; returns its name relative to the store, for the manifest."""
    if isinstance(loc, Path):
        rel = f"{rel_dir}/part-{part}.parquet"
        (loc / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, loc / rel)
        return rel
    from ..store.remote import place
    return place(loc, {"f": path}, {"f": rel_dir}, part)["f"]


def _entry(loc, run: str, run_key: str, align: dict, per_rank: dict, part: str) -> dict:
    """Move (upload) a run's staged summary files into place; returns its manifest entry."""
    files: dict[str, list[str]] = {}
    types: dict[str, list] = {}
    for view, (path, t) in align.items():
        files[view] = [place_file(loc, path, f"{FOLDER}/{view}/run={run}/rank=all", part)]
        types[view] = t
    for first in sorted(per_rank):
        label, views = per_rank[first]
        for view, (path, t) in views.items():
            files.setdefault(view, []).append(place_file(loc, path, f"{FOLDER}/{view}/run={run}/rank={label}", part))
            types[view] = t
    return {"key": run_key, "format": FORMAT, "types": types, "files": files}


def _commit(loc, made: dict) -> None:
    """List the runs' new summaries in one commit (docs/concurrency.md). A run whose current
    summaries another analyze saved meanwhile under the same key keeps those (these are dropped
    with the work folder); the files of a replaced entry are retired, not deleted, since a reader
    may hold them. Local: moved into place under the lock; remote: uploaded first under new names
    (the commit may be done again on a newer manifest)."""
    remote = not isinstance(loc, Path)
    if remote:
        ahead = st.read_manifest(loc).extra.get(ENTRY, {})
        made = {r: m for r, m in made.items() if ahead.get(r, {}).get("key") != m[0]}
        uploaded = {run: _entry(loc, run, *m, part=uuid.uuid4().hex[:8]) for run, m in made.items()}

    def change(manifest):
        saved = manifest.extra.setdefault(ENTRY, {})
        for run, (run_key, align, per_rank) in made.items():
            # a run re-ingested meanwhile keeps this (old) key: readers see it is not current
            if saved.get(run, {}).get("key") == run_key and _whole(loc, saved[run]):
                continue  # another analyze was first with the same summaries
            saved[run] = uploaded[run] if remote else _entry(loc, run, run_key, align, per_rank, str(manifest.generation))
    if made:
        writers.update(loc, change)


def attach(con, store, runs: list[str], params: dict) -> list[str]:
    """Put views over the saved summaries of ``runs`` in ``con`` in place of the align and rank
    views they hold (after ``prepare`` set ``params``): the cross-rank modules bound afterwards
    read them. Only when every run's summaries are current; returns the views provided."""
    loc = st.location(store)
    manifest = st.read_manifest(loc)  # read once: the files it lists stay RETIRED_KEEP_S at least
    saved = manifest.extra.get(ENTRY, {})
    if not runs or set(current(store, runs, params, manifest)) != set(runs):
        return []
    from . import prepare
    prepare(con, modules=[], **params)
    views = list(saved[runs[0]]["files"])
    where = (lambda rel: str(loc / rel)) if isinstance(loc, Path) else _remote_reader(con, loc, saved, runs)
    for view in views:
        paths = [where(f) for r in runs for f in saved[r]["files"].get(view, [])]
        M.provide(con, view, select(paths, saved[runs[0]]["types"][view]))
    for view in NOT_SAVED:  # left as a view over the events: computed only when queried
        M.provide(con, view, M.select_of(view))
    return views


def limit_memory(con, store, memory_bytes: int | None = None):
    """Cap ``con``'s DuckDB memory at ``memory_bytes`` (default :data:`REDUCE_MEMORY_BYTES`; 0: no
    cap) with its spill files in a work folder of the store (a local temporary folder for a remote
    store), removed with the connection. Both are settings of ``con``'s own in-memory database:
    nothing process-global changes. Returns the folder (None when no cap)."""
    memory_bytes = REDUCE_MEMORY_BYTES if memory_bytes is None else memory_bytes
    if not memory_bytes:
        return None
    import weakref
    folder = Path(writers.new_work_folder(st.location(store))).resolve()
    con.execute(f"SET temp_directory = '{sql_quote(str(folder))}'")
    con.execute(f"SET memory_limit = '{int(memory_bytes)}B'")
    weakref.finalize(con, shutil.rmtree, str(folder), True)
    return folder


def under_cap(con, fn, memory_bytes: int | None = None):
    """``fn()`` (the reduce's queries on ``con``, capped by :func:`limit_memory`); where DuckDB runs
    out of memory under the cap all the same (an operator that cannot spill), the cap doubles and
    ``fn`` runs again (the views made so far are kept: ``bind`` goes on from there), up to DuckDB's
    own default (80 % of the machine's memory), past which the error is raised."""
    import duckdb
    cap = REDUCE_MEMORY_BYTES if memory_bytes is None else memory_bytes
    ceiling = 0.8 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")  # DuckDB's default
    while True:
        try:
            return fn()
        except duckdb.OutOfMemoryException:
            if not cap or cap >= ceiling:
                raise
            import warnings

            from ..errors import StoreWarning
            was, cap = cap, int(min(2 * cap, ceiling))
            warnings.warn(StoreWarning(f"the analyses' reduce ran out of memory under its cap of {was >> 20} MiB "
                                       f"(summaries.REDUCE_MEMORY_BYTES): going on with {cap >> 20} MiB"), stacklevel=2)
            con.execute(f"SET memory_limit = '{cap}B'")


def _remote_reader(con, loc, saved, runs):
    from ..store.remote import readable
    where, folder = readable(loc, [f for r in runs for fs in saved[r]["files"].values() for f in fs])
    if folder is None:
        con.register_filesystem(loc.fs)
    else:
        import weakref
        weakref.finalize(con, shutil.rmtree, folder, True)
    return where.__getitem__
