"""The op-timeline table build as it was before session 17 (per-rank slices of one pandas/numpy
build, a lexsort of every event): the reference the vectorised build
(``traceanalyzer/ingest/op_timeline/tables.py``) must equal, row for row, on every input
(tests/test_op_timeline_ingest.py). Kept as it was (only the imports changed); not used by the
package. ``arrays`` is the old ``op_timeline._arrays``, ``build`` the old ``tables.build``."""
from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from traceanalyzer import schema as S
from traceanalyzer.errors import TraceInputError
from traceanalyzer.ingest.op_timeline import UNITS, _hosts, read
from traceanalyzer.ingest.op_timeline.tables import _DIMS, SEQ_STRIDE, SOURCE, TID, Grid


def arrays(path, t: pa.Table, cols: dict, to_ns: float, ops_u: list[str]) -> dict:
    """A block's columns as numpy arrays sorted by (rank, start): rank, step, ts, dur, mb, seq,
    vpp, code (index into ``ops_u``); checked (gaps, types, negative durations)."""
    n = t.num_rows

    def ints(c, default=0):
        name = cols[c]
        if name is None:
            return np.full(n, default, np.int64)
        return read._ints(path, t, name)

    def times(c):
        col = t.column(cols[c])
        if col.null_count or not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
            raise TraceInputError(path, f"op timeline column {cols[c]!r} must be numbers without gaps ({col.type})")
        if to_ns == 1 and pa.types.is_integer(col.type):
            return col.to_numpy().astype(np.int64)
        return np.round(col.to_numpy().astype(np.float64) * to_ns).astype(np.int64)

    rank, step = ints("rank"), ints("step")
    mb, vpp = ints("microbatch", -1), ints("vpp")
    ts, dur = times("start"), times("duration")
    if cols["clock_offset"]:
        m = re.search(r"_(ns|us|ms|s)$", cols["clock_offset"])
        off = t.column(cols["clock_offset"])
        if off.null_count or not (pa.types.is_integer(off.type) or pa.types.is_floating(off.type)):
            raise TraceInputError(path, f"op timeline column {cols['clock_offset']!r} must be numbers without gaps "
                                        f"({off.type})")
        scale = UNITS[m.group(1)] if m else to_ns
        ts = ts + (off.to_numpy().astype(np.int64) if scale == 1 and pa.types.is_integer(off.type)
                   else np.round(off.to_numpy().astype(np.float64) * scale).astype(np.int64))
    if (dur < 0).any():
        raise TraceInputError(path, f"op timeline has {int((dur < 0).sum())} negative duration(s)")
    code = pc.index_in(t.column(cols["op"]).cast(pa.string()), value_set=pa.array(ops_u, pa.string()))
    code = code.to_numpy(zero_copy_only=False).astype(np.int64)
    seq = ints("seq", -1) if cols["seq"] else order_seq(rank, step, code, ts)
    order = np.lexsort((ts, rank))
    a = {"rank": rank, "step": step, "ts": ts, "dur": dur, "mb": mb, "seq": seq, "vpp": vpp, "code": code}
    a = {k: v[order] for k, v in a.items()}
    a["hosts"] = _hosts(path, t, cols["host"], rank)
    return a



def order_seq(rank, step, code, ts) -> np.ndarray:
    """Sequence id per (rank, step, op) in start order (when the file has none)."""
    order = np.lexsort((ts, code, step, rank))
    seq = np.empty(len(rank), np.int64)
    seq[order] = pd.DataFrame({"r": rank[order], "s": step[order], "c": code[order]}).groupby(
        ["r", "s", "c"], sort=False).cumcount().to_numpy()
    return seq



def _nulls(n: int, name: str, table: S.Table) -> pa.Array:
    return pa.nulls(n, table.arrow_schema.field(name).type)


