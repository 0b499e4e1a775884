"""Views computed in numpy instead of SQL, where one sort and a few vector passes do what DuckDB
plans as a window over every row (issue 17: the analyses' cost per row on very large runs).

The SQL stays the definition: ``activity.sql``'s ``activity_segments`` is
``_activity_sweep('activity_intervals', true)`` and :func:`activity_segments` gives the same rows;
overlap.sql's ``_exposed_islands`` and :func:`exposed_islands` the same (``tests/test_sweep_reuse.py``
compares them on random intervals and on real shipped runs: CPU, GPU, op timeline).
:func:`.modules.bind` makes a view listed in :data:`COMPUTED` with its function instead of its SQL,
unless the function declines (returns False).

Why faster: the SQL sorts every row by (run, rank, window_id, step, t) as rows of strings and
integers and runs window sums over them; here the partition and the time are packed into one int64,
the sort is one stable ``argsort`` of it (the rows come nearly sorted), the running counts one
``cumsum``.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: the categories of activity_intervals, in the sweep's priority order (its label)
_CATEGORIES = ("compute", "comm", "memory")

#: run and label as dictionaries: DuckDB reads them as VARCHAR without a string copied per segment
_SCHEMA = pa.schema([("run", pa.dictionary(pa.int32(), pa.string())), ("rank", pa.int32()), ("window_id", pa.int32()),
                     ("step", pa.int32()), ("lo_ns", pa.int64()), ("hi_ns", pa.int64()), ("dur_ns", pa.int64()),
                     ("label", pa.dictionary(pa.int8(), pa.string())),
                     ("n_compute", pa.int64()), ("n_comm", pa.int64()), ("n_memory", pa.int64())])

#: the view's column types in SQL (the macro's: its counts are BIGINT)
_SELECT = "SELECT * FROM {src}"

#: _exposed_islands' column types in SQL (exposed_ns a sum of BIGINT, so HUGEINT)
_ISLANDS_SELECT = ("SELECT CAST(run AS VARCHAR) AS run, CAST(rank AS INTEGER) AS rank, CAST(window_id AS INTEGER) AS window_id, "
                   "CAST(step AS INTEGER) AS step, lo_ns, hi_ns, CAST(exposed_ns AS HUGEINT) AS exposed_ns FROM {src}")


def _codes(col: pa.ChunkedArray) -> tuple[np.ndarray, int]:
    """Non-negative int64 codes of a column (equal values, equal codes; NULL its own code) and how
    many there can be (a DictionaryArray: its own indices)."""
    if pa.types.is_dictionary(col.type) or pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        if not pa.types.is_dictionary(col.type):
            enc = pc.dictionary_encode(col).combine_chunks()
        else:   # one dictionary for every chunk
            enc = col.unify_dictionaries().combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        idx = enc.indices.to_numpy(zero_copy_only=False)
        idx = np.where(enc.indices.is_null().to_numpy(zero_copy_only=False), len(enc.dictionary), idx)
        return idx.astype(np.int64), len(enc.dictionary) + 1
    nulls = col.is_null().to_numpy(zero_copy_only=False) if col.null_count else None
    v = pc.fill_null(col, 0).to_numpy().astype(np.int64, copy=False)
    if len(v) == 0:
        return v, 1
    lo = int(v.min())
    span = int(v.max()) - lo + 1
    out = v - lo
    if nulls is not None:
        out = np.where(nulls, span, out)
    return out, span + 1


def _partition_key(cols: list[pa.ChunkedArray]) -> tuple[np.ndarray, int] | None:
    """One int64 per row, equal exactly when all ``cols`` are equal (NULL = NULL), and its width in
    bits; None when the columns' ranges do not fit in 62 bits together."""
    key, bits = None, 0
    for col in cols:
        codes, n = _codes(col)
        width = max(int(n - 1).bit_length(), 1)
        bits += width
        if bits > 62:
            return None
        key = codes if key is None else (key << width) | codes
    return key, bits


def _order(key: np.ndarray, key_bits: int, t: np.ndarray) -> np.ndarray:
    """The permutation sorting the rows by (key, t): one argsort of a packed int64 when the key and
    the time span fit in 63 bits together (a run's timestamps span seconds to hours: 30-43 bits),
    else a lexsort of the two."""
    if len(t) == 0:
        return np.zeros(0, np.int64)
    t0 = int(t.min())
    span_bits = max((int(t.max()) - t0).bit_length(), 1)
    if key_bits + span_bits <= 63:
        return np.argsort((key << span_bits) | (t - t0), kind="stable")   # timsort: the rows come nearly sorted
    return np.lexsort((t, key))


