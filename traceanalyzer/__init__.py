"""traceanalyzer: trace-driven workload analysis for distributed deep-learning training.

    import traceanalyzer as ta
    ta.ingest(["traces/ddp_gloo_2rank"], "store")      # Kineto JSON -> Parquet store
    con = ta.open("store")                             # DuckDB connection with the canonical views
    con.sql("SELECT rank, count(*) FROM comms GROUP BY rank").df()

Analysis needs no torch; only :mod:`traceanalyzer.collect` and :mod:`traceanalyzer.workloads` do.
"""
__version__ = "0.1.0"

from .errors import StoreError, TraceAnalyzerError, TraceInputError  # noqa: E402
from .ingest import IngestReport, ingest  # noqa: E402
from .store import open_store as open  # noqa: E402,A001
from .info import info  # noqa: E402

__all__ = ["ingest", "open", "info", "IngestReport", "TraceAnalyzerError", "TraceInputError", "StoreError", "__version__"]
