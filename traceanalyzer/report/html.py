"""The report as one self-contained HTML file: inline CSS, figures as base64 PNG, no network.

A trace is untrusted input: every string that can come from one (op and kernel names,
annotations, run and group names, host names) goes through :func:`esc`; the only markup is this
module's own. As a second line of defence the page carries a Content-Security-Policy that allows
no network at all, images only from ``data:`` URIs, and only the one script below (by its hash):
it checks that every figure decoded and says so (``data-images-decoded`` on ``<html>``, one
console line), so a broken figure is visible in the page and in a headless-browser test.
"""
from __future__ import annotations

import base64
import hashlib
import html

import pandas as pd

from .build import Report, RunReport
from .findings import ms
from .metrics import METRICS
from .whatif import replay_note
from .where import denominator

_SCRIPT = """
window.addEventListener('load', function () {
  var imgs = document.images, ok = 0;
  for (var i = 0; i < imgs.length; i++) {
    if (imgs[i].complete && imgs[i].naturalWidth > 0) { ok++; }
    else { imgs[i].insertAdjacentText('afterend', '[figure failed to render]'); }
  }
  document.documentElement.setAttribute('data-images-decoded', ok + '/' + imgs.length);
  console.log('traceanalyzer-report: images decoded ' + ok + '/' + imgs.length);
});
"""

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 2em auto; max-width: 1100px; color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { border-bottom: 2px solid #4C72B0; padding-bottom: .2em; margin-top: 2em; }
table { border-collapse: collapse; margin: .5em 0 1em; } td, th { border: 1px solid #ddd; padding: .25em .6em; text-align: left; vertical-align: top; max-width: 32em; overflow-wrap: anywhere; }
th { background: #f3f5f9; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
th, td.num { white-space: nowrap; overflow-wrap: normal; }
.finding { border-left: 5px solid #C44E52; background: #fdf6f6; padding: .4em 1em; margin: .8em 0; }
.finding h3 { margin: .3em 0; } .recoverable { font-weight: 600; color: #C44E52; }
.none { border-left: 5px solid #55A868; background: #f4faf5; padding: .4em 1em; margin: .8em 0; }
figure { margin: 1.2em 0; } figure img { max-width: 100%; border: 1px solid #eee; } figcaption { color: #555; font-size: .9em; }
code, .name { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: .92em; word-break: break-all; }
.meta { color: #666; font-size: .9em; }
"""


def esc(v) -> str:
    """HTML-escape anything (quotes too: values also land in attributes)."""
    return html.escape("" if v is None else str(v), quote=True)


def _csp() -> str:
    digest = base64.b64encode(hashlib.sha256(_SCRIPT.encode()).digest()).decode()
    return (f"default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'sha256-{digest}'; "
            "base-uri 'none'; form-action 'none'")


#: Longer cell texts (C++ kernel names run to 1,000 characters) are cut, the whole text in a tooltip.
MAX_CELL_CHARS = 160


def _cell(v) -> str:
    if v is None or (not isinstance(v, (str, list, tuple)) and pd.isna(v)):
        return "-"
    s = str(v)
    if len(s) <= MAX_CELL_CHARS:
        return esc(s)
    return f"<span title=\"{esc(s)}\">{esc(s[:MAX_CELL_CHARS - 1])}…</span>"


def _table(headers: list[str] | None, rows: list[list], num: set[int] = frozenset()) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers) if headers else ""
    body = "".join("<tr>" + "".join(f"<td class=\"num\">{_cell(c)}</td>" if i in num else f"<td>{_cell(c)}</td>"
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    thead = f"<thead><tr>{head}</tr></thead>" if head else ""
    return f"<table>{thead}<tbody>{body}</tbody></table>"


def _fmt(v, digits=1) -> str:
    return "-" if v is None or (isinstance(v, float) and pd.isna(v)) else (f"{v:.{digits}f}" if isinstance(v, float) else str(v))


def _summary(rr: RunReport) -> str:
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
    out = "<h3>Job</h3>" + _table(None, rows)
    st = rr.step_times
    out += "<h3>Step time per rank</h3>" + _table(
        ["rank", "steps", "median", "min", "max", "compute (median)"],
        [[int(r.rank), int(r.steps), ms(r.median_ns), ms(r.min_ns), ms(r.max_ns), ms(r.compute_ns)] for r in st.itertuples()],
        num={0, 1, 2, 3, 4, 5})
    return out


def _step_ns(rr: RunReport):
    step_ms = rr.metrics.get("step_ms")
    return None if step_ms is None else step_ms * 1e6


def _findings(rr: RunReport) -> str:
    caveats = ("<div class=\"caveats\"><h3>Caveats</h3><ul>" + "".join(f"<li>{esc(c)}</li>" for c in rr.caveats)
               + "</ul></div>") if rr.caveats else ""
    return caveats + _findings_only(rr)


def _findings_only(rr: RunReport) -> str:
    if not rr.findings:
        out = "<div class=\"none\"><h3>No findings</h3><p>Nothing in this run costs a step enough to report.</p></div>"
    else:
        note = replay_note(rr.replay)
        out = f"<p class=\"meta denominator\">{esc(denominator(_step_ns(rr)))}</p>"
        out += f"<p class=\"meta replay\" data-replay=\"{esc(rr.replay.status)}\">{esc(note)}</p>" if note else ""
        for i, f in enumerate(rr.findings, start=1):
            out += (f"<div class=\"finding\" id=\"finding-{esc(rr.run)}-{i}\" data-kind=\"{esc(f.kind)}\">"
                    f"<h3>#{i} {esc(f.title)}: <span class=\"recoverable\">{esc(ms(f.recoverable_ns_per_step))} per step "
                    f"({esc(_fmt(f.recoverable_pct))}% of the step) recoverable</span></h3>"
                    f"<p class=\"where\"><b>Where:</b> {esc(f.where_text or 'unknown')}</p>"
                    f"<p>{esc(f.summary)}.</p><ul>" + "".join(f"<li>{esc(e)}</li>" for e in f.evidence) + "</ul>")
            if f.evidence_rows:
                keys = list(f.evidence_rows[0])
                out += _table(keys, [[r[k] for k in keys] for r in f.evidence_rows])
            out += "</div>"
    if rr.negatives:
        out += "<div class=\"none\"><h3>Looked for, not found</h3><ul>" + "".join(f"<li>{esc(n)}</li>" for n in rr.negatives) + "</ul></div>"
    return out


def _metrics(rr: RunReport) -> str:
    return "<h3>Metrics (keys for <code>--fail-on</code>)</h3>" + _table(
        ["key", "value", "meaning"], [[k, _fmt(rr.metrics.get(k), 2), METRICS[k]] for k in METRICS], num={1})


def _figures(rr: RunReport) -> str:
    out = "".join(f"<p class=\"meta\">figure not drawn: {esc(e)}</p>" for e in rr.figure_errors)
    for f in rr.figures:
        b64 = base64.b64encode(f.png).decode("ascii")
        out += (f"<figure id=\"fig-{esc(rr.run)}-{esc(f.name)}\"><img alt=\"{esc(f.title)}\" src=\"data:image/png;base64,{b64}\">"
                f"<figcaption><b>{esc(f.title)}.</b> {esc(f.caption)}</figcaption></figure>")
    return out


def _tables(rr: RunReport) -> str:
    d = rr.data
    if d is None:
        return ""
    out = ""
    ex = d.r("exposed_comm").head(10)
    if not ex.empty:
        out += "<h3>Longest exposed communication intervals</h3>" + _table(
            ["#", "rank", "step", "exposed", "op", "pg", "seq", "bytes", "compute before", "compute after"],
            [[r.rank_order, r.rank, r.step, ms(r.exposed_ns), r.op, r.pg, r.seq, r.bytes, r.compute_before, r.compute_after]
             for r in ex.itertuples()], num={0, 1, 2, 3, 7})
    kb = d.r("kernel_breakdown")
    kb = kb[kb["category"] == "compute"] if not kb.empty else kb
    if not kb.empty:
        top = (kb.groupby("name").agg(count=("count", "sum"), total_ns=("total_ns", "sum"), ranks=("rank", "nunique"))
               .sort_values("total_ns", ascending=False).head(10))
        out += "<h3>Top compute kernels / operators (all ranks, whole window)</h3>" + _table(
            ["name", "count", "total", "ranks"],
            [[n, int(r.count), ms(r.total_ns), int(r.ranks)] for n, r in zip(top.index, top.itertuples())], num={1, 2, 3})
    return out


def _run(rr: RunReport, idx: int) -> str:
    return (f"<section id=\"run-{idx}\"><h2>Run <span class=\"name\">{esc(rr.run)}</span></h2>"
            + _summary(rr) + "<h3>Findings, ranked by recoverable time per step</h3>" + _findings(rr)
            + _figures(rr) + _tables(rr) + _metrics(rr) + "</section>")


def render_html(report: Report) -> str:
    v = report.versions
    nav = " · ".join(f"<a href=\"#run-{i}\">{esc(rr.run)}</a>" for i, rr in enumerate(report.runs)) if len(report.runs) > 1 else ""
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{esc(_csp())}\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>traceanalyzer report: {esc(', '.join(rr.run for rr in report.runs))}</title>"
            f"<style>{_CSS}</style><script>{_SCRIPT}</script></head><body>"
            f"<h1>traceanalyzer report</h1><p class=\"meta\">store <code>{esc(report.store)}</code> · created "
            f"{esc(report.created)} · traceanalyzer {esc(v['traceanalyzer'])}, store schema {esc(v['store_schema_version'])}, "
            f"results {esc(v['results_version'])}, report {esc(v['report_version'])}</p>"
            + (f"<p>{nav}</p>" if nav else "")
            + "".join(_run(rr, i) for i, rr in enumerate(report.runs)) + "</body></html>\n")
