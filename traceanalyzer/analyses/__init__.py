"""Analyses as documented DuckDB SQL modules over the canonical views.

Each ``sql/<name>.sql`` file is one concern, readable without Python, and declares the modules it
reads (:mod:`.modules`); a query binds only the modules its view needs, once per connection. This
module sets their named parameters (DuckDB variables, documented in :data:`PARAMETERS`) and returns
their results as DataFrames; :mod:`.registry` lists what each analysis returns. All analyses cover
every rank.

    import traceanalyzer as ta
    from traceanalyzer import analyses
    con = ta.open("store")
    analyses.stragglers(con)             # DataFrame of findings, ranked by cost
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from . import modules as _modules
from . import params as _params
from . import registry  # noqa: F401 - the analyses, one record each; fills schema.RESULTS

if TYPE_CHECKING:  # pandas loads in ~0.5 s: only the results need it, and DuckDB imports it then
    import pandas as pd

#: Named parameters of the SQL modules: name -> (default, meaning), the 'sql' scope of the one
#: settings object (:data:`.params.SETTINGS`, which documents each). Units are in the names.
PARAMETERS: dict[str, tuple[Any, str]] = {k: (s.default, s.help) for k, s in _params.scope("sql").items()}


def prepare(con, modules=None, views=None, **params) -> Any:
    """Set the analyses' parameters in ``con`` (defaults for the rest) and bind the SQL modules
    that define ``views`` (or the ``modules`` named; with neither, every module), each with the
    modules it reads, unless ``con`` has them already."""
    unknown = set(params) - set(PARAMETERS)
    if unknown:
        from ..errors import TraceAnalyzerError
        raise TraceAnalyzerError(f"unknown analysis parameter(s): {', '.join(sorted(unknown))}; "
                                 f"known: {', '.join(PARAMETERS)}")
    for key, (default, _) in PARAMETERS.items():
        value = _params.check_parameter(key, params.get(key, default), default)
        con.execute(f"SET VARIABLE {key} = ?", [value])
    if views is not None:
        names = _modules.modules_for(views)
    else:
        names = list(modules) if modules is not None else sorted(_modules.modules())
    _modules.bind(con, names)
    return con


def bind_views(con, views) -> Any:
    """Bind the SQL modules defining ``views`` (and what they read) into ``con`` unless it has them,
    leaving the parameters already set as they are (the others get their defaults)."""
    have = {n for (n,) in con.execute("SELECT name FROM duckdb_variables()").fetchall()}
    for key, (default, _) in PARAMETERS.items():
        if key not in have:
            con.execute(f"SET VARIABLE {key} = ?", [default])
    _modules.bind(con, _modules.modules_for(views))
    return con


def connect(store_or_con, run: str | None = None):
    """A DuckDB connection over a store: the canonical views (:func:`traceanalyzer.store.open_store`)
    plus ``nccl_comm_map`` / ``comms_nccl`` (NCCL communicators matched to process groups,
    :mod:`.nccl_join`). With ``run``, over that run's files and saved results only: the cross-rank
    views read canonical tables (``comms``, ``steps``, ...), which over the whole store hold every
    run's rows, so that analysing one run of a store of 150 cost the work and memory of all 150
    (issue 18). Over the whole store when it has no such run (so that
    :func:`traceanalyzer.store.runs.resolve_run` names the runs it has). An open connection is
    returned as it is."""
    if hasattr(store_or_con, "execute"):
        return store_or_con
    from ..store import open_store
    from .nccl_join import register
    con = open_store(store_or_con, select=None if run is None else (lambda t: t.get("run") == run))
    try:
        if run is not None and not con.execute("SELECT count(*) FROM ranks").fetchone()[0]:
            con.close()
            con = open_store(store_or_con)
        register(con)
    except BaseException:
        con.close()
        raise
    return con


def _query(store_or_con, sql: str, run: str | None, params: dict) -> pd.DataFrame:
    view = re.search(r"FROM (\w+)", sql).group(1)
    con = prepare(connect(store_or_con), views=[view], **params)
    where = "" if run is None else " WHERE run = $run"
    return con.execute(sql.format(where=where), {"run": run} if run is not None else {}).df()


def _result(store_or_con, name: str, run: str | None, params: dict) -> pd.DataFrame:
    """Analysis ``name``'s rows as its registry record selects them (its view, in its order)."""
    a = registry.get(name)
    return _query(store_or_con, f"SELECT * FROM {a.view}{{where}} ORDER BY {a.order}", run, params)


def step_alignment(store_or_con, run: str | None = None, **params) -> pd.DataFrame:
    """Per rank and trace window: each ProfilerStep number and the aligned step (the same
    iteration's number on every rank, from the collectives and p2p transfers the steps share)."""
    return _query(store_or_con, "SELECT * FROM step_alignment{where} ORDER BY run, rank, window_id, step", run, params)


