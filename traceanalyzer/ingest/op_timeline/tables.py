"""The canonical tables of a block of whole ranks of an op timeline, built column-wise for the whole
block (numpy/Arrow: a fixed number of passes over the rows, no Python per row, none per rank that
is per row inside), then sliced per rank. See the package docstring for the mapping; :class:`Grid`
holds the parallel coordinates.

How the rows are put in order without sorting them again: the block's ops come sorted by (rank,
start) (:func:`~traceanalyzer.ingest.op_timeline._arrays`), so (rank, start) maps to one
increasing integer key (each rank's times shifted past the previous rank's); a step span goes
before the ops it starts with (``searchsorted`` on that key), which is the order a stable sort by
(rank, start, step spans first) gives. Per-(rank, op) facts (group, peer, p2p channel) are worked
out once per pair present (a few per rank) and looked up by index.

Text columns stay dictionary-encoded (:data:`TEXT`: a code per row into a few distinct values, as
they are made): casting them to plain strings was ~30 % of building a block, and the Parquet writer
then hashed every string back into a dictionary; it writes a dictionary column as it is (stage.py).
The files hold the same values and types (strings) either way; :func:`plain` gives the plain table."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ... import schema as S

SOURCE = "op_timeline"
TID = 1
SEQ_STRIDE = 100_000
_DIMS = ("dp", "pp", "tp", "cp", "ep")
#: group kind -> the coordinates its members share (positions in (dp, pp, tp, cp, ep))
_SHARED = {"tp": (0, 1, 3, 4), "cp": (0, 1, 2, 4), "ep": (0, 1, 2, 3), "dp": (1, 2, 3, 4), "pp": (0, 2, 3, 4)}
#: a dense (rank, step) or (microbatch, seq, vpp) grid is used while it has at most this many cells
#: per row (plus DENSE_MIN); beyond it the keys are sorted (np.unique)
DENSE_CELLS_PER_ROW = 4
DENSE_MIN = 1 << 16


class Grid:
    """The ranks' parallel coordinates (dp, pp, tp, cp, ep), indexed for O(1) peer and group look-ups."""

    def __init__(self, coords: dict[int, tuple]):
        self.of = coords
        self.rank_at = {c: r for r, c in coords.items()}
        self.n_pp = 1 + max(c[1] for c in coords.values())
        self.members: dict[tuple, list[int]] = {}
        for r in sorted(coords):
            for kind, dims in _SHARED.items():
                self.members.setdefault((kind, tuple(coords[r][i] for i in dims)), []).append(r)

    def group(self, op: str, r: int) -> tuple[str, list[int]]:
        """(group name, member global ranks) of collective ``op`` on rank ``r``: ``tp-*`` over tp,
        ``cp-*`` over cp, ``ep-*``/``*-all-to-all`` over ep, ``embedding-*`` the first and last
        stage of the pipeline, ``pp`` the pipeline, anything else the data-parallel group."""
        me = self.of[r]
        kind = ("tp" if op.startswith("tp-") else "cp" if op.startswith("cp-") else
                "ep" if op.startswith("ep-") or op.endswith("-all-to-all") else
                "emb" if op.startswith("embedding-") else "pp" if op == "pipeline" else "dp")
        dims = _SHARED["pp" if kind == "emb" else kind]
        key = tuple(me[i] for i in dims)
        members = self.members[("pp" if kind == "emb" else kind, key)]
        if kind == "emb":
            members = [m for m in members if self.of[m][1] in (0, self.n_pp - 1)]
        return f"{kind}:" + "-".join(f"{_DIMS[i]}{v}" for i, v in zip(dims, key)), members

    def peer(self, op: str, r: int) -> int | None:
        """The other end of a pipeline send/recv: the next stage for forward-send and
        backward-recv, the previous one for forward-recv and backward-send (wrapping: interleaved
        chunks)."""
        dp, pp, tp, cp, ep = self.of[r]
        step = 1 if op in ("forward-send", "backward-recv") else -1
        return self.rank_at.get((dp, (pp + step) % self.n_pp, tp, cp, ep))


