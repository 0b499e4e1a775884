"""Read Flight Recorder (FR) dumps, JSON or pickle, into ``fr_dumps``/``fr_entries``, and join
them to gloo collectives.

Formats (torch 2.13, ``torch/csrc/distributed/c10d/FlightRecorderDetail.hpp``, version "2.10"):

* ``_dump_fr_trace_json()``: JSON with keys version, comm_lib_version, pg_config, pg_status,
  entries (omitted when empty), nccl_comm_state. Entries have no stack ``frames``; a missing
  start/complete time is 0; ``process_group`` is a [name, desc] list; pg_status values are text.
* ``_dump_fr_trace()``: a pickle of the same dict, *with* ``frames`` (a list of {name, filename,
  line}, innermost first), ``None`` for a missing time, a (name, desc) tuple, int pg_status.
  It is read only through :mod:`traceanalyzer.ingest.safe_pickle` (nothing in it can run).
* The collector's ``rank{R}.fr.json`` is that pickle converted to JSON in the dumping process.

gloo dumps carry sequence ids, group names, sizes, ``time_created_ns`` and frames, but no
start/end times (state stays "scheduled"), no p2p entries, and a broken ``pg_config``: one entry
keyed "" with empty name and desc (gloo registers its ranks before its name is set). NCCL dumps
have real per-group pg_config, start/complete times, ``duration_ms`` (with
``TORCH_NCCL_ENABLE_TIMING``), p2p entries (``p2p_seq_id``) and ``nccl_comm_state``.

The gloo join: a gloo trace carries no process group and no sequence number on its collectives;
the FR has both, plus ``time_created_ns``, taken while the ``c10d::*`` enqueue op runs. So the
enqueue op whose span holds ``time_created_ns`` is that FR entry's collective.
"""
from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa

from .. import schema as S
from ..errors import TraceInputError
from .kineto.validate import INT64_MAX, INT64_MIN, OutOfRange
from .safe_pickle import load_plain

#: File names of FR dumps: the collector's, a pickle beside it, and torch's own default
#: (TORCH_FR_DUMP_TEMP_FILE / TORCH_NCCL_DEBUG_INFO_TEMP_FILE = /tmp/nccl_trace_rank_<R>).
FR_NAME_RE = re.compile(r"(^rank\d+\.fr\.(json|pkl|pickle)$)|(^nccl_trace_rank_\d+(\.(json|pkl|pickle))?$)")
_PICKLE_SUFFIXES = (".pkl", ".pickle")


class FrEntry(msgspec.Struct, gc=False):
    collective_seq_id: int = -1
    process_group: list[Any] = msgspec.field(default_factory=list)
    profiling_name: str = ""
    time_created_ns: int = 0
    is_p2p: bool = False
    input_sizes: Any = None
    input_dtypes: Any = None


@dataclass
class FrDump:
    """One rank's dump, normalised (JSON and pickle look the same here)."""
    path: str
    source_format: str  # json | pickle
    version: str | None
    comm_lib_version: str
    pg_config: list[dict]  # {pg_name, pg_desc, ranks (list[int] | None)}
    pg_config_usable: bool
    pg_status: dict[str, dict[str, int]]
    nccl_comm_state: dict | None
    entries: list[dict]  # normalised, see _entry()
    n_skipped: int = 0
    backend: str | None = None
    extra: dict = field(default_factory=dict)


def sidecar_path(trace_path: str | Path, rank: int) -> Path | None:
    """The collector writes ``rank{R}.fr.json`` beside the rank's traces (a pickle dump may sit
    there as ``rank{R}.fr.pkl``)."""
    folder = Path(trace_path).parent
    for name in (f"rank{rank}.fr.json", f"rank{rank}.fr.pkl", f"rank{rank}.fr.pickle"):
        if (folder / name).is_file():
            return folder / name
    return None


def is_fr_name(path: str | Path) -> bool:
    return bool(FR_NAME_RE.match(Path(path).name))


