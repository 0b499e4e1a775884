"""Ingest Kineto traces into a store: one task per file (a worker process, or a Dask worker), then one atomic commit.

Each worker parses one trace and writes its tables into a private staging folder inside the store
(same file system, so that moving them into place is a rename). The parent checks the batch as a
whole (ranks, overlapping windows), moves the files to their partitions and commits the manifest.
Any error leaves the store as it was. For a store at a URL (``s3://...``) the staging folder is a
local temporary one and the commit uploads the files, then creates the next manifest generation
(:mod:`traceanalyzer.store.remote`).
"""
from __future__ import annotations

import os
import re
import shutil
import sys
import time
import traceback
import uuid
from collections import Counter
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from .. import schema as S
from ..errors import TraceAnalyzerError, TraceInputError
from ..store import files as st
from .flight_recorder import sidecar_path

#: Below this much input (compressed bytes on disk) and without an explicit --workers, files are
#: parsed in this process: a worker pool takes about a second to start.
SMALL_INPUT_BYTES = 16 * 1024 * 1024

_RUN_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_TRACE_SUFFIXES = (".json", ".json.gz")
#: Files read as SQLite (Nsight Systems exports) whatever their first bytes say (else by content).
_SQLITE_SUFFIXES = (".sqlite", ".sqlite3")


@dataclass
class TraceSummary:
    """What one worker made of one file."""
    path: str
    rank: int
    rank_source: str
    start_ts_ns: int
    end_ts_ns: int
    counts: dict[str, int]
    skipped: dict[str, int]
    staged: dict[str, str]  # table -> staged parquet path
    window: int = -1
    #: communication ops whose size / process group the trace does not say (see :func:`unknown_comms`)
    unknown: dict[str, int] = field(default_factory=dict)
    #: world size, backend, process-group layout, host and pid (:func:`.consistency.job_of`)
    job: dict = field(default_factory=dict)
    #: warning lines for the ingest summary (e.g. pre-built Parquet parts that could not be used)
    notes: list[str] = field(default_factory=list)


@dataclass
class IngestReport:
    """Result of :func:`ingest`."""
    store: str
    run: str
    traces: list[TraceSummary] = field(default_factory=list)
    seconds: float = 0.0
    #: per-process inputs (FR dumps, NCCL logs, ...): :class:`~traceanalyzer.ingest.sidecars.SidecarSummary`
    sidecars: list = field(default_factory=list)
    sidecars_already_in_store: int = 0

    @property
    def n_events(self) -> int:
        return sum(t.counts.get("events", 0) for t in self.traces)

    @property
    def skipped(self) -> dict[str, int]:
        total: Counter = Counter()
        for t in self.traces + self.sidecars:
            total.update(t.skipped)
        return dict(total)

    def summary(self) -> str:
        ranks = sorted({t.rank for t in self.traces})
        comms = sum(t.counts.get("comms", 0) for t in self.traces)
        line = (f"ingested {len(self.traces)} trace(s) of run '{self.run}' (ranks {format_ranges(ranks)}): "
                f"{self.n_events:,} events, {comms:,} communication ops in {self.seconds:.1f} s -> {self.store}")
        if not self.traces:
            side_ranks = sorted({s.rank for s in self.sidecars})
            line = (f"ingested no traces; run '{self.run}' (ranks {format_ranges(side_ranks)}) in {self.seconds:.1f} s "
                    f"-> {self.store}")
        from .sidecars import summary_line
        side = summary_line(self.sidecars, self.sidecars_already_in_store)
        if side:
            line += "\n" + side
        line += unknown_warning(self.traces)
        line += "".join(f"\n  {note}" for t in self.traces for note in t.notes)
        if self.skipped:
            line += "\n  skipped or repaired: " + ", ".join(f"{k}={v:,}" for k, v in sorted(self.skipped.items()))
        return line


