"""An Nsight Systems export -> one :class:`~traceanalyzer.ingest.kineto.build.RankTables` per process.

Mapping onto the canonical tables (see :mod:`traceanalyzer.schema`), spelled as Kineto spells
it so that the same classification, communication and analysis code applies:

* ``CUPTI_ACTIVITY_KIND_KERNEL`` -> events ``cat='kernel'`` (demangled name, as Kineto writes it;
  NCCL kernels become ``comm_kernel``), pid = device, tid = stream;
* ``..._MEMCPY`` / ``..._MEMSET`` -> ``gpu_memcpy`` ``Memcpy DtoD (Device -> Device)`` /
  ``gpu_memset`` ``Memset (Device)``, with ``bytes`` in args;
* ``..._RUNTIME`` -> ``cuda_runtime`` (``cu*`` driver calls ``cuda_driver``), the ``_v7000``
  version suffix dropped (``cudaLaunchKernel``); ``correlationId`` -> ``correlation`` and an
  ``ac2g`` flow from the launch to its kernel/memcpy/memset;
* ``NVTX_EVENTS`` ranges of the default domain -> PyTorch's ``emit_nvtx`` operator ranges
  (``aten::mm, seq = 4, op_id = 7`` -> ``cpu_op`` ``aten::mm`` with ``op_id``/``seq`` in args;
  its ``nccl:<op>`` / ``c10d::<op>`` ranges make the communication's CPU side), other default-
  domain ranges -> ``user_annotation``; ranges of other domains (NCCL's ``ncclGroupEnd`` ...)
  -> ``cat='nvtx'`` (kind other) with their domain id; marks -> instants.
  GPU work gets ``external_id`` = the ``op_id`` of the innermost operator range that held its
  launch call on the launching thread (Kineto's External id);
* streams and CPU threads (``ThreadNames``) -> ``threads``; process groups are not recorded.

Ranks (one per process that ran GPU work): ``--rank R`` numbers the file's processes R, R+1, ...
in order; else a file with one such process takes the rank its file name gives (``rank3``);
else they are numbered 0, 1, ... by their lowest CUDA device id, then pid (the order ``torchrun``
gives local ranks on one node). ``rank_map`` ({pid: rank}; by default the ``X.ranks.json`` beside
export ``X.sqlite``) overrides all of these.
Steps: NVTX ranges named ``ProfilerStep#N`` (else ``step N`` / ``iteration N``, see STEP_NAME_RE);
without such ranges in the file, its whole window is one step (WINDOW_STEP).
"""
from __future__ import annotations

import json
import re
from collections import Counter

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ... import schema as S
from ...errors import TraceInputError
from ..kineto.build import _FILE_RANK_RE, RankTables, _assign_steps, _nested
from ..kineto.classify import classify
from .reader import (
    MEM_KIND,
    MEMCPY_KIND,
    NVTX_MARK,
    NVTX_PUSH_POP,
    NVTX_START_END,
    NsysExport,
)

#: NVTX range names that delimit training steps: PyTorch's profiler step, else a user range such
#: as ``step 12``, ``train_step#12`` or ``iteration 12`` (the number is the step).
STEP_NAME_RE = re.compile(r"^(?:ProfilerStep#|(?:train[_ ]?)?step[ _#:]*|iteration[ _#:]*|iter[ _#:]*)(\d+)$",
                          re.IGNORECASE)
#: PyTorch's emit_nvtx suffixes: ``name, seq = N, op_id = M, sizes = [...]`` (sizes with record_shapes).
_TORCH_SUFFIX_RE = re.compile(r",\s*(seq|op_id|sizes|input_op_ids)\s*=\s*(.*?)(?=,\s*(?:seq|op_id|sizes|input_op_ids)\s*=|$)")
_VERSION_SUFFIX_RE = re.compile(r"_v\d+$")
_PID_MASK, _TID_MASK = 0xFFFFFF, 0xFFFFFF

