"""Op timelines: one row per operation of every rank (Parquet or CSV), the cheap record that large
Megatron-style jobs keep on all ranks, turned into the canonical tables.

Columns (other names through ``column_map``, {ours: theirs}; a few aliases are known, see
:data:`ALIASES`):

| column | meaning |
|---|---|
| ``rank`` | global rank (required) |
| ``dp``, ``pp``, ``vpp`` | data-parallel index, pipeline stage, virtual stage / model chunk (``pp`` and ``dp`` default 0) |
| ``tp``, ``cp``, ``ep`` | tensor / context / expert parallel index (optional, default 0) |
| ``step`` | training iteration (required): becomes ``steps`` and ``events.step`` |
| ``op`` | op type, :data:`VOCABULARY` (required); unknown types are kept as compute under their name (counted) |
| ``start``, ``duration`` | time of the op (required); unit from the column name (``start_us``, ``duration_ms`` ...), ``column_map['unit']``, else inferred from the magnitude of ``start`` (stated in ``ranks.trace_meta_json``) |
| ``microbatch`` | micro-batch id (optional) |
| ``seq`` | sequence id per (rank, step, op) (optional: else the order of start times) |

Mapping: every op is an event on one CPU thread of its rank (tid 1): compute ops ``cpu_op``,
communication ops ``comm_op`` plus one ``comms`` row each (dialect ``op_timeline``); each step's
span is a ``ProfilerStep#N`` event (kind ``step``), as in a Kineto trace. Pipeline sends/receives are p2p whose
peer is the rank with the next/previous stage (``vpp`` wraps from the last stage to the first, as
in the interleaved schedule) and the same other coordinates; the p2p group is ``pp:dp{d}...``,
``tag`` 0 for activations (forward), 1 for gradients. Collectives join across their group by
(group, step, op, seq): ``pg_name`` is ``<group>:<op>`` and ``seq`` = step x :data:`SEQ_STRIDE` +
the per-(rank, step, op) sequence id (``seq_source = 'op_timeline'``). Groups: ``tp-*`` ops the
ranks differing only in ``tp``, ``cp-*`` in ``cp``, ``ep-*``/``*-all-to-all`` in ``ep``,
``embedding-*`` the first and last stage of a pipeline, every other collective the data-parallel
group (same ``pp``, ``tp``, ``cp``, ``ep``). There are no kernels: nothing here says how
communication overlapped GPU work.
"""
from __future__ import annotations

import json
import logging
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa

from .. import schema as S
from ..errors import TraceInputError

log = logging.getLogger("traceanalyzer.ingest")

REQUIRED = ("rank", "step", "op", "start", "duration")
OPTIONAL = ("dp", "pp", "vpp", "tp", "cp", "ep", "microbatch", "seq")
ALIASES = {"rank": ("global_rank",), "dp": ("dp_rank",), "pp": ("pp_rank", "stage", "pp_stage"),
           "vpp": ("virtual_stage", "model_chunk", "chunk", "vpp_rank"), "tp": ("tp_rank",), "cp": ("cp_rank",),
           "ep": ("ep_rank",), "step": ("iteration", "iter"), "op": ("op_type", "type", "name"),
           "start": ("start_ts", "ts", "begin"), "duration": ("dur",),
           "microbatch": ("micro_batch", "microbatch_id", "mb"), "seq": ("seq_id", "sequence_id")}
#: The documented op types: (class, detail). Anything else ending in -all-reduce, -reduce-scatter,
#: -all-gather or -all-to-all is a collective of that op; the rest is compute, kept under its name.
VOCABULARY = {
    "forward-compute": "compute", "backward-compute": "compute", "optimizer": "compute",
    "data-load": "compute", "gc": "compute", "loss-compute": "compute",
    "forward-send": "p2p", "forward-recv": "p2p", "backward-send": "p2p", "backward-recv": "p2p",
    "grads-reduce-scatter": "collective", "grads-all-reduce": "collective", "params-all-gather": "collective",
}
_COLLECTIVE_SUFFIX = {"-all-reduce": "all_reduce", "-reduce-scatter": "reduce_scatter", "-all-gather": "all_gather",
                      "-all-to-all": "all_to_all"}
