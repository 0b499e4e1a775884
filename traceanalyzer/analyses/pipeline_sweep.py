"""pipeline_gaps.sql's ``_pipeline_gaps``, ``_pipeline_p2p_islands``, ``_pipeline_p2p_stalls`` and
``_pipeline_idle_sums`` computed in numpy (issue 17:
the pipeline views were the map's largest cost on op timelines of thousands of ranks).

The SQL stays the definition (``tests/test_sweep_reuse.py`` compares the two on random input and on
shipped pipeline runs); :func:`.modules.bind` makes the views with :func:`pipeline_gaps` and
:func:`pipeline_p2p_islands` unless they decline (return False), as for :mod:`.sweep`'s views.

``_pipeline_gaps``: the SQL merges each (run, rank, step)'s busy segments with a window (a running max
of their ends in (start, end) order); here one ``lexsort`` and one running max over the segments, each
partition's ends shifted above the earlier partitions' so that the max restarts at each. It declines a
partition with two step spans (two windows of one aligned step: the SQL's warmup and cooldown rows per
span) and keys or times that do not pack.

``_pipeline_p2p_islands``: the SQL joins every pending send or receive of a rank with the steps, then
the gaps, it overlaps (an ASOF join for a send's next call, two range joins) and merges the charged parts of each gap
into islands with a window. Here, per (run, rank), the gaps are disjoint and sorted by time, so the
gaps one call overlaps are a range found by two ``searchsorted``; a send's next call is one more;
the islands are one running max over the parts sorted by (gap, start). Input it cannot take so
(gaps of one rank that overlap or have no end, a call with no duration or no peer, keys or times
that do not pack into an int64) is left to the SQL.

``_pipeline_p2p_stalls``: the SQL groups the islands by their gap; here the islands, by gap as
:func:`p2p_islands` makes them (checked; else one ``lexsort``), are cut at each new gap and added up with ``reduceat``;
the peer of a gap's longest island (ties: the lowest rank) is a ``minimum.reduceat`` over the rows that
reach their gap's longest. It declines NULL times and keys that do not pack.

``_pipeline_idle_sums``: the SQL adds up warmup, cooldown, the stalls per peer and the rest of each gap
(its length less the stall the join on (run, rank, step, lo_ns, hi_ns) finds) per (run, rank, step);
here each gap's stall is found by one ``searchsorted`` of (key, start) and the sums are ``reduceat``
over one sort per kind (0.44 -> 0.29 CPU s a map task at 1,024 op-timeline ranks). It declines two
gaps of one step with one start, NULL times and keys that do not pack.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .sweep import _partition_key, _save

#: the view's column types in SQL
_SELECT = ("SELECT CAST(run AS VARCHAR) AS run, CAST(rank AS INTEGER) AS rank, CAST(step AS INTEGER) AS step, "
           "lo_ns, hi_ns, c_lo, c_hi, CAST(src_rank AS INTEGER) AS src_rank, part_ns FROM {src}")

_GAPS = "SELECT run, rank, step, lo_ns, hi_ns FROM _pipeline_gaps WHERE kind = 'gap'"
_CALLS = ("SELECT run, rank, op, src_rank, dst_rank, enqueue_ts_ns, enqueue_dur_ns, end_ts_ns FROM comms "
          "WHERE enqueue_ts_ns IS NOT NULL")


def _i64(col) -> np.ndarray:
    return pc.fill_null(col, 0).to_numpy().astype(np.int64, copy=False)


def _is(col, value: str) -> np.ndarray:
    return pc.fill_null(pc.equal(col, value), False).to_numpy(zero_copy_only=False)


def _bits(n: int) -> int:
    return max(int(n).bit_length(), 1)


def p2p_islands(gaps: pa.Table, calls: pa.Table, tail_ns: int | None) -> pa.Table | None:
    """``_pipeline_p2p_islands`` over an Arrow table of the gaps (run, rank, step, lo_ns, hi_ns: the
    kind 'gap' rows of _pipeline_gaps) and one of the communication calls (comms' run, rank, op,
    src_rank, dst_rank, enqueue_ts_ns, enqueue_dur_ns, end_ts_ns, enqueue_ts_ns not NULL), with
    ``p2p_wait_max_tail_ns`` (None: unset, no send waited past its call); None when it cannot."""
    ng = gaps.num_rows
    packed = _joint_key(gaps, calls)
    if packed is None:
        return None
    key, key_bits = packed
    kg, kc = key[:ng], key[ng:]
    glo, ghi = _i64(gaps.column("lo_ns")), _i64(gaps.column("hi_ns"))
    op = calls.column("op")
    recv, send = _is(op, "recv"), _is(op, "send")
    enq = _i64(calls.column("enqueue_ts_ns"))
    pend = np.flatnonzero(recv | send)
    dur, peer = calls.column("enqueue_dur_ns").take(pend), pc.if_else(
        pa.array(recv[pend]), calls.column("src_rank").take(pend), calls.column("dst_rank").take(pend))
    if dur.null_count or peer.null_count or gaps.column("lo_ns").null_count or gaps.column("hi_ns").null_count \
            or (ghi <= glo).any():
        return None
    p_send, p_lo, p_key = send[pend], enq[pend], kc[pend]
    p_call_end = p_lo + _i64(dur)
    p_hi = np.maximum(_i64(calls.column("end_ts_ns").take(pend)), p_call_end)
    times = [a for a in (glo, ghi, enq, p_hi) if len(a)]
    if not times or not len(pend) or not ng:
        return _empty()
    t0 = min(int(a.min()) for a in times)
    sb = _bits(max(int(a.max()) for a in times) - t0)
    if key_bits + sb > 63:
        return None
    # the gaps of each (run, rank) in time order: disjoint, so their ends are in that order too
    go = np.argsort((kg << sb) | (glo - t0), kind="stable")
    kg, glo, ghi = kg[go], glo[go], ghi[go]
    if ((kg[1:] == kg[:-1]) & (glo[1:] < ghi[:-1])).any():
        return None
    # a send's next call: the rank's first communication call at or after the send completed
    calls_sorted = np.sort((kc << sb) | (enq - t0))
    q = (p_key << sb) | (p_hi - t0)
    j = np.minimum(np.searchsorted(calls_sorted, q, "left"), len(calls_sorted) - 1)
    has_next = (calls_sorted[j] >> sb) == p_key
    has_next &= calls_sorted[j] >= q
    p_next = (calls_sorted[j] & ((1 << sb) - 1)) + t0
    # the gaps each pending call overlaps: end after the call's start, start before its end
    first = np.searchsorted((kg << sb) | (ghi - t0), (p_key << sb) | (p_lo - t0), "right")
    stop = np.searchsorted((kg << sb) | (glo - t0), q, "left")
    n = np.maximum(stop - first, 0)
    pi = np.repeat(np.arange(len(pend)), n)
    gi = np.repeat(first - (np.cumsum(n) - n), n) + np.arange(int(n.sum()))
    g_lo, g_hi, c_hi_p = glo[gi], ghi[gi], p_hi[pi]
    c_lo = np.maximum(g_lo, p_lo[pi])
    if tail_ns is None:
        waited_send = np.zeros(len(pi), dtype=bool)
    else:
        nxt = np.where(has_next[pi], np.minimum(g_hi, p_next[pi]), g_hi)
        waited_send = (g_hi >= c_hi_p) & (nxt <= c_hi_p + int(tail_ns))
    waited = np.where(p_send[pi], waited_send, c_hi_p <= g_hi)
    c_hi = np.where(waited, np.minimum(g_hi, c_hi_p), np.minimum(g_hi, p_call_end[pi]))
    keep = c_hi > c_lo
    gi, pi, c_lo, c_hi = gi[keep], pi[keep], c_lo[keep], c_hi[keep]
    # islands per gap: by (gap, start), a part opens one when it starts after every earlier part of
    # its gap ended (the running max of the ends, offset by the gap so it never crosses one). Parts
    # of one gap with the same start may come in any order: the later never opens an island (it
    # starts before the earlier ended), so the islands and their sums are the same.
    w = _bits(int((ghi - glo).max()))
    if _bits(ng) + w > 63:
        return None
    o = np.argsort((gi << w) | (c_lo - glo[gi]))
    gi, pi, c_lo, c_hi = gi[o], pi[o], c_lo[o], c_hi[o]
    run_max = np.maximum.accumulate((gi << w) | (c_hi - glo[gi]))
    opens = np.ones(len(gi), dtype=bool)
    opens[1:] = (gi[1:] != gi[:-1]) | (c_lo[1:] - glo[gi[1:]] > (run_max[:-1] & ((1 << w) - 1)))
    heads = np.flatnonzero(opens)
    if not len(heads):
        return _empty()
    island = np.cumsum(opens) - 1
    part = c_hi - c_lo
    longest = np.maximum.reduceat(part, heads)
    src = _i64(peer)[pi]
    # per island: the peer of its longest part, a tie the lowest peer
    best_src = np.minimum.reduceat(np.where(part == longest[island], src, np.iinfo(np.int64).max), heads)
    rows = pa.array(go[gi[heads]])
    return pa.Table.from_arrays(
        [gaps.column(c).take(rows) for c in ("run", "rank", "step")]
        + [pa.array(a, pa.int64()) for a in (glo[gi[heads]], ghi[gi[heads]], c_lo[heads],
                                             np.maximum.reduceat(c_hi, heads))]
        + [pa.array(best_src, pa.int64()), pa.array(longest, pa.int64())],
        names=["run", "rank", "step", "lo_ns", "hi_ns", "c_lo", "c_hi", "src_rank", "part_ns"])


def _joint_columns(a: pa.Table, b: pa.Table, names=("run", "rank")) -> list[pa.ChunkedArray]:
    """Key columns ``names`` of the rows of ``a`` then ``b`` (run as text, the others int64)."""
    return [pa.chunked_array(a.column(c).cast(t).chunks + b.column(c).cast(t).chunks, type=t)
            for c in names for t in [pa.string() if c == "run" else pa.int64()]]


def _joint_key(gaps: pa.Table, calls: pa.Table):
    """One int64 per row of the gaps then the calls, equal exactly when (run, rank) are."""
    return _partition_key(_joint_columns(gaps, calls))


def _empty() -> pa.Table:
    return pa.table({"run": pa.array([], pa.string()), "rank": pa.array([], pa.int32()),
                     "step": pa.array([], pa.int32()),
                     **{c: pa.array([], pa.int64()) for c in ("lo_ns", "hi_ns", "c_lo", "c_hi", "src_rank", "part_ns")}})


def pipeline_p2p_islands(con) -> bool:
    """Make ``_pipeline_p2p_islands`` (pipeline_gaps.sql) in ``con`` from ``_pipeline_gaps`` and
    ``comms``; False (nothing made) when :func:`p2p_islands` cannot: the caller runs the SQL."""
    tail = con.execute("SELECT getvariable('p2p_wait_max_tail_ns')").fetchall()[0][0]
    out = p2p_islands(con.sql(_GAPS).to_arrow_table(), con.sql(_CALLS).to_arrow_table(), tail)
    return _save(con, "_pipeline_p2p_islands", out, _SELECT)


_STALLS_SELECT = ("SELECT CAST(run AS VARCHAR) AS run, CAST(rank AS INTEGER) AS rank, CAST(step AS INTEGER) AS step, "
                  "lo_ns, hi_ns, CAST(src_rank AS INTEGER) AS src_rank, CAST(stall_ns AS HUGEINT) AS stall_ns FROM {src}")


def p2p_stalls(islands: pa.Table) -> pa.Table | None:
    """``_pipeline_p2p_stalls`` over an Arrow table of ``_pipeline_p2p_islands`` (run, rank, step,
    lo_ns, hi_ns, c_lo, c_hi, src_rank); None when it cannot (NULL times or peers, keys that do not pack)."""
    if any(islands.column(c).null_count for c in ("lo_ns", "hi_ns", "c_lo", "c_hi", "src_rank")):
        return None
    packed = _partition_key([islands.column(c) for c in ("run", "rank", "step")])
    if packed is None:
        return None
    key, key_bits = packed
    lo, hi, c_lo, c_hi, src = (_i64(islands.column(c)) for c in ("lo_ns", "hi_ns", "c_lo", "c_hi", "src_rank"))
    n = len(key)
    if not _grouped(key, lo, hi):   # a gap's islands together (as p2p_islands makes them: no sort)
        rows = np.lexsort((hi, lo, key))
        key, lo, hi, c_lo, c_hi, src = key[rows], lo[rows], hi[rows], c_lo[rows], c_hi[rows], src[rows]
    else:
        rows = np.arange(len(key))
    first = np.ones(n, bool)
    if n:
        first[1:] = (key[1:] != key[:-1]) | (lo[1:] != lo[:-1]) | (hi[1:] != hi[:-1])
    heads = np.flatnonzero(first)
    if not len(heads):
        return pa.table({"run": pa.array([], pa.string()), "rank": pa.array([], pa.int32()), "step": pa.array([], pa.int32()),
                         **{c: pa.array([], pa.int64()) for c in ("lo_ns", "hi_ns", "src_rank", "stall_ns")}})
    part = c_hi - c_lo
    group = np.cumsum(first) - 1
    longest = np.maximum.reduceat(part, heads)
    best = np.minimum.reduceat(np.where(part == longest[group], src, np.iinfo(np.int64).max), heads)
    stall = np.minimum(np.add.reduceat(part, heads), hi[heads] - lo[heads])
    take = pa.array(rows[heads])
    return pa.Table.from_arrays(
        [islands.column(c).take(take) for c in ("run", "rank", "step")]
        + [pa.array(a, pa.int64()) for a in (lo[heads], hi[heads], best, stall)],
        names=["run", "rank", "step", "lo_ns", "hi_ns", "src_rank", "stall_ns"])


def _grouped(key: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> bool:
    """Whether each ``key``'s (run, rank, step) rows are together and in the order of their gaps' starts,
    one start having one end, so that each gap's rows are together."""
    if len(key) < 2:
        return True
    new = key[1:] != key[:-1]
    if len(np.unique(key[np.r_[0, np.flatnonzero(new) + 1]])) != int(new.sum()) + 1:   # a key in two places
        return False
    return not (~new & ((lo[1:] < lo[:-1]) | ((lo[1:] == lo[:-1]) & (hi[1:] != hi[:-1])))).any()


