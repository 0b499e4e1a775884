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
| ``host`` | the rank's host (optional): ranks on several hosts have their clocks aligned by the analyses (``clock_offsets``) |
| ``clock_offset`` | added to ``start`` to put the rank's clock on a common one (optional; unit from its name, ``clock_offset_ns``, else the unit of ``start``): a per-host monotonic clock plus (wall − monotonic) read together on that rank, as the light collector writes it |

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

import dataclasses
import logging
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ...errors import TraceInputError
from . import read, tables
from .tables import SEQ_STRIDE, SOURCE, TID, Grid  # noqa: F401 (documented here)

log = logging.getLogger("traceanalyzer.ingest")

REQUIRED = ("rank", "step", "op", "start", "duration")
OPTIONAL = ("dp", "pp", "vpp", "tp", "cp", "ep", "microbatch", "seq", "host", "clock_offset")
ALIASES = {"rank": ("global_rank",), "dp": ("dp_rank",), "pp": ("pp_rank", "stage", "pp_stage"),
           "vpp": ("virtual_stage", "model_chunk", "chunk", "vpp_rank"), "tp": ("tp_rank",), "cp": ("cp_rank",),
           "ep": ("ep_rank",), "step": ("iteration", "iter"), "op": ("op_type", "type", "name"),
           "start": ("start_ts", "ts", "begin"), "duration": ("dur",),
           "microbatch": ("micro_batch", "microbatch_id", "mb"), "seq": ("seq_id", "sequence_id"),
           "host": ("hostname", "host_name", "node")}
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
            if f"{name}_{unit}" in have and ours in ("start", "duration", "clock_offset"):
                return f"{name}_{unit}"
    return None


def parquet_columns(path) -> list[str] | None:
    import pyarrow.parquet as pq
    try:
        return pq.read_schema(path).names
    except Exception:
        return None


def is_op_timeline(path, column_map: dict | None = None) -> bool:
    from ..sniff import sniff
    return sniff(path, column_map)[0] == "op_timeline"


#: The light collector's per-rank files (``profile(op_timeline=True)``): ``RUN/rank{R}.op_timeline.parquet``.
RANK_FILE_RE = re.compile(r"^rank\d+\.op_timeline\.parquet$")
RANK_FILES = "rank*.op_timeline.parquet"


def is_rank_files(path) -> bool:
    """``path`` names every per-rank op timeline file of one folder (:func:`group_rank_files`)."""
    return Path(path).name == RANK_FILES


def group_rank_files(files: list[Path]) -> list[Path]:
    """Per-rank op timeline files of one folder become one input, ``FOLDER/rank*.op_timeline.parquet``
    (read together: peers and groups need every rank)."""
    out, seen = [], set()
    for f in files:
        f = Path(f)
        if RANK_FILE_RE.match(f.name):
            f = f.parent / RANK_FILES
            if f in seen:
                continue
            seen.add(f)
        out.append(f)
    return out


def _input(path: Path):
    """(pieces, Parquet schema or None, CSV table or None) of an op timeline input."""
    files = None
    if is_rank_files(path):
        files = [f for f in sorted(Path(path).parent.glob(RANK_FILES)) if RANK_FILE_RE.match(f.name)]
        if not files:
            raise TraceInputError(path, "no per-rank op timeline files")
    pieces, schema = read.pieces_of(path, files)
    csv_table = read.read_piece(pieces[0]) if schema is None else None
    return pieces, schema, csv_table


@dataclass
class Plan:
    """What :func:`plan` learned of an op timeline before converting any row (picklable: a worker
    converts a part of the pieces, :func:`parts`, from it)."""
    path: Path
    schema: pa.Schema | None
    sc: read.Scan
    cols: dict
    wanted: list[str]
    to_ns: float
    grid: Grid
    world: int
    meta: dict
    unknown: set
    csv_table: pa.Table | None = None


