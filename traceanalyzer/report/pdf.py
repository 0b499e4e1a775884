"""The report as a PDF (matplotlib's PdfPages): the findings in words, then one page per figure.

Same content as the Markdown report (the text is built from the same :class:`Report`): per run the
denominator (median step), each finding with where and how much and its evidence, what was looked
for and not found, then the run's figures with their captions.
"""
from __future__ import annotations

import io
import os
import textwrap

import matplotlib.image as mpimg
from matplotlib import rc_context
from matplotlib.backends.backend_pdf import PdfPages
from matplotlib.figure import Figure

from .build import Report
from .record import ms
from .whatif import replay_note
from .where import denominator

#: A4 portrait, inches; lines of text per page at the font size below.
PAGE_IN = (8.27, 11.69)
LINES_PER_PAGE = 62
WRAP_CHARS = 110
_RC = {"text.parse_math": False, "font.size": 8, "font.family": "monospace"}


def report_lines(report: Report) -> list[str]:
    out = [f"traceanalyzer report: store {report.store}", f"created {report.created}", ""]
    for rr in report.runs:
        step_ms = rr.metrics.get("step_ms")
        out += [f"== run {rr.run}", denominator(None if step_ms is None else step_ms * 1e6)]
        if replay_note(rr.replay):
            out.append(replay_note(rr.replay))
        out.append("")
        if not rr.findings:
            out.append("No findings.")
        for i, f in enumerate(rr.findings, start=1):
            out += [f"#{i} {f.title}: {ms(f.recoverable_ns_per_step)} per step ({f.recoverable_pct:.1f}% of the step) "
                    f"recoverable", f"   where: {f.where_text or 'unknown'}", f"   {f.summary}"]
            out += [f"   - {e}" for e in f.evidence]
            out.append("")
        out += [f"- {n}" for n in rr.negatives] + [""]
    return [w for line in out for w in (textwrap.wrap(line, WRAP_CHARS, subsequent_indent="     ") or [""])]


def write_pdf(report: Report, path: str | os.PathLike) -> None:
    """Write the PDF to ``path`` (the caller makes it atomic). Each page is its own matplotlib
    Figure (no pyplot, no backend chosen for the process)."""
    lines = report_lines(report)
    with rc_context(_RC), PdfPages(path) as pdf:
        for start in range(0, max(len(lines), 1), LINES_PER_PAGE):
            fig = Figure(figsize=PAGE_IN)
            fig.text(0.05, 0.97, "\n".join(lines[start:start + LINES_PER_PAGE]), va="top", ha="left")
            pdf.savefig(fig)
        for rr in report.runs:
            for f in rr.figures:
                img = mpimg.imread(io.BytesIO(f.png), format="png")
                fig = Figure(figsize=PAGE_IN)
                ax = fig.add_axes((0.05, 0.3, 0.9, 0.62))
                ax.imshow(img)
                ax.axis("off")
                fig.text(0.05, 0.97, textwrap.fill(f"run {rr.run}: {f.title}", WRAP_CHARS), va="top")
                fig.text(0.05, 0.27, textwrap.fill(f.caption, WRAP_CHARS), va="top")
                pdf.savefig(fig)
        info = pdf.infodict()
        info["Title"], info["Creator"] = "traceanalyzer report", f"traceanalyzer {report.versions.get('traceanalyzer')}"