UNITS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
#: unit inference: epoch start values lie in [10^k, EPOCH_SPAN x 10^k) of their unit (2001-2100)
#: and no op may last longer than MAX_OP_NS in the unit chosen
EPOCH_SPAN = 4.1
MAX_OP_NS = 3600 * 1_000_000_000
#: seq of a collective = step * SEQ_STRIDE + its sequence id within (rank, step, op)
SEQ_STRIDE = 100_000
#: every op of a rank is on one CPU thread (the training loop that timed it)
TID = 1
SOURCE = "op_timeline"


def columns_match(cols, column_map: dict | None = None) -> list[str]:
    """The required columns ``cols`` lacks (empty: it is an op timeline)."""
    have = set(cols)
    return [c for c in REQUIRED if _find(c, have, column_map or {}) is None]


def _find(ours: str, have: set, column_map: dict) -> str | None:
    if ours in column_map:
        return column_map[ours] if column_map[ours] in have else None
    for name in (ours, *ALIASES.get(ours, ())):
        if name in have:
            return name
        for unit in UNITS:
            if f"{name}_{unit}" in have and ours in ("start", "duration"):
                return f"{name}_{unit}"
    return None


def parquet_columns(path) -> list[str] | None:
    import pyarrow.parquet as pq
    try:
        return pq.read_schema(path).names
    except Exception:
        return None


def is_op_timeline(path, column_map: dict | None = None) -> bool:
    from .sniff import sniff
    return sniff(path, column_map)[0] == "op_timeline"


def read_table(path: Path) -> pa.Table:
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
        if magic == b"PAR1":
            import pyarrow.parquet as pq
            return pq.read_table(path)
        import pyarrow.csv as pcsv
        return pcsv.read_csv(path)
    except OSError as exc:
        raise TraceInputError(path, f"cannot read op timeline ({exc.strerror or exc})") from None
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise TraceInputError(path, f"unreadable op timeline ({str(exc).splitlines()[0]})") from None


def load(path, column_map: dict | None = None) -> list:
    """One :class:`~traceanalyzer.ingest.kineto.build.RankTables` per rank of the timeline."""
    from .kineto.build import RankTables
    path = Path(path)
    column_map = dict(column_map or {})
    t = read_table(path)
    have = set(t.column_names)
    missing = columns_match(t.column_names, column_map)
    if missing:
        raise TraceInputError(path, f"op timeline without column(s) {', '.join(missing)} (it has "
                                    f"{', '.join(t.column_names[:12])}); name them with --column-map ours=theirs")
    cols = {c: _find(c, have, column_map) for c in REQUIRED + OPTIONAL}
    to_ns, unit, unit_source = _unit(path, t, cols, column_map.get("unit"))
    n = t.num_rows
    if n == 0:
        raise TraceInputError(path, "empty op timeline (no rows)")

    def ints(c, default=0):
        name = cols[c]
        if name is None:
            return np.full(n, default, np.int64)
        col = t.column(name)
        if col.null_count:
            raise TraceInputError(path, f"op timeline column {name!r} has {col.null_count} empty value(s)")
        try:
            return col.to_numpy().astype(np.int64)
        except (ValueError, TypeError, pa.ArrowInvalid):
            raise TraceInputError(path, f"op timeline column {name!r} is not integer ({col.type})") from None

    def times(c):
        col = t.column(cols[c])
        if col.null_count or not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
            raise TraceInputError(path, f"op timeline column {cols[c]!r} must be numbers without gaps ({col.type})")
        v = col.to_numpy().astype(np.float64) * to_ns
        return np.round(v).astype(np.int64)

    rank, step = ints("rank"), ints("step")
    coords = {c: ints(c) for c in ("dp", "pp", "vpp", "tp", "cp", "ep")}
    mb = ints("microbatch", -1)
    ts, dur = times("start"), times("duration")
    if (dur < 0).any():
        raise TraceInputError(path, f"op timeline has {int((dur < 0).sum())} negative duration(s)")
    ops = [str(o) for o in t.column(cols["op"]).to_pylist()]
    seq = ints("seq", -1) if cols["seq"] else _order_seq(rank, step, ops, ts)
    grid = Grid(_grid(path, rank, coords))
    skipped: Counter = Counter()
    unknown = Counter(o for o in set(ops) if _class(o) == "compute" and o not in VOCABULARY)
    n_unknown = sum(1 for o in ops if o in unknown)
    if n_unknown:
        log.info("%s: %d op(s) of %d unknown type(s) kept as compute: %s", path, n_unknown, len(unknown),
                 ", ".join(sorted(unknown)[:8]))
    log.info("%s: op timeline times in %s (%s)", path, unit, unit_source)
    meta = {"source": SOURCE, "time_unit": unit, "time_unit_source": unit_source, "step_source": "op_timeline",
            "parallel": {k: int(v.max()) + 1 for k, v in coords.items()}, "kernels": False}
    out = []
    ranks = sorted(grid.of)
    world = max(ranks) + 1
    missing_ranks = sorted(set(range(world)) - set(ranks))
    if missing_ranks:
        from .batch import format_ranges
        raise TraceInputError(path, f"op timeline has no rows for rank(s) {format_ranges(missing_ranks)} of "
                                    f"0-{world - 1}: every rank must be in the file")
    order = np.lexsort((ts, rank))
    bounds = np.searchsorted(rank[order], np.arange(world + 1))
    for r in ranks:
        idx = order[bounds[r]:bounds[r + 1]]
        mine: Counter = Counter(skipped)  # per rank: the ingest summary adds them up
        n_unk = sum(1 for i in idx if ops[i] in unknown)
        if n_unk:
            mine["op_timeline.unknown_op_types_kept_as_compute"] = n_unk
        out.append(RankTables(r, SOURCE, *_rank_tables(path, r, idx, grid, ops, step, ts, dur, mb, seq, coords,
                                                       world, meta, mine), skipped=mine))
    return out