_JSON = msgspec.json.Encoder()


def _json(value) -> str:
    return _JSON.encode(value).decode()


_EVENT_COLS = ("ph", "cat", "name", "ts", "dur", "pid", "tid", "is_gpu", "device", "stream", "corr", "ext", "args")


def process_of(global_id) -> int:
    """nsys globalPid/globalTid -> the process key (hardware, VM and pid bits; the tid dropped)."""
    return int(global_id) >> 24


def gpu_processes(ex: NsysExport) -> list[int]:
    """globalPids of the processes that ran GPU work, in the default rank order."""
    lowest: dict[int, int] = {}
    for t in (ex.kernels, ex.memcpy, ex.memset):
        if t.num_rows == 0:
            continue
        g = t.group_by("globalPid").aggregate([("deviceId", "min")]).to_pydict()
        for gp, dev in zip(g["globalPid"], g["deviceId_min"]):
            if gp is not None:
                lowest[gp] = min(dev, lowest.get(gp, dev))
    return sorted(lowest, key=lambda gp: (lowest[gp], _pid(ex, gp)))


def _pid(ex: NsysExport, gpid: int) -> int:
    return ex.processes.get(gpid, (process_of(gpid) & _PID_MASK, ""))[0]


def assign_ranks(ex: NsysExport, rank_arg: int | None, rank_map: dict[int, int] | None = None) -> list[tuple[int, int, str]]:
    """[(globalPid, rank, rank_source)] for the export's GPU processes (rule in the module doc)."""
    procs = gpu_processes(ex)
    if not procs:
        raise TraceInputError(ex.path, "the export has no GPU activity (no kernels, memcpy or memset rows)")
    if rank_map:
        missing = [_pid(ex, g) for g in procs if _pid(ex, g) not in rank_map]
        if missing:
            raise TraceInputError(ex.path, f"the rank mapping names no rank for pid(s) {missing}")
        ranks = [int(rank_map[_pid(ex, g)]) for g in procs]
        if len(set(ranks)) < len(ranks):
            raise TraceInputError(ex.path, f"the rank mapping gives two processes one rank ({ranks})")
        return [(g, r, "rank_map") for g, r in zip(procs, ranks)]
    if rank_arg is not None:
        return [(g, int(rank_arg) + i, "argument") for i, g in enumerate(procs)]
    m = _FILE_RANK_RE.search(ex.path.name)
    if m and len(procs) == 1:
        return [(procs[0], int(m.group(1)), "file_name")]
    return [(g, i, "nsys_process_order") for i, g in enumerate(procs)]


def build_all(ex: NsysExport, rank_arg: int | None = None, rank_map: dict[int, int] | None = None,
              window_step: bool = True) -> list[RankTables]:
    """One RankTables per GPU process of the export (comms not built here). Without step ranges
    in any process and with ``window_step``, the file's window is one step (see WINDOW_STEP)."""
    built = [build_rank(ex, gpid, rank, source) for gpid, rank, source in assign_ranks(ex, rank_arg, rank_map)]
    if window_step and built and all(b.tables["steps"].num_rows == 0 for b in built):
        _window_as_step(built)
    return built


#: The step number given to the whole window of an export that has no step ranges: nsys is often
#: started for a fixed span of a job (``--delay``/``--duration``) rather than for whole steps, and
#: the per-step analyses and ``diff`` then compare the ranks (and two exports) over that span.
#: Its range is the file's span, the same on every rank of the file; ranks.trace_meta_json says
#: ``"step_source": "window"`` (else ``"nvtx"``).
WINDOW_STEP = 0