#: the category as its code in SQL (:func:`_category_codes`): no string per interval fetched or encoded
_CATEGORY_CODE = ("CAST(CASE category WHEN 'compute' THEN 0 WHEN 'comm' THEN 1 WHEN 'memory' THEN 2 ELSE 3 END "
                  "AS TINYINT)")

#: bits per running count when the three are packed in one int64 (2 M intervals of one partition)
_BITS = 21

#: per category code (compute, comm, memory, other): its +1 in the packed running counts
_UNITS = np.array([1, 1 << _BITS, 1 << (2 * _BITS), 0], dtype=np.int64)


def _category_codes(col: pa.ChunkedArray) -> np.ndarray:
    """Per row: 0 compute, 1 comm, 2 memory, 3 anything else (NULL included); a column of integers
    holds these codes already (:data:`_CATEGORY_CODE`)."""
    if pa.types.is_integer(col.type):
        return pc.fill_null(col, 3).to_numpy().astype(np.int64, copy=False)
    enc = pc.dictionary_encode(col).combine_chunks()
    lookup = np.array([_CATEGORIES.index(v) if v in _CATEGORIES else 3 for v in enc.dictionary.to_pylist()] + [3],
                      dtype=np.int64)
    idx = pc.fill_null(enc.indices, len(enc.dictionary)).to_numpy(zero_copy_only=False)
    return lookup[idx]


def _largest_partition(k: np.ndarray) -> int:
    """The most rows of one partition in sorted keys ``k`` (deltas: two per interval)."""
    if len(k) == 0:
        return 0
    bounds = np.flatnonzero(k[1:] != k[:-1])
    return int(np.diff(np.concatenate([[-1], bounds, [len(k) - 1]])).max())


def sweep(tbl: pa.Table, per_step: bool, pack_limit: int = 1 << _BITS) -> pa.Table | None:
    """``_activity_sweep(tbl, per_step)`` (activity.sql) over an Arrow table of activity_intervals'
    columns (run, rank, window_id, step, category, lo_ns, hi_ns); None when the partition keys do not
    pack into one int64 (the caller then runs the SQL). The three running counts share one cumsum
    when every partition has fewer than ``pack_limit`` deltas (each count then fits its bits)."""
    n = tbl.num_rows
    runs = pc.dictionary_encode(tbl.column("run")).combine_chunks()  # once: the key and the output
    packed = _partition_key([runs] + [tbl.column(k) for k in ["rank", "window_id"] + (["step"] if per_step else [])])
    if packed is None:
        return None
    key, key_bits = packed
    lo, hi = _times(tbl)
    t = np.concatenate([lo, hi])
    key = np.concatenate([key, key])
    order = _order(key, key_bits, t)
    t, k = t[order], key[order]
    starts = order < n
    row = np.where(starts, order, order - n)
    unit = _UNITS[_category_codes(tbl.column("category"))[row]]
    # a segment from each delta to the next one of its partition (of equal timestamps only the last
    # starts one longer than zero, and its running sums count them all)
    nxt = np.flatnonzero((k[1:] == k[:-1]) & (t[1:] > t[:-1]))
    seg_lo, seg_hi = t[nxt], t[nxt + 1]
    # the three running counts packed in one int64: exact when each is in [0, 2^_BITS) wherever a
    # segment starts (no interval ends before it starts; fewer deltas in a partition than that)
    if _largest_partition(k) < min(pack_limit, 1 << _BITS) and not (hi < lo).any():
        run = np.cumsum(np.where(starts, unit, -unit))[nxt]
        n_compute, n_comm, n_memory = ((run >> (_BITS * i)) & ((1 << _BITS) - 1) for i in range(3))
    else:
        n_compute, n_comm, n_memory = (np.cumsum(np.where(starts, 1, -1) * ((unit >> (_BITS * i)) & 1))[nxt]
                                       for i in range(3))
    code = np.full(len(nxt), 3, np.int8)
    for i, counts in ((2, n_memory), (1, n_comm), (0, n_compute)):   # the highest priority last
        code[counts > 0] = i
    label = pa.DictionaryArray.from_arrays(pa.array(code, pa.int8()), pa.array(list(_CATEGORIES) + ["idle"], pa.string()))
    src = pa.array(row[nxt])
    step = tbl.column("step").take(src) if per_step else pa.nulls(len(nxt), pa.int32())
    return pa.Table.from_arrays(
        [pa.DictionaryArray.from_arrays(runs.indices.take(src).cast(pa.int32()), runs.dictionary),
         tbl.column("rank").take(src).cast(pa.int32()),
         tbl.column("window_id").take(src).cast(pa.int32()), step.cast(pa.int32()), pa.array(seg_lo, pa.int64()),
         pa.array(seg_hi, pa.int64()), pa.array(seg_hi - seg_lo, pa.int64()), label,
         pa.array(n_compute, pa.int64()), pa.array(n_comm, pa.int64()), pa.array(n_memory, pa.int64())],
        schema=_SCHEMA)


