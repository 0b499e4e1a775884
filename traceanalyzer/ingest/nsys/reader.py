"""Read an Nsight Systems SQLite export (``nsys export --type sqlite``) with the standard library.

No nsys binary is needed. Recognition is by content: the file starts with SQLite's magic bytes
and holds the tables every nsys export has (``StringIds`` and ``TARGET_INFO_SESSION_START_TIME``
or ``CUPTI_ACTIVITY_KIND_*``/``NVTX_EVENTS``). Every table and column read here was checked
against real exports of nsys 2026.2 (export schema 3.25); a table we need that lacks a column
is refused with one line naming the table and the column.

Time: nsys writes event times in nanoseconds of the target's system clock
(``EXPORT_PARAM_TIME_NORMALIZE=false``, the default) or since the session start (``true``).
``TARGET_INFO_SESSION_START_TIME`` holds the session start both as UTC epoch ns (``utcEpochNs``)
and as that clock (``systemClockNs``), so epoch ns = ts + utcEpochNs - systemClockNs (not
normalised) or ts + utcEpochNs (normalised). Without that table the times stay session-relative
(the rule used is written to ``ranks.trace_meta_json.time_base``).
"""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from ...errors import TraceInputError

SQLITE_MAGIC = b"SQLite format 3\x00"

#: Tables whose presence (with StringIds) marks an nsys export.
_MARKER_TABLES = ("TARGET_INFO_SESSION_START_TIME", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME",
                  "NVTX_EVENTS", "META_DATA_EXPORT")

#: What we read from each activity table: (table, columns). The first four must exist; the
#: others are optional (read when present, checked column by column).
KERNEL_COLS = ("start", "end", "deviceId", "streamId", "correlationId", "globalPid", "shortName", "demangledName",
               "gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ", "registersPerThread",
               "staticSharedMemory", "dynamicSharedMemory")
MEMCPY_COLS = ("start", "end", "deviceId", "streamId", "correlationId", "globalPid", "bytes", "copyKind", "srcKind",
               "dstKind")
MEMSET_COLS = ("start", "end", "deviceId", "streamId", "correlationId", "globalPid", "bytes", "memKind")
RUNTIME_COLS = ("start", "end", "globalTid", "correlationId", "nameId")
NVTX_COLS = ("start", "end", "eventType", "text", "textId", "globalTid", "domainId")

#: CUDA_MEMCPY_KIND_* (ENUM_CUDA_MEMCPY_OPER) -> Kineto's short spelling (Memcpy DtoD ...).
MEMCPY_KIND = {0: "Unknown", 1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA",
               8: "DtoD", 9: "HtoH", 10: "PtoP", 11: "HtoD", 12: "DtoH", 13: "DtoD"}
#: CUDA_MEMOPR_MEMORY_KIND_* (ENUM_CUDA_MEM_KIND) labels.
MEM_KIND = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static",
            6: "Managed Static", 7: "Unknown"}

#: NVTX event types (ENUM_NSYS_EVENT_TYPE): ranges and marks.
NVTX_PUSH_POP, NVTX_START_END, NVTX_MARK = 59, 60, 34


def looks_like_sqlite(path: str | Path) -> bool:
    """True when the file starts with SQLite's 16-byte header magic."""
    try:
        with open(path, "rb") as fh:
            return fh.read(16) == SQLITE_MAGIC
    except OSError:
        return False


def is_nsys_export(path: str | Path) -> bool:
    """An SQLite file holding an Nsight Systems export's tables (never raises)."""
    if not looks_like_sqlite(path):
        return False
    try:
        con = _connect(path)
        try:
            names = _tables(con)
        finally:
            con.close()
    except sqlite3.Error:
        return False
    return "StringIds" in names and any(t in names for t in _MARKER_TABLES)


def _connect(path) -> sqlite3.Connection:
    # immutable=1: read-only files (and no journal or lock files written beside them)
    return sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro&immutable=1", uri=True)


def _tables(con: sqlite3.Connection) -> set[str]:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}


@dataclass
class NsysExport:
    """The rows of one export that the builder needs, as Arrow tables (one per activity kind)."""
    path: Path
    kernels: pa.Table
    memcpy: pa.Table
    memset: pa.Table
    runtime: pa.Table
    nvtx: pa.Table
    strings: dict[int, str]
    processes: dict[int, tuple[int, str]]   # globalPid -> (pid, name)
    thread_names: dict[int, str]            # globalTid -> name
    time_offset_ns: int                     # added to every nsys time to get epoch ns
    time_base: str                          # the rule used (see the module doc)
    meta: dict = field(default_factory=dict)


def read_export(path: str | Path) -> NsysExport:
    """Read ``path``; raises :class:`TraceInputError` naming the file and the problem."""
    path = Path(path)
    if not looks_like_sqlite(path):
        raise TraceInputError(path, "not an SQLite file (no 'SQLite format 3' header); expected an Nsight Systems "
                                    "export made by `nsys export --type sqlite`")
    try:
        con = _connect(path)
    except sqlite3.Error as exc:
        raise TraceInputError(path, f"cannot open the SQLite file ({exc})") from None
    try:
        return _read(con, path)
    except sqlite3.DatabaseError as exc:  # truncated or corrupt pages show up on first read
        raise TraceInputError(path, f"unreadable SQLite file, truncated or corrupt ({exc})") from None
    finally:
        con.close()