def _window_event(ev: pa.Table, lo: int, hi: int) -> pa.Table:
    """The window step as an event (kind 'step', like ProfilerStep#N) on the process's main thread
    (the one that made the most launch calls): the replay finds a rank's steps on that thread."""
    cpu = ev.filter(pc.and_(pc.invert(ev["is_gpu"]), pc.is_in(ev["kind"], pa.array(["runtime", "sync"]))))
    if cpu.num_rows == 0:
        cpu = ev.filter(pc.invert(ev["is_gpu"]))
    tid = pc.mode(cpu["tid"])[0]["mode"].as_py() if cpu.num_rows else 0
    pid = pc.mode(cpu["pid"])[0]["mode"].as_py() if cpu.num_rows else 0
    row = {"event_id": ev.num_rows, "ph": "X", "cat": "nsys", "kind": "step", "name": WINDOW_STEP_NAME,
           "ts_ns": lo, "dur_ns": hi - lo, "pid": pid, "tid": tid, "is_gpu": False, "device": None, "stream": None,
           "correlation": None, "external_id": None, "step": WINDOW_STEP, "nested": False,
           "args_json": _json({"synthetic": True, "step": WINDOW_STEP})}
    return pa.Table.from_pylist([row], schema=S.EVENTS.arrow_schema)


#: Name of the synthetic step event of WINDOW_STEP.
WINDOW_STEP_NAME = "nsys window (no step ranges)"


def _window_as_step(built: list[RankTables]) -> None:
    lo, hi = min(b.start_ts_ns for b in built), max(b.end_ts_ns for b in built)
    for b in built:
        t = b.tables
        t["steps"] = pa.table({"step": pa.array([WINDOW_STEP], pa.int32()), "start_ts_ns": [lo], "end_ts_ns": [hi],
                               "dur_ns": [hi - lo]}, schema=S.STEPS.arrow_schema)
        ev = t["events"]
        ev = ev.set_column(ev.schema.get_field_index("step"), "step", pa.array(np.full(ev.num_rows, WINDOW_STEP, np.int32)))
        t["events"] = pa.concat_tables([ev, _window_event(ev, lo, hi)])
        meta = json.loads(t["ranks"]["trace_meta_json"][0].as_py())
        meta["step_source"] = "window"
        t["ranks"] = t["ranks"].set_column(t["ranks"].schema.get_field_index("trace_meta_json"), "trace_meta_json",
                                           pa.array([json.dumps(meta, sort_keys=True)], pa.string()))


def _of_process(t: pa.Table, gpid: int, key: str) -> pa.Table:
    if t.num_rows == 0:
        return t
    if key == "globalPid":
        return t.filter(pc.equal(t[key], gpid))
    return t.filter(pc.equal(pc.shift_right(t[key], 24), gpid >> 24))


def _i64(t: pa.Table, name: str) -> np.ndarray:
    if name not in t.column_names:
        return np.full(t.num_rows, -1, dtype=np.int64)
    return pc.fill_null(t[name].cast(pa.int64()), -1).to_numpy()


def build_rank(ex: NsysExport, gpid: int, rank: int, rank_source: str) -> RankTables:
    skipped: Counter = Counter()
    pid = _pid(ex, gpid)
    parts = [_gpu_part(ex, _of_process(ex.kernels, gpid, "globalPid"), "kernel"),
             _gpu_part(ex, _of_process(ex.memcpy, gpid, "globalPid"), "gpu_memcpy"),
             _gpu_part(ex, _of_process(ex.memset, gpid, "globalPid"), "gpu_memset"),
             _runtime_part(ex, _of_process(ex.runtime, gpid, "globalTid"), pid),
             _nvtx_part(ex, _of_process(ex.nvtx, gpid, "globalTid"), pid, skipped)]
    cols = {k: [v for p in parts for v in p[k]] if k in ("ph", "cat", "name", "args") else
            np.concatenate([p[k] for p in parts]) for k in _EVENT_COLS}
    events, flows = _events_and_flows(ex, cols, skipped)
    if events.num_rows == 0:
        raise TraceInputError(ex.path, f"process {pid} has no events")
    steps = _steps(events)
    events = events.set_column(events.schema.get_field_index("step"), "step", _assign_steps(events, steps))
    events = events.set_column(events.schema.get_field_index("nested"), "nested", _nested(events))
    start = int(pc.min(events["ts_ns"]).as_py())
    end = int(pc.max(pc.add(events["ts_ns"], events["dur_ns"])).as_py())
    threads = _threads(ex, events, pid, gpid)
    pgs = S.PROCESS_GROUPS.arrow_schema.empty_table()
    ranks = _rank_row(ex, events, rank_source, pid, gpid, start, end, skipped)
    tables = {"events": events, "steps": steps, "threads": threads, "flows": flows,
              "process_groups": pgs, "ranks": ranks}
    return RankTables(rank, rank_source, tables, start, end, skipped)


