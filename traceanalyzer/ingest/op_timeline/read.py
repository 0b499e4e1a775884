"""Reading an op timeline in blocks of whole ranks, so that a job of thousands of ranks (a hundred
million rows) never sits in memory at once.

An input is a list of *pieces*: the row groups of a Parquet file, or of each per-rank file of the
light collector, or one CSV table. :func:`scan` reads a few columns of every piece once (the
ranks, their coordinates, the op names; the time columns only when their unit must be inferred)
and notes each piece's rank range. When the pieces, in that order, never go back in rank (a file
sorted by rank, or per-rank files), :func:`blocks` reads about ``block_rows`` rows at a time and
hands over only whole ranks (a rank cut by a piece boundary waits for its next piece); otherwise
the whole table is read and split (an unsorted file costs its size in memory, as before).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...errors import TraceInputError

#: Rows converted at a time (the canonical tables of one block take ~0.5 kB a row; a block of
#: 2 M rows cost twice the CPU of 256 k ones: fresh pages for every array instead of reused memory).
BLOCK_ROWS = 262_144


@dataclass
class Piece:
    path: Path
    row_group: int | None   # None: the whole file
    rows: int
    lo: int = 0             # smallest and largest rank of its rows (from scan)
    hi: int = -1


@dataclass
class Scan:
    """What :func:`scan` learned from the whole input."""
    columns: list[str]
    pieces: list[Piece]
    rows: int
    ops: list[str]                                    # every op name, in first-seen order
    op_counts: dict = field(default_factory=dict)     # op name -> rows
    coords: dict[int, tuple] = field(default_factory=dict)   # rank -> (dp, pp, tp, cp, ep)
    conflicts: list = field(default_factory=list)     # (rank, coords a, coords b)
    time_max: tuple[float, float] = (0.0, 0.0)        # max |start|, max duration (when asked)
    sorted_by_rank: bool = True
    vpp_max: int = 0


def pieces_of(path: Path, files: list[Path] | None) -> tuple[list[Piece], pa.Schema | None]:
    """The pieces of ``files`` (per-rank files) or of ``path`` (one file); the schema of Parquet
    input (None for CSV)."""
    import pyarrow.parquet as pq
    out, schemas = [], []
    for f in files or [path]:
        try:
            with open(f, "rb") as fh:
                magic = fh.read(4)
        except OSError as exc:
            raise TraceInputError(f, f"cannot read op timeline ({exc.strerror or exc})") from None
        if magic != b"PAR1":
            if files:
                raise TraceInputError(f, "a per-rank op timeline file that is not Parquet")
            return [Piece(Path(f), None, -1)], None
        try:
            meta = pq.ParquetFile(f).metadata
            schemas.append(meta.schema.to_arrow_schema().remove_metadata())
        except (pa.ArrowInvalid, OSError) as exc:
            raise TraceInputError(f, f"unreadable op timeline ({str(exc).splitlines()[0]})") from None
        out += [Piece(Path(f), i, meta.row_group(i).num_rows) for i in range(meta.num_row_groups)]
    try:
        schema = pa.unify_schemas(schemas, promote_options="default") if len(schemas) > 1 else schemas[0]
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise TraceInputError(path, f"per-rank op timelines with different columns ({str(exc).splitlines()[0]})") from None
    return out, schema


def read_piece(piece: Piece, columns: list[str] | None = None, schema: pa.Schema | None = None) -> pa.Table:
    """One piece's rows (``columns`` only; missing ones as nulls when ``schema`` names them)."""
    try:
        if piece.row_group is None:
            import pyarrow.csv as pcsv
            t = pcsv.read_csv(piece.path)
            return t.select(columns) if columns else t
        import pyarrow.parquet as pq
        f = pq.ParquetFile(piece.path)
        have = set(f.schema_arrow.names)
        t = f.read_row_group(piece.row_group, columns=[c for c in columns if c in have] if columns else None)
    except OSError as exc:
        raise TraceInputError(piece.path, f"cannot read op timeline ({exc.strerror or exc})") from None
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise TraceInputError(piece.path, f"unreadable op timeline ({str(exc).splitlines()[0]})") from None
    if schema is not None:
        for name in (columns or schema.names):
            if name not in t.column_names:
                t = t.append_column(schema.field(name), pa.nulls(t.num_rows, schema.field(name).type))
        t = t.select(columns or schema.names)
    return t.replace_schema_metadata(None)


