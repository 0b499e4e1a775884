"""What a report reads: the results ``analyze`` saved in the store, for one run.

The report never recomputes an analysis it can read: ``traceanalyzer analyze`` saved every result
table (``result_<name>`` views); a run whose results are missing, or were saved by another
``RESULTS_VERSION``, is analysed first (and saved, so the next report is fast). Only the
pipeline timeline figure needs intervals no result table keeps (when each stage sat idle): those
come from the analyses' ``pipeline_idle`` view, for pipeline runs only, computed from the run's
saved per-rank summaries when ``analyze`` saved them (no events read).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import pandas as pd

from .. import schema as S
from ..analyses import registry as _registry  # noqa: F401 - fills schema.RESULTS (the result columns)
from ..errors import TraceAnalyzerError
from ..store.files import location
from ..store.runs import select_runs


@dataclass
class RunData:
    """Everything one run's report is made from: result tables (schema.RESULTS columns) and the
    job's shape from the canonical tables."""
    run: str
    results: dict[str, pd.DataFrame]
    ranks: pd.DataFrame                 # one row per rank: host, world_size, backend, device, windows
    groups: pd.DataFrame                # process groups: pg_name, pg_desc, pg_size, pg_ranks
    params: dict                        # the analysis parameters the results were computed with
    pipeline_idle: pd.DataFrame | None = field(default_factory=pd.DataFrame)  # run, rank, stage, step, kind, caused_by_rank, lo_ns, hi_ns, dur_ns; None: a pipeline's, not loaded
    events: int = 0                     # stored events of the run (what a replay graph has to hold)
    caveats: list[str] = field(default_factory=list)  # what the report cannot know or corrected (caveats.py)

    def r(self, name: str) -> pd.DataFrame:
        """The result table ``name`` of this run (empty with the schema's columns if absent)."""
        df = self.results.get(name)
        return df if df is not None else pd.DataFrame(columns=S.RESULTS[name].column_names)


def _saved(store) -> dict:
    from ..store.files import read_manifest
    return read_manifest(store).extra.get("results", {})


#: The result tables a report is made from. The others (critical path, GPU launch statistics, ...)
#: are shown when ``analyze`` saved them, and not computed for the report alone: the critical path
#: is the costliest analysis and the findings do not depend on it.
REQUIRED = ("phases", "temporal_breakdown", "stragglers", "imbalance", "imbalance_ops", "all_to_all_balance",
            "collectives", "overlap", "exposed_comm", "serialized_comm", "kernel_breakdown", "pipeline_shape",
            "pipeline_bubbles", "pipeline_slow_stages", "launch_stats", "clock_offsets",  # launch_stats: the clock-offset caveat (caveats.py)
            "host_cpu")  # the CPU-contention caveat and evidence (caveats.py, findings.py)


def missing_results(store: str | os.PathLike, runs: list[str]) -> dict[str, list[str]]:
    """Per run of ``runs``: the required result tables not saved, or saved by another results version."""
    saved = _saved(location(store))
    out = {}
    for run in runs:
        names = [n for n in REQUIRED if run not in saved.get(n, {}).get("files", {})
                 or saved[n].get("version") != S.RESULTS_VERSION]
        if names:
            out[run] = names
    return out


def ensure_results(store: str | os.PathLike, runs: list[str], all_runs: list[str] | None, progress=None,
                   dask=None) -> None:
    """Run ``analyze`` for what is missing: once for the whole store when every run of ``all_runs``
    (the store's) misses the same tables (the SQL views cost about the same for one run as for
    all), else run by run (``all_runs`` None: some runs were asked for)."""
    from ..analyses.results import analyze
    missing = missing_results(store, runs)
    if not missing:
        return
    if progress:
        progress(f"analysing {', '.join(missing)} (results not saved in the store yet)")
    names = {tuple(v) for v in missing.values()}
    if all_runs is not None and set(missing) == set(all_runs) and len(names) == 1:
        analyze(store, only=list(names.pop()), dask=dask)
    else:
        for run, only in missing.items():
            analyze(store, run=run, only=only, dask=dask)