def _times(tbl: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """The lo_ns and hi_ns columns as int64 arrays."""
    return tuple(tbl.column(c).to_numpy().astype(np.int64, copy=False) for c in ("lo_ns", "hi_ns"))


def _save(con, view: str, out: pa.Table | None, select: str) -> bool:
    """Make ``view`` in ``con`` as a temporary view of ``select`` (the view's column types) over
    ``out``, registered in ``con`` (``{src}``: the connection holds it as long as the view); False
    (nothing made) when ``out`` is None. A view, not a table: DuckDB scans the Arrow columns about
    as fast as its own (0.28 against 0.27 CPU s for three scans of 3 M segments), and copying them
    into a table cost 0.55 s."""
    if out is None:
        return False
    con.register(f"_ta_np_{view}", out)
    con.execute(f"CREATE OR REPLACE TEMP VIEW {view} AS " + select.format(src=f"_ta_np_{view}"))
    return True


def _swept(con, view: str, source: str) -> bool:
    """Make ``view``, ``_activity_sweep(source, true)`` (activity.sql), in ``con`` (:func:`_save`);
    False (nothing made) when :func:`sweep` cannot: the caller runs the SQL."""
    tbl = con.sql(f"SELECT run, rank, window_id, step, {_CATEGORY_CODE} AS category, lo_ns, hi_ns "
                  f"FROM {source}").to_arrow_table()
    return _save(con, view, sweep(tbl, per_step=True), _SELECT)


def activity_segments(con) -> bool:
    """``activity_segments`` (activity.sql) from ``activity_intervals`` (:func:`_swept`)."""
    return _swept(con, "activity_segments", "activity_intervals")


def several_segments(con) -> bool:
    """``_activity_several_segments`` (activity.sql: the islands of several steps, each swept as one)
    from ``_activity_several`` (:func:`_swept`)."""
    return _swept(con, "_activity_several_segments", "_activity_several")


def islands(tbl: pa.Table) -> pa.Table | None:
    """overlap.sql's ``_exposed_islands`` over an Arrow table of comm segments (run, rank, window_id,
    step, lo_ns, hi_ns): per (run, rank, window_id, step), consecutive segments joined (one starting
    exactly where the previous ended joins it), with their summed length. None when the partition
    keys do not pack, or when two segments of a partition overlap (the sweep's never do; the SQL's
    running max is then needed)."""
    packed = _partition_key([tbl.column(k) for k in ("run", "rank", "window_id", "step")])
    if packed is None:
        return None
    key, key_bits = packed
    lo, hi = _times(tbl)
    order = _order(key, key_bits, lo)
    key, lo, hi = key[order], lo[order], hi[order]
    same = key[1:] == key[:-1]
    if (same & (lo[1:] < hi[:-1])).any():
        return None
    opens = np.ones(len(lo), dtype=bool)
    opens[1:] = ~same | (lo[1:] > hi[:-1])
    first = np.flatnonzero(opens)
    last = np.append(first[1:], len(lo))[:len(first)] - 1   # (none when there are no segments)
    src = pa.array(order[first])
    # an island's segments touch end to start: its summed length is its span
    return pa.Table.from_arrays([tbl.column(c).take(src) for c in ("run", "rank", "window_id", "step")]
                                + [pa.array(lo[first], pa.int64()), pa.array(hi[last], pa.int64()),
                                   pa.array(hi[last] - lo[first], pa.int64())],
                                names=["run", "rank", "window_id", "step", "lo_ns", "hi_ns", "exposed_ns"])


def exposed_islands(con) -> bool:
    """Make ``_exposed_islands`` (overlap.sql) in ``con`` from ``activity_segments``; False (nothing
    made) when :func:`islands` cannot: the caller runs the SQL."""
    tbl = con.sql("SELECT run, rank, window_id, step, lo_ns, hi_ns FROM activity_segments "
                  "WHERE label = 'comm'").to_arrow_table()
    return _save(con, "_exposed_islands", islands(tbl), _ISLANDS_SELECT)


#: view -> the function that makes it in a connection (returns False to have the SQL run instead)
COMPUTED = {"activity_segments": activity_segments, "_activity_several_segments": several_segments,
            "_exposed_islands": exposed_islands}