def read_fr_dump(path: str | Path) -> FrDump:
    """Read a JSON or pickle FR dump; one-line :class:`TraceInputError` naming the file otherwise."""
    path = Path(path)
    from .kineto.gunzip import read_bounded  # bounded, refuses FIFOs
    data = bytes(read_bounded(path, "Flight Recorder dump"))
    if not data.strip():
        raise TraceInputError(path, "empty Flight Recorder dump")
    if data[:1] == b"\x80" or path.suffix in _PICKLE_SUFFIXES:
        doc, fmt = load_plain(data, path), "pickle"
    else:
        try:
            doc, fmt = msgspec.json.decode(data), "json"
        except RecursionError:
            from .kineto.reader import TOO_DEEP
            raise TraceInputError(path, TOO_DEEP) from None
        except msgspec.DecodeError as exc:
            what = "truncated" if "truncated" in str(exc) else "invalid"
            raise TraceInputError(path, f"{what} Flight Recorder JSON dump ({exc})") from None
    return normalise_dump(doc, path, fmt)


def normalise_dump(doc: Any, path: str | Path, fmt: str) -> FrDump:
    if not isinstance(doc, dict):
        raise TraceInputError(path, f"not a Flight Recorder dump (top level is a {type(doc).__name__}, not an object)")
    if not {"version", "entries", "pg_config"} & doc.keys():
        raise TraceInputError(path, "not a Flight Recorder dump (no version, pg_config or entries)")
    raw_entries = doc.get("entries") or []
    if not isinstance(raw_entries, list):
        raise TraceInputError(path, "not a Flight Recorder dump ('entries' is not a list)")
    entries, skipped = [], 0
    for i, raw in enumerate(raw_entries):
        try:
            e = _entry(raw)
        except OutOfRange as exc:
            field = next((k for k, v in raw.items() if _out_of_range(v)), None)
            raise TraceInputError(path, f"entry {i}: " + (f"{field} {_clip(raw.get(field))} is outside the int64 range "
                                        "of its column" if field else str(exc))) from None
        if e is None:
            skipped += 1
        else:
            entries.append(e)
    try:
        pg_status = _pg_status(doc.get("pg_status"))
    except OutOfRange:
        raise TraceInputError(path, "pg_status holds a number outside the int64 range") from None
    pg_config, usable = _pg_config(doc.get("pg_config"))
    names = {e["profiling_name"].split(":")[0] for e in entries if ":" in e["profiling_name"]}
    backend = "nccl" if "nccl" in names else ("gloo" if "gloo" in names else (next(iter(names)) if names else None))
    state = doc.get("nccl_comm_state")
    return FrDump(str(Path(path).resolve()), fmt, _str(doc.get("version")), _str(doc.get("comm_lib_version")) or "",
                  pg_config, usable, pg_status, state if state else None, entries, skipped,
                  backend)


def _entry(raw: Any) -> dict | None:
    """A normalised entry, or None when it lacks what identifies it (group and sequence id)."""
    if not isinstance(raw, dict):
        return None
    for key in ("input_sizes", "output_sizes"):
        if _out_of_range(raw.get(key)):
            raise OutOfRange(key, raw.get(key))
        _numel(raw.get(key))
    pg = raw.get("process_group")
    seq = _int(raw.get("collective_seq_id"))
    if not isinstance(pg, list) or not pg or seq is None:
        return None
    frames = raw.get("frames")
    duration = raw.get("duration_ms")
    return {
        "record_id": _int(raw.get("record_id")), "pg_id": _int(raw.get("pg_id")),
        "pg_name": _str(pg[0]), "pg_desc": _str(pg[1]) if len(pg) > 1 else None,
        "collective_seq_id": seq, "p2p_seq_id": _int(raw.get("p2p_seq_id")), "op_id": _int(raw.get("op_id")),
        "is_p2p": bool(raw.get("is_p2p", False)), "profiling_name": _str(raw.get("profiling_name")) or "",
        "input_sizes": raw.get("input_sizes"), "input_dtypes": raw.get("input_dtypes"),
        "output_sizes": raw.get("output_sizes"), "output_dtypes": raw.get("output_dtypes"),
        "state": _str(raw.get("state")),
        "time_created_ns": _int(raw.get("time_created_ns")) or None,
        "time_discovered_started_ns": _int(raw.get("time_discovered_started_ns")) or None,
        "time_discovered_completed_ns": _int(raw.get("time_discovered_completed_ns")) or None,
        "duration_ns": _ms_to_ns("duration_ms", duration),
        "timeout_ns": _ms_to_ns("timeout_ms", _int(raw.get("timeout_ms"))),
        "retired": raw.get("retired") if isinstance(raw.get("retired"), bool) else None,
        "thread_id": _str(raw.get("thread_id")), "thread_name": _str(raw.get("thread_name")),
        "frames": frames if isinstance(frames, list) else None,
    }