def pipeline_p2p_stalls(con) -> bool:
    """Make ``_pipeline_p2p_stalls`` (pipeline_gaps.sql) in ``con`` from ``_pipeline_p2p_islands``;
    False (nothing made) when :func:`p2p_stalls` cannot: the caller runs the SQL."""
    islands = con.sql("SELECT run, rank, step, lo_ns, hi_ns, c_lo, c_hi, src_rank FROM _pipeline_p2p_islands").to_arrow_table()
    return _save(con, "_pipeline_p2p_stalls", p2p_stalls(islands), _STALLS_SELECT)


_GAPS_SELECT = ("SELECT CAST(run AS VARCHAR) AS run, CAST(rank AS INTEGER) AS rank, CAST(step AS INTEGER) AS step, "
                "kind, lo_ns, hi_ns FROM {src}")


def gaps(busy: pa.Table) -> pa.Table | None:
    """``_pipeline_gaps`` over an Arrow table of ``_pipeline_busy`` (run, rank, step, s0, s1, lo_ns,
    hi_ns); None when it cannot (NULLs, a partition with two step spans, keys or times that do not pack)."""
    n = busy.num_rows
    if n == 0:
        return pa.table({"run": pa.array([], pa.string()), "rank": pa.array([], pa.int32()),
                         "step": pa.array([], pa.int32()), "kind": pa.array([], pa.string()),
                         "lo_ns": pa.array([], pa.int64()), "hi_ns": pa.array([], pa.int64())})
    if any(busy.column(c).null_count for c in ("step", "s0", "s1", "lo_ns", "hi_ns")):
        return None
    packed = _partition_key([busy.column(c) for c in ("run", "rank", "step")])
    if packed is None:
        return None
    key = packed[0]
    s0, s1, lo, hi = (_i64(busy.column(c)) for c in ("s0", "s1", "lo_ns", "hi_ns"))
    order = np.lexsort((hi, lo, key))
    key, s0, s1, lo, hi = key[order], s0[order], s1[order], lo[order], hi[order]
    first = np.ones(n, bool)
    first[1:] = key[1:] != key[:-1]
    heads = np.flatnonzero(first)
    part = np.cumsum(first) - 1
    if (s0 != s0[heads][part]).any() or (s1 != s1[heads][part]).any():
        return None
    base = lo[heads][part]                        # the partition's first start (its smallest)
    rel = hi - base
    span = int(rel.max()) + 1
    if rel.min() < 0 or len(heads) * span >= 1 << 62:
        return None
    shift = part * span                           # every partition's ends above the earlier ones'
    ends_max = np.maximum.accumulate(rel + shift) - shift + base
    prev = np.r_[0, ends_max[:-1]]                # the max end of the earlier segments of its partition
    gap = np.flatnonzero(~first & (lo > prev))
    last = np.r_[heads[1:], n] - 1
    src = pa.array(np.concatenate([order[heads], order[heads], order[gap]]))
    kind = np.repeat(np.array([0, 1, 2], np.int8), [len(heads), len(heads), len(gap)])
    return pa.Table.from_arrays(
        [busy.column("run").take(src), busy.column("rank").take(src), busy.column("step").take(src),
         pa.DictionaryArray.from_arrays(pa.array(kind), pa.array(["warmup", "cooldown", "gap"])).cast(pa.string()),
         pa.array(np.concatenate([s0[heads], ends_max[last], prev[gap]]), pa.int64()),
         pa.array(np.concatenate([lo[heads], s1[heads], lo[gap]]), pa.int64())],
        names=["run", "rank", "step", "kind", "lo_ns", "hi_ns"])