def collectives(store_or_con, run: str | None = None, **params) -> pd.DataFrame:
    """One row per logical collective joined across ranks: arrival skew, last arriver, transfer
    time, waits, bytes, algbw/busbw."""
    return _result(store_or_con, "collectives", run, params)


def clock_offsets(store_or_con, run: str | None = None, **params) -> pd.DataFrame:
    """Estimated clock offset per rank (from collective completions), and whether it is applied."""
    return _result(store_or_con, "clock_offsets", run, params)


def phases(store_or_con, run: str | None = None, **params) -> pd.DataFrame:
    """Forward / backward / optimizer / data-loading time per rank and step."""
    return _result(store_or_con, "phases", run, params)


def stragglers(store_or_con, run: str | None = None, **params) -> pd.DataFrame:
    """Ranks that made their peers wait, ranked by the time they cost per step."""
    return _result(store_or_con, "stragglers", run, params)


def straggler_steps(store_or_con, run: str | None = None, **params) -> pd.DataFrame:
    """Per rank and step: the delay it imposed on its peers (the evidence behind stragglers())."""
    return _query(store_or_con, "SELECT * FROM straggler_steps{where} ORDER BY run, step, rank", run, params)


def straggler_candidates(store_or_con, run: str | None = None, **params) -> pd.DataFrame:
    """Every rank's cost and excess, thresholds not applied (what stragglers() filters)."""
    return _query(store_or_con, "SELECT * FROM straggler_candidates{where} ORDER BY run, rank", run, params)


def overlap(store_or_con, run: str | None = None, per: str = "rank", **params) -> pd.DataFrame:
    """Communication/computation overlap (HTA's definition), per 'rank' or per 'step'."""
    view = {"rank": "overlap_ranks", "step": "overlap_steps"}[per]
    order = "run, rank" + (", step" if per == "step" else "")
    return _query(store_or_con, f"SELECT * FROM {view}{{where}} ORDER BY {order}", run, params)


def exposed_comm(store_or_con, run: str | None = None, **params) -> pd.DataFrame:
    """The largest exposed communication intervals (no compute at the same time; exposed_top per
    run), each with its collective and the compute before and after it."""
    return _result(store_or_con, "exposed_comm", run, params)


def exposed_intervals(store_or_con, run: str | None = None, **params) -> pd.DataFrame:
    """Every exposed communication interval (not attributed), largest first."""
    return _query(store_or_con, "SELECT * FROM exposed_intervals{where} ORDER BY run, rank_order", run, params)


def temporal_breakdown(store_or_con, run: str | None = None, per: str = "step", **params) -> pd.DataFrame:
    """Compute / communication / memory / idle time over merged intervals, per 'step' (and rank)
    or per 'rank' (all steps swept together)."""
    if per == "rank":
        return _result(store_or_con, "temporal_ranks", run, params)
    return _result(store_or_con, "temporal_breakdown", run, params)


def kernel_breakdown(store_or_con, run: str | None = None, top: int = 10, **params) -> pd.DataFrame:
    """The top kernels (GPU) or CPU operators per rank and category by total time."""
    where_top = f"rank_in_category <= {int(top)}"
    sql = "SELECT * FROM kernel_breakdown{where} ORDER BY run, rank, category, rank_in_category"
    df = _query(store_or_con, sql, run, params)
    return df[df["rank_in_category"] <= int(top)].reset_index(drop=True) if where_top else df


def imbalance(store_or_con, run: str | None = None, **params) -> pd.DataFrame:
    """Per rank: compute relative to the mean of the ranks (median over steps), findings flagged."""
    return _result(store_or_con, "imbalance", run, params)


def imbalance_steps(store_or_con, run: str | None = None, **params) -> pd.DataFrame:
    """Per step: the spread of compute over the ranks (max/mean, coefficient of variation)."""
    return _query(store_or_con, "SELECT * FROM imbalance_steps{where} ORDER BY run, step", run, params)


def all_to_all_balance(store_or_con, run: str | None = None, **params) -> pd.DataFrame:
    """MoE routing: all_to_all bytes sent/received per rank and their ratio to the mean."""
    return _query(store_or_con, "SELECT * FROM all_to_all_balance{where} ORDER BY run, rank", run, params)


def seqlen_signal(store_or_con, run: str | None = None, **params) -> pd.DataFrame:
    """Per rank: correlation of forward and backward durations across steps (sequence-length signal)."""
    return _result(store_or_con, "seqlen_signal", run, params)


def launch_stats(store_or_con, run: str | None = None, **params) -> pd.DataFrame:
    """CPU->GPU launch delay statistics per rank (empty for CPU-only traces)."""
    return _result(store_or_con, "launch_stats", run, params)


def queue_length(store_or_con, run: str | None = None, **params) -> pd.DataFrame:
    """Launched-but-not-started GPU operations per stream: max and time-weighted mean."""
    return _result(store_or_con, "queue_length", run, params)


