"""Pre-built Parquet parts: a trace converted into the canonical tables where it was recorded.

The collector (:mod:`traceanalyzer.collect.parquet`) converts each profiling window on its own
rank, in a background process, with the same code ``ingest`` parses a trace with
(:func:`build_trace`), into::

    RUN/parquet/rank={R}/window={W}/<table>.parquet   one file per canonical table (schema.TABLES)
    RUN/parquet/rank={R}/window={W}/summary.json      what ingest would have learnt parsing it

``summary.json`` holds the schema version, the signature (size, hash of both ends) of the JSON it was built
from and of the Flight Recorder dump used for ``comms`` (or null), the rank, the time span, the
row counts and the parse's counters. ``traceanalyzer ingest`` uses valid parts instead of parsing
(:func:`stage_prebuilt`): same schema version, same JSON and FR signatures, every table present
with the columns of the schema and the row count of the summary; the cross-rank resolution and the
commit are the same as after parsing. Parts that are stale or damaged are ignored with one warning
line and the JSON is parsed. When the collector ran with ``keep_json=False`` the parts are the only
copy: they are still validated (columns, counts), and damaged ones are an error naming the folder.

This module never imports torch: ``python -m traceanalyzer.ingest.prebuilt`` is the converter
process the collector starts.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import sys
import uuid
from pathlib import Path

from .. import schema as S
from ..errors import TraceInputError
from ..store import files as st

PARTS_DIR = "parquet"
SUMMARY = "summary.json"
#: Bump when summary.json changes meaning (parts with another version are ignored, never misread).
PARTS_VERSION = 1
#: Bytes hashed at each end of a file for its :func:`signature`.
SIGNATURE_BYTES = 64 * 1024
_TRACE_RE = re.compile(r"^rank(\d+)\.window(\d+)\.pt\.trace\.json(\.gz)?$")
_PART_PATH_RE = re.compile(rf"(^|{re.escape(os.sep)}){PARTS_DIR}{re.escape(os.sep)}rank=\d+{re.escape(os.sep)}window=\d+"
                           rf"{re.escape(os.sep)}[^{re.escape(os.sep)}]+$")
#: The tables one trace becomes (the store's others come from per-process inputs: FR dumps, NCCL logs).
TRACE_TABLES = tuple(name for name in S.TABLES if S.TABLES[name].partition == tuple(S.PARTITION_KEYS))


def parts_dir(trace_path: str | Path) -> Path | None:
    """Where the collector puts the parts of ``RUN/rank{R}.window{W}.pt.trace.json.gz`` (None for
    a file not named by the collector)."""
    trace_path = Path(trace_path)
    m = _TRACE_RE.match(trace_path.name)
    if not m:
        return None
    return trace_path.parent / PARTS_DIR / f"rank={int(m.group(1))}" / f"window={int(m.group(2))}"


def is_part(path: str | Path) -> bool:
    """A file inside ``.../parquet/rank=R/window=W/`` (never a trace nor a sidecar of its own)."""
    return bool(_PART_PATH_RE.search(os.fspath(path)))


def signature(path: str | Path | None) -> list | None:
    """[size, sha256 of the first and last :data:`SIGNATURE_BYTES`] of a file (None: no file).
    Content, not mtime: a run folder copied without its times (``cp -r``, ``scp -r``) keeps its
    parts; a gzipped trace ends with the CRC-32 and length of its whole content, so any change to
    the JSON changes its signature."""
    if path is None:
        return None
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            h = hashlib.sha256(fh.read(SIGNATURE_BYTES))
            if size > SIGNATURE_BYTES:
                fh.seek(max(SIGNATURE_BYTES, size - SIGNATURE_BYTES))
                h.update(fh.read())
    except OSError:
        return None
    return [size, h.hexdigest()]


def build_trace(path: str, rank_arg: int | None, fr_path: str | Path | None = "beside"):
    """Parse one Kineto trace into its canonical tables, ``comms`` included: the one build step of
    ``ingest`` (``_parse_one``) and of the collector's converter. ``fr_path="beside"`` joins the
    Flight Recorder dump found beside the trace (:func:`~.flight_recorder.sidecar_path`), None
    none. Returns (RankTables, shapes_on, distributedInfo, the FR file used or None)."""
    from .comms import build_comms
    from .flight_recorder import read_fr_json, sidecar_path
    from .kineto.build import build_tables
    from .kineto.reader import read_trace
    trace = read_trace(path)
    info = trace.meta.get("distributedInfo")
    shapes_on = bool(trace.meta.get("record_shapes"))  # Kineto writes "record_shapes": 1 when it was on
    built = build_tables(trace, rank_arg)
    del trace
    if fr_path == "beside":
        fr_path = sidecar_path(path, built.rank)
    fr = read_fr_json(fr_path) if fr_path else None
    t = built.tables
    t["comms"] = build_comms(t["events"], t["process_groups"], t["threads"], info, built.rank, fr)
    return built, shapes_on, info, fr_path


def write_parts(trace_path: str | Path, rank_arg: int | None = None, fr_path: str | Path | None = "beside") -> Path:
    """Convert one trace into its parts folder (written whole, then renamed into place); ``fr_path``
    as in :func:`build_trace`."""
    from .batch import _stage
    trace_path = Path(trace_path)
    out = parts_dir(trace_path)
    if out is None:
        raise TraceInputError(trace_path, "not a collector trace name (rank{R}.window{W}.pt.trace.json.gz)")
    sig = signature(trace_path)
    built, shapes_on, info, fr_used = build_trace(str(trace_path), rank_arg, fr_path)
    tmp_root = out.parent / f".tmp-{uuid.uuid4().hex}"
    tmp_root.mkdir(parents=True)    # _stage writes into an existing staging folder only
    summary = _stage(str(trace_path), built, str(tmp_root), shapes_on)
    (folder,) = [p for p in tmp_root.iterdir()]
    doc = {"parts_version": PARTS_VERSION, "schema_version": S.SCHEMA_VERSION, "trace": trace_path.name,
           "trace_signature": sig, "fr": Path(fr_used).name if fr_used else None, "fr_signature": signature(fr_used),
           "rank": summary.rank, "rank_source": summary.rank_source, "start_ts_ns": summary.start_ts_ns,
           "end_ts_ns": summary.end_ts_ns, "counts": summary.counts, "skipped": summary.skipped,
           "unknown": summary.unknown, "shapes_on": shapes_on, "distributed_info": info}
    _write_json(folder / SUMMARY, doc)
    if out.exists():
        shutil.rmtree(out)
    os.replace(folder, out)
    shutil.rmtree(tmp_root, ignore_errors=True)
    return out


def refresh_comms(folder: str | Path, fr_path: str | Path) -> None:
    """Rebuild ``comms`` of a parts folder with the rank's Flight Recorder dump (written when the
    job ends, after the windows were converted): the same ``build_comms`` call as parsing the JSON
    with that dump beside it."""
    import pyarrow.parquet as pq

    from .batch import unknown_comms
    from .comms import build_comms
    from .flight_recorder import read_fr_json
    folder = Path(folder)
    doc = json.loads((folder / SUMMARY).read_text())
    t = {n: pq.read_table(folder / f"{n}.parquet") for n in ("events", "process_groups", "threads")}
    comms = build_comms(t["events"], t["process_groups"], t["threads"], doc["distributed_info"], doc["rank"],
                        read_fr_json(fr_path))
    tmp = folder / "comms.parquet.tmp"
    st.write_table(comms.select(S.COMMS.column_names), tmp)
    os.replace(tmp, folder / "comms.parquet")
    doc.update(fr=Path(fr_path).name, fr_signature=signature(fr_path), unknown=unknown_comms(comms, doc["shapes_on"]))
    doc["counts"]["comms"] = comms.num_rows
    _write_json(folder / SUMMARY, doc)


def _write_json(path: Path, doc: dict) -> None:
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(doc, sort_keys=True))
    os.replace(tmp, path)


def without_json(paths) -> list[Path]:
    """The traces (their original JSON paths) that only exist as parts, in folders among ``paths``
    (the collector ran with ``keep_json=False``)."""
    out = []
    for p in map(Path, paths):
        if not p.is_dir():
            continue
        for summary in sorted(p.rglob(f"{PARTS_DIR}/rank=*/window=*/{SUMMARY}")):
            try:
                name = json.loads(summary.read_text()).get("trace")
            except (OSError, ValueError, AttributeError):
                continue  # damaged parts of a JSON that exists are reported when that JSON is ingested
            run = summary.parents[3]
            if isinstance(name, str) and parts_dir(run / name) == summary.parent and not (run / name).exists():
                out.append(run / name)
    return out


def check(trace_path: Path) -> tuple[dict, Path] | str | None:
    """(summary, folder) when ``trace_path`` has valid parts; None when it has none; else why not."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from .flight_recorder import sidecar_path
    folder = parts_dir(trace_path)
    if folder is None or not (folder / SUMMARY).is_file():
        return None
    try:
        doc = json.loads((folder / SUMMARY).read_text())
    except (OSError, ValueError) as exc:
        return f"unreadable {SUMMARY} ({exc})"
    if not isinstance(doc, dict) or doc.get("parts_version") != PARTS_VERSION:
        return f"parts version {doc.get('parts_version') if isinstance(doc, dict) else None} (expected {PARTS_VERSION})"
    if doc.get("schema_version") != S.SCHEMA_VERSION:
        return f"built for schema {doc.get('schema_version')}, this traceanalyzer writes {S.SCHEMA_VERSION}"
    if trace_path.exists() and doc.get("trace_signature") != signature(trace_path):
        return "the JSON changed after the parts were built (its size or content)"
    fr = sidecar_path(trace_path, doc.get("rank", -1))
    if trace_path.exists() and doc.get("fr_signature") != signature(fr):
        return "the Flight Recorder dump beside it is not the one its comms were built with"
    if sorted(doc.get("counts") or {}) != sorted(TRACE_TABLES):
        return f"{SUMMARY} lists tables {sorted(doc.get('counts') or {})}, expected {sorted(TRACE_TABLES)}"
    for name in TRACE_TABLES:
        table = S.TABLES[name]
        f = folder / f"{name}.parquet"
        try:
            meta = pq.read_metadata(f)
        except (OSError, pa.ArrowException) as exc:
            return f"{f.name}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        if meta.schema.to_arrow_schema().names != table.column_names:
            return f"{f.name}: columns differ from schema {S.SCHEMA_VERSION}"
        if meta.num_rows != doc.get("counts", {}).get(name):
            return f"{f.name}: {meta.num_rows} rows, {SUMMARY} says {doc.get('counts', {}).get(name)}"
    return doc, folder


