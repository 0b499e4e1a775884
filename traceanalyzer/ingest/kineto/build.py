"""Turn one decoded trace into the canonical per-rank tables (events, threads, flows, steps,
process groups, and the rank's own row). Communication is normalised separately
(:mod:`traceanalyzer.ingest.comms`) from the events table built here.
"""
from __future__ import annotations

import json
import re
import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Union

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ... import schema as S
from ...errors import TraceInputError
from .classify import STEP_RE, classify
from .reader import Event, RawTrace
from .timeparse import us_text_to_ns
from .validate import INT32_MAX, OutOfRange, add_checked, check_meta, check_rank, int_in, named

_FILE_RANK_RE = re.compile(r"(?:^|[^a-z])(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)


class _ArgIds(msgspec.Struct, gc=False):
    """The few args every event may carry that we lift into typed columns."""
    external_id: Union[int, None] = msgspec.field(default=None, name="External id")
    correlation: Union[int, None] = None
    stream: Union[int, None] = None
    device: Union[int, None] = None


class _LooseArgIds(msgspec.Struct, gc=False):
    """The same, for writers that put text or floats there (converted one by one)."""
    external_id: Any = msgspec.field(default=None, name="External id")
    correlation: Any = None
    stream: Any = None
    device: Any = None


@dataclass
class RankTables:
    """The tables of one trace file (window column not yet filled in)."""
    rank: int
    rank_source: str
    tables: dict[str, pa.Table]
    start_ts_ns: int
    end_ts_ns: int
    skipped: Counter = field(default_factory=Counter)


def _id(value) -> int | None:
    """Numeric pid/tid/flow id; text ids (``"Spans"``) become stable negative ids."""
    if value is None:
        return None
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and value == value and abs(value) != float("inf"):
        value = int(value)
    if isinstance(value, int):
        return int_in("id", value)
    text = str(value)
    if text.lstrip("-").isdigit():
        return int_in("id", int(text))
    return -1 - (zlib.crc32(text.encode()) & 0x7FFFFFFF)


def _int_or_none(value) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):  # 1e400 decodes as inf
        return None


def _concat(raws: list) -> tuple[bytes, np.ndarray]:
    """Raw JSON slices back to back in one buffer, with their offsets (no Python strings made)."""
    offsets = np.zeros(len(raws) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, raws), dtype=np.int64, count=len(raws)), out=offsets[1:])
    return b"".join(raws), offsets


def _raw_column(raws: list) -> pa.Array:
    """A string array of raw JSON slices (zero-copy over the joined bytes)."""
    buf, offsets = _concat(raws)
    if offsets[-1] < 2**31:
        return pa.StringArray.from_buffers(len(raws), pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(buf))
    return pa.LargeStringArray.from_buffers(len(raws), pa.py_buffer(offsets), pa.py_buffer(buf)).cast(pa.string())


def _int_column(values: list, what: str = "id") -> pa.Array:
    """int64 column from ints/None; other values (text ids) through :func:`_id`; a number
    beyond int64 raises :class:`OutOfRange` naming ``what``."""
    try:
        return pa.array(values, pa.int64())
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        try:
            return pa.array([_id(v) for v in values], pa.int64())
        except OutOfRange:
            bad = next((v for v in values if _out_of_int64(v)), None)
            raise OutOfRange(what, bad) from None


def _out_of_int64(value) -> bool:
    try:
        _id(value)
    except OutOfRange:
        return True
    return False


def resolve_rank(trace: RawTrace, rank_arg: int | None) -> tuple[int, str]:
    rank, source = _resolve_rank(trace, rank_arg)
    rank = check_rank(trace.path, rank, source)
    info = trace.meta.get("distributedInfo")
    world = _int_or_none(info.get("world_size")) if isinstance(info, dict) else None
    if world is not None and rank >= world:
        raise TraceInputError(trace.path, f"rank {rank} (from the {source.replace('_', ' ')}) is not in "
                                          f"[0, world_size {world})")
    return rank, source


