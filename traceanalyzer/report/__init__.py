"""Reports: the findings of a run a person can act on, ranked by the time they would give back.

    from traceanalyzer import report
    rep = report.build_report("store", run="ddp4")        # reads what `analyze` saved (runs it if missing)
    rep.runs[0].findings[0].title                          # 'Straggler: rank 2'
    report.write_report(rep, "report.html")                # or .md / .json / .pdf

Modules, in the order the data flows: ``load`` (saved results of a run) -> ``findings`` (ranked by
recoverable time) and ``shape``/``metrics`` (summary numbers, ``--fail-on``) -> ``figures``
(matplotlib PNGs) -> ``build`` (one :class:`Report`) -> ``html`` / ``markdown`` / ``jsondoc``.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import TraceAnalyzerError
from .build import REPORT_VERSION, Report, RunReport, build_report, render_pending
from .findings import EXPOSED_COMM_MIN_PCT
from .html import render_html
from .jsondoc import report_dict, to_json
from .markdown import render_markdown
from .metrics import METRICS, Threshold, check, parse_fail_on
from .record import Finding

FORMATS = ("html", "md", "json", "pdf")
_EXTENSIONS = {"html": "html", "htm": "html", "md": "md", "markdown": "md", "json": "json", "pdf": "pdf"}


def format_for(path: str | os.PathLike, fmt: str | None = None) -> str:
    """The output format: ``fmt`` if given, else from the file extension (html without one). An
    extension that names no format the report writes is an error, never HTML under another name."""
    if fmt:
        if fmt not in FORMATS:
            raise TraceAnalyzerError(f"unknown report format {fmt!r}; choose one of {', '.join(FORMATS)}")
        return fmt
    ext = Path(path).suffix.lower().lstrip(".")
    if not ext:
        return "html"
    if ext not in _EXTENSIONS:
        raise TraceAnalyzerError(f"{path}: the report cannot be written as .{ext}; use .html, .md, .json or .pdf "
                                 f"(or --format)")
    return _EXTENSIONS[ext]


def write_report(report: Report, path: str | os.PathLike, fmt: str | None = None) -> Path:
    """Write ``report`` to ``path`` (atomically: a reader never sees half a report)."""
    path = Path(path)
    fmt = format_for(path, fmt)
    if fmt != "json":       # the JSON report names the figures; the others embed them
        render_pending(report)
    text = {"html": lambda: render_html(report), "json": lambda: to_json(report),
            "md": lambda: render_markdown(report, path), "pdf": None}[fmt]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    if fmt == "pdf":
        from .pdf import write_pdf
        write_pdf(report, tmp)
    else:
        tmp.write_text(text(), encoding="utf-8")
    os.replace(tmp, path)
    return path


def failures(report: Report, rules: list[str]) -> list[str]:
    """The ``--fail-on`` rules ``report`` breaks, one line each (empty: it passes)."""
    return check({rr.run: rr.metrics for rr in report.runs}, parse_fail_on(rules))


__all__ = ["build_report", "write_report", "render_html", "render_markdown", "to_json", "report_dict", "failures",
           "parse_fail_on", "check", "Report", "RunReport", "Finding", "Threshold", "METRICS", "FORMATS",
           "REPORT_VERSION", "EXPOSED_COMM_MIN_PCT"]