def load_run(con, store: str | os.PathLike, run: str, with_intervals: bool = True) -> RunData:
    """Read one run's saved results and job shape from an open store connection; with
    ``with_intervals``, a pipeline's idle intervals too (the timeline figure draws them; they
    cost most of the analyses' SQL chain), else its ``pipeline_idle`` is None (not loaded)."""
    results = {name: con.execute(f"SELECT * FROM result_{name} WHERE run = $run", {"run": run}).df()
               for name in S.RESULTS}
    ranks = con.execute("""
        SELECT rank, any_value(host) AS host, max(world_size) AS world_size, any_value(backend) AS backend,
               any_value(device) AS device, count(*) AS windows
        FROM ranks WHERE run = $run GROUP BY rank ORDER BY rank""", {"run": run}).df()
    groups = con.execute("""
        SELECT pg_name, any_value(pg_desc) AS pg_desc, max(pg_size) AS pg_size, any_value(pg_ranks) AS pg_ranks,
               count(DISTINCT rank) AS seen_on_ranks
        FROM process_groups WHERE run = $run GROUP BY pg_name ORDER BY pg_name""", {"run": run}).df()
    entry = _saved(location(store)).get("stragglers", {})
    events = con.execute("SELECT count(*) FROM events WHERE run = $run", {"run": run}).fetchone()[0]
    data = RunData(run=run, results=results, ranks=ranks, groups=groups, params=dict(entry.get("params", {})),
                   events=int(events))
    from .caveats import host_cpu_caveat, run_caveats
    data.caveats = run_caveats(con, run, results.get("launch_stats")) + host_cpu_caveat(results.get("host_cpu"))
    if not data.r("pipeline_shape").empty:
        data.pipeline_idle = pipeline_idle(con, run, data.params, store) if with_intervals else None
    return data


def pipeline_idle(con, run: str, params: dict, store=None) -> pd.DataFrame:
    """When each pipeline stage sat idle and why (warm-up, cool-down, stall on a peer, other):
    from the run's saved per-rank summaries and results when they are current (:func:`_over_saved`,
    no events read), else computed on ``con``."""
    from ..analyses import PARAMETERS, prepare
    p = {k: v for k, v in params.items() if k in PARAMETERS}
    own = _over_saved(store, run, p) if store is not None else None
    use = own or con
    try:
        prepare(use, views=["pipeline_idle"], **p)
        return use.execute("SELECT * FROM pipeline_idle WHERE run = $run ORDER BY rank, step, lo_ns", {"run": run}).df()
    finally:
        if own is not None:
            own.close()


def _over_saved(store, run: str, params: dict):
    """A connection of its own (its bound views hold this run only) whose rank views are the run's
    saved summaries and whose ``pipeline_shape`` is the saved result: ``pipeline_idle`` is then
    computed from compact per-rank tables and ``comms``, without reading events (a second report of
    a large pipeline run). None when the summaries are not current (never analysed, other params)."""
    from ..analyses import connect
    from ..analyses import modules as M
    from ..analyses import summaries as sm
    from ..analyses.results import effective_params
    p = effective_params(params)
    if sm.current(store, [run], p) != [run]:
        return None
    con = connect(store, run=run)    # the run's files only: comms of the other runs are not read
    try:
        if not sm.attach(con, store, [run], p) or not con.execute(
                "SELECT count(*) FROM result_pipeline_shape WHERE run = $run", {"run": run}).fetchone()[0]:
            con.close()
            return None
        M.provide(con, "pipeline_shape", f"SELECT * FROM result_pipeline_shape WHERE run = '{run.replace(chr(39), chr(39) * 2)}'")
    except BaseException:
        con.close()
        raise
    return con


def open_runs(store: str | os.PathLike, run: str | None, progress=None, dask=None):
    """Open ``store``, check ``run``, make sure its results are saved; returns (con, runs)."""
    from ..analyses import connect
    con = connect(store, run=run)   # with a run: its files and results only
    try:
        runs = select_runs(con, run, where=store)
        runs_all = None if run is not None else runs
    except TraceAnalyzerError:
        con.close()
        raise
    if missing_results(store, runs) and not _writable(store):
        _results_in_memory(con, store, runs, progress)  # a read-only store: computed, not saved
        return con, runs
    if missing_results(store, runs):
        con.close()
        ensure_results(store, runs, runs_all, progress, dask=dask)
        con = connect(store, run=run)  # the result views are created when the store is opened
    return con, runs


def _writable(store) -> bool:
    from ..store.files import writable
    return writable(location(store))


def _results_in_memory(con, store, runs: list[str], progress=None) -> None:
    """The analyses of ``runs`` computed on ``con`` and put behind its ``result_<name>`` views
    (the store cannot keep them: it is read-only)."""
    import warnings

    import pandas as pd

    from ..analyses.results import compute
    from ..errors import StoreWarning
    warnings.warn(StoreWarning(f"{store}: the store is read-only: results not saved in it"), stacklevel=3)
    if progress:
        progress(f"analysing {', '.join(runs)} in memory")
    parts = [compute(con, run=r) for r in runs]
    for name in S.RESULTS:
        df = pd.concat([p[name] for p in parts], ignore_index=True)
        con.register(f"_mem_result_{name}", df)
        con.execute(f"CREATE OR REPLACE VIEW result_{name} AS SELECT * FROM _mem_result_{name}")