def pipeline_gaps(con) -> bool:
    """Make ``_pipeline_gaps`` (pipeline_gaps.sql) in ``con`` from ``_pipeline_busy``; False (nothing
    made) when :func:`gaps` cannot: the caller runs the SQL."""
    busy = con.sql("SELECT run, rank, step, s0, s1, lo_ns, hi_ns FROM _pipeline_busy").to_arrow_table()
    return _save(con, "_pipeline_gaps", gaps(busy), _GAPS_SELECT)


_SUMS_SELECT = ("SELECT CAST(run AS VARCHAR) AS run, CAST(rank AS INTEGER) AS rank, CAST(step AS INTEGER) AS step, "
                "CAST(kind AS VARCHAR) AS kind, CAST(caused_by_rank AS INTEGER) AS caused_by_rank, "
                "CAST(dur_ns AS HUGEINT) AS dur_ns FROM {src}")
_SUM_KINDS = ("warmup", "cooldown", "stall", "other")


def _sums(group: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first row of each distinct ``group`` and the sum of its ``values`` (exact int64)."""
    if not len(group):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.argsort(group, kind="stable")
    g = group[order]
    heads = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    return order[heads], np.add.reduceat(values[order], heads)


def idle_sums(gaps: pa.Table, stalls: pa.Table) -> pa.Table | None:
    """``_pipeline_idle_sums`` over Arrow tables of ``_pipeline_gaps`` (run, rank, step, kind, lo_ns,
    hi_ns) and ``_pipeline_p2p_stalls`` (run, rank, step, lo_ns, hi_ns, src_rank, stall_ns); None when
    it cannot (NULL times or peers, keys that do not pack, two gaps of one step with the same start).
    A gap's 'other' time is its length less the stall of the same (run, rank, step, lo_ns, hi_ns), as
    the SQL's join (a NULL step matches no stall)."""
    ng = gaps.num_rows
    if any(gaps.column(c).null_count for c in ("lo_ns", "hi_ns")) or \
            any(stalls.column(c).null_count for c in ("lo_ns", "hi_ns", "src_rank", "stall_ns")):
        return None
    cols = _joint_columns(gaps, stalls, ("run", "rank", "step"))
    packed = _partition_key(cols)
    if packed is None:
        return None
    key, key_bits = packed
    lo, hi = (np.concatenate([_i64(gaps.column(c)), _i64(stalls.column(c))]) for c in ("lo_ns", "hi_ns"))
    kind = gaps.column("kind")
    is_gap = _is(kind, "gap")
    length = hi[:ng] - lo[:ng]
    # each gap's stall: the stall of the same (key, lo_ns) -- one gap per start in a step -- and hi_ns
    step_known = ~np.concatenate([gaps.column("step").is_null().to_numpy(zero_copy_only=False),
                                  stalls.column("step").is_null().to_numpy(zero_copy_only=False)])
    stall_of_gap = np.zeros(ng, np.int64)
    g = np.flatnonzero(is_gap & step_known[:ng])
    s = ng + np.flatnonzero(step_known[ng:])
    if len(g) and len(s):
        t0 = int(min(lo[g].min(), lo[s].min()))
        tb = _bits(int(max(lo[g].max(), lo[s].max())) - t0)
        if key_bits + tb > 63:
            return None
        gk = (key[g] << tb) | (lo[g] - t0)
        go = np.argsort(gk)
        gk = gk[go]
        if (gk[1:] == gk[:-1]).any():
            return None   # two gaps of one step with one start: the SQL joins each with the stall
        sk = (key[s] << tb) | (lo[s] - t0)
        at = np.minimum(np.searchsorted(gk, sk), len(gk) - 1)
        hit = (gk[at] == sk) & (hi[g[go[at]]] == hi[s])
        stall_of_gap[g[go[at[hit]]]] = _i64(stalls.column("stall_ns"))[s[hit] - ng]
    parts = []   # (rows of the combined table, kind code, caused_by_rank or None, sums)
    edge = np.flatnonzero(~is_gap & (length > 0))
    kind_code = np.where(_is(kind, "warmup"), 0, np.where(_is(kind, "cooldown"), 1, -1))
    if (kind_code[edge] < 0).any():
        return None   # a kind the SQL would keep under its own name
    rows, total = _sums((key[edge] << 1) | kind_code[edge], length[edge])
    parts.append((edge[rows], kind_code[edge[rows]], None, total))
    stall = _i64(stalls.column("stall_ns"))
    src = _i64(stalls.column("src_rank"))
    pos = np.flatnonzero(stall > 0)
    if len(pos):
        src_lo = int(src[pos].min())
        sb = _bits(int(src[pos].max()) - src_lo)
        if key_bits + sb > 63:
            return None
        rows, total = _sums((key[ng + pos] << sb) | (src[pos] - src_lo), stall[pos])
        parts.append((ng + pos[rows], np.full(len(rows), 2), src[pos[rows]], total))
    other = length - stall_of_gap
    left = np.flatnonzero(is_gap & (other > 0))
    rows, total = _sums(key[left], other[left])
    parts.append((left[rows], np.full(len(rows), 3), None, total))
    take = pa.array(np.concatenate([p[0] for p in parts]).astype(np.int64))
    caused = np.concatenate([p[2] if p[2] is not None else np.zeros(len(p[0]), np.int64) for p in parts])
    caused_null = np.concatenate([np.full(len(p[0]), p[2] is None) for p in parts])
    codes = np.concatenate([p[1] for p in parts]).astype(np.int8)
    return pa.Table.from_arrays(
        [col.take(take) for col in cols]
        + [pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(_SUM_KINDS)),
           pa.array(caused, pa.int64(), mask=caused_null), pa.array(np.concatenate([p[3] for p in parts]), pa.int64())],
        names=["run", "rank", "step", "kind", "caused_by_rank", "dur_ns"])


def pipeline_idle_sums(con) -> bool:
    """Make ``_pipeline_idle_sums`` (pipeline_gaps.sql) in ``con`` from ``_pipeline_gaps`` and
    ``_pipeline_p2p_stalls``; False (nothing made) when :func:`idle_sums` cannot: the caller runs the SQL."""
    gaps_t = con.sql("SELECT run, rank, step, kind, lo_ns, hi_ns FROM _pipeline_gaps").to_arrow_table()
    stalls = con.sql("SELECT run, rank, step, lo_ns, hi_ns, src_rank, CAST(stall_ns AS BIGINT) AS stall_ns "
                     "FROM _pipeline_p2p_stalls").to_arrow_table()   # (a stall is at most its gap's length)
    return _save(con, "_pipeline_idle_sums", idle_sums(gaps_t, stalls), _SUMS_SELECT)


#: view -> the function that makes it in a connection (returns False to have the SQL run instead)
COMPUTED = {"_pipeline_gaps": pipeline_gaps, "_pipeline_p2p_islands": pipeline_p2p_islands,
            "_pipeline_p2p_stalls": pipeline_p2p_stalls, "_pipeline_idle_sums": pipeline_idle_sums}
