"""Parse the output of two NCCL profiler plugins (NVIDIA/nccl ``plugins/profiler/``).

**Inspector** (``plugins/profiler/inspector``, ``NCCL_INSPECTOR_ENABLE=1``): one file per process,
``$NCCL_INSPECTOR_DUMP_DIR/<hostname>-pid<pid>.log``, JSON lines. Up to v4.2 every line is a
self-contained record ``{"header": {id, comm_name, rank, n_ranks, nnodes}, "metadata":
{inspector_output_format_version, git_rev, rec_mechanism, dump_timestamp_us, hostname, pid},
"coll_perf"|"p2p_perf": {...}}``. From v4.3 a ``dump_stats`` marker line carries header and
metadata once, and the following ``{"coll_perf": ...}`` / ``{"p2p_perf": ...}`` /
``{"proxy_trace": ...}`` lines belong to it (``inspector_json_reader.py`` there). coll_perf:
coll, coll_algo, coll_proto, coll_sn, coll_msg_size_bytes, coll_exec_time_us, coll_timing_source,
coll_algobw_gbs, coll_busbw_gbs; p2p_perf: p2p, p2p_sn, p2p_peer, p2p_msg_size_bytes, ...
(``inspector_json.cc``). The rank is the file name's, else the header rank of the process's
largest communicator, else ``--rank``.

**Example profiler** (``plugins/profiler/example``, ``NCCL_PROFILE_DUMP_FILE=PREFIX``): one file
``PREFIX-<hostname>-<tid>.txt`` at finalisation: ``[``, one Chrome-trace async event per line
(``{"name": ..., "cat": "COLL", "ph": "b", "id": N, "pid": P, "tid": 1, "ts": µs, "args": {...}},``)
and a closing ``{}]`` (``print_event.cc``). Older versions print some args unquoted
(``"datatype": ncclFloat32``, ``"Stream": 0x7f...``), which is not JSON: such bare words are quoted
before parsing. ``ts`` is µs since the plugin's own start, not epoch. Begin/end pairs are matched
by (cat, id, name). The rank comes from the file name or ``--rank`` (COLL events carry only the
communicator rank).

Records or lines that do not parse are skipped and counted.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa

from ... import schema as S
from ...errors import TraceInputError
from .logs import NcclLog, rank_from_name

INSPECTOR_NAME_RE = re.compile(r"-pid\d+\.(log|jsonl)(\.gz)?$")
PROFILER_NAME_RE = re.compile(r"-\d+\.txt$")
#: A bare word or hex number as a value (older example plugins print ncclFloat32 and %p unquoted).
_BARE = re.compile(r'(:\s*)(0x[0-9a-fA-F]+|(?!(?:true|false|null)\b)[A-Za-z_][A-Za-z0-9_]*)(\s*[,}])')


def _read_text(path: Path, what: str) -> str:
    try:
        from ..kineto.gunzip import read_bounded  # streaming, bounded; refuses FIFOs
        raw = read_bounded(path, what)
    except (OSError, EOFError) as exc:
        raise TraceInputError(path, f"cannot read {what} ({getattr(exc, 'strerror', None) or exc})") from None
    return raw.decode("utf-8", errors="replace")


def _num(value: Any, kind=int):
    if value is None or isinstance(value, bool):
        return None
    try:
        return kind(value)
    except (TypeError, ValueError):
        return None


def looks_like_inspector(head: str) -> bool:
    first = next((ln for ln in head.splitlines() if ln.strip()), "")
    return first.lstrip().startswith("{") and any(k in first for k in ('"coll_perf"', '"p2p_perf"', '"dump_stats"'))


def looks_like_profiler_dump(head: str) -> bool:
    lines = [ln for ln in head.splitlines() if ln.strip()]
    return bool(lines) and lines[0].strip() == "[" and len(lines) > 1 and '"cat":' in lines[1] and '"ph":' in lines[1]


# -- Inspector -------------------------------------------------------------------------------------

def read_inspector(path: str | Path, rank: int | None = None) -> NcclLog:
    path = Path(path)
    text = _read_text(path, "NCCL Inspector log")
    rows: list[dict] = []
    bad = orphan = 0
    header = meta = None
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if not isinstance(rec, dict):
            bad += 1
            continue
        if "dump_stats" in rec:  # v4.3 marker: context for the records that follow
            header, meta = rec.get("header"), rec.get("metadata")
            continue
        h, m = rec.get("header", header), rec.get("metadata", meta)
        for kind in ("coll", "p2p"):
            body = rec.get(f"{kind}_perf")
            if body is None:
                continue
            if not isinstance(body, dict) or not isinstance(h, dict) or not isinstance(m, dict):
                orphan += 1
                continue
            rows.append(_inspector_row(path, kind, body, h, m))
    if not rows and bad and not header:
        raise TraceInputError(path, "not an NCCL Inspector log (no JSON records)")
    log_rank, source = rank_from_name(path), "file_name"
    if log_rank is None and rows:
        biggest = max(rows, key=lambda r: r["comm_nranks"] or 0)
        log_rank, source = biggest["comm_rank"], "inspector_header"
    if log_rank is None:
        log_rank, source = rank, "argument"
    if log_rank is None:
        raise TraceInputError(path, "cannot tell the rank of this Inspector log: put the rank in its name or pass --rank")
    skipped = {k: v for k, v in (("inspector.bad_lines", bad), ("inspector.records_without_header", orphan)) if v}
    return NcclLog(str(path.resolve()), log_rank, source, pa.Table.from_pylist(rows, schema=S.NCCL_INSPECTOR_OPS.arrow_schema),
                   {"nccl_inspector_ops": len(rows)}, skipped)


def _inspector_row(path: Path, kind: str, b: dict, h: dict, m: dict) -> dict:
    from ..ops import normalize_op
    op = b.get(kind)
    exec_us = _num(b.get(f"{kind}_exec_time_us"), float)
    dump_us = _num(m.get("dump_timestamp_us"))
    return {"source_file": str(path.resolve()), "kind": kind, "nccl_op": op, "op": normalize_op(op) if op else None,
            "sn": _num(b.get(f"{kind}_sn")), "peer": _num(b.get("p2p_peer")) if kind == "p2p" else None,
            "msg_size_bytes": _num(b.get(f"{kind}_msg_size_bytes")),
            "exec_dur_ns": round(exec_us * 1000) if exec_us is not None else None,
            "timing_source": b.get(f"{kind}_timing_source"), "algo": b.get("coll_algo"), "proto": b.get("coll_proto"),
            "algobw_gbs": _num(b.get(f"{kind}_algobw_gbs"), float), "busbw_gbs": _num(b.get(f"{kind}_busbw_gbs"), float),
            "comm_id": None if h.get("id") is None else str(h.get("id")), "comm_name": h.get("comm_name"),
            "comm_rank": _num(h.get("rank")), "comm_nranks": _num(h.get("n_ranks")), "comm_nnodes": _num(h.get("nnodes")),
            "hostname": m.get("hostname"), "pid": _num(m.get("pid")),
            "dump_ts_ns": dump_us * 1000 if dump_us is not None else None,
            "format_version": m.get("inspector_output_format_version")}


# -- example profiler plugin ------------------------------------------------------------------------

def read_profiler_dump(path: str | Path, rank: int | None = None) -> NcclLog:
    path = Path(path)
    text = _read_text(path, "NCCL profiler plugin dump")
    begins: dict[tuple, dict] = {}
    rows: list[dict] = []
    bad = unmatched_end = repaired = 0
    for line in text.splitlines():
        line = line.strip().rstrip(",")
        if line in ("", "[", "]", "{}", "{}]"):
            continue
        line = line.removesuffix("]").rstrip(",") if line.endswith("}]") else line
        ev = _parse_event(line)
        if ev is None:
            fixed = _BARE.sub(lambda m: f'{m.group(1)}"{m.group(2)}"{m.group(3)}', line.replace("\u201c", '"'))
            ev = _parse_event(fixed)
            if ev is None:
                bad += 1
                continue
            repaired += 1
        key = (ev.get("cat"), ev.get("id"), ev.get("name"))
        if ev.get("ph") == "b":
            begins[key] = ev
            rows.append(_profiler_row(path, ev))
            ev["_row"] = rows[-1]
        elif ev.get("ph") == "e":
            start = begins.pop(key, None)
            ts, t0 = _num(ev.get("ts"), float), _num((start or {}).get("ts"), float)
            if start is None or ts is None or t0 is None:
                unmatched_end += 1
                continue
            start["_row"]["dur_ns"] = round((ts - t0) * 1000)
        else:
            bad += 1
    if not rows and bad:
        raise TraceInputError(path, "not an NCCL profiler plugin dump (no Chrome-trace events)")
    log_rank, source = rank_from_name(path), "file_name"
    if log_rank is None:
        log_rank, source = rank, "argument"
    if log_rank is None:
        raise TraceInputError(path, "cannot tell the rank of this NCCL profiler dump: put the rank in its name or pass --rank")
    skipped = {k: v for k, v in (("profiler_plugin.bad_lines", bad), ("profiler_plugin.end_without_begin", unmatched_end),
                                 ("profiler_plugin.begin_without_end", len(begins))) if v}
    return NcclLog(str(path.resolve()), log_rank, source,
                   pa.Table.from_pylist(rows, schema=S.NCCL_PROFILER_EVENTS.arrow_schema),
                   {"nccl_profiler_events": len(rows), "repaired_lines": repaired}, skipped)


def _parse_event(line: str) -> dict | None:
    try:
        ev = json.loads(line)
    except ValueError:
        return None
    return ev if isinstance(ev, dict) and "ph" in ev else None


def _profiler_row(path: Path, ev: dict) -> dict:
    from ..ops import normalize_op
    args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
    ts = _num(ev.get("ts"), float)
    cat = ev.get("cat")
    comm_hash = args.get("CommHash")
    return {"source_file": str(path.resolve()), "name": ev.get("name"), "cat": cat, "event_id": _num(ev.get("id")),
            "pid": _num(ev.get("pid")), "start_rel_ns": round(ts * 1000) if ts is not None else None, "dur_ns": None,
            "op": normalize_op(ev.get("name")) if cat in ("COLL", "P2P", "COLL_API", "P2P_API") else None,
            "seq_num": _num(args.get("SeqNum")), "comm_hash": None if comm_hash is None else str(comm_hash),
            "comm_rank": _num(args.get("Rank")), "peer": _num(args.get("Peer")),
            "count": _num(args.get("Count", args.get("count"))),
            "datatype": args.get("Datatype", args.get("datatype")), "algorithm": args.get("Algorithm"),
            "protocol": args.get("Protocol"), "n_channels": _num(args.get("nChannels")),
            "channel": _num(args.get("Channel")), "args_json": json.dumps(args) if args else None}
