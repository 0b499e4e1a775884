"""``ta.open(store)``: the one entry object for notebooks and scripts.

    import traceanalyzer as ta
    s = ta.open("store")                     # or ta.open("s3://bucket/store") (docs/store.md)
    s.runs                                   # one row per run
    s.analysis("stragglers", run="ddp4")     # a DataFrame (as_relation=True: a lazy DuckDB relation)
    s.sql("SELECT rank, count(*) FROM comms GROUP BY rank").df()
    s.analyze(run="ddp4")                    # every analysis, saved in the store
    s.replay({"actions": [{"action": "idealize", "ranks": [2]}]}, run="ddp4")
    s.report("report.html", run="ddp4")
    s.export("ddp4_rank2.json", run="ddp4", rank=2)
    s.job_step_ns("ddp4")                    # the measured job step, as the replay defines it

It holds one DuckDB connection over the store (the canonical views, ``comms_nccl``, the saved
``result_*`` views), and everything else a DuckDB connection offers (``sql``, ``execute``,
``close``, ...) is that connection's own, so the object can be passed wherever a connection goes.
The CLI is formatting on top of these same calls.
"""
from __future__ import annotations

import os
from pathlib import Path


class Session:
    """An open store: its runs, its analyses, replay, report and export."""

    def __init__(self, store: str | os.PathLike):
        from .analyses import connect
        from .store.files import location
        self.path = location(store)  # a Path, or a Remote for an s3://... URL
        self.con = connect(self.path)

    def __getattr__(self, name):          # sql, execute, df, close ...: the DuckDB connection's
        return getattr(self.con, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.con.close()

    def __repr__(self) -> str:
        return f"<traceanalyzer store {str(self.path)!r}>"

    @property
    def runs(self):
        """One row per run: ranks, windows, world size, backend, time span."""
        return self.con.sql("SELECT * FROM runs ORDER BY run").df()

    def analyses(self) -> list[str]:
        """The names :meth:`analysis` takes (each one a saved result table, ``traceanalyzer schema``)."""
        from .analyses.results import ALL
        return list(ALL)

    def analysis(self, name: str, run: str | None = None, as_relation: bool = False, **params):
        """The result of analysis ``name`` (computed in SQL with ``params``; defaults for the rest)
        as a DataFrame, or as a lazy DuckDB relation with ``as_relation``. ``name`` is one of
        :meth:`analyses` (the saved results) or any view an SQL module defines (``straggler_steps``,
        ``pipeline_stall_causes``, ...: ``traceanalyzer/analyses/sql/``)."""
        from .analyses import modules, prepare
        from .analyses.results import ALL, compute, query
        from .store.runs import resolve_run
        if run is not None:
            resolve_run(self.con, run, where=self.path)   # an unknown run is an error, not an empty table
        if name not in ALL and name in modules.owner():
            prepare(self.con, views=[name], **params)
            where = "" if run is None else " WHERE run = $run"
            rel = self.con.sql(f"SELECT * FROM {name}{where}", params={"run": run} if run is not None else None)
            return rel if as_relation else rel.df()
        if as_relation:
            return query(self.con, name, run, **params)
        return compute(self.con, run=run, only=[name], **params)[name]

    def analyze(self, run: str | None = None, only: list[str] | None = None, save: bool = True, **params):
        """Every analysis (or ``only`` these) of ``run`` (default: every run), saved in the store
        unless ``save`` is False; returns name -> DataFrame."""
        from .analyses.results import analyze
        results = analyze(self.path, run=run, only=only, save_results=save, **params)
        if save:        # the saved result_* views are made when a store is opened
            self.con.close()
            from .analyses import connect
            self.con = connect(self.path)
        return results

    def info(self):
        """One row per (run, rank): windows, steps, events, kernels, collectives, time span."""
        from .analyses.summary import info
        return info(self.path)

    def replay(self, plan, run: str | None = None, straggler_metrics: bool = False, chrome_trace=None):
        """Replay ``run`` under ``plan`` (a dict or a JSON file: idealize / scale / scale_comm, or
        the structural pipeline / ddp plans), with the straggler metrics and a Chrome trace of the
        predicted timeline on request (:class:`~traceanalyzer.replay.job.ReplayRun`: ``.per_rank_ns``,
        ``.breakdown_ns``, ``.straggler``, and the model's ``.steps`` per rank and step,
        ``.identity_error``, ``.job_step_ns()``)."""
        from .replay import run as replay_run
        return replay_run(self.path, plan, run=run, straggler_metrics=straggler_metrics, chrome_trace=chrome_trace,
                          con=self.con)

    def job_step_ns(self, run: str) -> float | None:
        """The measured job step of ``run`` from its ``steps`` (per rank the mean step, then the
        slowest rank: ``replay.simulate.job_step_ns``, the number a replay's ``.job_step_ns()``
        predicts); None when the run has no steps."""
        from .replay.simulate import job_step_ns
        steps = self.con.execute("SELECT rank, dur_ns FROM steps WHERE run = $run", {"run": run}).df()
        return None if steps.empty else job_step_ns(steps, "dur_ns")

    def graph(self, run: str | None = None):
        """The replay's dependency graph of ``run`` (:class:`~traceanalyzer.replay.graph.Graph`), for
        :func:`traceanalyzer.replay.what_if`, ``identity`` and ``straggler_metrics``: stitched from the
        per-rank pieces saved in the store, built and saved by the first call (``replay.graph.pieces``)."""
        from .replay import build_graph
        return build_graph(self.path, run=run, con=self.con)

    def straggler_metrics(self, run: str | None = None) -> dict:
        """The OSDI'25 what-if metrics of ``run``: T, T_ideal, S, waste, S_w per rank, S_t per op type."""
        from .replay import straggler_metrics
        return straggler_metrics(self.graph(run))

    def diff(self, run_a: str, run_b: str, other: str | os.PathLike | None = None):
        """What changed from ``run_a`` to ``run_b`` (of ``other``, another store, when given), ranked
        by impact on the step (:class:`~traceanalyzer.analyses.diff.Diff`: ``.text()``, ``.to_json()``)."""
        from .analyses.diff import diff_runs
        return diff_runs(self.path, other, run_a=run_a, run_b=run_b)

    def report(self, path: str | os.PathLike | None = None, run: str | None = None, replay: bool = True,
               fmt: str | None = None):
        """The report of ``run`` (default: every run); written to ``path`` (HTML, Markdown or JSON
        by its extension) when given. Returns the :class:`~traceanalyzer.report.Report` (its figures are
        drawn when written as HTML, Markdown or PDF, or when a figure's ``png`` is first read)."""
        from .report import build_report, format_for, write_report
        listed = path is not None and format_for(path, fmt) == "json"   # JSON names the figures, draws none
        rep = build_report(self.path, run=run, replay=replay, figures="listed" if listed else True, render=False)
        if path is not None:
            write_report(rep, path, fmt)
        return rep

    def failures(self, report, rules: list[str]) -> list[str]:
        """The ``--fail-on`` rules (``"slowdown_pct>10"``, ...) that ``report`` (from :meth:`report`)
        breaks, one line each; empty: it passes."""
        from .report import failures
        return failures(report, rules)

    def export(self, path: str | os.PathLike, run: str | None = None, rank: int | None = None,
               overlays: bool = True, flows: bool = True, replay_plan=None) -> Path:
        """A Chrome/Perfetto trace of ``rank`` (None: every rank) of ``run``, written to ``path``."""
        from .export import export_trace, write_trace
        return write_trace(export_trace(self.path, run=run, rank=rank, overlays=overlays, flows=flows,
                                        replay_plan=replay_plan), path)

    @staticmethod
    def validate_nesting(trace) -> list[str]:
        """Perfetto's nesting rule checked on an exported trace (the path :meth:`export` returns, or
        the trace as a dict): one line per complete event Perfetto would drop; empty: valid."""
        if not isinstance(trace, dict):
            import gzip
            import json
            p = Path(trace)
            with (gzip.open(p, "rt") if p.suffix == ".gz" else open(p)) as f:
                trace = json.load(f, parse_float=str)   # exact µs text: ns_from_us parses it
        from .export.trace import validate_nesting
        return validate_nesting(trace)
