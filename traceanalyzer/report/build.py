"""Assemble a report: for each run, its shape, ranked findings, metrics and figures.

The report is a plain data structure (:class:`Report`) that the HTML, Markdown and JSON writers
render; nothing here formats output, so the three formats always say the same thing.
"""
from __future__ import annotations

import datetime as _dt
import os
from dataclasses import dataclass, field

import pandas as pd

from .. import __version__
from .. import schema as S
from .caveats import shared_host_caveat
from .figures import Figure, plan_figures, render_figures
from .findings import median_step_ns, rank_findings
from .load import RunData, load_run, open_runs
from .metrics import run_metrics
from .negatives import negatives
from .record import Finding
from .shape import job_shape, step_times
from .whatif import REPLAY_MAX_EVENTS, RunReplay, apply_replay, confirm_by_replay
from .where import annotate

#: Version of the report's JSON document; bump when a key changes meaning.
REPORT_VERSION = "1.1"   # 1.1: replay what-ifs (findings[].replay, recoverable_source, runs[].replay)


@dataclass
class RunReport:
    run: str
    shape: dict
    step_times: pd.DataFrame            # rank, steps, median_ns, min_ns, max_ns, compute_ns
    findings: list[Finding]
    negatives: list[str]                # what was looked for and not found
    metrics: dict
    figures: list[Figure] = field(default_factory=list)
    figure_errors: list[str] = field(default_factory=list)   # figures that could not be drawn, and why
    data: RunData | None = None         # the results it was made from (tables in the HTML)
    replay: RunReplay = field(default_factory=lambda: RunReplay("off", "replay not asked for"))
    caveats: list[str] = field(default_factory=list)   # unknown sizes/groups, clock offsets (caveats.py)


@dataclass
class Report:
    store: str
    runs: list[RunReport]
    created: str
    versions: dict


def build_run(data: RunData, figures: bool | str = True, store=None, replay: bool = True,
              replay_max_events: int = REPLAY_MAX_EVENTS, render: bool = True, con=None) -> RunReport:
    """One run's report; with ``replay`` (and the ``store``; ``con``: a connection over it already
    open), rank findings are re-ranked by their what-if replay (whatif.py), falling back to the
    analyses' estimates if replay fails. With ``figures``, the figures that apply to the run; drawn
    here with ``render``, else when a writer first needs their PNG (:func:`render_pending`; the JSON
    report never does); ``"listed"``: only named, titled and captioned (see :func:`build_report`)."""
    findings = rank_findings(data)
    rp = apply_replay(store, data, findings, replay_max_events, con=con) if replay and store is not None \
        else RunReplay("off", "replay not asked for")
    findings = confirm_by_replay(data, findings)
    annotate(data, findings, median_step_ns(data))
    figs, errors = plan_figures(data) if figures else ([], [])
    if render and figures is True:
        figs, errors = render_figures(figs, errors)
    return RunReport(run=data.run, shape=job_shape(data), step_times=step_times(data), findings=findings,
                     negatives=negatives(data, findings), metrics=run_metrics(data, findings),
                     figures=figs, figure_errors=errors, data=data, replay=rp,
                     caveats=list(data.caveats) + shared_host_caveat(
                         data.ranks, any((f.replay or {}).get("status") == "ok" for f in findings)))


def build_report(store: str | os.PathLike, run: str | None = None, figures: bool | str = True, progress=None,
                 replay: bool = True, replay_max_events: int = REPLAY_MAX_EVENTS, dask=None,
                 render: bool = True) -> Report:
    """The report of ``run`` (default: every run of the store) from the results ``analyze`` saved;
    runs whose results are missing are analysed (and saved) first. ``dask`` (``"local:N"``, a
    scheduler address or a ``distributed.Client``) builds the runs' reports (replay, figures) one
    task per run on a Dask cluster (:func:`traceanalyzer.ingest.executor.run_all`). ``render=False``
    leaves the figures undrawn (drawn when first written as HTML, Markdown or PDF);
    ``figures="listed"`` only names, titles and captions them -- all the JSON report shows -- and
    loads nothing to draw them with (a pipeline's idle intervals: most of the analyses' SQL)."""
    if figures is True and render and dask is None:
        _import_matplotlib_meanwhile()
    con, runs = open_runs(store, run, progress, dask=dask)
    try:
        datas = [load_run(con, store, r, with_intervals=figures is True) for r in runs]
        if dask is None:  # in this process, one run after the other (what run_all does without dask)
            # the replay reads the store through a cursor of this connection: the store's views without
            # opening it again, and none of this connection's temporary tables or parameters (a DuckDB
            # cursor is a new connection to the same database: the state of a freshly opened store);
            # its graph is stitched from the pieces saved in the store (built and saved the first time)
            cur = con.cursor()
            try:
                reports = [build_run(d, figures, store, replay, replay_max_events, render, con=cur) for d in datas]
            finally:
                cur.close()
    finally:
        con.close()
    if dask is not None:
        from ..ingest.executor import run_all
        where = str(os.path.abspath(store))  # a cluster's workers open the store themselves: absolute paths
        reports = run_all(dask, build_run, [(d, figures, where, replay, replay_max_events, render) for d in datas],
                          [f"report of run '{d.run}'" for d in datas])
    return Report(store=str(store), runs=reports,
                  created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                  versions={"traceanalyzer": __version__, "store_schema_version": S.SCHEMA_VERSION,
                            "results_version": S.RESULTS_VERSION, "report_version": REPORT_VERSION})


def _import_matplotlib_meanwhile() -> None:
    """Import what the figures draw with on a thread while this one waits on DuckDB (which lets go
    of the GIL): matplotlib's import (~0.4 s) was the largest fixed cost of a small run's HTML
    report. Python's import lock makes the drawing wait for it if it has not finished."""
    import threading

    def imports():
        try:
            import matplotlib.backends.backend_agg  # noqa: F401
            import matplotlib.figure  # noqa: F401
        except ImportError:   # drawing says so in the report's figure errors
            pass
    threading.Thread(target=imports, name="traceanalyzer-import-matplotlib", daemon=True).start()


def render_pending(report: Report) -> None:
    """Draw the figures of ``report`` not drawn yet (in place); one that cannot be drawn leaves the
    run's figures and is named in its ``figure_errors``."""
    for rr in report.runs:
        if any(f.drawn is None for f in rr.figures):
            rr.figures, rr.figure_errors = render_figures(rr.figures, rr.figure_errors)