#: the type of the built tables' text columns: int32 codes into their distinct values
TEXT = pa.dictionary(pa.int32(), pa.string())


def _built_schema(table: S.Table) -> pa.Schema:
    """``table``'s schema with its text columns as :data:`TEXT` (what :func:`build` makes)."""
    return pa.schema([f.with_type(TEXT) if pa.types.is_string(f.type) else f for f in table.arrow_schema])


_EVENTS, _COMMS = _built_schema(S.EVENTS), _built_schema(S.COMMS)


def plain(table: pa.Table) -> pa.Table:
    """``table`` with its dictionary columns as plain values (the canonical schema's types)."""
    return pa.table([c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c for c in table.columns],
                    names=table.column_names)


def _nulls(n: int, name: str, table: S.Table) -> pa.Array:
    return pa.nulls(n, table.arrow_schema.field(name).type)


def build(path, grid: Grid, ops_u: list[str], classes: list[str], coll_ops: list[str | None], a: dict,
          world: int, meta: dict, unknown_code: np.ndarray) -> list[tuple[int, dict, int, int, dict]]:
    """Per rank (ascending): (rank, tables, start_ts_ns, end_ts_ns, skipped). ``a`` holds the
    block's columns as numpy arrays sorted by (rank, start): rank, step, ts, dur, mb, seq, vpp,
    code (index into ``ops_u``)."""
    rank, step, ts, dur, code = a["rank"], a["step"], a["ts"], a["dur"], a["code"]
    n = len(rank)
    r_first = np.flatnonzero(np.r_[True, rank[1:] != rank[:-1]]) if n else np.zeros(0, np.int64)
    present = rank[r_first]
    R = len(present)
    r_bounds = np.r_[r_first, n]
    ri = np.repeat(np.arange(R), np.diff(r_bounds))           # rank index (in this block) of each row
    is_comp = np.array([c == "compute" for c in classes], bool)[code]
    st = _steps(ri, step, ts, dur, R)
    m = len(st["ri"])
    # merged order of step spans and ops: (rank, start), step spans first at an equal start
    key = _rank_time_key(ri, ts, r_bounds)
    s_order = np.lexsort((st["lo"], st["ri"]))                  # stable: (rank, start, step)
    s_key = key[r_bounds[st["ri"][s_order]]] + (st["lo"][s_order] - ts[r_bounds[st["ri"][s_order]]]) \
        if key is not None else None
    if key is None:   # times too far apart for one int64 key: sort (rank, start, flag) instead
        order = np.lexsort((np.r_[np.zeros(m, np.int8), np.ones(n, np.int8)], np.r_[st["lo"], ts], np.r_[st["ri"], ri]))
        pos = np.empty(n + m, np.int64)
        pos[order] = np.arange(n + m)
        pos_s, pos_o = pos[:m][s_order], pos[m:]
    else:
        ins = np.searchsorted(key, s_key, "left")               # ops before each step span
        pos_s = ins + np.arange(m)
        pos_o = np.arange(n) + np.searchsorted(ins, np.arange(n), "right")
    N = n + m
    s_per_rank = np.bincount(st["ri"], minlength=R)
    e_first = r_first + np.r_[0, np.cumsum(s_per_rank)[:-1]] if R else np.zeros(0, np.int64)
    op_eid = pos_o - e_first[ri]
    s_ri = st["ri"][s_order]

    def merged(step_values, op_values, dtype):
        out = np.empty(N, dtype)
        out[pos_s] = step_values
        out[pos_o] = op_values
        return out

    e_ts = merged(st["lo"][s_order], ts, np.int64)
    e_rank = merged(present[s_ri], rank, np.int64)
    step_u, step_code = np.unique(st["step"], return_inverse=True)
    names = _strings(merged(step_code.reshape(-1)[s_order], len(step_u) + code, np.int32),
                     [f"ProfilerStep#{x}" for x in step_u.tolist()] + list(ops_u))
    kinds = _strings(merged(0, np.where(is_comp, 1, 2), np.int32), ["step", "cpu_op", "comm_op"])
    cats = _strings(merged(0, 1, np.int32), ["user_annotation", "cpu_op"])
    args_code, args_values = _args_json(a["mb"], a["seq"], a["vpp"])
    args = _strings(merged(len(args_values), args_code, np.int32), args_values + ["{}"])
    events = pa.table({
        "event_id": pa.array(np.arange(N) - np.repeat(e_first, np.diff(np.r_[e_first, N])), pa.int64()),
        "ph": _strings(np.zeros(N, np.int32), ["X"]),
        "cat": cats, "kind": kinds, "name": names,
        "ts_ns": pa.array(e_ts, pa.int64()),
        "dur_ns": pa.array(merged((st["hi"] - st["lo"])[s_order], dur, np.int64), pa.int64()),
        "pid": pa.array(e_rank, pa.int64()),
        "tid": pa.array(np.full(N, TID), pa.int64()), "is_gpu": pa.array(np.zeros(N, bool)),
        "device": _nulls(N, "device", S.EVENTS), "stream": _nulls(N, "stream", S.EVENTS),
        "correlation": _nulls(N, "correlation", S.EVENTS), "external_id": _nulls(N, "external_id", S.EVENTS),
        "step": pa.array(merged(st["step"][s_order], step, np.int32), pa.int32()),
        "nested": pa.array(np.zeros(N, bool)),
        "args_json": args}, schema=_EVENTS)
    comms, c_ri, pgs_of = _comms(grid, ops_u, classes, coll_ops, a, ~is_comp, op_eid, ri, present)
    c_bounds = np.searchsorted(c_ri, np.arange(R + 1), "left")
    e_bounds = np.r_[e_first, N]
    s_bounds = np.r_[0, np.cumsum(s_per_rank)]
    steps_all = pa.table({"step": pa.array(st["step"], pa.int32()), "start_ts_ns": pa.array(st["lo"], pa.int64()),
                          "end_ts_ns": pa.array(st["hi"], pa.int64()), "dur_ns": pa.array(st["hi"] - st["lo"], pa.int64())},
                         schema=S.STEPS.arrow_schema)
    unknown_by_rank = np.bincount(ri[unknown_code[code]], minlength=R) if unknown_code.any() else np.zeros(R, int)
    nopeer_by_rank = np.bincount(c_ri[_p2p_without_peer(comms)], minlength=R) if comms.num_rows else np.zeros(R, int)
    start_r = np.minimum.reduceat(st["lo"], s_bounds[:-1]) if R else []
    end_r = np.maximum.reduceat(st["hi"], s_bounds[:-1]) if R else []
    flows = S.FLOWS.arrow_schema.empty_table()
    trace_file = str(path.resolve())
    out = []
    for i, r in enumerate(present.tolist()):
        n_ev = int(e_bounds[i + 1] - e_bounds[i])
        skipped = {}
        if unknown_by_rank[i]:
            skipped["op_timeline.unknown_op_types_kept_as_compute"] = int(unknown_by_rank[i])
        if nopeer_by_rank[i]:
            skipped["op_timeline.p2p_without_peer"] = int(nopeer_by_rank[i])
        start, end = int(start_r[i]), int(end_r[i])
        pgs = pa.Table.from_pylist([{"pg_name": name, "pg_desc": desc, "backend_config": SOURCE, "pg_size": len(members),
                                     "pg_ranks": members} for name, desc, members in sorted(pgs_of.get(r, []))],
                                   schema=S.PROCESS_GROUPS.arrow_schema)
        threads = pa.Table.from_pylist([{"pid": r, "tid": TID, "is_gpu": False, "name": "op timeline",
                                         "n_events": n_ev}], schema=S.THREADS.arrow_schema)
        rank_meta = dict(meta, coordinates=dict(zip(_DIMS, grid.of[r])))
        ranks = pa.Table.from_pylist([{
            "trace_file": trace_file, "host": a["hosts"].get(r, ""), "pid": r, "world_size": world, "backend": None,
            "device": None, "rank_source": SOURCE, "base_time_ns": 0, "start_ts_ns": start, "end_ts_ns": end,
            "clock_offset_ns": 0, "n_events": n_ev, "n_skipped": sum(skipped.values()),
            "skipped_json": json.dumps(skipped, sort_keys=True), "distributed_info_json": "{}",
            "trace_meta_json": json.dumps(rank_meta, sort_keys=True)}], schema=S.RANKS.arrow_schema)
        tables = {"ranks": ranks, "process_groups": pgs, "threads": threads,
                  "events": events.slice(e_bounds[i], n_ev), "flows": flows,
                  "steps": steps_all.slice(s_bounds[i], s_bounds[i + 1] - s_bounds[i]),
                  "comms": comms.slice(c_bounds[i], c_bounds[i + 1] - c_bounds[i])}
        out.append((r, tables, start, end, skipped))
    return out


