"""Range and type checks of a trace's metadata, before any table is built.

Every integer that ends up in a store column is checked against that column's type: ranks,
world and group sizes against int32 (the ``rank`` partition column is an INTEGER), ids and
times against int64, and ``baseTimeNanoseconds + ts`` too (the sum is checked where it is
computed, in :mod:`.build`). A value of the wrong type or outside its range is refused with one
line naming the file and the field; nothing is guessed.

The rules for duplicate JSON keys (a second ``traceEvents`` or ``rank`` would silently replace
the first): the top-level keys and every key of the metadata objects (``distributedInfo``, its
``pg_config``, ``deviceProperties``, ...) are checked, and a trace with a duplicate there is
refused. Inside an event the last value wins, as in every JSON reader; that is not checked (it
would cost a second parse of every event).
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from ...errors import TraceInputError

INT64_MIN, INT64_MAX = -2**63, 2**63 - 1
#: ranks, world and group sizes, step numbers: int32 columns of the store
INT32_MAX = 2**31 - 1
#: top-level keys whose second occurrence is looked for in the raw bytes (a key is a quoted
#: string followed by ':'; inside a JSON string a quote is escaped, so this cannot match text)
_KEY_RE = {k: re.compile(rb'"' + k.encode() + rb'"\s*:') for k in ("traceEvents", "distributedInfo",
                                                                    "baseTimeNanoseconds", "deviceProperties")}


class OutOfRange(ValueError):
    """A value outside its column's range; :mod:`.build` turns it into a TraceInputError."""

    def __init__(self, what: str, value: Any, lo: int = INT64_MIN, hi: int = INT64_MAX):
        super().__init__(f"{what} {_short(value)} is outside the range of its column ({lo:,} .. {hi:,})")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def int_in(what: str, value: Any, lo: int = INT64_MIN, hi: int = INT64_MAX) -> int:
    """``value`` as an int in [lo, hi]; raises :class:`OutOfRange` (or ValueError for a non-integer)."""
    if isinstance(value, bool):
        raise ValueError(f"{what} is a boolean, not an integer")
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise ValueError(f"{what} {_short(value)} is not an integer")
        value = int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if not isinstance(value, int):
        raise ValueError(f"{what} is a {type(value).__name__} ({_short(value)}), not an integer")
    if not lo <= value <= hi:
        raise OutOfRange(what, value, lo, hi)
    return value


def named(fn, what: str, value):
    """``fn(value)``, an :class:`OutOfRange` naming ``what``."""
    try:
        return fn(value)
    except OutOfRange:
        raise OutOfRange(what, value) from None


def add_checked(a, b, what: str):
    """a + b of int64 Arrow arrays/scalars, refused (not wrapped around) on overflow."""
    import pyarrow as pa
    import pyarrow.compute as pc
    try:
        return pc.add_checked(a, b)
    except pa.ArrowInvalid:
        raise ValueError(f"{what} overflows int64 (a time beyond the year 2262): the timestamps are damaged") from None


def check_duplicate_keys(path: Path, data, top_keys) -> None:
    """Refuse a trace whose top level names one of the main keys twice."""
    for key, rx in _KEY_RE.items():
        # bytes.count runs at memory speed; the exact checks only when the key occurs twice at all
        if key in top_keys and data.count(b'"' + key.encode() + b'"') > 1 and len(rx.findall(data)) > 1 \
                and _top_level_twice(data, key):
            raise TraceInputError(path, f"duplicate JSON key '{key}' at the top level (a second one would silently "
                                        f"replace the first); the file is damaged or was concatenated")


def _top_level_twice(data, key: str) -> bool:
    """Occurrences of the key may be nested (e.g. inside args); count only depth-1 ones, which
    is cheap here because it runs only when the key occurs more than once at all."""
    n, depth, in_str, esc = 0, 0, False, False
    needle = b'"' + key.encode() + b'"'
    for m in re.finditer(rb'[{}\[\]"\\]', data):
        c = m.group()
        if in_str:
            if esc:
                esc = False
            elif c == b"\\":
                esc = True
            elif c == b'"':
                in_str = False
            continue
        if c == b'"':
            if depth == 1 and data[m.start():m.start() + len(needle)] == needle:
                n += 1
                if n > 1:
                    return True
            in_str = True
        elif c in (b"{", b"["):
            depth += 1
        elif c in (b"}", b"]"):
            depth -= 1
    return False


