"""Analyses as documented DuckDB SQL modules over the canonical views.

Each ``sql/<name>.sql`` file is one concern, readable without Python; this module loads them
into a connection in dependency order, sets their named parameters (DuckDB variables, documented
in :data:`PARAMETERS`), and returns their results as DataFrames. All analyses cover every rank.

    import traceanalyzer as ta
    from traceanalyzer import analyses
    con = ta.open("store")
    analyses.stragglers(con)             # DataFrame of findings, ranked by cost
"""
from __future__ import annotations

from importlib import resources
from typing import Any

import pandas as pd

#: SQL modules in dependency order.
MODULES = ("clock_offsets", "collectives", "phases", "stragglers")

#: Named parameters of the SQL modules: name -> (default, meaning). Units are in the names.
PARAMETERS: dict[str, tuple[Any, str]] = {
    "align_clocks": ("auto", "apply estimated clock offsets: 'auto' (only when the run spans several hosts), 'always', 'never'"),
    # 10 %: the OSDI'25 what-if study calls a job straggling when its slowdown S >= 1.1
    "straggler_min_delay_pct": (10.0, "a straggler costs its peers at least this % of the median step time per step"),
    "straggler_min_delay_ns": (1_000_000, "... and at least this many ns per step"),
    "straggler_min_excess_pct": (10.0, "... and was slower on its own: median excess in one phase >= this % of the step time"),
    "straggler_persistent_pct": (50.0, "flagged in at least this % of steps: 'persistent', else 'sporadic'"),
}


def _sql(name: str) -> str:
    return resources.files(__package__).joinpath("sql", f"{name}.sql").read_text()


def prepare(con, **params) -> Any:
    """Load every SQL module into ``con`` with the given parameters (defaults for the rest)."""
    unknown = set(params) - set(PARAMETERS)
    if unknown:
        from ..errors import TraceAnalyzerError
        raise TraceAnalyzerError(f"unknown analysis parameter(s): {', '.join(sorted(unknown))}; "
                                 f"known: {', '.join(PARAMETERS)}")
    for key, (default, _) in PARAMETERS.items():
        value = params.get(key, default)
        con.execute(f"SET VARIABLE {key} = ?", [value])
    for name in MODULES:
        con.execute(_sql(name))
    return con


def _connect(store_or_con):
    if hasattr(store_or_con, "execute"):
        return store_or_con
    from ..store import open_store
    return open_store(store_or_con)


def _query(store_or_con, sql: str, run: str | None, params: dict) -> pd.DataFrame:
    con = prepare(_connect(store_or_con), **params)
    where = "" if run is None else " WHERE run = $run"
    return con.execute(sql.format(where=where), {"run": run} if run is not None else {}).df()


def collectives(store_or_con, run: str | None = None, **params) -> pd.DataFrame:
    """One row per logical collective joined across ranks: arrival skew, last arriver, transfer
    time, waits, bytes, algbw/busbw."""
    return _query(store_or_con, "SELECT * FROM collective_instances{where} ORDER BY run, pg, seq", run, params)


def clock_offsets(store_or_con, run: str | None = None, **params) -> pd.DataFrame:
    """Estimated clock offset per rank (from collective completions), and whether it is applied."""
    return _query(store_or_con, "SELECT * FROM clock_offsets{where} ORDER BY run, rank", run, params)


def phases(store_or_con, run: str | None = None, **params) -> pd.DataFrame:
    """Forward / backward / optimizer / data-loading time per rank and step."""
    return _query(store_or_con, "SELECT * FROM step_phases{where} ORDER BY run, step, rank", run, params)


def stragglers(store_or_con, run: str | None = None, **params) -> pd.DataFrame:
    """Ranks that made their peers wait, ranked by the time they cost per step."""
    return _query(store_or_con, "SELECT * FROM straggler_findings{where} ORDER BY run, rank_order", run, params)


def straggler_steps(store_or_con, run: str | None = None, **params) -> pd.DataFrame:
    """Per rank and step: the delay it imposed on its peers (the evidence behind stragglers())."""
    return _query(store_or_con, "SELECT * FROM straggler_steps{where} ORDER BY run, step, rank", run, params)


def straggler_candidates(store_or_con, run: str | None = None, **params) -> pd.DataFrame:
    """Every rank's cost and excess, thresholds not applied (what stragglers() filters)."""
    return _query(store_or_con, "SELECT * FROM straggler_candidates{where} ORDER BY run, rank", run, params)