def unknown_comms(comms, shapes_on: bool = False) -> dict[str, int]:
    """Counts of communication ops whose message size (``size``; a barrier carries none) or
    process group (``group``; collectives only) is unknown: stored as NULL, never as 0.
    ``shapes_on``: the trace says record_shapes was on (``shapes_on`` = 1 in the result)."""
    import pyarrow.compute as pc
    if comms.num_rows == 0:
        return {}
    sized = comms.filter(pc.invert(pc.equal(pc.fill_null(comms["op"], ""), "barrier")))
    coll = comms.filter(pc.invert(comms["is_p2p"]))
    out = {"size": sized["in_bytes"].null_count, "group": coll["pg_name"].null_count, "ops": comms.num_rows,
           "shapes_on": int(shapes_on)}
    return out if out["size"] or out["group"] else {}


def unknown_warning(traces: list[TraceSummary]) -> str:
    """The ingest summary's warning lines for unknown sizes and groups ('' when all are known)."""
    text = ""
    for key, what, why in (("size", "message size", "recorded without record_shapes?"),
                           ("group", "process group", "no Flight Recorder dump and no process group in the trace")):
        hit = [t for t in traces if t.unknown.get(key)]
        if hit and key == "size" and all(t.unknown.get("shapes_on") for t in hit):
            why = "record_shapes was on, but the trace holds no size or dtype for them"
        if hit:
            n = sum(t.unknown[key] for t in hit)
            total = sum(t.counts.get("comms", 0) for t in traces)
            text += (f"\n  warning: {n:,} of {total:,} communication ops on rank(s) "
                     f"{format_ranges({t.rank for t in hit})} have an unknown {what} ({why}): shown as n/a, "
                     "not 0; analyses that need it leave those ops out")
    return text