def build(path, grid: Grid, ops_u: list[str], classes: list[str], coll_ops: list[str | None], a: dict,
          world: int, meta: dict, unknown_code: np.ndarray) -> list[tuple[int, dict, int, int, dict]]:
    """Per rank (ascending): (rank, tables, start_ts_ns, end_ts_ns, skipped). ``a`` holds the
    file's columns as numpy arrays sorted by (rank, start): rank, step, ts, dur, mb, seq, vpp,
    code (index into ``ops_u``)."""
    rank, step, ts, dur, code = a["rank"], a["step"], a["ts"], a["dur"], a["code"]
    n = len(rank)
    is_comp = np.array([c == "compute" for c in classes], bool)[code]
    # steps per (rank, step): the ProfilerStep#N spans
    st = (pd.DataFrame({"rank": rank, "step": step, "lo": ts, "hi": ts + dur})
          .groupby(["rank", "step"], sort=True).agg(lo=("lo", "min"), hi=("hi", "max")).reset_index())
    m = len(st)
    # events: step spans first at equal start, then ops in start order, per rank
    e_rank = np.concatenate([st["rank"].to_numpy(), rank])
    e_ts = np.concatenate([st["lo"].to_numpy(), ts])
    e_flag = np.concatenate([np.zeros(m, np.int8), np.ones(n, np.int8)])
    order = np.lexsort((e_flag, e_ts, e_rank))
    e_rank, e_ts = e_rank[order], e_ts[order]
    starts = np.searchsorted(e_rank, e_rank, "left")
    eid = np.arange(n + m) - starts
    pos = np.empty(n + m, np.int64)
    pos[order] = np.arange(n + m)
    op_eid = eid[pos[m:]]
    # text columns as dictionary codes, turned into strings by Arrow (no Python object per row)
    step_u, step_code = np.unique(st["step"].to_numpy(), return_inverse=True)
    names = _strings(np.concatenate([step_code.reshape(-1), len(step_u) + code])[order],
                     [f"ProfilerStep#{x}" for x in step_u.tolist()] + list(ops_u))
    kinds = _strings(np.concatenate([np.zeros(m, np.int64), np.where(is_comp, 1, 2)])[order], ["step", "cpu_op", "comm_op"])
    cats = _strings(np.concatenate([np.zeros(m, np.int64), np.ones(n, np.int64)])[order], ["user_annotation", "cpu_op"])
    durs = np.concatenate([(st["hi"] - st["lo"]).to_numpy(), dur])[order]
    steps_e = np.concatenate([st["step"].to_numpy(), step])[order]
    N = n + m
    args = pa.concat_arrays([pa.array(["{}"] * m, pa.string()), _args_json(a["mb"], a["seq"], a["vpp"])]).take(
        pa.array(order))
    events = pa.table({
        "event_id": pa.array(eid, pa.int64()), "ph": _strings(np.zeros(N, np.int64), ["X"]),
        "cat": cats, "kind": kinds, "name": names,
        "ts_ns": pa.array(e_ts, pa.int64()), "dur_ns": pa.array(durs, pa.int64()), "pid": pa.array(e_rank, pa.int64()),
        "tid": pa.array(np.full(N, TID), pa.int64()), "is_gpu": pa.array(np.zeros(N, bool)),
        "device": _nulls(N, "device", S.EVENTS), "stream": _nulls(N, "stream", S.EVENTS),
        "correlation": _nulls(N, "correlation", S.EVENTS), "external_id": _nulls(N, "external_id", S.EVENTS),
        "step": pa.array(steps_e, pa.int32()), "nested": pa.array(np.zeros(N, bool)),
        "args_json": args}, schema=S.EVENTS.arrow_schema)
    comms, pgs_of = _comms(grid, ops_u, classes, coll_ops, a, ~is_comp, op_eid)
    # per rank of this block (the ranks in ``a``; every rank when it holds the whole file)
    present = np.unique(rank)
    e_bounds = _bounds(e_rank, present)
    c_rank = comms.column("rank_").to_numpy() if comms.num_rows else np.zeros(0, np.int64)
    c_bounds = _bounds(c_rank, present)
    comms = comms.drop_columns(["rank_"])
    s_bounds = _bounds(st["rank"].to_numpy(), present)
    unknown_by_rank = np.bincount(rank[unknown_code[code]], minlength=world) if unknown_code.any() else np.zeros(world, int)
    out = []
    for i, r in enumerate(present.tolist()):
        ev = events.slice(e_bounds[i], e_bounds[i + 1] - e_bounds[i])
        cm = comms.slice(c_bounds[i], c_bounds[i + 1] - c_bounds[i])
        cm = cm.set_column(0, "comm_id", pa.array(np.arange(cm.num_rows), pa.int64()))
        s = st.iloc[s_bounds[i]:s_bounds[i + 1]]
        steps = pa.table({"step": pa.array(s["step"].to_numpy(), pa.int32()),
                          "start_ts_ns": pa.array(s["lo"].to_numpy(), pa.int64()),
                          "end_ts_ns": pa.array(s["hi"].to_numpy(), pa.int64()),
                          "dur_ns": pa.array((s["hi"] - s["lo"]).to_numpy(), pa.int64())}, schema=S.STEPS.arrow_schema)
        start, end = int(s["lo"].min()), int(s["hi"].max())
        skipped = {}
        if unknown_by_rank[r]:
            skipped["op_timeline.unknown_op_types_kept_as_compute"] = int(unknown_by_rank[r])
        n_nopeer = int(pc.sum(pc.and_(cm["is_p2p"], pc.is_null(cm["peer_rank"]))).as_py() or 0) if cm.num_rows else 0
        if n_nopeer:
            skipped["op_timeline.p2p_without_peer"] = n_nopeer
        pgs = pa.Table.from_pylist([{"pg_name": name, "pg_desc": desc, "backend_config": SOURCE, "pg_size": len(members),
                                     "pg_ranks": members} for name, desc, members in sorted(pgs_of.get(r, []))],
                                   schema=S.PROCESS_GROUPS.arrow_schema)
        threads = pa.Table.from_pylist([{"pid": r, "tid": TID, "is_gpu": False, "name": "op timeline",
                                         "n_events": ev.num_rows}], schema=S.THREADS.arrow_schema)
        rank_meta = dict(meta, coordinates=dict(zip(_DIMS, grid.of[r])))
        ranks = pa.Table.from_pylist([{
            "trace_file": str(path.resolve()), "host": a["hosts"].get(r, ""), "pid": r, "world_size": world, "backend": None,
            "device": None, "rank_source": SOURCE, "base_time_ns": 0, "start_ts_ns": start, "end_ts_ns": end,
            "clock_offset_ns": 0, "n_events": ev.num_rows, "n_skipped": sum(skipped.values()),
            "skipped_json": json.dumps(skipped, sort_keys=True), "distributed_info_json": "{}",
            "trace_meta_json": json.dumps(rank_meta, sort_keys=True)}], schema=S.RANKS.arrow_schema)
        tables = {"ranks": ranks, "process_groups": pgs, "threads": threads, "events": ev,
                  "flows": S.FLOWS.arrow_schema.empty_table(), "steps": steps, "comms": cm}
        out.append((r, tables, start, end, skipped))
    return out


