"""Per-process inputs beside the traces ("sidecars"): find them, parse them, commit them.

What ingest accepts besides Kineto traces. A file named on the command line is classified by its
content (:mod:`traceanalyzer.ingest.sniff`; the names below only when the content cannot tell);
in folders (searched recursively) these names are taken, and other files are sniffed (an FR dump
named ``fr_rank_{R}``, JSON or pickle, is found so):

| kind | files | table(s) |
|---|---|---|
| ``flight_recorder`` | ``rank{R}.fr.json`` (the collector's), ``rank{R}.fr.pkl``, torch's ``nccl_trace_rank_{R}`` (JSON or pickle; pickles through :mod:`traceanalyzer.ingest.safe_pickle`) | ``fr_dumps``, ``fr_entries`` |
| ``nccl_log`` | ``*.nccl.log``, ``*.nccl.txt``, ``nccl_debug*.log/.txt`` (``.gz`` too), any ``.log``/``.txt`` whose first 64 KiB hold ``NCCL INFO`` lines, and every ``--nccl-log`` file | ``nccl_log_ops`` |
| ``nccl_inspector`` | ``*.log``/``*.jsonl`` whose first line is an Inspector record (``<host>-pid<pid>.log``) | ``nccl_inspector_ops`` |
| ``nccl_profiler`` | ``*.txt`` that start with ``[`` and a Chrome-trace event (``<prefix>-<host>-<tid>.txt``) | ``nccl_profiler_events`` |
| ``cpu_sched`` | the collector's ``rank{R}.cpu_sched.json`` (CPU wait samples: :mod:`traceanalyzer.ingest.cpu_sched`) | ``cpu_sched`` |

Their tables are partitioned by (run, rank) only. A source file already in the store for the run
is skipped (counted ``already_in_store``); a second, different Flight Recorder dump (or CPU wait
record) for one rank of a run is an error (its entries would count twice).

Also here: the check that a trace's rank agrees with the ``rank{R}.manifest.json`` beside it.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from .. import schema as S
from ..errors import TraceInputError
from ..store import files as st

SNIFF_BYTES = 64 * 1024
_TEXT_SUFFIXES = (".log", ".txt", ".jsonl", ".log.gz", ".txt.gz", ".jsonl.gz")
KIND_TABLES = {"flight_recorder": ("fr_dumps", "fr_entries"), "nccl_log": ("nccl_log_ops",),
               "nccl_inspector": ("nccl_inspector_ops",), "nccl_profiler": ("nccl_profiler_events",),
               "cpu_sched": ("cpu_sched",)}
KIND_WORDS = {"flight_recorder": ("Flight Recorder dump", "entries"), "nccl_log": ("NCCL log", "ops"),
              "nccl_inspector": ("NCCL Inspector log", "records"), "nccl_profiler": ("NCCL profiler dump", "events"),
              "cpu_sched": ("CPU wait record", "samples")}


@dataclass
class Sidecar:
    kind: str
    path: Path
    rank: int | None = None  # known before parsing (the trace it sits beside)


@dataclass
class SidecarSummary:
    """What one per-process input gave."""
    kind: str
    path: str
    rank: int
    rank_source: str
    counts: dict[str, int]
    skipped: dict[str, int]
    staged: dict[str, str] = field(default_factory=dict)


def classify(paths: list[Path], nccl_logs: list[Path] = (), column_map: dict | None = None,
             fmt: str | None = None) -> tuple[list[Path], list[Sidecar]]:
    """Split the inputs into trace paths (files and folders, for :func:`ingest.find_traces`) and
    per-process inputs. A file named on the command line is classified by its content
    (:func:`traceanalyzer.ingest.sniff.sniff`; its name only when the content cannot tell), and one
    that is nothing we read is refused in one line; in folders, files with a known name are taken
    as before and the others are sniffed (kept only when recognised)."""
    from .sniff import EXPECTED, SIDECAR_KINDS, head_is_pickle, is_fr_pickle, kind_by_name, sniff
    traces, side = [], []
    for p in nccl_logs:
        if not p.is_file():
            raise TraceInputError(p, "no such NCCL log file")
        side.append(Sidecar("nccl_log", p))
    forced = {p.resolve() for p in nccl_logs}
    for p in paths:
        if p.is_dir():
            traces.append(p)
            for f in sorted(p.rglob("*")):
                if not f.is_file() or f.resolve() in forced:
                    continue
                kind = _kind(f, explicit=False)
                if kind:
                    side.append(Sidecar(kind, f))
                elif not _found_by_name(f):
                    kind = sniff(f, column_map)[0]
                    if kind == "flight_recorder" and head_is_pickle(f) and not is_fr_pickle(f):
                        kind = None  # some other pickle in the folder: not ours to read
                    if kind in SIDECAR_KINDS:
                        side.append(Sidecar(kind, f))
                    elif kind in ("kineto", "op_timeline"):
                        traces.append(f)
        elif p.is_file():
            if fmt == "op-timeline":
                traces.append(p)
                continue
            kind, seen = sniff(p, column_map)
            kind = kind or kind_by_name(p)
            if kind is None:
                raise TraceInputError(p, f"not a recognised input: this is {seen}; {EXPECTED}")
            if kind in SIDECAR_KINDS:
                if p.resolve() not in forced:
                    side.append(Sidecar(kind, p))
            else:
                traces.append(p)
        else:
            traces.append(p)  # find_traces reports it
    return traces, side


def _found_by_name(f: Path) -> bool:
    """Files that find_traces or the collector's layout account for by name (not sniffed again)."""
    from .batch import trace_by_name
    from .prebuilt import is_part
    name = f.name
    return is_part(f) or trace_by_name(f) or name.endswith(("manifest.json", ".ranks.json", ".json", ".json.gz", ".sqlite",
                                              ".sqlite3", ".py", ".md", ".sh"))


