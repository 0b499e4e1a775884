"""Read Flight Recorder JSON dumps (``_dump_fr_trace_json``) and join them to gloo collectives.

A gloo trace carries no process group and no sequence number on its collectives; the Flight
Recorder has both (``process_group`` [name, desc] and ``collective_seq_id``, counted per group),
plus ``time_created_ns``, taken while the ``c10d::*`` enqueue op runs. So the enqueue op whose span
holds ``time_created_ns`` is that FR entry's collective. Only JSON dumps are read here; pickled dumps
are never unpickled (they can run code).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from .errors import TraceInputError


class FrEntry(msgspec.Struct, gc=False):
    collective_seq_id: int = -1
    process_group: list[Any] = msgspec.field(default_factory=list)
    profiling_name: str = ""
    time_created_ns: int = 0
    is_p2p: bool = False
    input_sizes: Any = None


class FrDump(msgspec.Struct, gc=False):
    entries: list[FrEntry] = msgspec.field(default_factory=list)
    version: Any = None


def sidecar_path(trace_path: str | Path, rank: int) -> Path | None:
    """The collector writes ``rank{R}.fr.json`` beside the rank's traces."""
    p = Path(trace_path).parent / f"rank{rank}.fr.json"
    return p if p.is_file() else None


def read_fr_json(path: str | Path) -> list[FrEntry]:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceInputError(path, f"cannot read Flight Recorder dump ({exc.strerror or exc})") from None
    if data[:1] == b"\x80":
        raise TraceInputError(path, "Flight Recorder dump is a pickle; only JSON dumps are read "
                                    "(use _dump_fr_trace_json, or the collector's converter)")
    try:
        return msgspec.json.decode(data, type=FrDump).entries
    except msgspec.DecodeError as exc:
        raise TraceInputError(path, f"not a Flight Recorder JSON dump ({exc})") from None


def join_fr(rows: list[dict], entries: list[FrEntry]) -> int:
    """Give gloo collective rows the FR's process group and sequence id; returns rows joined."""
    collectives = sorted((e for e in entries if not e.is_p2p and e.time_created_ns > 0 and e.process_group),
                         key=lambda e: e.time_created_ns)
    candidates = sorted((r for r in rows if r["dialect"] == "gloo" and not r["is_p2p"]
                         and r["enqueue_ts_ns"] is not None), key=lambda r: r["enqueue_ts_ns"])
    joined, i = 0, 0
    for r in candidates:
        lo, hi = r["enqueue_ts_ns"], r["enqueue_ts_ns"] + r["enqueue_dur_ns"]
        while i < len(collectives) and collectives[i].time_created_ns < lo:
            i += 1
        if i < len(collectives) and collectives[i].time_created_ns <= hi:
            e = collectives[i]
            r.update(pg_name=str(e.process_group[0]), pg_source="flight_recorder", pg_inferred=False,
                     fr_seq=e.collective_seq_id)
            if len(e.process_group) > 1 and e.process_group[1]:
                r["pg_desc"] = str(e.process_group[1])
            joined += 1
            i += 1
    return joined
