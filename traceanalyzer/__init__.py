"""traceanalyzer: trace-driven workload analysis for distributed deep-learning training.

    import traceanalyzer as ta
    ta.ingest(["traces/ddp_gloo_2rank"], "store")      # Kineto JSON -> Parquet store
    s = ta.open("store")                               # the store: runs, analyses, replay, report, export
    s.sql("SELECT rank, count(*) FROM comms GROUP BY rank").df()   # ... and DuckDB over its views
    s.analysis("stragglers")

Analysis needs no torch; only :mod:`traceanalyzer.collect` and :mod:`traceanalyzer.workloads` do.
"""
__version__ = "0.1.0"

from . import ingest as _ingest_package  # noqa: E402,F401 - the subpackage first, so that the function below wins
from .errors import StoreError, TraceAnalyzerError, TraceInputError  # noqa: E402


def ingest(paths, store, run=None, rank=None, workers=None, progress=False, nccl_logs=(), dask=None):
    """Parse trace files (or folders) into ``store`` in one atomic commit; returns an ``IngestReport``
    (:func:`traceanalyzer.ingest.batch.ingest`, which documents the arguments; ``dask="local:4"`` or
    ``"tcp://HOST:8786"`` parses on a Dask cluster)."""
    from .ingest.batch import ingest as _ingest
    return _ingest(paths, store, run=run, rank=rank, workers=workers, progress=progress, nccl_logs=nccl_logs,
                   dask=dask)


def __getattr__(name):
    # pyarrow and msgspec load on first use: `import traceanalyzer` and the CLI's --help stay light
    if name == "IngestReport":
        from .ingest.batch import IngestReport
        return IngestReport
    raise AttributeError(f"module 'traceanalyzer' has no attribute {name!r}")


def open(store):  # noqa: A001 - the natural name: ta.open(store)
    """The store as a :class:`~traceanalyzer.session.Session`: its runs, analyses, replay, report and
    export, and every method of the DuckDB connection over its views (``sql``, ``execute``, ...)."""
    from .session import Session
    return Session(store)


def info(store):
    """One row per (run, rank) of ``store``: windows, steps, events, kernels, collectives, span."""
    from .analyses.summary import info as _info
    return _info(store)


__all__ = ["ingest", "open", "info", "IngestReport", "TraceAnalyzerError", "TraceInputError", "StoreError", "__version__"]