def _steps(ri: np.ndarray, step: np.ndarray, ts: np.ndarray, dur: np.ndarray, R: int) -> dict:
    """The ProfilerStep#N spans, one per (rank, step), sorted by (rank, step): rank index ``ri``,
    ``step``, ``lo`` (first start), ``hi`` (last end)."""
    n = len(ri)
    if n == 0:
        return {"ri": np.zeros(0, np.int64), "step": np.zeros(0, np.int64), "lo": np.zeros(0, np.int64),
                "hi": np.zeros(0, np.int64)}
    s_min = int(step.min())
    width = int(step.max()) - s_min + 1
    if R * width <= DENSE_CELLS_PER_ROW * n + DENSE_MIN:
        cell = ri * width + (step - s_min)
        cells = R * width
        inv = None
    else:
        uniq, inv = np.unique(step, return_inverse=True)  # steps far apart: their distinct values
        width = len(uniq)
        cell = ri * width + inv
        cells = R * width
    lo = np.full(cells, np.iinfo(np.int64).max, np.int64)
    hi = np.full(cells, np.iinfo(np.int64).min, np.int64)
    np.minimum.at(lo, cell, ts)
    np.maximum.at(hi, cell, ts + dur)
    used = np.flatnonzero(np.bincount(cell, minlength=cells))
    s_vals = used % width + s_min if inv is None else uniq[used % width]
    return {"ri": used // width, "step": s_vals.astype(np.int64), "lo": lo[used], "hi": hi[used]}


def _rank_time_key(ri: np.ndarray, ts: np.ndarray, r_bounds: np.ndarray) -> np.ndarray | None:
    """One increasing int64 per row of rows sorted by (rank, start): each rank's times shifted to
    start after the previous rank's last (None: the spans do not fit in an int64)."""
    if len(ts) == 0:
        return np.zeros(0, np.int64)
    base = ts[r_bounds[:-1]]
    span = ts[r_bounds[1:] - 1].astype(object) - base.astype(object) + 1
    if sum(span.tolist()) >= (1 << 62):
        return None
    span = span.astype(np.int64)
    off = np.r_[0, np.cumsum(span)[:-1]]
    return ts - (base - off)[ri]


def _strings(codes: np.ndarray, values: list[str], mask: np.ndarray | None = None) -> pa.Array:
    """``values[codes]`` (NULL where ``mask``) as a :data:`TEXT` array whose dictionary holds each
    value once (the Parquet writer writes it as the column's dictionary page)."""
    uniq, inv = np.unique(np.array(values, dtype=object), return_inverse=True)
    codes = inv.reshape(-1).astype(np.int32)[codes]
    return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32(), mask=mask), pa.array(uniq.tolist(), pa.string()))


