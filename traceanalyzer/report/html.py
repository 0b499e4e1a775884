"""The report as one self-contained HTML file: inline CSS, figures as base64 PNG, no network.

The markup lives in ``templates/*.html.j2`` (Jinja2); this module only turns a :class:`Report` into
plain values for them and renders. A trace is untrusted input (op and kernel names, annotations,
run and group names, host names): the environment escapes every value by default
(``autoescape=True``), so no field can be forgotten; the only markup is the templates' own, and the
only values marked safe are the page's CSS and script, read from the package. As a second line of
defence the page carries a Content-Security-Policy that allows no network at all, images only from
``data:`` URIs, and only the one script (``templates/images_check.js``, by its hash): it checks that
every figure decoded and says so (``data-images-decoded`` on ``<html>``, one console line), so a
broken figure is visible in the page and in a headless-browser test.
"""
from __future__ import annotations

import base64
import functools
import hashlib

import pandas as pd
from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from .build import Report, RunReport
from .metrics import METRICS
from .record import ms
from .whatif import replay_note
from .where import denominator

#: Longer cell texts (C++ kernel names run to 1,000 characters) are cut, the whole text in a tooltip.
MAX_CELL_CHARS = 160


def _cell_text(v) -> str:
    """A table cell's text: unknown (None/NaN) is "-", never 0."""
    if v is None or (not isinstance(v, (str, list, tuple)) and pd.isna(v)):
        return "-"
    return str(v)


@functools.lru_cache(maxsize=1)
def _env() -> Environment:
    env = Environment(loader=PackageLoader("traceanalyzer.report", "templates"), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["cell_text"] = _cell_text
    env.globals["max_cell_chars"] = MAX_CELL_CHARS
    return env


def _asset(name: str) -> str:
    return _env().loader.get_source(_env(), name)[0]


def _csp(script: str) -> str:
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    return (f"default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'sha256-{digest}'; "
            "base-uri 'none'; form-action 'none'")


def _fmt(v, digits=1) -> str:
    return "-" if v is None or (isinstance(v, float) and pd.isna(v)) else (f"{v:.{digits}f}" if isinstance(v, float) else str(v))


def _job_rows(rr: RunReport) -> list[list[str]]:
    s = rr.shape
    rows = [["ranks", f"{len(s['ranks'])} (world size {_fmt(s['world_size'])})"],
            ["backend / device", f"{_fmt(s['backend'])} / {', '.join(s['devices']) or '-'}"],
            ["hosts", ", ".join(s["hosts"]) or "-"],
            ["process groups", "; ".join(f"{g['pg_name']} ({g['pg_desc']}, {g['size']} ranks)" for g in s["process_groups"]) or "-"],
            ["steps", f"{len(s['steps'])} ({min(s['steps'])}-{max(s['steps'])})" if s["steps"] else "-"],
            ["median step", f"{_fmt(rr.metrics.get('step_ms'), 2)} ms"]]
    if s.get("clocks"):
        rows.append(["clocks", s["clocks"]])
    if s.get("critical_path"):
        rows.append(["critical path (all steps)", ", ".join(f"rank {c['rank']} {c['label']} {c['pct']:.0f}%"
                                                            for c in s["critical_path"])])
    p = s["pipeline"]
    if p:
        order = ", ".join(f"stage {k}: rank {v}" for k, v in sorted(p["stage_to_rank"].items()))
        rows.append(["pipeline", f"{p['stages']} stages x {p['stages_per_rank']}, {p['microbatches']:g} micro-batches, "
                                 f"{p['schedule']}; bubble: theoretical {p['theoretical_bubble_pct']:.1f}%, measured "
                                 f"{_fmt(p['measured_bubble_pct'])}% (median); {order}"])
        if len(p.get("pipelines") or {}) > 1:
            rows.append([f"{len(p['pipelines'])} pipelines (PP x DP)", "; ".join(
                f"pipeline {pid}: " + ", ".join(f"stage {k}: rank {v}" for k, v in sorted(st.items()))
                for pid, st in sorted(p["pipelines"].items()))])
    return rows


def _finding(f) -> dict:
    keys = list(f.evidence_rows[0]) if f.evidence_rows else []
    return {"kind": f.kind, "title": f.title, "recoverable": ms(f.recoverable_ns_per_step), "pct": _fmt(f.recoverable_pct),
            "where": f.where_text or "unknown", "summary": f.summary, "evidence": list(f.evidence),
            "evidence_keys": keys, "evidence_rows": [[r[k] for k in keys] for r in f.evidence_rows or []]}


def _tables(rr: RunReport) -> list[dict]:
    d = rr.data
    if d is None:
        return []
    out = []
    ex = d.r("exposed_comm").head(10)
    if not ex.empty:
        out.append({"title": "Longest exposed communication intervals",
                    "headers": ["#", "rank", "step", "exposed", "op", "pg", "seq", "bytes", "compute before", "compute after"],
                    "rows": [[r.rank_order, r.rank, r.step, ms(r.exposed_ns), r.op, r.pg, r.seq, r.bytes, r.compute_before,
                              r.compute_after] for r in ex.itertuples()], "num": (0, 1, 2, 3, 7)})
    kb = d.r("kernel_breakdown")
    kb = kb[kb["category"] == "compute"] if not kb.empty else kb
    if not kb.empty:
        top = (kb.groupby("name").agg(count=("count", "sum"), total_ns=("total_ns", "sum"), ranks=("rank", "nunique"))
               .sort_values("total_ns", ascending=False).head(10))
        out.append({"title": "Top compute kernels / operators (all ranks, whole window)", "headers": ["name", "count", "total", "ranks"],
                    "rows": [[n, int(r.count), ms(r.total_ns), int(r.ranks)] for n, r in zip(top.index, top.itertuples())],
                    "num": (1, 2, 3)})
    return out


def _run(rr: RunReport) -> dict:
    step_ms = rr.metrics.get("step_ms")
    return {"run": rr.run, "job_rows": _job_rows(rr),
            "step_rows": [[int(r.rank), int(r.steps), ms(r.median_ns), ms(r.min_ns), ms(r.max_ns), ms(r.compute_ns)]
                          for r in rr.step_times.itertuples()],
            "caveats": list(rr.caveats), "findings": [_finding(f) for f in rr.findings], "negatives": list(rr.negatives),
            "denominator": denominator(None if step_ms is None else step_ms * 1e6),
            "replay_note": replay_note(rr.replay), "replay_status": rr.replay.status,
            "figure_errors": list(rr.figure_errors),
            "figures": [{"name": f.name, "title": f.title, "caption": f.caption,
                         "png_b64": base64.b64encode(f.png).decode("ascii")} for f in rr.figures],
            "tables": _tables(rr),
            "metric_rows": [[k, _fmt(rr.metrics.get(k), 2), METRICS[k]] for k in METRICS]}


def render_html(report: Report) -> str:
    script = _asset("images_check.js")
    return _env().get_template("report.html.j2").render(
        csp=_csp(script), css=Markup(_asset("report.css")), script=Markup(script), store=report.store,
        created=report.created, versions=report.versions, runs=[_run(rr) for rr in report.runs])