def _unit(path, t, cols, given) -> tuple[int, str, str]:
    for c in ("start", "duration"):
        m = re.search(r"_(ns|us|ms|s)$", cols[c] or "")
        if m and given is None:
            return UNITS[m.group(1)], m.group(1), f"from the column name {cols[c]!r}"
    if given is not None:
        if given not in UNITS:
            raise TraceInputError(path, f"unknown time unit {given!r} for the op timeline: use one of {', '.join(UNITS)}")
        return UNITS[given], given, "given"
    col = t.column(cols["start"])
    if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
        raise TraceInputError(path, f"op timeline column {cols['start']!r} must be numbers ({col.type})")
    top = float(np.nanmax(np.abs(col.to_numpy().astype(np.float64)))) if len(col) else 0.0
    dcol = t.column(cols["duration"])
    longest = float(np.nanmax(dcol.to_numpy().astype(np.float64))) if len(dcol) and (
        pa.types.is_integer(dcol.type) or pa.types.is_floating(dcol.type)) else 0.0
    # epoch times (2001-2100) in a unit under which no op lasts more than MAX_OP_NS; a monotonic
    # clock in ns can look like epoch ms (3.8e12 after an hour of uptime): its ops would last hours
    for unit, lo in (("ns", 1e18), ("us", 1e15), ("ms", 1e12), ("s", 1e9)):
        if lo <= top < EPOCH_SPAN * lo and longest * UNITS[unit] <= MAX_OP_NS:
            return UNITS[unit], unit, f"inferred: start values look like epoch {unit}"
    if pa.types.is_floating(col.type):
        return UNITS["s"], "s", "inferred: fractional start values taken as seconds"
    raise TraceInputError(path, "cannot tell the op timeline's time unit (integer times, not epoch-sized): "
                                "name the columns start_us/duration_us (ns, us, ms, s) or pass --column-map unit=us")


def _order_seq(rank, step, ops, ts) -> np.ndarray:
    seq = np.zeros(len(rank), np.int64)
    counter: Counter = Counter()
    for i in np.lexsort((ts, step, rank)):
        key = (rank[i], step[i], ops[i])
        seq[i] = counter[key]
        counter[key] += 1
    return seq