def _args_json(mb: np.ndarray, seq: np.ndarray, vpp: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """``{"microbatch":M|null,"seq":S,"vpp":V}`` per op as (code per row, the distinct texts): the
    text is made once per distinct (microbatch, seq, vpp), not once per row."""
    mb = np.where(mb < 0, -1, mb)
    if len(mb) == 0:
        return np.zeros(0, np.int32), []
    cols = [mb, seq, vpp]
    lows = [int(c.min()) for c in cols]
    widths = [int(c.max()) - lo + 1 for c, lo in zip(cols, lows)]
    cells = widths[0] * widths[1] * widths[2]
    if cells <= DENSE_CELLS_PER_ROW * len(mb) + DENSE_MIN:
        cell = ((mb - lows[0]) * widths[1] + (seq - lows[1])) * widths[2] + (vpp - lows[2])
        used = np.flatnonzero(np.bincount(cell, minlength=cells))
        index = np.zeros(cells, np.int32)
        index[used] = np.arange(len(used), dtype=np.int32)
        code = index[cell]
        u_vpp = used % widths[2] + lows[2]
        u_seq = used // widths[2] % widths[1] + lows[1]
        u_mb = used // (widths[2] * widths[1]) + lows[0]
    else:
        uniq, code = np.unique(np.stack(cols, axis=1), axis=0, return_inverse=True)
        u_mb, u_seq, u_vpp = uniq[:, 0], uniq[:, 1], uniq[:, 2]
        code = code.reshape(-1).astype(np.int32)
    text = lambda v: pc.cast(pa.array(v, pa.int64()), pa.string())  # noqa: E731
    mbs = pc.if_else(pa.array(u_mb < 0), pa.scalar("null"), text(u_mb))
    values = pc.binary_join_element_wise('{"microbatch":', mbs, ',"seq":', text(u_seq), ',"vpp":', text(u_vpp), "}", "")
    return code, values.to_pylist()


def _p2p_without_peer(comms: pa.Table) -> np.ndarray:
    return pc.and_(comms["is_p2p"], pc.is_null(comms["peer_rank"])).to_numpy()


def _comms(grid: Grid, ops_u, classes, coll_ops, a: dict, is_comm: np.ndarray, op_eid: np.ndarray,
           ri_all: np.ndarray, present: np.ndarray):
    """The comms rows (sorted by rank, start), the rank index of each row, and per rank its groups."""
    idx = np.flatnonzero(is_comm)
    k = len(idx)
    C = len(ops_u)
    rank, code, ri = a["rank"][idx], a["code"][idx], ri_all[idx]
    ts, dur, step = a["ts"][idx], a["dur"][idx], a["step"][idx]
    is_p2p_op = np.array([c == "p2p" for c in classes], bool)
    is_send_op = np.array([o.endswith("-send") for o in ops_u], bool) & is_p2p_op
    is_fwd_op = np.array([o.startswith("forward") for o in ops_u], bool)
    p2p, send = is_p2p_op[code], is_send_op[code]
    # per (rank, op) pair present: its group, peer and p2p channel (src, dst, tag), looked up by index
    pair = ri * C + code
    seen = np.flatnonzero(np.bincount(pair, minlength=len(present) * C)) if k else np.zeros(0, np.int64)
    g_of = np.zeros(len(present) * C, np.int64)
    peer_of = np.full(len(present) * C, -1, np.int64)
    chan_of = np.zeros(len(present) * C, np.int64)
    names, descs, members = [], [], []
    group_index: dict[str, int] = {}
    channels: dict[tuple, int] = {}
    pgs_of: dict[int, set] = {}
    for pr in seen.tolist():
        i, c = divmod(pr, C)
        r, op = int(present[i]), ops_u[c]
        if is_p2p_op[c]:
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
        g_of[pr] = group_index[name]
        peer_of[pr] = -1 if peer is None else peer
        p = -1 if peer is None else peer
        tag = (0 if is_fwd_op[c] else 1) if is_p2p_op[c] else -1
        chan = (r, r, p, tag) if is_send_op[c] else (r, p, r, tag)
        chan_of[pr] = channels.setdefault(chan, len(channels))
        pgs_of.setdefault(r, set()).add((name, desc, tuple(mem)))
    g, peer, chan = g_of[pair], peer_of[pair], chan_of[pair]
    has_peer = p2p & (peer >= 0)
    src = np.where(send, rank, peer)
    dst = np.where(send, peer, rank)
    tag = np.where(p2p, np.where(is_fwd_op[code], 0, 1), -1)
    p2p_seq = _cumcount(chan)
    sizes = np.array([len(x) for x in members], np.int32)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    member_lists = pa.ListArray.from_arrays(pa.array(offsets), pa.array([x for mem in members for x in mem], pa.int32()))
    op_values = [c or "" for c in coll_ops] + ["send", "recv"]
    op_col = _strings(np.where(p2p, np.where(send, len(coll_ops), len(coll_ops) + 1), code), op_values)
    i64 = lambda v, mask=None: pa.array(v, pa.int64(), mask=mask)  # noqa: E731
    i32 = lambda v, mask=None: pa.array(v, pa.int32(), mask=mask)  # noqa: E731
    c_first = np.searchsorted(ri, np.arange(len(present)), "left")
    cols = {
        "comm_id": i64(np.arange(k) - c_first[ri]), "dialect": _strings(np.zeros(k, np.int32), [SOURCE]),
        "op": op_col, "is_p2p": pa.array(p2p), "pg_name": _strings(g, names) if k else pa.nulls(0, TEXT),
        "pg_desc": _strings(g, descs) if k else pa.nulls(0, TEXT),
        "pg_ranks": member_lists.take(pa.array(g)) if k else pa.array([], pa.list_(pa.int32())),
        "group_size": i32(sizes[g] if k else []), "pg_source": _strings(np.zeros(k, np.int32), [SOURCE]),
        "pg_inferred": pa.array(np.zeros(k, bool)),
        "seq": i64(step * SEQ_STRIDE + a["seq"][idx], mask=p2p),
        "seq_source": _strings(np.zeros(k, np.int32), [SOURCE], mask=p2p),
        "p2p_seq": i64(p2p_seq, mask=~p2p), "src_rank": i32(src, mask=~p2p | (~send & ~has_peer)),
        "dst_rank": i32(dst, mask=~p2p | (send & ~has_peer)), "peer_rank": i32(peer, mask=~has_peer),
        "tag": i64(tag, mask=~p2p),
        "enqueue_event_id": i64(op_eid[idx]), "enqueue_ts_ns": i64(ts), "enqueue_dur_ns": i64(dur),
        "enqueue_tid": i64(np.full(k, TID)), "exec_event_id": i64(op_eid[idx]),
        "exec_name": _strings(code, list(ops_u)),
        "start_ts_ns": i64(ts), "end_ts_ns": i64(ts + dur), "dur_ns": i64(dur), "exec_tid": i64(np.full(k, TID)),
        "on_gpu": pa.array(np.zeros(k, bool)), "step": i32(step)}
    fields = {f.name: f for f in _COMMS}
    arrays = [cols[name] if name in cols else pa.nulls(k, fields[name].type) for name in fields]
    table = pa.Table.from_arrays(arrays, schema=_COMMS)
    return table, ri, {r: sorted((n, d, list(mm)) for n, d, mm in v) for r, v in pgs_of.items()}


def _cumcount(key: np.ndarray) -> np.ndarray:
    """Per row, how many earlier rows have the same ``key``."""
    order = np.argsort(key, kind="stable")
    sk = key[order]
    first = np.flatnonzero(np.r_[True, sk[1:] != sk[:-1]]) if len(sk) else np.zeros(0, np.int64)
    run_start = np.repeat(first, np.diff(np.r_[first, len(sk)]))
    out = np.empty(len(key), np.int64)
    out[order] = np.arange(len(key)) - run_start
    return out