def stage(trace_path: Path, doc: dict, folder: Path, staging: str, manifests: dict | None = None):
    """Stage valid parts like a parse would (hard links; ``comms`` is copied, since the cross-rank
    resolution rewrites it in place) and return their TraceSummary."""
    import pyarrow.parquet as pq

    from .batch import TraceSummary
    from .consistency import collector_run_id, job_of
    from .sidecars import check_rank_manifest
    check_rank_manifest(trace_path, doc["rank"], doc["rank_source"], manifests)
    out = Path(staging) / uuid.uuid4().hex
    out.mkdir(parents=True)
    staged = {}
    for name in TRACE_TABLES:
        src, dst = folder / f"{name}.parquet", out / f"{name}.parquet"
        if name == "comms":
            shutil.copyfile(src, dst)
        elif name == "ranks":  # one row; says where the trace is now (the run folder may have moved)
            import pyarrow as pa
            t = pq.ParquetFile(src).read()
            col = t.schema.get_field_index("trace_file")
            ranks = t.set_column(col, t.schema.field(col), pa.array([str(trace_path.resolve())] * t.num_rows,
                                                                    t.schema.field(col).type))
            st.write_table(ranks, dst)
        else:
            try:
                os.link(src, dst)
            except OSError:  # another file system
                shutil.copyfile(src, dst)
        staged[name] = str(dst)
    job_tables = {"ranks": ranks, "process_groups": pq.ParquetFile(staged["process_groups"]).read()}
    summary = TraceSummary(str(trace_path.resolve()), doc["rank"], doc["rank_source"], doc["start_ts_ns"],
                           doc["end_ts_ns"], dict(doc["counts"]), dict(doc["skipped"]), staged,
                           unknown=dict(doc.get("unknown") or {}))
    summary.job = dict(job_of(job_tables), run_id=collector_run_id(trace_path, manifests))
    return summary