def _gpu_part(ex: NsysExport, t: pa.Table, cat: str) -> dict:
    n = t.num_rows
    dev, stream = _i64(t, "deviceId"), _i64(t, "streamId")
    if cat == "kernel":
        short, long_ = _i64(t, "shortName"), _i64(t, "demangledName")
        names = [ex.strings.get(lg) or ex.strings.get(s, "") for s, lg in zip(short, long_)]
        dims = {k: _i64(t, k) for k in ("gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ",
                                        "registersPerThread", "staticSharedMemory", "dynamicSharedMemory")}
        args = [_json({"device": int(dev[i]), "stream": int(stream[i]),
                            "grid": [int(dims["gridX"][i]), int(dims["gridY"][i]), int(dims["gridZ"][i])],
                            "block": [int(dims["blockX"][i]), int(dims["blockY"][i]), int(dims["blockZ"][i])],
                            "registers per thread": int(dims["registersPerThread"][i]),
                            "shared memory": int(dims["staticSharedMemory"][i] + dims["dynamicSharedMemory"][i])})
                for i in range(n)]
    else:
        nbytes = _i64(t, "bytes")
        if cat == "gpu_memcpy":
            kind, src, dst = _i64(t, "copyKind"), _i64(t, "srcKind"), _i64(t, "dstKind")
            names = [f"Memcpy {MEMCPY_KIND.get(k, 'Unknown')} ({MEM_KIND.get(s, 'Unknown')} -> {MEM_KIND.get(d, 'Unknown')})"
                     for k, s, d in zip(kind, src, dst)]
        else:
            names = [f"Memset ({MEM_KIND.get(k, 'Unknown')})" for k in _i64(t, "memKind")]
        args = [_json({"device": int(d), "stream": int(s), "bytes": int(b) if b >= 0 else None})
                for d, s, b in zip(dev, stream, nbytes)]
    start, end = _i64(t, "start"), _i64(t, "end")
    return {"ph": ["X"] * n, "cat": [cat] * n, "name": names, "ts": start, "dur": end - start, "pid": dev,
            "tid": stream, "is_gpu": np.ones(n, bool), "device": dev, "stream": stream,
            "corr": _i64(t, "correlationId"), "ext": np.full(n, -1, np.int64), "args": args}


def _runtime_part(ex: NsysExport, t: pa.Table, pid: int) -> dict:
    n = t.num_rows
    names = [_VERSION_SUFFIX_RE.sub("", ex.strings.get(i, "")) for i in _i64(t, "nameId")]
    cats = ["cuda_driver" if (nm.startswith("cu") and not nm.startswith("cuda")) else "cuda_runtime" for nm in names]
    corr = _i64(t, "correlationId")
    start, end = _i64(t, "start"), _i64(t, "end")
    return {"ph": ["X"] * n, "cat": cats, "name": names, "ts": start, "dur": end - start,
            "pid": np.full(n, pid, np.int64), "tid": _i64(t, "globalTid") & _TID_MASK, "is_gpu": np.zeros(n, bool),
            "device": np.full(n, -1, np.int64), "stream": np.full(n, -1, np.int64), "corr": corr,
            "ext": np.full(n, -1, np.int64), "args": [_json({"correlation": int(c)}) for c in corr]}