def scan(path: Path, pieces: list[Piece], schema, cols: dict, times: bool, csv_table: pa.Table | None = None) -> Scan:
    """One pass over ``pieces`` reading the rank, coordinate and op columns (``cols``: ours ->
    the file's name or None); ``times``: also the largest start and duration (unit inference)."""
    dims = ("dp", "pp", "tp", "cp", "ep")
    need = [cols["rank"], cols["op"]] + [cols[d] for d in dims if cols[d]]
    if times:
        need += [cols["start"], cols["duration"]]
    if cols.get("vpp"):
        need.append(cols["vpp"])
    vpp_max = 0
    ops: dict[str, int] = {}
    coords: dict[int, tuple] = {}
    conflicts = []
    top = longest = 0.0
    rows = 0
    for p in pieces:
        t = csv_table.select(need) if csv_table is not None else read_piece(p, need, schema)
        p.rows = t.num_rows
        rows += t.num_rows
        if t.num_rows == 0:
            continue
        rcol = t.column(cols["rank"])
        if rcol.null_count or not pa.types.is_integer(rcol.type):
            return _bad_ranks(path, cols["rank"], rcol)
        rank = rcol.to_numpy().astype(np.int64)
        p.lo, p.hi = int(rank.min()), int(rank.max())
        keys = [rank] + [_ints(path, t, cols[d]) if cols[d] else np.zeros(len(rank), np.int64) for d in dims]
        _coords(keys, coords, conflicts)
        op = t.column(cols["op"])   # a dictionary column is counted as it is (its cast was ~40 % of the scan)
        if op.null_count:   # an op without a type has no name to keep it under
            raise TraceInputError(path, f"op timeline column {cols['op']!r} has {op.null_count} empty value(s)")
        counts = pc.value_counts(op if pa.types.is_dictionary(op.type) else op.cast(pa.string()))
        for o, k in zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist()):
            ops[str(o)] = ops.get(str(o), 0) + k
        if cols.get("vpp"):
            vpp_max = max(vpp_max, int(pc.max(t.column(cols["vpp"])).as_py() or 0))
        if times:
            for c, is_dur in ((cols["start"], False), (cols["duration"], True)):
                col = t.column(c)
                if pa.types.is_integer(col.type) or pa.types.is_floating(col.type):
                    v = pc.max(col if is_dur else pc.abs(col)).as_py()
                    if v is not None:
                        top, longest = (top, max(longest, float(v))) if is_dur else (max(top, float(v)), longest)
    s = Scan(list(schema.names) if schema is not None else csv_table.column_names, pieces, rows, list(ops), ops,
             coords, conflicts, (top, longest), vpp_max=vpp_max)
    order = sorted(range(len(pieces)), key=lambda i: (pieces[i].lo, pieces[i].hi))
    s.pieces = [pieces[i] for i in order if pieces[i].rows]
    s.sorted_by_rank = all(a.hi <= b.lo for a, b in zip(s.pieces, s.pieces[1:]))
    return s


def _bad_ranks(path, name, col):
    if col.null_count:
        raise TraceInputError(path, f"op timeline column {name!r} has {col.null_count} empty value(s)")
    raise TraceInputError(path, f"op timeline column {name!r} is not integer ({col.type})")


def _ints(path, t, name) -> np.ndarray:
    col = t.column(name)
    if col.null_count:
        raise TraceInputError(path, f"op timeline column {name!r} has {col.null_count} empty value(s)")
    try:
        return col.to_numpy().astype(np.int64)
    except (ValueError, TypeError, pa.ArrowInvalid):
        raise TraceInputError(path, f"op timeline column {name!r} is not integer ({col.type})") from None