def plan(path, column_map: dict | None = None) -> Plan:
    """Check an op timeline's columns, scan it once (:func:`.read.scan`: ranks, coordinates, op
    names, the unit) and say what its rows will become; raises TraceInputError with one line."""
    path = Path(path)
    column_map = dict(column_map or {})
    pieces, schema, csv_table = _input(path)
    names = list(schema.names) if schema is not None else csv_table.column_names
    have = set(names)
    missing = columns_match(names, column_map)
    if missing:
        raise TraceInputError(path, f"op timeline without column(s) {', '.join(missing)} (it has "
                                    f"{', '.join(names[:12])}); name them with --column-map ours=theirs")
    cols = {c: _find(c, have, column_map) for c in REQUIRED + OPTIONAL}
    named_unit = _unit_from_names(path, cols, column_map.get("unit"))
    sc = read.scan(path, pieces, schema, cols, times=named_unit is None, csv_table=csv_table)
    if sc.rows == 0:
        raise TraceInputError(path, "empty op timeline (no rows)")
    to_ns, unit, unit_source = named_unit or _unit_inferred(path, sc, schema, csv_table, cols)
    grid = Grid(_grid(path, sc))
    unknown = {o for o in sc.ops if _class(o) == "compute" and o not in VOCABULARY}
    log.info("%s: op timeline times in %s (%s)", path, unit, unit_source)
    ranks = sorted(grid.of)
    world = max(ranks) + 1
    missing_ranks = sorted(set(range(world)) - set(ranks))
    if missing_ranks:
        from ..batch import format_ranges
        raise TraceInputError(path, f"op timeline has no rows for rank(s) {format_ranges(missing_ranks)} of "
                                    f"0-{world - 1}: every rank must be in the file")
    parallel = {c: 1 + max(v[i] for v in grid.of.values()) for i, c in enumerate(("dp", "pp", "tp", "cp", "ep"))}
    meta = {"source": SOURCE, "time_unit": unit, "time_unit_source": unit_source, "step_source": "op_timeline",
            "parallel": dict(parallel, vpp=sc.vpp_max + 1), "kernels": False}
    wanted = [c for c in dict.fromkeys(cols.values()) if c is not None]
    if unknown:
        log.info("%s: %d op(s) of %d unknown type(s) kept as compute: %s", path,
                 sum(sc.op_counts[o] for o in unknown), len(unknown), ", ".join(sorted(unknown)[:8]))
    return Plan(path, schema, sc, cols, wanted, to_ns, grid, world, meta, unknown, csv_table)


def parts(p: Plan, n: int) -> list[list[read.Piece]]:
    """The plan's pieces in at most ``n`` parts of whole ranks and about equal rows, for as many
    workers to convert (:func:`load`'s ``pieces``): a cut only between pieces that no rank spans. One
    part where the input cannot be cut (CSV, a file not sorted by rank, a single piece)."""
    pieces = p.sc.pieces
    if n < 2 or p.csv_table is not None or not p.sc.sorted_by_rank or len(pieces) < 2:
        return [pieces]
    done = np.cumsum([x.rows for x in pieces])
    cuttable = [i + 1 for i in range(len(pieces) - 1) if pieces[i].hi < pieces[i + 1].lo]  # cut before piece i+1
    if not cuttable:
        return [pieces]
    at = np.array([done[i - 1] for i in cuttable])
    cuts = sorted({cuttable[int(np.abs(at - done[-1] * k / n).argmin())] for k in range(1, n)})
    return [pieces[a:b] for a, b in zip([0] + cuts, cuts + [len(pieces)])]


def load(path, column_map: dict | None = None, block_rows: int = read.BLOCK_ROWS, plan_: Plan | None = None,
         pieces: list[read.Piece] | None = None):
    """One :class:`~traceanalyzer.ingest.kineto.build.RankTables` per rank of the timeline, in rank
    order, built a block of about ``block_rows`` rows at a time (:mod:`.read`): a generator.
    ``plan_`` (default: :func:`plan` of ``path``) and ``pieces`` (one of its :func:`parts`; default:
    all) let workers convert parts of one input."""
    from ..kineto.build import RankTables
    p = plan_ if plan_ is not None else plan(path, column_map)
    sc = p.sc if pieces is None else dataclasses.replace(p.sc, pieces=pieces)
    ops_u = sc.ops
    classes = [_class(o) for o in ops_u]
    coll = [_coll_op(o) if _class(o) == "collective" else None for o in ops_u]
    is_unknown = np.array([o in p.unknown for o in ops_u], bool)
    for t in read.blocks(sc, p.schema, p.wanted, block_rows, p.cols["rank"], p.csv_table):
        a = _arrays(p.path, t, p.cols, p.to_ns, ops_u)
        for r, tb, start, end, sk in tables.build(p.path, p.grid, ops_u, classes, coll, a, p.world, p.meta, is_unknown):
            yield RankTables(r, SOURCE, tb, start, end, skipped=Counter(sk))


def _arrays(path, t: pa.Table, cols: dict, to_ns: float, ops_u: list[str]) -> dict:
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
    seq = ints("seq", -1) if cols["seq"] else _order_seq(rank, step, code, ts)
    a = {"rank": rank, "step": step, "ts": ts, "dur": dur, "mb": mb, "seq": seq, "vpp": vpp, "code": code}
    if not _sorted_by_rank_time(rank, ts):   # a stable sort: rows already in order stay as they are
        order = np.lexsort((ts, rank))
        a = {k: v[order] for k, v in a.items()}
    a["hosts"] = _hosts(path, t, cols["host"], rank)
    return a