def _strings(codes: np.ndarray, values: list[str]) -> pa.Array:
    """``values[codes]`` as an Arrow string array (built by Arrow from the dictionary)."""
    return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), pa.array(values, pa.string())).cast(pa.string())


def _bounds(sorted_ranks: np.ndarray, present: np.ndarray) -> np.ndarray:
    """Row bounds of each rank of ``present`` in ``sorted_ranks``: rank i is rows [b[i], b[i + 1])
    (``present`` holds every rank of the rows, so the end of one is the start of the next)."""
    return np.r_[np.searchsorted(sorted_ranks, present, "left"), len(sorted_ranks)]


def _args_json(mb: np.ndarray, seq: np.ndarray, vpp: np.ndarray) -> pa.Array:
    """``{"microbatch":M|null,"seq":S,"vpp":V}`` per op, built column-wise (no Python loop per row)."""
    text = lambda v: pc.cast(pa.array(v, pa.int64()), pa.string())  # noqa: E731
    mbs = pc.if_else(pa.array(mb < 0), pa.scalar("null"), text(mb))
    return pc.binary_join_element_wise('{"microbatch":', mbs, ',"seq":', text(seq), ',"vpp":', text(vpp), "}", "")


def _comms(grid: Grid, ops_u, classes, coll_ops, a: dict, is_comm: np.ndarray, op_eid: np.ndarray):
    """The comms rows (sorted by rank, start; a helper column rank_) and per rank its groups."""
    idx = np.flatnonzero(is_comm)
    k = len(idx)
    rank, code = a["rank"][idx], a["code"][idx]
    ts, dur, step = a["ts"][idx], a["dur"][idx], a["step"][idx]
    p2p = np.array([c == "p2p" for c in classes], bool)[code]
    send = np.array([ops_u[c].endswith("-send") for c in range(len(ops_u))], bool)[code] & p2p
    # group of each (rank, op) pair: name, members; one entry per distinct group in a list array
    pair = rank * len(ops_u) + code
    uniq_pairs, inv = np.unique(pair, return_inverse=True)
    names, descs, members, peers = [], [], [], []
    group_index: dict[str, int] = {}
    pgs_of: dict[int, set] = {}
    gidx = np.empty(len(uniq_pairs), np.int64)
    for j, pr in enumerate(uniq_pairs.tolist()):
        r, c = divmod(pr, len(ops_u))
        op = ops_u[c]
        if classes[c] == "p2p":
            name, mem = grid.group("pipeline", r)
            desc, peer = "pipeline", grid.peer(op, r)
        else:
            name, mem = grid.group(op, r)
            name, desc, peer = f"{name}:{op}", op, None
        if name not in group_index:
            group_index[name] = len(names)
            names.append(name)
            descs.append(desc)
            members.append(mem)
        gidx[j] = group_index[name]
        peers.append(-1 if peer is None else peer)
        pgs_of.setdefault(r, set()).add((name, desc, tuple(mem)))
    g = gidx[inv]
    peer = np.asarray(peers, np.int64)[inv] if k else np.zeros(0, np.int64)
    has_peer = p2p & (peer >= 0)
    src = np.where(send, rank, peer)
    dst = np.where(send, peer, rank)
    tag = np.where(np.array([ops_u[c].startswith("forward") for c in range(len(ops_u))], bool)[code], 0, 1)
    tag = np.where(p2p, tag, -1)  # keeps collectives out of the p2p numbering below
    p2p_seq = (pd.DataFrame({"r": rank, "s": src, "d": dst, "t": tag}).groupby(["r", "s", "d", "t"]).cumcount()
               .to_numpy())
    sizes = np.array([len(x) for x in members], np.int32)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    member_lists = pa.ListArray.from_arrays(pa.array(offsets), pa.array([x for mem in members for x in mem], pa.int32()))
    op_values = [c or "" for c in coll_ops] + ["send", "recv"]
    op_col = _strings(np.where(p2p, np.where(send, len(coll_ops), len(coll_ops) + 1), code), op_values)
    i64 = lambda v, mask=None: pa.array(v, pa.int64(), mask=mask)  # noqa: E731
    i32 = lambda v, mask=None: pa.array(v, pa.int32(), mask=mask)  # noqa: E731
    cols = {
        "comm_id": pa.array(np.zeros(k), pa.int64()), "dialect": _strings(np.zeros(k, np.int64), [SOURCE]),
        "op": op_col, "is_p2p": pa.array(p2p), "pg_name": _strings(g, names) if k else pa.array([], pa.string()),
        "pg_desc": _strings(g, descs) if k else pa.array([], pa.string()),
        "pg_ranks": member_lists.take(pa.array(g)) if k else pa.array([], pa.list_(pa.int32())),
        "group_size": i32(sizes[g] if k else []), "pg_source": _strings(np.zeros(k, np.int64), [SOURCE]),
        "pg_inferred": pa.array(np.zeros(k, bool)),
        "seq": i64(step * SEQ_STRIDE + a["seq"][idx], mask=p2p), "seq_source": pc.if_else(pa.array(p2p), pa.scalar(None, pa.string()),
                                                                   _strings(np.zeros(k, np.int64), [SOURCE])),
        "p2p_seq": i64(p2p_seq, mask=~p2p), "src_rank": i32(src, mask=~p2p | (~send & ~has_peer)),
        "dst_rank": i32(dst, mask=~p2p | (send & ~has_peer)), "peer_rank": i32(peer, mask=~has_peer),
        "tag": i64(tag, mask=~p2p),
        "enqueue_event_id": i64(op_eid[idx]), "enqueue_ts_ns": i64(ts), "enqueue_dur_ns": i64(dur),
        "enqueue_tid": i64(np.full(k, TID)), "exec_event_id": i64(op_eid[idx]),
        "exec_name": _strings(code, list(ops_u)),
        "start_ts_ns": i64(ts), "end_ts_ns": i64(ts + dur), "dur_ns": i64(dur), "exec_tid": i64(np.full(k, TID)),
        "on_gpu": pa.array(np.zeros(k, bool)), "step": i32(step)}
    fields = {f.name: f for f in S.COMMS.arrow_schema}
    arrays = [cols[name] if name in cols else pa.nulls(k, fields[name].type) for name in fields]
    table = pa.Table.from_arrays(arrays, schema=S.COMMS.arrow_schema).append_column("rank_", pa.array(rank, pa.int64()))
    return table, {r: sorted((n, d, list(mm)) for n, d, mm in v) for r, v in pgs_of.items()}