def _grid(path, rank, coords) -> dict[int, tuple]:
    """rank -> (dp, pp, vpp-free coordinates); one set of coordinates per rank."""
    keys = np.stack([rank] + [coords[c] for c in ("dp", "pp", "tp", "cp", "ep")], axis=1)
    uniq = np.unique(keys, axis=0)
    grid: dict[int, tuple] = {}
    for row in uniq:
        r = int(row[0])
        if r in grid:
            raise TraceInputError(path, f"rank {r} has two sets of parallel coordinates (dp, pp, tp, cp, ep): "
                                        f"{grid[r]} and {tuple(int(x) for x in row[1:])}")
        grid[r] = tuple(int(x) for x in row[1:])
    by_coord = {}
    for r, c in grid.items():
        if c in by_coord:
            raise TraceInputError(path, f"ranks {by_coord[c]} and {r} have the same coordinates (dp, pp, tp, cp, ep) {c}")
        by_coord[c] = r
    return grid


def _class(op: str) -> str:
    if op in VOCABULARY:
        return VOCABULARY[op]
    return "collective" if op.endswith(tuple(_COLLECTIVE_SUFFIX)) else "compute"


def _coll_op(op: str) -> str:
    return next(v for k, v in _COLLECTIVE_SUFFIX.items() if op.endswith(k))