def _pg_config(raw: Any) -> tuple[list[dict], bool]:
    out, usable = [], isinstance(raw, dict) and bool(raw)
    for key, cfg in (raw or {}).items() if isinstance(raw, dict) else ():
        cfg = cfg if isinstance(cfg, dict) else {}
        name = _str(cfg.get("name", key)) or ""
        ranks = _ranks(cfg.get("ranks"))
        if not name or not key:  # gloo: {"": {"name": "", "desc": "", ...}}
            usable = False
        out.append({"pg_name": name, "pg_desc": _str(cfg.get("desc")), "ranks": ranks})
    return out, usable


def _ranks(value: Any) -> list[int] | None:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, list) and all(isinstance(r, int) and not isinstance(r, bool) for r in value):
        return value
    return None


def _pg_status(raw: Any) -> dict[str, dict[str, int]]:
    if not isinstance(raw, dict):
        return {}
    return {str(pg): {k: _int(v) for k, v in st.items()} for pg, st in raw.items() if isinstance(st, dict)}


def _int(value: Any) -> int | None:
    """An int64 (None when missing or not a number; :class:`OutOfRange` beyond int64)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        v = int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if not INT64_MIN <= v <= INT64_MAX:
        raise OutOfRange("integer", value)
    return v


def _ms_to_ns(what: str, value: Any) -> int | None:
    """Milliseconds (int or float) as int64 nanoseconds; None when not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        ns = round(value * 1_000_000)
    except (OverflowError, ValueError):  # inf, nan
        raise OutOfRange(f"{what} in nanoseconds", value) from None
    if not INT64_MIN <= ns <= INT64_MAX:
        raise OutOfRange(f"{what} in nanoseconds", value)
    return ns


def _out_of_range(value: Any) -> bool:
    """Does this field (or a number nested in it, e.g. input_sizes) leave int64?"""
    if isinstance(value, list):
        return any(_out_of_range(v) for v in value)
    return isinstance(value, int) and not isinstance(value, bool) and not INT64_MIN <= value <= INT64_MAX