def decode_meta(path: Path, key: str, raw) -> Any:
    """One top-level metadata value; a duplicate key inside it is refused."""
    def pairs(items):
        seen = set()
        for k, _ in items:
            if k in seen:
                raise TraceInputError(path, f"duplicate JSON key '{k}' in '{key}' (a second one would silently "
                                            "replace the first)")
            seen.add(k)
        return dict(items)
    text = bytes(raw).decode("utf-8", errors="replace")
    return json.loads(text, object_pairs_hook=pairs)


def check_meta(path: Path, meta: dict) -> None:
    """Types and ranges of the top-level metadata that become columns."""
    try:
        _check_meta(meta)
    except ValueError as exc:
        raise TraceInputError(path, str(exc)) from None


def _check_meta(meta: dict) -> None:
    base = meta.get("baseTimeNanoseconds")
    if base is not None:
        int_in("baseTimeNanoseconds", base, 0, INT64_MAX)
    props = meta.get("deviceProperties")
    if props is not None and not isinstance(props, list):
        raise ValueError(f"deviceProperties is a {type(props).__name__}, not a list")
    info = meta.get("distributedInfo")
    if info is None:
        return
    if not isinstance(info, dict):
        raise ValueError(f"distributedInfo is a {type(info).__name__}, not an object")
    world = info.get("world_size")
    if world is not None:
        world = int_in("distributedInfo.world_size", world, 1, INT32_MAX)
    if info.get("rank") is not None:
        rank = int_in("distributedInfo.rank", info["rank"], 0, INT32_MAX)
        if world is not None and rank >= world:
            raise ValueError(f"distributedInfo.rank {rank} is not in [0, world_size {world})")
    for key in ("backend",):
        if info.get(key) is not None and not isinstance(info[key], str):
            raise ValueError(f"distributedInfo.{key} is a {type(info[key]).__name__}, not a string")
    configs = info.get("pg_config")
    if configs is None:
        return
    if isinstance(configs, dict):
        configs = list(configs.values())
    if not isinstance(configs, list):
        raise ValueError(f"distributedInfo.pg_config is a {type(configs).__name__}, not a list")
    for i, pg in enumerate(configs):
        where = f"distributedInfo.pg_config[{i}]"
        if not isinstance(pg, dict):
            raise ValueError(f"{where} is a {type(pg).__name__}, not an object")
        for key in ("pg_desc", "backend_config"):
            if pg.get(key) is not None and not isinstance(pg[key], str):
                raise ValueError(f"{where}.{key} is a {type(pg[key]).__name__}, not a string")
        if pg.get("pg_name", pg.get("uid")) is not None and not isinstance(pg.get("pg_name", pg.get("uid")), (str, int)):
            raise ValueError(f"{where}.pg_name is a {type(pg.get('pg_name')).__name__}, not a string")
        if pg.get("pg_size") is not None:
            int_in(f"{where}.pg_size", pg["pg_size"], 0, INT32_MAX)
        ranks = pg.get("ranks")
        if isinstance(ranks, str):
            try:
                ranks = json.loads(ranks)
            except ValueError:
                raise ValueError(f"{where}.ranks {_short(ranks)} is not a list of ranks") from None
        if ranks is None:
            continue
        if not isinstance(ranks, list):
            raise ValueError(f"{where}.ranks is a {type(ranks).__name__}, not a list of ranks")
        for r in ranks:
            if isinstance(r, str) or isinstance(r, bool) or not isinstance(r, (int, float)):
                raise ValueError(f"{where}.ranks holds {_short(r)}, not an integer rank")
            r = int_in(f"{where}.ranks member", r, 0, INT32_MAX)
            if world is not None and r >= world:
                raise ValueError(f"{where}.ranks holds rank {r}, not in [0, world_size {world})")


def check_rank(path: Path, rank: int, source: str) -> int:
    """A rank from the trace, the file name or --rank: an int32 >= 0."""
    try:
        return int_in(f"rank (from the {source.replace('_', ' ')})", rank, 0, INT32_MAX)
    except ValueError as exc:
        raise TraceInputError(path, str(exc)) from None
