"""Writing an op timeline's per-rank tables into the staging folder: at thousands of ranks and
~100 M rows the writing was half of an op timeline's ingest, and most of a rank's fixed cost
(7 files a rank: 8,192 ranks are 57 k files).

- the big tables (``events``, ``comms``): dictionary encoding only for text columns (the time and
  id columns are distinct per row: the writer's dictionary attempt was wasted work), written from the
  built tables' dictionary columns as they are (no hashing of every string; the Arrow schema is not
  stored, so a reader sees the strings the Parquet types say, as in any other file), no min/max
  statistics for text (``args_json`` compared per row), delta encoding for the time and id
  columns (increasing per rank), LZ4 (benchmarks/RESULTS.md, issue 17). With zstd level 1 these
  options took ~40 % less CPU than the store's defaults (zstd, a dictionary tried for every column,
  statistics for all) for files half the size, read as fast by DuckDB; LZ4 (session 34) writes with
  a quarter less CPU again (the ingest of 2,048 ranks 17-19 % shorter) and reads ~4 % cheaper in the
  analyses' map, for files ~25 % larger than zstd level 1's;
- the small ones (``ranks``, ``threads``, ``process_groups``, ``steps``, ``flows``; a few rows per
  rank): no compression, dictionary or statistics (a file's fixed cost is per column and option);
  the empty ``flows`` file is the same bytes for every rank: made once;
- each Parquet file is made in memory and written with one ``write`` (no file system look-up per
  file), named ``<uuid>-<table>.parquet`` in the staging folder (no folder per rank).

The values written are those of the tables: only the encoding differs from
:func:`traceanalyzer.store.files.write_table`'s defaults. What else a rank's
:class:`~traceanalyzer.ingest.batch.TraceSummary` holds is what :func:`~traceanalyzer.ingest.batch._stage`
gives a Kineto trace's tables.
"""
from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ... import schema as S
from ...errors import TraceInputError

BIG = ("events", "comms")
#: delta-encoded columns of the big tables: increasing within a rank
DELTA_COLUMNS = ("event_id", "comm_id", "ts_ns", "start_ts_ns", "end_ts_ns", "enqueue_ts_ns",
                 "enqueue_event_id", "exec_event_id")
#: the big tables' codec (see the module's docstring)
COMPRESSION = "lz4"
ROW_GROUP_ROWS = 256 * 1024

_options: dict[tuple, dict] = {}
_empty: dict[tuple, bytes] = {}


def write_options(name: str, schema: pa.Schema) -> dict:
    """Keyword arguments for ``pyarrow.parquet.write_table`` of table ``name`` with ``schema``."""
    key = (name, tuple(schema.names), tuple(map(str, schema.types)))
    if key not in _options:
        if name in BIG:
            text = [f.name for f in schema if _is_text(f.type)]
            _options[key] = {"compression": COMPRESSION, "use_dictionary": text,
                             "write_statistics": [f.name for f in schema if not _is_text(f.type)],
                             "column_encoding": {c: "DELTA_BINARY_PACKED" for c in DELTA_COLUMNS if c in schema.names},
                             "row_group_size": ROW_GROUP_ROWS, "store_schema": False}
        else:
            _options[key] = {"compression": "none", "use_dictionary": False, "write_statistics": False,
                             "row_group_size": ROW_GROUP_ROWS}
    return _options[key]


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or (pa.types.is_dictionary(t) and pa.types.is_string(t.value_type))


def parquet_bytes(name: str, table: pa.Table) -> bytes:
    """Table ``name`` as the bytes of a Parquet file (an empty table's made once per schema)."""
    key = (name, table.schema)
    if table.num_rows == 0 and key in _empty:
        return _empty[key]
    buf = pa.BufferOutputStream()
    pq.write_table(table, buf, **write_options(name, table.schema))
    data = buf.getvalue().to_pybytes()
    if table.num_rows == 0:
        _empty[key] = data
    return data


def unknown_comms(comms: pa.Table) -> dict[str, int]:
    """:func:`traceanalyzer.ingest.batch.unknown_comms` of a rank's comms (the same counts, fewer
    Arrow calls: it runs once per rank)."""
    if comms.num_rows == 0:
        return {}
    size = pc.sum(pc.and_(pc.is_null(comms["in_bytes"]), pc.not_equal(pc.fill_null(comms["op"], ""), "barrier")))
    group = pc.sum(pc.and_(pc.invert(comms["is_p2p"]), pc.is_null(comms["pg_name"])))
    out = {"size": int(size.as_py() or 0), "group": int(group.as_py() or 0), "ops": comms.num_rows, "shapes_on": 0}
    return out if out["size"] or out["group"] else {}


def stage_all(path: str, built, staging: str) -> list:
    """Stage every rank of ``built`` (:func:`traceanalyzer.ingest.op_timeline.load`); one
    :class:`~traceanalyzer.ingest.batch.TraceSummary` per rank."""
    from ..batch import TraceSummary
    if not Path(staging).is_dir():  # a cluster's worker without the store, or an ingest already given up
        raise TraceInputError(path, f"the store's staging folder {staging} is not there on this machine: "
                                    "the workers of a cluster need the store on a shared file system")
    trace = str(Path(path).resolve())
    out = []
    for b in built:
        prefix = f"{staging}/{uuid.uuid4().hex}-"
        staged = {}
        for name, table in b.tables.items():
            table = table.select(S.TABLES[name].column_names)
            staged[name] = f"{prefix}{name}.parquet"
            with open(staged[name], "wb") as fh:
                fh.write(parquet_bytes(name, table))
        counts = {name: table.num_rows for name, table in b.tables.items()}
        out.append(TraceSummary(trace, b.rank, b.rank_source, b.start_ts_ns, b.end_ts_ns, counts, dict(b.skipped),
                                staged, unknown=unknown_comms(b.tables["comms"])))
    return out