_DIMS = ("dp", "pp", "tp", "cp", "ep")
#: group kind -> the coordinates its members share (positions in (dp, pp, tp, cp, ep))
_SHARED = {"tp": (0, 1, 3, 4), "cp": (0, 1, 2, 4), "ep": (0, 1, 2, 3), "dp": (1, 2, 3, 4), "pp": (0, 2, 3, 4)}


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
        stage of the pipeline, anything else the data-parallel group."""
        me = self.of[r]
        kind = ("tp" if op.startswith("tp-") else "cp" if op.startswith("cp-") else
                "ep" if op.startswith("ep-") or op.endswith("-all-to-all") else
                "emb" if op.startswith("embedding-") else "dp")
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

    def pipeline(self, r: int) -> tuple[str, list[int]]:
        me = self.of[r]
        key = tuple(me[i] for i in _SHARED["pp"])
        return "pp:" + "-".join(f"{_DIMS[i]}{v}" for i, v in zip(_SHARED["pp"], key)), self.members[("pp", key)]


def _rank_tables(path, r, idx, grid, ops, step, ts, dur, mb, seq, coords, world, meta, skipped):
    me = grid.of[r]
    ev, comms = [], []
    steps = _steps(step[idx], ts[idx], dur[idx])
    st = steps.to_pydict()
    marks = sorted([(a, -1 - k, None) for k, a in enumerate(st["start_ts_ns"])] + [(int(ts[i]), 0, i) for i in idx])
    for eid, (_, k, i) in enumerate(marks):
        if i is None:  # the step's span, as ProfilerStep#N in a Kineto trace (the replay's step boundaries)
            k = -1 - k
            ev.append({"event_id": eid, "ph": "X", "cat": "user_annotation", "kind": "step",
                       "name": f"ProfilerStep#{st['step'][k]}", "ts_ns": st["start_ts_ns"][k], "dur_ns": st["dur_ns"][k],
                       "pid": r, "tid": TID, "is_gpu": False, "device": None, "stream": None, "correlation": None,
                       "external_id": None, "step": st["step"][k], "nested": False, "args_json": "{}"})
            continue
        op = ops[i]
        cls = _class(op)
        args = {"microbatch": int(mb[i]) if mb[i] >= 0 else None, "seq": int(seq[i]),
                "vpp": int(coords["vpp"][i])}
        ev.append({"event_id": eid, "ph": "X", "cat": "cpu_op", "kind": "cpu_op" if cls == "compute" else "comm_op",
                   "name": op, "ts_ns": int(ts[i]), "dur_ns": int(dur[i]), "pid": r,
                   "tid": TID, "is_gpu": False, "device": None,
                   "stream": None, "correlation": None, "external_id": None, "step": int(step[i]), "nested": False,
                   "args_json": json.dumps(args, separators=(",", ":"))})
        if cls == "compute":
            continue
        row = {"comm_id": len(comms), "dialect": SOURCE, "is_p2p": cls == "p2p", "pg_inferred": False,
               "pg_source": SOURCE, "enqueue_event_id": eid, "enqueue_ts_ns": int(ts[i]), "enqueue_dur_ns": int(dur[i]),
               "enqueue_tid": TID, "exec_event_id": eid, "exec_name": op, "start_ts_ns": int(ts[i]),
               "end_ts_ns": int(ts[i] + dur[i]), "dur_ns": int(dur[i]), "exec_tid": TID, "on_gpu": False,
               "step": int(step[i])}
        if cls == "p2p":
            peer = grid.peer(op, r)
            if peer is None:
                skipped["op_timeline.p2p_without_peer"] += 1
            send = op.endswith("-send")
            pg, members = grid.pipeline(r)
            row.update(op="send" if send else "recv", pg_name=pg, pg_desc="pipeline", pg_ranks=members, group_size=len(members),
                       src_rank=r if send else peer, dst_rank=peer if send else r, peer_rank=peer,
                       tag=0 if op.startswith("forward") else 1)
        else:
            name, members = grid.group(op, r)
            row.update(op=_coll_op(op), pg_name=f"{name}:{op}", pg_desc=op, pg_ranks=members, group_size=len(members),
                       seq=int(step[i]) * SEQ_STRIDE + int(seq[i]), seq_source=SOURCE)
        comms.append(row)
    _p2p_seq(comms)
    events = pa.Table.from_pylist(ev, schema=S.EVENTS.arrow_schema)
    comms_t = pa.Table.from_pylist(comms, schema=S.COMMS.arrow_schema)
    start, end = int(ts[idx].min()), int((ts[idx] + dur[idx]).max())
    groups = {}
    for c in comms:
        groups.setdefault(c["pg_name"], c)
    pgs = pa.Table.from_pylist([{"pg_name": k, "pg_desc": c["pg_desc"], "backend_config": SOURCE,
                                 "pg_size": c["group_size"], "pg_ranks": c["pg_ranks"]} for k, c in sorted(groups.items())],
                               schema=S.PROCESS_GROUPS.arrow_schema)
    threads = pa.Table.from_pylist([{"pid": r, "tid": TID, "is_gpu": False, "name": "op timeline", "n_events": len(ev)}],
                                   schema=S.THREADS.arrow_schema)
    rank_meta = dict(meta, coordinates=dict(zip(("dp", "pp", "tp", "cp", "ep"), me)))
    ranks = pa.Table.from_pylist([{
        "trace_file": str(Path(path).resolve()), "host": "", "pid": r, "world_size": world, "backend": None,
        "device": None, "rank_source": SOURCE, "base_time_ns": 0, "start_ts_ns": start, "end_ts_ns": end,
        "clock_offset_ns": 0, "n_events": len(ev), "n_skipped": sum(skipped.values()),
        "skipped_json": json.dumps(dict(skipped), sort_keys=True), "distributed_info_json": "{}",
        "trace_meta_json": json.dumps(rank_meta, sort_keys=True)}], schema=S.RANKS.arrow_schema)
    flows = pa.Table.from_pylist([], schema=S.FLOWS.arrow_schema)
    tables = {"ranks": ranks, "process_groups": pgs, "threads": threads, "events": events, "flows": flows,
              "steps": steps, "comms": comms_t}
    return tables, start, end


def _p2p_seq(comms: list[dict]) -> None:
    """p2p_seq: index among this rank's ops of the same (pg, src, dst, tag), in time order."""
    counter: Counter = Counter()
    for c in sorted((c for c in comms if c["is_p2p"]), key=lambda c: (c["start_ts_ns"], c["comm_id"])):
        key = (c["pg_name"], c["src_rank"], c["dst_rank"], c["tag"])
        c["p2p_seq"] = counter[key]
        counter[key] += 1


def _steps(step, ts, dur) -> pa.Table:
    ranges: dict[int, list[int]] = {}
    for s, a, d in zip(step.tolist(), ts.tolist(), dur.tolist()):
        lo, hi = ranges.get(s, (a, a + d))
        ranges[s] = [min(lo, a), max(hi, a + d)]
    keys = sorted(ranges)
    return pa.table({"step": pa.array(keys, pa.int32()),
                     "start_ts_ns": pa.array([ranges[s][0] for s in keys], pa.int64()),
                     "end_ts_ns": pa.array([ranges[s][1] for s in keys], pa.int64()),
                     "dur_ns": pa.array([ranges[s][1] - ranges[s][0] for s in keys], pa.int64())},
                    schema=S.STEPS.arrow_schema)