_TORCH_KEYS = (", seq = ", ", op_id = ", ", sizes = ", ", input_op_ids = ")


def _split_torch_text(text: str) -> tuple[str, dict]:
    """'aten::mm, seq = 4, op_id = 7' -> ('aten::mm', {'seq': 4, 'op_id': 7})."""
    cut = min((i for i in map(text.find, _TORCH_KEYS) if i >= 0), default=-1)
    if cut < 0:
        return text, {}
    rest = text[cut:]
    if rest.startswith(", op_id = ") and rest[10:].isdigit():  # the common case, without a regex
        return text[:cut], {"op_id": int(rest[10:])}
    args = {}
    for k, v in _TORCH_SUFFIX_RE.findall(rest):
        v = v.strip()
        args[k] = int(v) if v.lstrip("-").isdigit() else v
    if isinstance(args.get("sizes"), str):  # record_shapes: the shapes, as Kineto's Input Dims
        try:
            args["Input Dims"] = json.loads(args["sizes"])
        except ValueError:
            pass
    return text[:cut], args


def _nvtx_part(ex: NsysExport, t: pa.Table, pid: int, skipped: Counter) -> dict:
    etype, start, end = _i64(t, "eventType"), _i64(t, "start"), _i64(t, "end")
    text_id, domain = _i64(t, "textId"), _i64(t, "domainId")
    texts = t["text"].cast(pa.string()).to_pylist() if "text" in t.column_names else [None] * t.num_rows
    is_range = (etype == NVTX_PUSH_POP) | (etype == NVTX_START_END)
    keep = np.flatnonzero((etype == NVTX_MARK) | (is_range & (end >= 0)))  # not domain/category records
    if (is_range & (end < 0)).any():  # ranges never closed in the capture
        skipped["nvtx_range_without_end"] += int((is_range & (end < 0)).sum())
    ph, cat, names, args, ext = [], [], [], [], np.full(len(keep), -1, np.int64)
    for j, i in enumerate(keep):
        text = texts[i] if texts[i] is not None else ex.strings.get(int(text_id[i]), "")
        a: dict = {}
        if domain[i] > 0:
            name, c, a = text, "nvtx", {"domain": int(domain[i])}
        else:
            name, a = _split_torch_text(text)
            c = "cpu_op" if ("op_id" in a or STEP_NAME_RE.match(name)) else "user_annotation"
            if "op_id" in a and isinstance(a["op_id"], int):
                ext[j] = a["op_id"]
        ph.append("i" if etype[i] == NVTX_MARK else "X")
        cat.append(c)
        names.append(name)
        args.append(_json(a))
    st = start[keep]
    dur = np.where(etype[keep] == NVTX_MARK, 0, end[keep] - st)
    n = len(keep)
    return {"ph": ph, "cat": cat, "name": names, "ts": st, "dur": dur, "pid": np.full(n, pid, np.int64),
            "tid": _i64(t, "globalTid")[keep] & _TID_MASK, "is_gpu": np.zeros(n, bool),
            "device": np.full(n, -1, np.int64), "stream": np.full(n, -1, np.int64),
            "corr": np.full(n, -1, np.int64), "ext": ext, "args": args}