def _read(con: sqlite3.Connection, path: Path) -> NsysExport:
    names = _tables(con)
    if "StringIds" not in names or not any(t in names for t in _MARKER_TABLES):
        raise TraceInputError(path, "an SQLite file but not an Nsight Systems export: it has no StringIds and no "
                                    "CUPTI_ACTIVITY_KIND_* / NVTX_EVENTS / TARGET_INFO_* tables "
                                    "(make one with `nsys export --type sqlite`)")
    if "CUPTI_ACTIVITY_KIND_KERNEL" not in names:
        raise TraceInputError(path, "Nsight Systems export without CUPTI_ACTIVITY_KIND_KERNEL: it was recorded "
                                    "without CUDA tracing (use `nsys profile --trace=cuda,nvtx`)")

    def table(name: str, cols: tuple[str, ...], required: tuple[str, ...]) -> pa.Table:
        have = _columns(con, name) if name in names else set()
        if name not in names:
            return pa.table({c: pa.array([], pa.int64()) for c in cols if c in required})
        missing = [c for c in required if c not in have]
        if missing:
            raise TraceInputError(path, f"table {name} has no column {', '.join(missing)}; not an nsys export "
                                        "this reader knows (expected `nsys export --type sqlite`, schema 3.x)")
        use = [c for c in cols if c in have]
        rows = con.execute(f"SELECT {', '.join(f'[{c}]' for c in use)} FROM [{name}]").fetchall()
        cols = list(zip(*rows)) if rows else [() for _ in use]  # rows -> columns, in C
        del rows
        out = {}
        for c, v in zip(use, cols):
            try:
                out[c] = pa.array(v) if len(v) else pa.array([], pa.int64())
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                raise TraceInputError(path, f"table {name} column {c} holds values of mixed types "
                                            "(not as nsys writes it)") from None
        return pa.table(out)

    base = ("start", "end", "deviceId", "streamId", "correlationId", "globalPid")
    kernels = table("CUPTI_ACTIVITY_KIND_KERNEL", KERNEL_COLS, base + ("shortName",))
    memcpy = table("CUPTI_ACTIVITY_KIND_MEMCPY", MEMCPY_COLS, base + ("bytes", "copyKind"))
    memset = table("CUPTI_ACTIVITY_KIND_MEMSET", MEMSET_COLS, base + ("bytes",))
    runtime = table("CUPTI_ACTIVITY_KIND_RUNTIME", RUNTIME_COLS, RUNTIME_COLS)
    nvtx = table("NVTX_EVENTS", NVTX_COLS, ("start", "end", "eventType", "text", "globalTid"))
    if _columns(con, "StringIds") >= {"id", "value"}:
        strings = dict(con.execute("SELECT id, value FROM StringIds"))
    else:
        raise TraceInputError(path, "table StringIds has no column id, value; not an nsys export this reader knows")
    processes = {}
    if "PROCESSES" in names and _columns(con, "PROCESSES") >= {"globalPid", "pid", "name"}:
        processes = {g: (p, n or "") for g, p, n in con.execute("SELECT globalPid, pid, name FROM PROCESSES")}
    thread_names = {}
    if "ThreadNames" in names and _columns(con, "ThreadNames") >= {"nameId", "globalTid"}:
        thread_names = {g: strings.get(n, "") for n, g in con.execute("SELECT nameId, globalTid FROM ThreadNames")}
    meta = _kv(con, names, "META_DATA_EXPORT")
    offset, time_base = _time_offset(con, names, meta)
    if "TARGET_INFO_SYSTEM_ENV" in names and _columns(con, "TARGET_INFO_SYSTEM_ENV") >= {"name", "value"}:
        host = con.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'").fetchone()
        if host and host[0]:
            meta["Hostname"] = str(host[0])
    info = {k: meta[k] for k in ("Hostname", "EXPORT_PRODUCT_VERSION", "EXPORT_SCHEMA_VERSION", "EXPORT_HOST",
                                 "EXPORT_PARAM_TIME_NORMALIZE", "EXPORT_CONFIG_TIME_SHIFT") if k in meta}
    return NsysExport(path, kernels, memcpy, memset, runtime, nvtx, strings, processes, thread_names,
                      offset, time_base, info)


def _columns(con: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in con.execute(f"PRAGMA table_info([{table}])")}


def _kv(con, names: set[str], table: str) -> dict[str, str]:
    if table not in names or not _columns(con, table) >= {"name", "value"}:
        return {}
    out: dict[str, str] = {}
    for k, v in con.execute(f"SELECT name, value FROM [{table}]"):
        out.setdefault(str(k), str(v))
    return out


def _time_offset(con, names: set[str], meta: dict[str, str]) -> tuple[int, str]:
    """(ns to add to nsys times for epoch ns, the rule used): see the module doc."""
    normalized = meta.get("EXPORT_PARAM_TIME_NORMALIZE", "false").lower() == "true"
    shift = int(meta.get("EXPORT_CONFIG_TIME_SHIFT") or meta.get("EXPORT_PARAM_TIME_SHIFT") or 0)
    if "TARGET_INFO_SESSION_START_TIME" in names and \
            _columns(con, "TARGET_INFO_SESSION_START_TIME") >= {"utcEpochNs", "systemClockNs"}:
        row = con.execute("SELECT utcEpochNs, systemClockNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
        if row and row[0] is not None and row[1] is not None:
            if normalized:
                return int(row[0]) - shift, "epoch: ts + utcEpochNs (times normalised to the session start)"
            return int(row[0]) - int(row[1]) - shift, "epoch: ts + utcEpochNs - systemClockNs (session start)"
    return 0, "session: nsys times as exported (no TARGET_INFO_SESSION_START_TIME; not epoch)"