def _sorted_by_rank_time(rank: np.ndarray, ts: np.ndarray) -> bool:
    """Are the rows in (rank, start) order already (a file sorted by rank, each rank's ops in time order)?"""
    if len(rank) < 2:
        return True
    d_rank = np.diff(rank)
    return bool((d_rank >= 0).all() and ((d_rank > 0) | (ts[1:] >= ts[:-1])).all())


def _hosts(path, t: pa.Table, col: str | None, rank: np.ndarray) -> dict[int, str]:
    """rank -> host of a block (empty without a host column); a rank on two hosts is an error."""
    if col is None:
        return {}
    per = pd.DataFrame({"rank": rank, "host": t.column(col).cast(pa.string()).fill_null("").to_numpy(zero_copy_only=False)})
    per = per.drop_duplicates()
    two = per[per["rank"].duplicated(keep=False)]
    if not two.empty:
        r = int(two["rank"].iloc[0])
        raise TraceInputError(path, f"op timeline rank {r} is on several hosts ({', '.join(sorted(two.loc[two['rank'] == r, 'host']))})")
    return dict(zip(per["rank"].astype(int), per["host"].astype(str)))


def _unit_from_names(path, cols, given) -> tuple[int, str, str] | None:
    for c in ("start", "duration"):
        m = re.search(r"_(ns|us|ms|s)$", cols[c] or "")
        if m and given is None:
            return UNITS[m.group(1)], m.group(1), f"from the column name {cols[c]!r}"
    if given is not None:
        if given not in UNITS:
            raise TraceInputError(path, f"unknown time unit {given!r} for the op timeline: use one of {', '.join(UNITS)}")
        return UNITS[given], given, "given"
    return None


def _unit_inferred(path, sc, schema, csv_table, cols) -> tuple[int, str, str]:
    typ = (schema.field(cols["start"]).type if schema is not None else csv_table.column(cols["start"]).type)
    if not (pa.types.is_integer(typ) or pa.types.is_floating(typ)):
        raise TraceInputError(path, f"op timeline column {cols['start']!r} must be numbers ({typ})")
    top, longest = sc.time_max
    # epoch times (2001-2100) in a unit under which no op lasts more than MAX_OP_NS; a monotonic
    # clock in ns can look like epoch ms (3.8e12 after an hour of uptime): its ops would last hours
    for unit, lo in (("ns", 1e18), ("us", 1e15), ("ms", 1e12), ("s", 1e9)):
        if lo <= top < EPOCH_SPAN * lo and longest * UNITS[unit] <= MAX_OP_NS:
            return UNITS[unit], unit, f"inferred: start values look like epoch {unit}"
    if pa.types.is_floating(typ):
        return UNITS["s"], "s", "inferred: fractional start values taken as seconds"
    raise TraceInputError(path, "cannot tell the op timeline's time unit (integer times, not epoch-sized): "
                                "name the columns start_us/duration_us (ns, us, ms, s) or pass --column-map unit=us")


def _order_seq(rank, step, code, ts) -> np.ndarray:
    """Sequence id per (rank, step, op) in start order (when the file has none)."""
    order = np.lexsort((ts, code, step, rank))
    seq = np.empty(len(rank), np.int64)
    seq[order] = pd.DataFrame({"r": rank[order], "s": step[order], "c": code[order]}).groupby(
        ["r", "s", "c"], sort=False).cumcount().to_numpy()
    return seq


def _grid(path, sc) -> dict[int, tuple]:
    """rank -> (dp, pp, tp, cp, ep) (vpp-free coordinates); one set of coordinates per rank, one rank per set."""
    if sc.conflicts:
        r, a, b = sc.conflicts[0]
        raise TraceInputError(path, f"rank {r} has two sets of parallel coordinates (dp, pp, tp, cp, ep): {a} and {b}")
    by_coord = {}
    for r, c in sorted(sc.coords.items()):
        if c in by_coord:
            raise TraceInputError(path, f"ranks {by_coord[c]} and {r} have the same coordinates (dp, pp, tp, cp, ep) {c}")
        by_coord[c] = r
    return dict(sc.coords)


def _class(op: str) -> str:
    if op in VOCABULARY:
        return VOCABULARY[op]
    return "collective" if op.endswith(tuple(_COLLECTIVE_SUFFIX)) else "compute"


def _coll_op(op: str) -> str:
    return next(v for k, v in _COLLECTIVE_SUFFIX.items() if op.endswith(k))
