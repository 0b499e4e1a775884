"""Writing an op timeline's per-rank tables into the staging folder: Parquet options chosen for
these tables (thousands of ranks, ~100 M rows: the writing was half of an op timeline's ingest).

- the big tables (``events``, ``comms``): dictionary encoding only for text columns (the time and
  id columns are distinct per row: the writer's dictionary attempt was wasted work), no min/max
  statistics for text (``args_json`` compared per row), delta encoding for the time and id
  columns (increasing per rank), zstd level 1: ~40 % less CPU than the default options, files
  about half the size, read as fast or faster by DuckDB (benchmarks/RESULTS.md, issue 17 ingest);
- the small ones (``ranks``, ``threads``, ``process_groups``, ``steps``, ``flows``; a few rows per
  rank): no compression, dictionary or statistics (a file's fixed cost is per column and option).

The values written are those of the tables: only the encoding differs from
:func:`traceanalyzer.store.files.write_table`'s defaults.
"""
from __future__ import annotations

import pyarrow as pa

BIG = ("events", "comms")
#: delta-encoded columns of the big tables: increasing within a rank
DELTA_COLUMNS = ("event_id", "comm_id", "ts_ns", "start_ts_ns", "end_ts_ns", "enqueue_ts_ns",
                 "enqueue_event_id", "exec_event_id")
ZSTD_LEVEL = 1

_cache: dict[tuple, dict] = {}


def write_options(name: str, schema: pa.Schema) -> dict:
    """Keyword arguments for ``pyarrow.parquet.write_table`` of table ``name`` with ``schema``."""
    key = (name, tuple(schema.names))
    if key not in _cache:
        if name in BIG:
            text = [f.name for f in schema if pa.types.is_string(f.type)]
            _cache[key] = {"compression": "zstd", "compression_level": ZSTD_LEVEL, "use_dictionary": text,
                           "write_statistics": [f.name for f in schema if not pa.types.is_string(f.type)],
                           "column_encoding": {c: "DELTA_BINARY_PACKED" for c in DELTA_COLUMNS if c in schema.names}}
        else:
            _cache[key] = {"compression": "none", "use_dictionary": False, "write_statistics": False}
    return _cache[key]