def _kind(path: Path, explicit: bool) -> str | None:
    from .cpu_sched import is_samples_file
    from .flight_recorder import is_fr_name
    from .nccl.logs import NAME_RE, looks_like_nccl_log
    from .nccl.plugins import looks_like_inspector, looks_like_profiler_dump
    if is_fr_name(path):
        return "flight_recorder"
    if is_samples_file(path):  # the collector's CPU wait samples
        return "cpu_sched"
    if not path.name.endswith(_TEXT_SUFFIXES):
        return None
    head = _head(path)
    if NAME_RE.search(path.name) or looks_like_nccl_log(head):
        return "nccl_log"
    if looks_like_inspector(head):
        return "nccl_inspector"
    if looks_like_profiler_dump(head):
        return "nccl_profiler"
    return None


def _head(path: Path) -> str:
    try:
        with open(path, "rb") as fh:
            data = fh.read(SNIFF_BYTES)
        if path.suffix == ".gz":
            import zlib
            data = zlib.decompressobj(31).decompress(data, SNIFF_BYTES)
    except Exception:  # unreadable, or not gzip after all: not one of ours
        return ""
    return data.decode("utf-8", errors="replace")


def parse(sc: Sidecar, rank_arg: int | None, staging: Path, manifests: dict | None = None) -> SidecarSummary:
    """Parse one input and stage its tables (parquet files under ``staging``; ``manifests``: the
    rank manifests read so far, :func:`rank_manifests`)."""
    from .nccl.logs import read_nccl_log
    from .nccl.plugins import read_inspector, read_profiler_dump
    if sc.kind == "flight_recorder":
        from .flight_recorder import fr_tables, read_fr_dump
        dump = read_fr_dump(sc.path)
        rank, source = (sc.rank, "trace") if sc.rank is not None else fr_rank(sc.path, rank_arg, manifests)
        if rank is None:
            raise TraceInputError(sc.path, "cannot tell the rank of this Flight Recorder dump: no rank{R}.manifest.json "
                                           "lists it and its name has no number; pass --rank")
        tables = fr_tables(dump)
        counts = {"fr_entries": tables["fr_entries"].num_rows}
        skipped = {"fr.malformed_entries": dump.n_skipped} if dump.n_skipped else {}
        path = dump.path
    elif sc.kind == "cpu_sched":
        from .cpu_sched import read
        rank, table = read(sc.path)
        source, tables, counts, skipped, path = "file", {"cpu_sched": table}, {"cpu_sched": table.num_rows}, {}, \
            str(sc.path.resolve())
    else:
        reader = {"nccl_log": read_nccl_log, "nccl_inspector": read_inspector, "nccl_profiler": read_profiler_dump}[sc.kind]
        log = reader(sc.path, sc.rank if sc.rank is not None else rank_arg)
        rank, source, counts, skipped, path = log.rank, log.rank_source, log.counts, log.skipped, log.path
        tables = {KIND_TABLES[sc.kind][0]: log.table}
    folder = staging / uuid.uuid4().hex
    folder.mkdir(parents=True)
    staged = {}
    for name, table in tables.items():
        out = folder / f"{name}.parquet"
        st.write_table(table.select(S.TABLES[name].column_names), out)
        staged[name] = str(out)
    return SidecarSummary(sc.kind, path, rank, source, counts, skipped, staged)