def idle_breakdown(store_or_con, run: str | None = None, **params) -> pd.DataFrame:
    """Idle gaps per stream split into host wait / kernel wait / other (HTA's rule)."""
    return _result(store_or_con, "idle_breakdown", run, params)


# -- HTA compatibility (sql/hta_compat.sql) ------------------------------------------------------
# HTA 0.5.0's numbers reproduced from the store, per trace file (run, rank, window_id), in µs; see
# tests/reference/HTA_DEFINITIONS.md for HTA's rules and tests/reference/DEVIATIONS.md for how our
# own analyses above differ from them. ns_rounding=False is HTA's HTA_DISABLE_NS_ROUNDING=1.

def _hta_query(store_or_con, sql: str, run: str | None, params: dict, ns_rounding: bool) -> pd.DataFrame:
    con = connect(store_or_con)
    con.execute("SET VARIABLE hta_disable_ns_rounding = ?", [not ns_rounding])
    return _query(con, sql, run, params)


def hta_temporal_breakdown(store_or_con, run: str | None = None, ns_rounding: bool = True, **params) -> pd.DataFrame:
    """HTA's get_temporal_breakdown: kernel, idle, compute and non-compute time (µs, % of kernel time)."""
    return _hta_query(store_or_con, "SELECT * FROM hta_temporal_breakdown{where} ORDER BY run, rank, window_id",
                      run, params, ns_rounding)


def hta_overlap(store_or_con, run: str | None = None, ns_rounding: bool = True, **params) -> pd.DataFrame:
    """HTA's get_comm_comp_overlap: % of the merged NCCL time during which compute kernels run."""
    return _hta_query(store_or_con, "SELECT * FROM hta_overlap{where} ORDER BY run, rank, window_id",
                      run, params, ns_rounding)


def hta_kernel_type_breakdown(store_or_con, run: str | None = None, all_ranks: bool = False,
                              ns_rounding: bool = True, **params) -> pd.DataFrame:
    """HTA's kernel-type (Venn) table per trace file, or summed over the run's ranks as HTA
    publishes it (``all_ranks=True``)."""
    if all_ranks:
        sql = "SELECT * FROM hta_kernel_type_all_ranks{where} ORDER BY run, sum_us DESC, kernel_type"
    else:
        sql = "SELECT * FROM hta_kernel_type_breakdown{where} ORDER BY run, rank, window_id, sum_us DESC, kernel_type"
    return _hta_query(store_or_con, sql, run, params, ns_rounding)


def hta_kernel_stats(store_or_con, run: str | None = None, top: int | None = None, ns_rounding: bool = True,
                     **params) -> pd.DataFrame:
    """HTA's per-kernel table (sum/max/min/mean/std µs per name and kernel type, all streams pooled),
    with a count; ``top`` keeps the first names of each type."""
    df = _hta_query(store_or_con, "SELECT * FROM hta_kernel_stats{where} "
                    "ORDER BY run, rank, window_id, kernel_type, rank_in_type", run, params, ns_rounding)
    return df if top is None else df[df["rank_in_type"] <= int(top)].reset_index(drop=True)


def hta_window(store_or_con, run: str | None = None, ns_rounding: bool = True, **params) -> pd.DataFrame:
    """The window HTA analyses per trace file: µs rounding, ProfilerStep names, last-step cut."""
    return _hta_query(store_or_con, "SELECT * FROM hta_window{where} ORDER BY run, rank, window_id",
                      run, params, ns_rounding)


def bubbles(store_or_con, run: str | None = None, **params) -> pd.DataFrame:
    """Pipeline bubbles per stage and step: warm-up, cool-down, stalls (by cause), theoretical share."""
    return _result(store_or_con, "pipeline_bubbles", run, params)


def pipeline_shape(store_or_con, run: str | None = None, **params) -> pd.DataFrame:
    """Detected pipeline: stages, stages per rank, micro-batches, schedule, theoretical bubble %."""
    return _result(store_or_con, "pipeline_shape", run, params)


def stall_causes(store_or_con, run: str | None = None, **params) -> pd.DataFrame:
    """Which stage held the others up: stall time charged to each rank per step, worst first."""
    return _query(store_or_con, "SELECT * FROM pipeline_stall_causes{where} ORDER BY run, pipeline_id, rank_order", run, params)


def slow_stages(store_or_con, run: str | None = None, **params) -> pd.DataFrame:
    """Pipeline stages whose own time exceeds the others' (findings flagged), largest excess first."""
    return _result(store_or_con, "pipeline_slow_stages", run, params)


def imbalance_ops(store_or_con, run: str | None = None, **params) -> pd.DataFrame:
    """Which kernels/operators the ranks spend unevenly: per name, max/mean over ranks."""
    return _query(store_or_con, "SELECT * FROM imbalance_ops{where} ORDER BY run, rank_order", run, params)