def _resolve_rank(trace: RawTrace, rank_arg: int | None) -> tuple[int, str]:
    info = trace.meta.get("distributedInfo")
    if isinstance(info, dict) and _int_or_none(info.get("rank")) is not None:
        return int(info["rank"]), "distributedInfo"
    if rank_arg is not None:
        return int(rank_arg), "argument"
    m = _FILE_RANK_RE.search(trace.path.name)
    if m:
        return int(m.group(1)), "file_name"
    raise TraceInputError(trace.path, "no rank: the trace has no distributedInfo.rank and the file name "
                                      "names no rank (e.g. rank3); pass --rank")


def build_tables(trace: RawTrace, rank_arg: int | None = None) -> RankTables:
    """The canonical tables of one trace; a value that does not fit its column (type or range)
    is refused with one line naming the file and the field (:mod:`.validate`)."""
    check_meta(trace.path, trace.meta)
    try:
        return _build_tables(trace, rank_arg)
    except ValueError as exc:  # OutOfRange and friends: say which value
        raise TraceInputError(trace.path, str(exc)) from None
    except RecursionError:
        from .reader import TOO_DEEP
        raise TraceInputError(trace.path, TOO_DEEP) from None


def _build_tables(trace: RawTrace, rank_arg: int | None = None) -> RankTables:
    rank, rank_source = resolve_rank(trace, rank_arg)
    skipped = trace.skipped
    base_ns = _int_or_none(trace.meta.get("baseTimeNanoseconds")) or 0
    batches: list[pa.Table] = []
    flows: dict[str, list] = {k: [] for k in ("flow_id", "cat", "ph", "ts", "pid", "tid")}
    meta_events: list[Event] = []
    first_id = 0

    # One chunk of typed events at a time becomes one slice of the events table, so that
    # memory holds the file's bytes, the finished columns and one chunk -- never all structs.
    for chunk in trace.chunks():
        xs, fl = [], []
        for e in chunk:
            ph = e.ph
            if ph == "X" or ph == "i":
                xs.append(e)
            elif ph == "s" or ph == "f" or ph == "t":
                fl.append(e)
            elif ph == "M":
                meta_events.append(e)
            else:
                skipped[f"unsupported_phase_{ph or 'missing'}"] += 1
        del chunk
        args = [e.args for e in xs]
        ids = _decode_ids(args)
        cols = {
            "ph": pa.array([e.ph for e in xs], pa.string()),
            "cat": _str_column([e.cat for e in xs]), "name": _str_column([e.name for e in xs]),
            "pid": _int_column([e.pid for e in xs], "pid"), "tid": _int_column([e.tid for e in xs], "tid"),
            "ts": us_text_to_ns_checked(trace, [e.ts for e in xs]),
            "dur": us_text_to_ns_checked(trace, [e.dur for e in xs]),
            "args": _raw_column(args),
            "ext": _int_column([i.external_id for i in ids], "args.External id"),
            "corr": _int_column([i.correlation for i in ids], "args.correlation"),
            "stream": _int_column([i.stream for i in ids], "args.stream"),
            "device": _int_column([i.device for i in ids], "args.device"),
        }
        del args, ids
        batches.append(_events_table(cols, base_ns, skipped, first_id))
        first_id += len(xs)
        flows["flow_id"] += [named(_id, "flow id", e.id) for e in fl]
        flows["cat"] += [str(e.cat) for e in fl]
        flows["ph"] += [e.ph for e in fl]
        flows["ts"].append(us_text_to_ns_checked(trace, [e.ts for e in fl]))
        flows["pid"] += [named(_id, "pid", e.pid) for e in fl]
        flows["tid"] += [named(_id, "tid", e.tid) for e in fl]
        del xs, fl, cols

    trace.events_raw = []  # release the file's bytes
    events = pa.concat_tables(batches) if batches else None
    del batches
    if events is None or events.num_rows == 0:
        raise TraceInputError(trace.path, "the trace has no complete events (only metadata or flows)")
    steps = _steps_table(events)
    events = events.set_column(events.schema.get_field_index("step"), "step", _assign_steps(events, steps))
    events = events.set_column(events.schema.get_field_index("nested"), "nested", _nested(events))
    threads = _threads_table(meta_events, events)
    flows_t = _flows_table(flows, base_ns, skipped)
    pgs = _process_groups_table(trace.meta.get("distributedInfo"))
    start = int(pc.min(events["ts_ns"]).as_py())
    end = int(pc.max(add_checked(events["ts_ns"], events["dur_ns"], "ts + dur")).as_py())
    ranks = _rank_row(trace, rank_source, base_ns, meta_events, events, start, end, skipped)
    tables = {"events": events, "steps": steps, "threads": threads, "flows": flows_t,
              "process_groups": pgs, "ranks": ranks}
    return RankTables(rank, rank_source, tables, start, end, skipped)


