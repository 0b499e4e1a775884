"""Run selection, in one place: which run of a store a command means, and the one error when that
is not clear ("several runs ...: pass --run", "no run 'X': runs are ...").

Every caller (analyze, diff, replay and its what-ifs, report, export, desync, ``rm``, the session
and the CLI) picks its run here. ``con`` is a DuckDB connection with the store's views
(:func:`traceanalyzer.store.files.open_store` or ``analyses.connect``); ``table`` is the view whose
runs count (``ranks``: every ingested run; ``steps``: runs the replay can model; ``fr_dumps``: runs
with Flight Recorder dumps).
"""
from __future__ import annotations

from ..errors import TraceAnalyzerError


def store_runs(con, table: str = "ranks") -> list[str]:
    """The runs that have rows in ``table`` (a store view), sorted."""
    return [r for (r,) in con.execute(f"SELECT DISTINCT run FROM {table} ORDER BY run").fetchall()]


def _names(runs: list[str]) -> str:
    return ", ".join(runs) or "none"


def no_run_message(run: str, runs: list[str], what: str = "runs") -> str:
    """The one line for a run the store does not hold."""
    return f"no run '{run}': {what} are {_names(runs)}"


def several_runs_message(runs: list[str], flag: str = "--run", what: str = "runs") -> str:
    """The one line for a command that needs one run on a store that holds several (or none)."""
    if not runs:
        return f"the store holds no {what}; ingest traces first"
    return f"store has several {what} ({_names(runs)}): pass {flag}"


def resolve_run(con, run: str | None, where: object = "store", table: str = "ranks", flag: str = "--run",
                what: str = "runs") -> str:
    """The one run a command works on: ``run`` if ``table`` has it, else the store's only run;
    otherwise a one-line :class:`TraceAnalyzerError` that starts with ``where`` (the store path,
    or the model that asked)."""
    runs = store_runs(con, table)
    if run is None:
        if len(runs) != 1:
            raise TraceAnalyzerError(f"{where}: {several_runs_message(runs, flag, what)}")
        return runs[0]
    if run not in runs:
        raise TraceAnalyzerError(f"{where}: {no_run_message(run, runs, what)}")
    return run


def select_runs(con, run: str | None, where: object = "store", table: str = "ranks") -> list[str]:
    """The runs a command that takes "one run or every run" works on: ``[run]`` (checked), else
    every run of ``table`` (an empty store is an error: nothing to work on)."""
    runs = store_runs(con, table)
    if not runs:
        raise TraceAnalyzerError(f"{where}: {several_runs_message(runs)}")
    if run is not None and run not in runs:
        raise TraceAnalyzerError(f"{where}: {no_run_message(run, runs)}")
    return [run] if run is not None else runs