def _clip(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def _numel(sizes: Any) -> int | None:
    if not isinstance(sizes, list):
        return None
    total = 0
    for shape in sizes:
        if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
            return None
        n = 1
        for d in shape:
            n *= d
        total += n
    if not INT64_MIN <= total <= INT64_MAX:
        raise OutOfRange("input/output element count", total)
    return total


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"))


def fr_tables(dump: FrDump) -> dict[str, pa.Table]:
    """The ``fr_dumps`` (one row) and ``fr_entries`` tables of one dump."""
    from .ops import normalize_op
    rows = []
    for e in dump.entries:
        row = {k: e[k] for k in ("record_id", "pg_id", "pg_name", "pg_desc", "collective_seq_id", "p2p_seq_id",
                                 "op_id", "is_p2p", "profiling_name", "state", "time_created_ns",
                                 "time_discovered_started_ns", "time_discovered_completed_ns", "duration_ns",
                                 "timeout_ns", "retired", "thread_id", "thread_name")}
        row.update(op=normalize_op(e["profiling_name"].split(" ")[0]),
                   input_sizes=_json(e["input_sizes"]), input_dtypes=_json(e["input_dtypes"]),
                   output_sizes=_json(e["output_sizes"]), output_dtypes=_json(e["output_dtypes"]),
                   in_nelems=_numel(e["input_sizes"]), out_nelems=_numel(e["output_sizes"]),
                   frames_json=_json(e["frames"]))
        rows.append(row)
    head = {"source_file": dump.path, "source_format": dump.source_format, "fr_version": dump.version,
            "backend": dump.backend, "comm_lib_version": dump.comm_lib_version, "n_entries": len(rows),
            "n_skipped": dump.n_skipped, "pg_config_json": _json(dump.pg_config),
            "pg_config_usable": dump.pg_config_usable, "pg_status_json": _json(dump.pg_status),
            "nccl_comm_state_json": _json(dump.nccl_comm_state)}
    return {"fr_dumps": pa.Table.from_pylist([head], schema=S.FR_DUMPS.arrow_schema),
            "fr_entries": pa.Table.from_pylist(rows, schema=S.FR_ENTRIES.arrow_schema)}


def read_fr_json(path: str | Path) -> list[FrEntry]:
    """The entries of an FR dump (JSON or pickle), as needed by :func:`join_fr`."""
    dump = read_fr_dump(path)
    return [FrEntry(e["collective_seq_id"], [e["pg_name"], e["pg_desc"]], e["profiling_name"],
                    e["time_created_ns"] or 0, e["is_p2p"], e["input_sizes"], e.get("input_dtypes"))
            for e in dump.entries]


read_fr_entries = read_fr_json


def join_fr(rows: list[dict], entries: list[FrEntry]) -> int:
    """Give collective rows the FR's process group and sequence id; returns rows joined.

    gloo rows (no group, no sequence number in the trace) and NCCL rows whose trace carries no
    sequence number (torch 2.11's ``record_param_comms`` has none; seen on an H200) are joined to
    the FR entry created inside their enqueue span; an NCCL row keeps its own group, and only an
    entry of that group can join it."""
    collectives = sorted((e for e in entries if not e.is_p2p and e.time_created_ns > 0 and e.process_group),
                         key=lambda e: e.time_created_ns)
    candidates = sorted((r for r in rows if not r["is_p2p"] and r["enqueue_ts_ns"] is not None
                         and (r["dialect"] == "gloo" or (r["dialect"] == "nccl" and r.get("nccl_seq") is None))),
                        key=lambda r: r["enqueue_ts_ns"])
    joined, i = 0, 0
    e_used: set[int] = set()
    for r in candidates:
        lo, hi = r["enqueue_ts_ns"], r["enqueue_ts_ns"] + r["enqueue_dur_ns"]
        while i < len(collectives) and collectives[i].time_created_ns < lo:
            i += 1
        if i >= len(collectives) or collectives[i].time_created_ns > hi:
            continue
        e = collectives[i]
        if r["dialect"] == "gloo":   # the trace names no group: the FR's
            r.update(pg_name=str(e.process_group[0]), pg_source="flight_recorder", pg_inferred=False)
            if len(e.process_group) > 1 and e.process_group[1]:
                r["pg_desc"] = str(e.process_group[1])
        elif r.get("pg_name") is not None and str(e.process_group[0]) != str(r["pg_name"]):
            continue
        r["fr_seq"] = e.collective_seq_id
        r["fr_dtype"] = _first_dtype(e)
        e_used.add(id(e))
        joined += 1
        i += 1
    return joined + _join_fr_orphans(rows, collectives, e_used)


def _join_fr_orphans(rows: list[dict], collectives: list[FrEntry], used: set[int]) -> int:
    """gloo executions without an enqueue in the trace (the enqueue lies before the window, or one
    enqueue ran as several collectives: a list reduce_scatter is two ``gloo:all_reduce``) get the
    latest unused FR entry of their name created before they started: without it they would be
    numbered by order among FR-numbered rows, and could take another collective's seq."""
    orphans = sorted((r for r in rows if not r["is_p2p"] and r["enqueue_ts_ns"] is None and r["dialect"] == "gloo"
                      and r.get("fr_seq") is None), key=lambda r: r["start_ts_ns"])
    by_name: dict[str, list[FrEntry]] = {}
    for e in collectives:
        by_name.setdefault(e.profiling_name, []).append(e)
    joined = 0
    for r in orphans:
        cands = by_name.get(r["exec_name"] or "", [])
        times = [e.time_created_ns for e in cands]
        k = bisect.bisect_right(times, r["start_ts_ns"]) - 1
        while k >= 0 and id(cands[k]) in used:
            k -= 1
        if k < 0:
            continue
        e = cands[k]
        used.add(id(e))
        r.update(pg_name=str(e.process_group[0]), pg_source="flight_recorder", pg_inferred=False, fr_seq=e.collective_seq_id,
                 fr_dtype=_first_dtype(e))
        joined += 1
    return joined


def _first_dtype(e: FrEntry) -> str | None:
    """The entry's first input dtype ('Float', ...): what a gloo row lacks when neither its span nor
    its enqueue (a TensorList argument) records one."""
    dtypes = e.input_dtypes
    return dtypes[0] if isinstance(dtypes, list) and dtypes and isinstance(dtypes[0], str) else None