def cpu_sched_beside(summaries) -> list[Sidecar]:
    """The collector's ``rank{R}.cpu_sched.json`` beside each ingested trace (a trace named one by
    one, not its folder)."""
    found = {Path(s.path).parent / f"rank{s.rank}.cpu_sched.json" for s in summaries}
    return [Sidecar("cpu_sched", m) for m in sorted(found) if m.is_file()]


def fr_rank(path: Path, rank_arg: int | None = None, manifests: dict | None = None) -> tuple[int | None, str | None]:
    """A Flight Recorder dump's rank: its dump holds none, so the collector's manifest beside it,
    then ``--rank``, then the number in its name (``rank{R}.fr.json``, ``fr_rank_{R}``, ...)."""
    from .sniff import rank_of
    return rank_of(path, None, rank_arg, "flight_recorder", manifests)


def parse_all(side: list[Sidecar], rank_arg: int | None, staging: Path, manifest: st.Manifest,
              run: str, skip=frozenset(), manifests: dict | None = None) -> tuple[list[SidecarSummary], int]:
    """Parse the inputs not yet in the store (nor in ``skip``: (kind, resolved path) pairs already
    parsed); returns (summaries, inputs skipped as already in the store). ``manifests``: the
    ingest's rank manifests, each folder read once (:func:`rank_manifests`)."""
    have = {(s["run"], s["kind"], s["source_file"]) for s in manifest.sidecars}
    seen, out, already = set(skip), [], 0
    for sc in side:
        key = (sc.kind, str(sc.path.resolve()))
        if key in seen:
            continue
        seen.add(key)
        if (run, *key) in have:
            already += 1
            continue
        try:
            out.append(parse(sc, rank_arg, staging, manifests))
        except RecursionError:  # deep JSON/pickle anywhere in it (frames, sizes): one line, not a traceback
            from .kineto.reader import TOO_DEEP
            raise TraceInputError(sc.path, TOO_DEEP) from None
    return out, already


def check_unique(summaries: list[SidecarSummary], manifest: st.Manifest, run: str) -> None:
    """One Flight Recorder dump (and one CPU wait record) per rank of a run: two would count
    every collective (every step) twice."""
    for kind in ("flight_recorder", "cpu_sched"):
        owner = {s["rank"]: s["source_file"] for s in manifest.sidecars if s["run"] == run and s["kind"] == kind}
        for s in summaries:
            if s.kind != kind:
                continue
            if s.rank in owner and owner[s.rank] != s.path:
                raise TraceInputError(s.path, f"rank {s.rank} of run '{run}' already has a {KIND_WORDS[kind][0]} "
                                              f"({owner[s.rank]}); ingest only one per rank, or use another --run")
            owner[s.rank] = s.path


def commit(store: Path, manifest: st.Manifest, run: str, summaries: list[SidecarSummary], gen: int) -> None:
    """Move the staged files into their (run, rank) partitions and list them in the manifest
    (the caller writes the manifest: that is the commit point)."""
    for i, s in enumerate(summaries):
        files = st.place(store, s.staged, run, s.rank, f"{gen}-{i}")
        manifest.sidecars.append({"run": run, "rank": s.rank, "kind": s.kind, "source_file": s.path,
                                  "rank_source": s.rank_source, "counts": s.counts, "skipped": s.skipped,
                                  "files": files, "schema": S.SCHEMA_VERSION})