def _events_and_flows(ex: NsysExport, c: dict, skipped: Counter) -> tuple[pa.Table, pa.Table]:
    dur = c["dur"]
    bad = (c["ts"] < 0) | (dur < 0) | (dur > S.MAX_EVENT_DUR_NS)
    for reason, mask in (("missing_timestamp", c["ts"] < 0), ("negative_duration", (c["ts"] >= 0) & (dur < 0)),
                         ("absurd_duration", dur > S.MAX_EVENT_DUR_NS)):
        if mask.any():
            skipped[reason] += int(mask.sum())
    order = np.lexsort((np.arange(len(dur)), -dur, c["ts"]))
    order = order[~bad[order]]
    ts = c["ts"][order] + ex.time_offset_ns
    is_gpu = c["is_gpu"][order]
    corr = c["corr"][order]
    ext = _external_ids(ts, c["dur"][order], c["tid"][order], corr, c["ext"][order], is_gpu, np.asarray(c["cat"], object)[order])
    cat = pa.array(np.asarray(c["cat"], object)[order], pa.string())
    name = pa.array(np.asarray(c["name"], object)[order], pa.string())
    ph = pa.array(np.asarray(c["ph"], object)[order], pa.string())
    kind, _ = classify(cat, name, ph)

    def opt(a):  # -1 marks unknown
        return pa.array(a, pa.int64(), mask=a < 0)

    n = len(order)
    events = pa.table({
        "event_id": pa.array(np.arange(n, dtype=np.int64)), "ph": ph, "cat": cat, "kind": kind, "name": name,
        "ts_ns": pa.array(ts), "dur_ns": pa.array(c["dur"][order]), "pid": pa.array(c["pid"][order]),
        "tid": pa.array(c["tid"][order]), "is_gpu": pa.array(is_gpu), "device": opt(c["device"][order]).cast(pa.int32()),
        "stream": opt(c["stream"][order]), "correlation": opt(corr), "external_id": opt(ext),
        "step": pa.nulls(n, pa.int32()), "nested": pa.nulls(n, pa.bool_()),
        "args_json": pa.array(np.asarray(c["args"], object)[order], pa.string()),
    }, schema=S.EVENTS.arrow_schema)
    return events, _flows(events)


def _external_ids(ts, dur, tid, corr, ext, is_gpu, cat) -> np.ndarray:
    """Kineto's External id from PyTorch's op_id: a launch call takes the op_id of the innermost
    operator range open on its thread at its start; GPU work takes its launch call's."""
    ext = ext.copy()
    cpu_ops = np.flatnonzero((ext >= 0) & ~is_gpu)
    launches = np.flatnonzero((cat == "cuda_runtime") | (cat == "cuda_driver"))
    by_tid: dict[int, list] = {}
    for i in np.concatenate([cpu_ops, launches]):
        by_tid.setdefault(int(tid[i]), []).append(int(i))
    for rows in by_tid.values():
        rows.sort(key=lambda i: (ts[i], -dur[i], ext[i] < 0))  # ranges before calls at the same time
        stack: list[int] = []
        for i in rows:
            while stack and ts[stack[-1]] + dur[stack[-1]] <= ts[i]:
                stack.pop()
            if ext[i] >= 0 and not ((cat[i] == "cuda_runtime") or (cat[i] == "cuda_driver")):
                stack.append(i)
            elif stack:
                ext[i] = ext[stack[-1]]
    have = launches[(ext[launches] >= 0) & (corr[launches] >= 0)]
    by_corr = dict(zip(corr[have].tolist(), ext[have].tolist()))
    gpu = np.flatnonzero(is_gpu & (corr >= 0))
    ext[gpu] = [by_corr.get(int(k), -1) for k in corr[gpu]]
    return ext


def _flows(events: pa.Table) -> pa.Table:
    """ac2g flows: launch call ('s') -> the GPU work of the same correlation id ('f')."""
    corr = pc.fill_null(events["correlation"], -1).to_numpy()
    is_gpu = events["is_gpu"].to_numpy(zero_copy_only=False)
    gpu_corr = set(corr[is_gpu & (corr >= 0)].tolist())
    src = np.flatnonzero(~is_gpu & (corr >= 0) & np.isin(corr, list(gpu_corr)))
    dst = np.flatnonzero(is_gpu & (corr >= 0) & np.isin(corr, corr[src]))
    idx = np.concatenate([src, dst])
    ts, pid, tid = (events[k].to_numpy()[idx] for k in ("ts_ns", "pid", "tid"))
    return pa.table({"flow_id": pa.array(corr[idx]), "cat": pa.array(["ac2g"] * len(idx), pa.string()),
                     "ph": pa.array(["s"] * len(src) + ["f"] * len(dst), pa.string()), "ts_ns": pa.array(ts),
                     "pid": pa.array(pid), "tid": pa.array(tid)}, schema=S.FLOWS.arrow_schema)