def us_text_to_ns_checked(trace: RawTrace, raws: list) -> pa.Array:
    try:
        return us_text_to_ns(*_concat(raws))
    except ValueError as exc:
        raise TraceInputError(trace.path, f"bad timestamp or duration: {exc}") from None


def _str_column(values: list) -> pa.Array:
    try:
        return pa.array(values, pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        return pa.array([v if isinstance(v, str) else ("" if v is None else str(v)) for v in values], pa.string())


_IDS = msgspec.json.Decoder(list[_ArgIds])
_LOOSE_IDS = msgspec.json.Decoder(_LooseArgIds)
_NO_IDS = _LooseArgIds()


def _decode_ids(args: list) -> list:
    """Typed decode of the id args of a chunk in one call; row by row where a writer deviates."""
    try:
        return _IDS.decode(b"[" + b",".join(a if a else b"{}" for a in args) + b"]")
    except (msgspec.DecodeError, msgspec.ValidationError):
        out = []
        for a in args:
            try:
                ids = _LOOSE_IDS.decode(a) if a else _NO_IDS
            except msgspec.DecodeError:
                ids = _NO_IDS
            out.append(_LooseArgIds(*(_int_or_none(getattr(ids, f)) for f in ("external_id", "correlation", "stream", "device"))))
        return out


def _events_table(cols: dict[str, pa.Array], base_ns: int, skipped: Counter, first_id: int) -> pa.Table:
    ts = cols["ts"]
    dur = cols["dur"]
    n = len(ts)
    lowest = pc.min(ts).as_py()
    if lowest is not None and lowest < 0:
        raise ValueError(f"negative timestamp (ts {lowest / 1000:g} us): Kineto writes none; the trace is damaged")
    no_ts = pc.is_null(ts).to_numpy(zero_copy_only=False)
    is_instant = pc.equal(cols["ph"], "i").to_numpy(zero_copy_only=False)
    dur_np = pc.fill_null(dur, 0).to_numpy(zero_copy_only=False)
    missing_dur = pc.is_null(dur).to_numpy(zero_copy_only=False) & ~is_instant
    negative = dur_np < 0
    absurd = dur_np > S.MAX_EVENT_DUR_NS
    drop = no_ts | negative | absurd
    for reason, mask in (("missing_timestamp", no_ts), ("negative_duration", negative & ~no_ts),
                         ("absurd_duration", absurd & ~no_ts)):
        if mask.any():
            skipped[reason] += int(mask.sum())
    if (missing_dur & ~drop).any():
        skipped["missing_duration_kept_as_zero"] += int((missing_dur & ~drop).sum())
    keep = pa.array(~drop)
    kind, is_gpu = classify(cols["cat"], cols["name"], cols["ph"])
    is_gpu_a = pa.array(is_gpu)
    device = pc.if_else(is_gpu_a, pc.coalesce(cols["device"], cols["pid"]), pa.scalar(None, pa.int64()))
    stream = pc.if_else(is_gpu_a, pc.coalesce(cols["stream"], cols["tid"]), pa.scalar(None, pa.int64()))
    table = pa.table({
        "event_id": pa.array(np.arange(first_id, first_id + n, dtype=np.int64)),
        "ph": cols["ph"], "cat": cols["cat"], "kind": kind, "name": cols["name"],
        "ts_ns": add_checked(ts, base_ns, "baseTimeNanoseconds + ts"), "dur_ns": pa.array(dur_np), "pid": cols["pid"], "tid": cols["tid"],
        "is_gpu": is_gpu_a, "device": device.cast(pa.int32()), "stream": stream,
        "correlation": cols["corr"], "external_id": cols["ext"],
        "step": pa.nulls(n, pa.int32()), "nested": pa.nulls(n, pa.bool_()), "args_json": cols["args"],
    })
    # event_id is the position in the file (kept for every event, dropped ones leave gaps)
    return table.filter(keep) if drop.any() else table


def _steps_table(events: pa.Table) -> pa.Table:
    """CPU-side ProfilerStep#N ranges (GPU-side copies are ignored)."""
    mask = pc.and_(pc.equal(events["kind"], "step"), pc.invert(events["is_gpu"]))
    st = events.filter(mask).select(["name", "ts_ns", "dur_ns"]).to_pydict()
    ranges: dict[int, list[int]] = {}
    for name, ts, dur in zip(st["name"], st["ts_ns"], st["dur_ns"]):
        m = STEP_RE.match(name)
        if not m:
            continue
        step = int_in(f"step number of {name[:40]!r}", int(m.group(1)), 0, INT32_MAX)
        lo, hi = ranges.get(step, (ts, ts + dur))
        ranges[step] = [min(lo, ts), max(hi, ts + dur)]
    steps = sorted(ranges)
    return pa.table({
        "step": pa.array(steps, pa.int32()),
        "start_ts_ns": pa.array([ranges[s][0] for s in steps], pa.int64()),
        "end_ts_ns": pa.array([ranges[s][1] for s in steps], pa.int64()),
        "dur_ns": pa.array([ranges[s][1] - ranges[s][0] for s in steps], pa.int64()),
    }, schema=S.STEPS.arrow_schema)


#: kinds that do not count as a thread's work when nesting is decided (ProfilerStep spans hold
#: everything; instants and GPU-side annotations are not CPU work)
_NOT_WORK = ("step", "instant", "gpu_annotation")


def _nested(events: pa.Table) -> pa.Array:
    """events.nested: per CPU thread, events sorted by (start, longest first, file order); an event
    is nested when it starts before and ends no later than the latest end of the events before it.
    The replay graph builder (replay/graph/load.py) merges each thread's events into top-level work
    by this very rule, so it may leave nested cpu_ops in the store: they cannot start or extend
    a top-level span. The profiler's own 'PyTorch Profiler' spans are not counted either."""
    n = events.num_rows
    out = np.zeros(n, dtype=bool)
    kind, name = events["kind"], events["name"]
    work = pc.and_(pc.equal(events["ph"], "X"), pc.invert(events["is_gpu"]))
    work = pc.and_(work, pc.invert(pc.is_in(kind, pa.array(_NOT_WORK))))
    work = pc.and_(work, pc.invert(pc.and_(pc.equal(kind, "other"), pc.starts_with(name, "PyTorch Profiler"))))
    idx = np.flatnonzero(pc.fill_null(work, False).to_numpy(zero_copy_only=False))
    if not len(idx):
        return pa.array(out)
    tid = pc.fill_null(events["tid"], 0).to_numpy()[idx]
    ts = events["ts_ns"].to_numpy()[idx]
    dur = pc.fill_null(events["dur_ns"], 0).to_numpy()[idx]
    o = np.lexsort((idx, -dur, ts, tid))
    tid, ts, te = tid[o], ts[o], ts[o] + dur[o]
    bounds = np.flatnonzero(np.r_[True, tid[1:] != tid[:-1], True])
    prev_max = np.empty_like(te)
    for a, b in zip(bounds[:-1], bounds[1:]):
        prev_max[a] = np.iinfo(np.int64).min
        if b - a > 1:
            np.maximum.accumulate(te[a:b - 1], out=prev_max[a + 1:b])
    out[idx[o]] = (te <= prev_max) & (ts < prev_max)
    return pa.array(out)


def _assign_steps(events: pa.Table, steps: pa.Table) -> pa.Array:
    """CPU events: the step whose range holds their start. GPU events: the step of the CPU call
    that launched them (same correlation id, else same external id)."""
    n = events.num_rows
    out = np.full(n, -1, dtype=np.int64)
    if steps.num_rows == 0:
        return pa.nulls(n, pa.int32())
    order = np.argsort(steps["start_ts_ns"].to_numpy())
    starts = steps["start_ts_ns"].to_numpy()[order]
    ends = steps["end_ts_ns"].to_numpy()[order]
    numbers = steps["step"].to_numpy()[order]
    ts = events["ts_ns"].to_numpy()
    is_gpu = events["is_gpu"].to_numpy(zero_copy_only=False)
    idx = np.searchsorted(starts, ts, side="right") - 1
    inside = (idx >= 0) & (ts < ends[np.clip(idx, 0, None)])
    cpu = ~is_gpu
    out[cpu & inside] = numbers[idx[cpu & inside]]
    if is_gpu.any():
        for key in ("correlation", "external_id"):
            keys = pc.fill_null(events[key], -1).to_numpy()
            have = cpu & (out >= 0) & (keys >= 0)
            if not have.any():
                continue
            order = np.argsort(keys[have], kind="stable")
            known_keys, known_steps = keys[have][order], out[have][order]
            todo = np.nonzero(is_gpu & (out < 0) & (keys >= 0))[0]
            pos = np.clip(np.searchsorted(known_keys, keys[todo]), 0, len(known_keys) - 1)
            hit = known_keys[pos] == keys[todo]
            out[todo[hit]] = known_steps[pos[hit]]
    return pa.array(out, mask=out < 0).cast(pa.int32())


def _thread_name_score(name: str, process_names: set[str]) -> int:
    inner = name[name.find("(") + 1:name.rfind(")")] if "(" in name else name
    return 0 if (not inner or inner in process_names or inner.startswith("python")) else 1


def _threads_table(meta_events: list[Event], events: pa.Table) -> pa.Table:
    process_names = {str((_args(e) or {}).get("name", "")) for e in meta_events if e.name == "process_name"}
    names: dict[tuple[int, int], str] = {}
    for e in meta_events:
        if e.name != "thread_name":
            continue
        key = (_id(e.pid), _id(e.tid))
        name = str((_args(e) or {}).get("name", "")).strip()
        old = names.get(key)
        if old is None or _thread_name_score(name, process_names) >= _thread_name_score(old, process_names):
            names[key] = name
    counts = events.group_by(["pid", "tid", "is_gpu"]).aggregate([("event_id", "count")]).to_pydict()
    seen = {(p, t): (g, c) for p, t, g, c in zip(counts["pid"], counts["tid"], counts["is_gpu"], counts["event_id_count"])}
    keys = sorted(set(seen) | set(names), key=lambda k: (k[0] is None, k[0] or 0, k[1] is None, k[1] or 0))
    gpu_pids = {p for (p, _), (g, _) in seen.items() if g}
    return pa.table({
        "pid": pa.array([k[0] for k in keys], pa.int64()),
        "tid": pa.array([k[1] for k in keys], pa.int64()),
        "is_gpu": pa.array([seen[k][0] if k in seen else (k[0] in gpu_pids or names.get(k, "").startswith("stream")) for k in keys]),
        "name": pa.array([names.get(k, "") for k in keys], pa.string()),
        "n_events": pa.array([seen[k][1] if k in seen else 0 for k in keys], pa.int64()),
    }, schema=S.THREADS.arrow_schema)


def _args(e: Event) -> dict | None:
    if not e.args:
        return None
    try:
        value = msgspec.json.decode(e.args)
    except msgspec.DecodeError:
        return None
    return value if isinstance(value, dict) else None


def _flows_table(flows: dict[str, list], base_ns: int, skipped: Counter) -> pa.Table:
    ts = pa.chunked_array(flows["ts"], pa.int64()).combine_chunks() if flows["ts"] else pa.array([], pa.int64())
    t = pa.table({
        "flow_id": pa.array(flows["flow_id"], pa.int64()), "cat": pa.array(flows["cat"], pa.string()),
        "ph": pa.array(flows["ph"], pa.string()), "ts_ns": add_checked(ts, base_ns, "baseTimeNanoseconds + ts of a flow"),
        "pid": pa.array(flows["pid"], pa.int64()), "tid": pa.array(flows["tid"], pa.int64()),
    }, schema=S.FLOWS.arrow_schema)
    missing = t.num_rows - pc.count(t["ts_ns"]).as_py()
    if missing:
        skipped["flow_missing_timestamp"] += missing
        t = t.filter(pc.is_valid(t["ts_ns"]))
    return t


def _process_groups_table(info: Any) -> pa.Table:
    rows = []
    configs = info.get("pg_config") if isinstance(info, dict) else None
    if isinstance(configs, dict):  # some writers key the configs by name
        configs = [dict(v, pg_name=k) if isinstance(v, dict) else {} for k, v in configs.items()]
    for pg in configs or []:
        if not isinstance(pg, dict):
            continue
        ranks = pg.get("ranks")
        if isinstance(ranks, str):
            ranks = parse_rank_list(ranks)
        rows.append({
            "pg_name": str(pg.get("pg_name", pg.get("uid", ""))),
            "pg_desc": pg.get("pg_desc"),
            "backend_config": pg.get("backend_config"),
            "pg_size": _int_or_none(pg.get("pg_size")),
            "pg_ranks": [int(r) for r in ranks] if isinstance(ranks, list) else None,
        })
    return pa.Table.from_pylist(rows, schema=S.PROCESS_GROUPS.arrow_schema)


def parse_rank_list(text: Any) -> list[int] | None:
    """'[0, 1, 2]' (as record_param_comms writes it) -> [0, 1, 2]; None when not a list."""
    if isinstance(text, list):
        return [int(r) for r in text]
    if not isinstance(text, str) or not text.strip().startswith("["):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return [int(r) for r in value] if isinstance(value, list) else None


def _rank_row(trace: RawTrace, rank_source: str, base_ns: int, meta_events: list[Event], events: pa.Table,
              start: int, end: int, skipped: Counter) -> pa.Table:
    meta = trace.meta
    info = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    is_gpu = events["is_gpu"]
    pids = [_id(e.pid) for e in meta_events if e.name == "process_name" and _id(e.pid) is not None and _id(e.pid) >= 0]
    if not pids:
        cpu_pids = pc.drop_null(pc.filter(events["pid"], pc.invert(is_gpu)))
        if len(cpu_pids):
            pids = [pc.mode(cpu_pids)[0]["mode"].as_py()]
    props = meta.get("deviceProperties") or []
    device = "cpu"
    gpu_devices = pc.drop_null(pc.filter(events["device"], is_gpu))
    if pc.any(is_gpu).as_py():
        dev_id = pc.mode(gpu_devices)[0]["mode"].as_py() if len(gpu_devices) else 0
        names = {p.get("id"): p.get("name") for p in props if isinstance(p, dict)}
        device = str(names.get(dev_id) or (next(iter(names.values())) if names else "gpu"))
    other = {k: v for k, v in meta.items() if k not in ("distributedInfo",)}
    row = {
        "trace_file": str(trace.path.resolve()),
        "host": str(meta.get("host_name") or meta.get("hostname") or ""),
        "pid": pids[0] if pids else None,
        "world_size": _int_or_none(info.get("world_size")),
        "backend": info.get("backend"),
        "device": device,
        "rank_source": rank_source,
        "base_time_ns": base_ns,
        "start_ts_ns": start, "end_ts_ns": end, "clock_offset_ns": 0,
        "n_events": events.num_rows,
        "n_skipped": sum(v for k, v in skipped.items() if not k.startswith("replaced") and not k.startswith("missing_duration")),
        "skipped_json": json.dumps(dict(skipped), sort_keys=True),
        "distributed_info_json": json.dumps(info, sort_keys=True),
        "trace_meta_json": json.dumps(other, sort_keys=True, default=str),
    }
    return pa.Table.from_pylist([row], schema=S.RANKS.arrow_schema)