def summary_line(summaries: list[SidecarSummary], already: int) -> str:
    if not summaries and not already:
        return ""
    parts = []
    for kind, (word, unit) in KIND_WORDS.items():
        mine = [s for s in summaries if s.kind == kind]
        if mine:
            rows = sum(sum(v for k, v in s.counts.items() if k in S.TABLES) for s in mine)
            parts.append(f"{len(mine)} {word}(s) ({rows:,} {unit})")
    if already:
        parts.append(f"{already} already in the store")
    return "  per-process inputs: " + ", ".join(parts)


def rank_manifests(folder: Path, cache: dict | None = None) -> list[tuple[Path, object]]:
    """(path, its JSON, None when unreadable) of the collector's rank manifests in ``folder``;
    with ``cache`` (a dict the caller keeps for one ingest) each folder is read once, not once a trace."""
    if cache is not None and folder in cache:
        return cache[folder]
    out = [(m, _checked_part(read_rank_manifest(m))) for m in sorted(folder.glob("rank*.manifest.json"))]
    if cache is not None:
        cache[folder] = out
    return out


def read_rank_manifest(path: Path):
    """One rank manifest's JSON; None when unreadable (:func:`check_rank_manifest` refuses it)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


#: the fields of a rank manifest the ingest's checks read (its rank, run id and files)
_CHECKED = ("rank", "run_id", "files")


def _checked_part(doc):
    """What the checks read of a manifest (a dict whose ``files`` is a dict: its :data:`_CHECKED`
    fields, the same values and missing keys; anything else as it is, for the check to refuse): the
    rest (the process groups list every rank: N ints a manifest) is not held N times by the driver."""
    if isinstance(doc, dict) and isinstance(doc.get("files"), dict):
        return {k: doc[k] for k in _CHECKED if k in doc}
    return doc


def manifests_for(paths: list[str], cache: dict) -> list[dict]:
    """Per trace of ``paths``, the part of its folder's rank manifests that its checks read
    (:func:`check_rank_manifest`, ``consistency.collector_run_id``), as the ``cache`` they take:
    ``{folder: [(path, JSON)]}`` with the manifests that list the trace or are named after its rank,
    and the malformed ones (which refuse every trace of the folder). The driver reads each folder
    once (``cache``) and hands each parse task its own small part, not every rank's manifest: a task
    that read the folder itself made N x N reads for N ranks (~3 GB of JSON at 1,024 ranks)."""
    from .nccl.logs import rank_from_name
    out = []
    for p in paths:
        trace_path = Path(p)
        named = rank_from_name(trace_path)
        mine = [(m, doc) for m, doc in rank_manifests(trace_path.parent, cache)
                if _concerns(m, doc, trace_path.name, named)]
        out.append({trace_path.parent: mine})
    return out


def _concerns(m: Path, doc, name: str, named: int | None) -> bool:
    """Does manifest ``m`` matter to the checks of trace ``name`` (``named``: the rank its name
    says)? Yes when it lists the trace, or lists none and is named after that rank, or is malformed."""
    try:
        int(doc["rank"])
        listed = doc.get("files", {}).get("traces") or []
        return name in listed or (not listed and m.name == f"rank{named}.manifest.json")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return True


def check_rank_manifest(trace_path: str | Path, rank: int, rank_source: str, cache: dict | None = None) -> None:
    """The collector's ``rank{R}.manifest.json`` says which traces rank R wrote; a trace whose own
    rank disagrees is refused (a renamed or mixed-up file would join the wrong rank's data)."""
    trace_path = Path(trace_path)
    from .nccl.logs import rank_from_name
    named = rank_from_name(trace_path)
    for m, doc in rank_manifests(trace_path.parent, cache):
        try:
            claimed = int(doc["rank"])
            listed = doc.get("files", {}).get("traces") or []
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise TraceInputError(m, "unreadable rank manifest (expected the collector's JSON with 'rank' and "
                                     "'files.traces'); fix or remove it") from None
        mentions = trace_path.name in listed or (not listed and m.name == f"rank{named}.manifest.json")
        if mentions and claimed != rank:
            raise TraceInputError(trace_path, f"rank mismatch: {m.name} says this is rank {claimed}'s trace, but its "
                                              f"{rank_source} says rank {rank}; fix or remove the manifest")
