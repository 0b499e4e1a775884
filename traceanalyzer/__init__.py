"""traceanalyzer: trace-driven workload analysis for distributed deep-learning training.

    import traceanalyzer as ta
    ta.ingest(["traces/ddp_gloo_2rank"], "store")      # Kineto JSON -> Parquet store
    con = ta.open("store")                             # DuckDB connection with the canonical views
    con.sql("SELECT rank, count(*) FROM comms GROUP BY rank").df()

Analysis needs no torch; only :mod:`traceanalyzer.collect` and :mod:`traceanalyzer.workloads` do.
"""
__version__ = "0.1.0"

from .errors import StoreError, TraceAnalyzerError, TraceInputError  # noqa: E402
from .ingest.batch import IngestReport, ingest  # noqa: E402


def open(store):  # noqa: A001 - the natural name: ta.open(store)
    """A DuckDB connection with one view per canonical table over ``store``."""
    from .analyses import connect
    return connect(store)


def info(store):
    """One row per (run, rank) of ``store``: windows, steps, events, kernels, collectives, span."""
    from .analyses.summary import info as _info
    return _info(store)


__all__ = ["ingest", "open", "info", "IngestReport", "TraceAnalyzerError", "TraceInputError", "StoreError", "__version__"]