def stage_prebuilt(files: list[Path], staging: str, manifests: dict | None = None) -> tuple[list, list[Path], dict[str, str]]:
    """Split ``files`` into staged summaries of valid parts and files still to parse; returns
    (summaries, to parse, {path: warning line}) for parts that could not be used. ``manifests``:
    each folder's rank manifests, read once (the ingest's cache, ``sidecars.rank_manifests``)."""
    done, rest, notes = [], [], {}
    manifests = {} if manifests is None else manifests
    for f in files:
        f = Path(f)
        got = check(f)
        if isinstance(got, tuple):
            done.append(stage(f, got[0], got[1], staging, manifests))
            continue
        if got is not None and not f.exists():  # only parts exist (keep_json=False): nothing to fall back on
            raise TraceInputError(parts_dir(f), f"damaged pre-built Parquet parts and no JSON to parse ({got})")
        if got is not None:
            notes[str(f.resolve())] = f"warning: {f}: pre-built Parquet parts not used ({got}); parsed the JSON instead"
        rest.append(f)
    return done, rest, notes


def main(argv: list[str] | None = None) -> int:
    """The collector's converter process: ``build TRACE [--rank R]`` or ``refresh FOLDER... --fr FR``."""
    p = argparse.ArgumentParser(prog="python -m traceanalyzer.ingest.prebuilt")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("trace")
    b.add_argument("--rank", type=int, default=None)
    r = sub.add_parser("refresh")
    r.add_argument("folders", nargs="+")
    r.add_argument("--fr", required=True)
    args = p.parse_args(argv)
    try:
        if args.cmd == "build":
            write_parts(args.trace, args.rank)
        else:
            for folder in args.folders:
                refresh_comms(folder, args.fr)
    except TraceInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