def _coords(keys: list[np.ndarray], coords: dict, conflicts: list) -> None:
    """Add each rank's (dp, pp, tp, cp, ep) of these rows to ``coords``; a rank with two sets goes
    to ``conflicts``. O(rows): rows are grouped by rank (sorted first unless they are), then a
    rank's first set is compared with every row's."""
    rank = keys[0]
    order = None if len(rank) < 2 or (rank[1:] >= rank[:-1]).all() else np.argsort(rank, kind="stable")
    k = keys if order is None else [x[order] for x in keys]
    rank = k[0]
    first = np.flatnonzero(np.r_[True, rank[1:] != rank[:-1]])
    lead = np.repeat(first, np.diff(np.r_[first, len(rank)]))
    differ = np.zeros(len(rank), bool)
    for col in k[1:]:
        differ |= col != col[lead]
    at = lambda i: tuple(int(col[i]) for col in k[1:])  # noqa: E731
    for i in first.tolist():
        r, c = int(rank[i]), at(i)
        if coords.setdefault(r, c) != c:
            conflicts.append((r, coords[r], c))
    for i in np.flatnonzero(differ)[:1].tolist():
        conflicts.append((int(rank[i]), at(lead[i]), at(i)))


def blocks(s: Scan, schema, columns: list[str], block_rows: int = BLOCK_ROWS, rank_col: str = "rank",
           csv_table: pa.Table | None = None):
    """Tables of whole ranks, about ``block_rows`` rows each (all rows at once when the pieces
    are not in rank order)."""
    if csv_table is not None or not s.sorted_by_rank:
        t = csv_table.select(columns) if csv_table is not None else pa.concat_tables(
            [read_piece(p, columns, schema) for p in s.pieces])
        yield from _split(t, rank_col, block_rows)
        return
    parts, n = [], 0
    for i, p in enumerate(s.pieces):
        parts.append(read_piece(p, columns, schema))
        n += p.rows
        last = i == len(s.pieces) - 1
        if n < block_rows and not last:
            continue
        t = pa.concat_tables(parts)
        if not last and s.pieces[i + 1].lo == p.hi:   # the last rank continues in the next piece
            cut = pc.equal(t.column(rank_col), p.hi)
            carry, t = t.filter(cut), t.filter(pc.invert(cut))
            parts, n = [carry], carry.num_rows
        else:
            parts, n = [], 0
        if t.num_rows:
            yield from _cut(t, rank_col, block_rows)


def _cut(t: pa.Table, rank_col: str, block_rows: int):
    """A table sorted by rank as zero-copy slices of whole ranks, about ``block_rows`` rows each (a
    row group of the file may hold many: small blocks keep the conversion's arrays in the allocator's
    reused memory instead of fresh pages)."""
    if t.num_rows <= block_rows:
        yield t
        return
    rank = t.column(rank_col).to_numpy()
    if (rank[1:] < rank[:-1]).any():   # ranks interleaved inside a row group: sorted first
        yield from _split(t, rank_col, block_rows)
        return
    yield from _slices(t, rank, block_rows)


def _split(t: pa.Table, rank_col: str, block_rows: int):
    """A table in memory cut into blocks of whole ranks."""
    rank = t.column(rank_col).to_numpy().astype(np.int64)
    order = np.argsort(rank, kind="stable")
    yield from _slices(t.take(pa.array(order)), rank[order], block_rows)


def _slices(t: pa.Table, rank, block_rows: int):
    """Zero-copy slices of ``t`` (sorted by ``rank``) of about ``block_rows`` rows, whole ranks each."""
    lo = 0
    while lo < len(rank):
        hi = min(len(rank), lo + block_rows)
        if hi < len(rank):
            hi = int(np.searchsorted(rank, rank[hi - 1], "right"))
        yield t.slice(lo, hi - lo)
        lo = hi