def format_ranges(values) -> str:
    """[0, 1, 2, 5] -> '0-2,5' (how ranks are listed in one-line messages)."""
    values = sorted(values)
    if not values:
        return "-"
    out, start, prev = [], values[0], values[0]
    for v in values[1:] + [None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ",".join(out)


def find_traces(paths: Iterable[str | os.PathLike], allow_empty: bool = False) -> list[Path]:
    """Trace files named by ``paths`` (files, or folders searched recursively)."""
    found: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            found += sorted(f for f in p.rglob("*") if f.is_file() and trace_by_name(f))
        elif p.exists():
            if not p.is_file():  # a FIFO would block the reader forever
                raise TraceInputError(p, "not a regular file (a FIFO, socket or device): only regular files are read")
            found.append(p)
        else:
            raise TraceInputError(p, "no such file or folder")
    if not found and not allow_empty:
        raise TraceAnalyzerError("no trace files (Kineto *.json, *.json.gz or Nsight Systems SQLite exports) found in "
                                 + ", ".join(map(str, paths)))
    return found


def trace_by_name(f: Path) -> bool:
    """A file in a folder taken as a trace: a Kineto ``*.json``/``*.json.gz`` (not a manifest nor
    an FR dump) or an Nsight Systems export (by content). Other files are sniffed by
    :func:`traceanalyzer.ingest.sidecars.classify`."""
    from .flight_recorder import is_fr_name
    from .nsys import is_nsys_export
    from .prebuilt import is_part
    if is_part(f):  # the collector's pre-built Parquet parts (summary.json): used through their trace
        return False
    return ((f.name.endswith(_TRACE_SUFFIXES) and not f.name.endswith((".fr.json", "manifest.json", ".ranks.json",
                                                                         ".cpu_sched.json"))
             and not is_fr_name(f)) or is_nsys_export(f))


def _parse_one(path: str, rank_arg: int | None, staging: str, opts: dict | None = None,
               manifests: dict | None = None) -> tuple:
    """Worker: parse one file and stage its tables. Returns ("ok", TraceSummary) or ("error", path, problem).
    ``manifests``: what the driver read of the rank manifests beside it (``sidecars.manifests_for``;
    None: read them here)."""
    from .consistency import collector_run_id, job_of
    from .nsys import load as load_nsys
    from .nsys import looks_like_sqlite
    from .op_timeline import is_op_timeline, is_rank_files
    from .op_timeline import load as load_op_timeline
    from .op_timeline.stage import stage_all as stage_op_timeline
    from .prebuilt import build_trace
    from .sidecars import check_rank_manifest
    try:
        opts = opts or {}
        if "op_timeline_part" in opts:  # a part of one large op timeline (_op_timeline_parts)
            plan, pieces = opts["op_timeline_part"]
            return ("ok", stage_op_timeline(path, load_op_timeline(path, plan_=plan, pieces=pieces), staging))
        if is_rank_files(path):  # the light collector's per-rank op timelines of one run, read together
            return ("ok", stage_op_timeline(path, load_op_timeline(path, opts.get("column_map")), staging))
        if looks_like_sqlite(path) or path.endswith(_SQLITE_SUFFIXES):  # Nsight Systems: a rank per GPU process
            return ("ok", [_stage(path, b, staging) for b in load_nsys(path, rank_arg)])
        if opts.get("format") == "op-timeline" or is_op_timeline(path, opts.get("column_map")):  # every rank in one file
            return ("ok", stage_op_timeline(path, load_op_timeline(path, opts.get("column_map")), staging))
        built, shapes_on, _, _ = build_trace(path, rank_arg)
        manifests = {} if manifests is None else manifests
        check_rank_manifest(path, built.rank, built.rank_source, manifests)
        summary = _stage(path, built, staging, shapes_on)
        summary.job = dict(job_of(built.tables), run_id=collector_run_id(path, manifests))
        return ("ok", summary)
    except TraceInputError as exc:
        return ("error", exc.path, exc.problem)
    except MemoryError:
        return ("error", path, "out of memory while parsing")
    except RecursionError:
        from .kineto.reader import TOO_DEEP
        return ("error", path, TOO_DEEP)
    except OSError as exc:  # reading errors are TraceInputErrors already: this is writing the staged tables
        return ("error", path, f"cannot write its tables into the store ({exc.strerror or exc}); the store is unchanged")
    except Exception as exc:  # a bug of ours: say so, keep the traceback for --debug
        return ("error", path, f"internal error while parsing ({type(exc).__name__}: {exc})", traceback.format_exc())


def _stage(path: str, built, staging: str, shapes_on: bool = False) -> TraceSummary:
    """Write one rank's tables (comms included) into a fresh staging folder."""
    if not Path(staging).is_dir():  # a cluster's worker without the store, or an ingest already given up
        raise TraceInputError(path, f"the store's staging folder {staging} is not there on this machine: "
                                    "the workers of a cluster need the store on a shared file system")
    folder = Path(staging) / uuid.uuid4().hex
    folder.mkdir()
    staged = {}
    for name, table in built.tables.items():
        out = folder / f"{name}.parquet"
        st.write_table(table.select(S.TABLES[name].column_names), out)
        staged[name] = str(out)
    counts = {name: table.num_rows for name, table in built.tables.items()}
    return TraceSummary(str(Path(path).resolve()), built.rank, built.rank_source, built.start_ts_ns,
                        built.end_ts_ns, counts, dict(built.skipped), staged,
                        unknown=unknown_comms(built.tables["comms"], shapes_on))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _worker_init() -> None:
    """Workers use the system allocator: mimalloc (Arrow's default) keeps freed pages, which
    counts against the per-worker memory budget."""
    import pyarrow as pa
    pa.set_memory_pool(pa.system_memory_pool())


def default_run_name(paths: list[Path]) -> str:
    first = paths[0]
    name = first.parent.name if first.is_file() else first.name
    name = re.sub(r"[^A-Za-z0-9._-]", "_", name).strip("._-") or "run"
    return name


def ingest(paths, store, run: str | None = None, rank: int | None = None, workers: int | None = None,
           progress: bool = False, nccl_logs=(), format: str | None = None,
           column_map: dict | None = None, dask=None) -> IngestReport:
    """Parse trace files (or folders of them) into ``store`` (a folder, or a URL such as
    ``s3://bucket/prefix``: :mod:`traceanalyzer.store.remote`); returns an :class:`IngestReport`.

    Per-process inputs found among ``paths`` (Flight Recorder dumps, NCCL debug logs, NCCL
    Inspector / profiler plugin output; see :mod:`traceanalyzer.ingest.sidecars`) are ingested too, and
    ``nccl_logs`` names NCCL debug logs whatever their file names.
    ``rank`` is used only for files whose trace has no ``distributedInfo.rank``. ``format="op-timeline"``
    reads the files named as op timelines (:mod:`traceanalyzer.ingest.op_timeline`; else recognised
    by their columns), ``column_map`` maps its column names to ours. ``dask`` runs the per-file
    tasks on a Dask cluster: ``"local"`` / ``"local:N"`` (a LocalCluster of N workers, closed
    afterwards), a scheduler address (``"tcp://HOST:8786"``) or a ``distributed.Client``; the
    commit stays in this process (:mod:`traceanalyzer.ingest.executor`). Raises
    :class:`~traceanalyzer.errors.TraceInputError` or :class:`~traceanalyzer.errors.StoreError`
    with a one-line message; the store is then unchanged.
    """
    t0 = time.perf_counter()
    from . import coll_groups, consistency, p2p_groups, sidecars
    paths = [Path(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths)]
    nccl_logs = [Path(p) for p in ([nccl_logs] if isinstance(nccl_logs, (str, os.PathLike)) else nccl_logs)]
    if not paths and not nccl_logs:
        raise TraceAnalyzerError("nothing to ingest: name trace files or folders (or --nccl-log FILE)")
    trace_paths, side = sidecars.classify(paths, nccl_logs, column_map, format)
    opts = {"format": format, "column_map": column_map}
    from .op_timeline import group_rank_files
    from .prebuilt import without_json
    only_parts = without_json(trace_paths)  # the collector kept no JSON: its Parquet parts are the trace
    files = find_traces(trace_paths, allow_empty=bool(side or only_parts)) if trace_paths or not side else []
    files = group_rank_files(files) + only_parts
    run = run or default_run_name(paths or nccl_logs)
    if not _RUN_RE.match(run):
        raise TraceAnalyzerError(f"invalid run name {run!r}: use letters, digits, '.', '_' and '-'")
    store = st.location(store)  # a folder, or a URL (s3://...: staged here, uploaded at the commit)
    created = _first_missing(store) if isinstance(store, Path) else None  # the top folder this ingest creates
    st.check_writable(store)
    rank_manifests: dict = {}  # each folder's rank manifests, read once by this ingest (sidecars.rank_manifests)
    with st.locked(store), _removed_on_failure(created):
        manifest = st.read_manifest(store)
        staging = st.new_staging(store)
        try:
            side_done, already = sidecars.parse_all(side, rank, staging, manifest, run,  # small: first, fail fast
                                                    manifests=rank_manifests)
            summaries = _parse_all(files, rank, staging, workers, progress, opts, dask,
                                   rank_manifests) if files else []
            p2p_groups.resolve(summaries)  # gloo p2p on subgroups (PP x DP): needs every rank
            coll_groups.resolve(summaries)  # gloo collectives whose group no runloop thread told
            beside = [sidecars.Sidecar("flight_recorder", p, s.rank) for s in summaries
                      if (p := sidecar_path(s.path, s.rank)) is not None]  # FR dumps beside traces named one by one
            beside += sidecars.cpu_sched_beside(summaries)  # and their rank's CPU wait samples
            more, already_too = sidecars.parse_all(beside, rank, staging, manifest, run,
                                                   skip={(x.kind, x.path) for x in side_done}, manifests=rank_manifests)
            side_done, already = side_done + more, already + already_too
            sidecars.check_unique(side_done, manifest, run)
            consistency.check_run(store, manifest, run, summaries)  # one job per run, one process per rank
            _assign_windows(summaries, manifest, run)
            leftovers = st.run_folders_exist(store, run)  # a killed ingest of the run may have left files
            _commit(store, manifest, run, summaries, side_done)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        try:  # this run's folders (no walk of the whole store), if they were there before
            st.collect_garbage(store, manifest, run=run, sweep_run=leftovers)
        except OSError:
            pass
    return IngestReport(str(store), run, summaries, time.perf_counter() - t0, side_done, already)


def _first_missing(path: Path) -> Path | None:
    """The outermost of ``path`` and its parents that does not exist yet (None: ``path`` exists)."""
    missing = None
    for p in (path.absolute(), *path.absolute().parents):
        if p.exists():
            return missing
        missing = p
    return missing


@contextmanager
def _removed_on_failure(created: Path | None):
    """A failed ingest leaves no (empty) store folder, nor parent folders, that it created."""
    try:
        yield
    except BaseException:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise


#: Modules the local pool's workers import once (forkserver), before forking one process per file.
_PRELOAD = ["traceanalyzer.ingest.batch", "traceanalyzer.ingest.comms", "traceanalyzer.ingest.kineto.build"]


def _parse_all(files: list[Path], rank: int | None, staging: Path, workers: int | None, progress: bool,
               opts: dict | None = None, dask=None, manifests: dict | None = None) -> list[TraceSummary]:
    """Stage the collector's pre-built parts (:mod:`.prebuilt`), then parse every other file, one
    task each, on the executor ``dask`` names (:mod:`.executor`); stop at the first error and raise it.
    The rank manifests beside the files are read here, each folder once (``manifests``: the
    ingest's cache), and each task gets its own trace's part of them."""
    from .executor import open_executor
    from .prebuilt import stage_prebuilt
    from .sidecars import manifests_for
    manifests = {} if manifests is None else manifests
    prebuilt, files, notes = stage_prebuilt(files, str(staging), manifests)  # the collector's parts: validate, stage
    bar = _Progress(len(files), enabled=progress)
    results = []
    want = max(1, workers or os.cpu_count() or 1)
    if dask is None and workers is None and sum(_size(f) for f in files) < SMALL_INPUT_BYTES:
        want = 1  # starting a pool costs more than parsing a few small files
    # a cluster's workers have another working directory: they get absolute paths
    paths = [str(f) if dask is None else str(Path(f).absolute()) for f in files]
    where = str(staging) if dask is None else str(Path(staging).absolute())
    # the task's own manifests, under its folder as the task names it (a cluster's: absolute)
    mine = [{Path(p).parent: docs for docs in part.values()}
            for p, part in zip(paths, manifests_for([str(f) for f in files], manifests))]
    calls, of_file = [], []   # a task per file, or per part of one large op timeline
    for i, (p, m) in enumerate(zip(paths, mine)):
        for task_opts in _op_timeline_parts(p, opts or {}, want) if want > 1 else [opts]:
            calls.append((p, rank, where, task_opts, m))
            of_file.append(i)
    n_workers = max(1, min(want, len(calls)))
    last = {i: k for k, i in enumerate(of_file)}
    if files:  # every file pre-built: no executor (nor cluster) to start
        names = [f"parse-{files[i].name}" + (f"-{k}" if len(calls) > len(files) else "") for k, i in enumerate(of_file)]
        with open_executor(dask, n_workers, len(calls), _PRELOAD, _worker_init) as ex, \
                closing(ex.map_unordered(_parse_one, calls, names)) as outcomes:
            for k, result, failure in outcomes:
                results.append(result if failure is None else ("error", paths[of_file[k]], failure))
                if last[of_file[k]] == k:
                    bar.advance(files[of_file[k]])
                if results[-1][0] == "error":
                    break  # closing the generator cancels the rest
    bar.close()
    for r in results:
        if r[0] == "error":
            err = TraceInputError(r[1], r[2])
            err.debug_traceback = r[3] if len(r) > 3 else None
            raise err
    done = [s for r in results for s in (r[1] if isinstance(r[1], list) else [r[1]])]  # nsys: several ranks a file
    for s in done:
        if s.path in notes:  # both resolved paths
            s.notes.append(notes[s.path])
    done += prebuilt
    return sorted(done, key=lambda s: (s.rank, s.start_ts_ns))


def _op_timeline_parts(path: str, opts: dict, n: int) -> list[dict]:
    """The tasks' options for one input: a large op timeline (one file of every rank, or the light
    collector's per-rank files, over SMALL_INPUT_BYTES) is scanned here once and converted in up to
    ``n`` parts of whole ranks, one task each (its conversion and writes are ~95 % of its ingest);
    anything else is one task."""
    from .nsys import looks_like_sqlite
    from .op_timeline import RANK_FILES, is_op_timeline, is_rank_files, parts, plan
    if is_rank_files(path):  # the light collector's per-rank files of one run, read together
        if sum(_size(f) for f in Path(path).parent.glob(RANK_FILES)) < SMALL_INPUT_BYTES:
            return [opts]
    elif (_size(Path(path)) < SMALL_INPUT_BYTES or looks_like_sqlite(path) or path.endswith(_SQLITE_SUFFIXES)
            or not (opts.get("format") == "op-timeline" or is_op_timeline(path, opts.get("column_map")))):
        return [opts]
    p = plan(path, opts.get("column_map"))
    return [dict(opts, op_timeline_part=(p, pieces)) for pieces in parts(p, n)]


def _assign_windows(summaries: list[TraceSummary], manifest: st.Manifest, run: str) -> None:
    """Number each new trace's window; two traces of one rank must not overlap in time."""
    existing: dict[int, list[dict]] = {}
    for t in manifest.traces:
        if t["run"] == run:
            existing.setdefault(t["rank"], []).append(t)
    for s in summaries:
        for other in existing.get(s.rank, []):
            if s.start_ts_ns < other["end_ts_ns"] and other["start_ts_ns"] < s.end_ts_ns:
                same = Path(other["trace_file"]) == Path(s.path)
                raise TraceInputError(s.path, (
                    f"rank {s.rank} of run '{run}' is already in the store from this file" if same else
                    f"duplicate rank {s.rank}: its time range overlaps {other['trace_file']} "
                    f"(run '{run}', window_id {other['window_id']}); use another --run or check the rank")
                    + ("" if not same else "; use another --run to ingest it again"))
        s.window = max([o["window_id"] for o in existing.get(s.rank, [])], default=-1) + 1
        existing.setdefault(s.rank, []).append({"trace_file": s.path, "start_ts_ns": s.start_ts_ns,
                                                "end_ts_ns": s.end_ts_ns, "window_id": s.window})


def _commit(store: Path, manifest: st.Manifest, run: str, summaries: list[TraceSummary], side=()) -> None:
    manifest.generation += 1
    gen = manifest.generation
    for s in summaries:
        files = st.place(store, s.staged, run, s.rank, str(gen), s.window)
        manifest.traces.append({"run": run, "rank": s.rank, "window_id": s.window, "trace_file": s.path,
                                "start_ts_ns": s.start_ts_ns, "end_ts_ns": s.end_ts_ns, "files": files,
                                "schema": S.SCHEMA_VERSION,
                                **({"job": s.job} if s.job else {})})
    from .sidecars import commit as commit_sidecars
    commit_sidecars(store, manifest, run, list(side), gen)
    st.write_manifest(store, manifest)


class _Progress:
    """A one-line progress bar on stderr (a line per file when stderr is not a terminal)."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.enabled = total, 0, enabled
        self.t0 = time.perf_counter()
        self.tty = sys.stderr.isatty()

    def advance(self, path) -> None:
        self.done += 1
        if not self.enabled:
            return
        width = 30
        filled = int(width * self.done / self.total)
        text = f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} files  {time.perf_counter() - self.t0:.1f} s  {Path(path).name}"
        if self.tty:
            sys.stderr.write("\r" + text[:150].ljust(150))
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\n")
