"""Read a Kineto trace file into its top-level metadata and chunks of typed events.

Memory matters (a rank's trace can be gigabytes): the file is decompressed once, the
``traceEvents`` array is split into raw per-event slices without building Python dicts, and the
events are then decoded into small typed structs one chunk at a time. msgspec does the parsing in
C and a typed decode creates no dicts, which keeps the garbage collector out of the hot loop.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import msgspec

from ...errors import TraceInputError
from .validate import check_duplicate_keys, decode_meta

#: the one message for JSON nested deeper than the reader allows (msgspec stops at Python's
#: recursion limit, about 1,000 levels; Kineto traces and FR dumps nest a few levels)
TOO_DEEP = "JSON nested too deeply (more than about 1,000 levels; traces and dumps nest a few): the file is damaged"

#: Events decoded per chunk: large enough to amortise call overhead, small enough to bound memory.
CHUNK_EVENTS = 10_000

_EMPTY = msgspec.Raw(b"")


class Event(msgspec.Struct, gc=False):
    """The fields of a Chrome-trace event that we read; ``args`` stays raw JSON text."""
    ph: str = ""
    name: Any = ""
    cat: Any = ""
    pid: Any = None
    tid: Any = None
    ts: msgspec.Raw = _EMPTY
    dur: msgspec.Raw = _EMPTY
    id: Any = None
    args: msgspec.Raw = _EMPTY


@dataclass
class RawTrace:
    """A decoded trace: top-level keys plus the raw event slices."""
    path: Path
    meta: dict[str, Any]
    events_raw: list[msgspec.Raw]
    n_bytes: int
    skipped: Counter = field(default_factory=Counter)

    def chunks(self, size: int = CHUNK_EVENTS) -> Iterator[list[Event]]:
        """Typed events, ``size`` at a time; malformed events are skipped and counted."""
        decoder = msgspec.json.Decoder(list[Event])
        one = msgspec.json.Decoder(Event)
        for start in range(0, len(self.events_raw), size):
            part = self.events_raw[start:start + size]
            blob = b"[" + b",".join(part) + b"]"
            try:
                blob.decode("utf-8")  # args stay raw: their bytes are checked here, one chunk at a time
            except UnicodeDecodeError:
                # invalid UTF-8 bytes (seen in C++ symbol names, anywhere in args): replace, count.
                part = [_repair_utf8(raw, self.skipped) for raw in part]
                blob = b"[" + b",".join(part) + b"]"
            try:
                yield decoder.decode(blob)
                continue
            except RecursionError:
                raise TraceInputError(self.path, TOO_DEEP) from None
            except msgspec.DecodeError:
                pass
            good = []
            for raw in part:
                try:
                    good.append(one.decode(raw))
                except RecursionError:
                    raise TraceInputError(self.path, TOO_DEEP) from None
                except msgspec.DecodeError:
                    self.skipped["malformed_event"] += 1
            yield good


def _repair_utf8(raw, skipped: Counter) -> bytes:
    data = bytes(raw)
    try:
        data.decode("utf-8")
        return data
    except UnicodeDecodeError:
        repaired = data.decode("utf-8", errors="replace").encode("utf-8")
        skipped["replaced_invalid_utf8_bytes"] += repaired.count(_FFFD) - data.count(_FFFD)
        return repaired


_FFFD = "\ufffd".encode()


def read_bytes(path: Path) -> bytes:
    """The file's bytes, gunzipped when it is gzip (by magic number, not by extension), with
    the uncompressed size bounded (:mod:`.gunzip`); FIFOs and devices are refused, not read."""
    from .gunzip import read_bounded
    return read_bounded(path)


def read_trace(path: str | Path) -> RawTrace:
    """Decode the top level of a Kineto trace and split its events; raise one-line errors."""
    path = Path(path)
    data = read_bytes(path)
    skipped: Counter = Counter()
    try:
        top = _decode_top(path, data, skipped)
    except RecursionError:
        raise TraceInputError(path, TOO_DEEP) from None
    if not isinstance(top, dict):
        raise TraceInputError(path, "not a Kineto trace: the JSON top level is not an object")
    if "traceEvents" not in top:
        raise TraceInputError(path, "not a Kineto trace: no 'traceEvents' key")
    check_duplicate_keys(path, data, top)
    try:
        events_raw = msgspec.json.decode(top.pop("traceEvents"), type=list[msgspec.Raw])
    except msgspec.ValidationError:
        raise TraceInputError(path, "not a Kineto trace: 'traceEvents' is not a list") from None
    except RecursionError:
        raise TraceInputError(path, TOO_DEEP) from None
    if not events_raw:
        raise TraceInputError(path, "the trace has no events ('traceEvents' is empty)")
    meta = {}
    for key, raw in top.items():
        try:
            meta[key] = decode_meta(path, key, raw)
        except RecursionError:
            raise TraceInputError(path, TOO_DEEP) from None
        except ValueError:
            skipped["malformed_metadata"] += 1
    return RawTrace(path, meta, events_raw, len(data), skipped)


def _error_at_end(msg: str, size: int) -> bool:
    """msgspec reports a file cut inside a number as 'invalid number (byte N)' at the very end."""
    m = re.search(r"\(byte (\d+)\)", msg)
    return bool(m) and int(m.group(1)) >= size - 1


def _decode_top(path: Path, data: bytes, skipped: Counter) -> Any:
    try:
        return msgspec.json.decode(data, type=dict[str, msgspec.Raw])
    except msgspec.ValidationError:
        return None  # valid JSON, but not an object
    except msgspec.DecodeError as exc:
        msg = str(exc)
        if "utf-8" not in msg.lower():
            if "truncated" in msg.lower() or _error_at_end(msg, len(data)):
                raise TraceInputError(path, "truncated JSON (the file ends in the middle of the data)") from None
            raise TraceInputError(path, f"invalid JSON ({msg})") from None
    # Names with invalid UTF-8 bytes (seen with C++ symbol names): replace and count them.
    return _decode_top(path, _repair_utf8(data, skipped), skipped)