def _steps(events: pa.Table) -> pa.Table:
    """Step ranges from the NVTX ranges STEP_NAME_RE matches (kind 'step' for ProfilerStep#N)."""
    cpu = events.filter(pc.and_(pc.invert(events["is_gpu"]), pc.equal(events["ph"], "X")))
    cpu = cpu.filter(pc.is_in(cpu["cat"], pa.array(["cpu_op", "user_annotation"])))
    ranges: dict[int, list[int]] = {}
    for name, ts, dur in zip(*(cpu[k].to_pylist() for k in ("name", "ts_ns", "dur_ns"))):
        m = STEP_NAME_RE.match(name)
        if m:
            lo, hi = ranges.get(int(m.group(1)), (ts, ts + dur))
            ranges[int(m.group(1))] = [min(lo, ts), max(hi, ts + dur)]
    steps = sorted(ranges)
    return pa.table({"step": pa.array(steps, pa.int32()),
                     "start_ts_ns": pa.array([ranges[s][0] for s in steps], pa.int64()),
                     "end_ts_ns": pa.array([ranges[s][1] for s in steps], pa.int64()),
                     "dur_ns": pa.array([ranges[s][1] - ranges[s][0] for s in steps], pa.int64())},
                    schema=S.STEPS.arrow_schema)


def _threads(ex: NsysExport, events: pa.Table, pid: int, gpid: int) -> pa.Table:
    g = events.group_by(["pid", "tid", "is_gpu"]).aggregate([("event_id", "count")]).to_pydict()
    rows = []
    for p, t, gpu, n in sorted(zip(g["pid"], g["tid"], g["is_gpu"], g["event_id_count"]), key=lambda r: (r[2], r[0], r[1])):
        name = f"stream {t}" if gpu else ex.thread_names.get(((gpid >> 24) << 24) | t, "")
        rows.append({"pid": p, "tid": t, "is_gpu": gpu, "name": name, "n_events": n})
    return pa.Table.from_pylist(rows, schema=S.THREADS.arrow_schema)


def _rank_row(ex: NsysExport, events: pa.Table, rank_source: str, pid: int, gpid: int, start: int, end: int,
              skipped: Counter) -> pa.Table:
    kinds = set(pc.unique(events["kind"]).to_pylist())
    devices = sorted(d for d in pc.unique(events["device"]).to_pylist() if d is not None)
    meta = {"source": "nsys", "time_base": ex.time_base, "process_name": ex.processes.get(gpid, (pid, ""))[1],
            "global_pid": gpid, "cuda_devices": devices, "step_source": "nvtx", **ex.meta}
    row = {"trace_file": str(ex.path.resolve()), "host": ex.meta.get("Hostname", ""), "pid": pid,
           "world_size": None, "backend": "nccl" if "comm_kernel" in kinds else None,
           "device": "gpu", "rank_source": rank_source, "base_time_ns": ex.time_offset_ns,
           "start_ts_ns": start, "end_ts_ns": end, "clock_offset_ns": 0, "n_events": events.num_rows,
           "n_skipped": sum(skipped.values()),
           "skipped_json": json.dumps(dict(skipped), sort_keys=True), "distributed_info_json": "{}",
           "trace_meta_json": json.dumps(meta, sort_keys=True, default=str)}
    return pa.Table.from_pylist([row], schema=S.RANKS.arrow_schema)
