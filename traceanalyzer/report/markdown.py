"""The report as Markdown (for a pull request or a wiki); figures are written as PNG files beside it.

Markdown renderers pass raw HTML through, so text from a trace is escaped here too: ``& < >`` as
entities, and the characters Markdown gives meaning to (``| * _ ` [ ] #``) with a backslash.
"""
from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import quote

from .build import Report, RunReport
from .metrics import METRICS
from .record import ms
from .whatif import replay_note
from .where import denominator

_MD_SPECIAL = re.compile(r"([\\`*_\[\]|#])")


def md(v) -> str:
    s = "" if v is None else str(v)
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("\n", " ")
    return _MD_SPECIAL.sub(r"\\\1", s)


def _table(headers, rows) -> list[str]:
    return ["| " + " | ".join(md(h) for h in headers) + " |", "|" + "---|" * len(headers)] + \
           ["| " + " | ".join(md(c) for c in r) + " |" for r in rows] + [""]


def _safe_name(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", s)[:80] or "run"


def _run(rr: RunReport, fig_dir: Path | None, fig_rel: str) -> list[str]:
    s = rr.shape
    out = [f"## Run {md(rr.run)}", "",
           f"{len(s['ranks'])} ranks, backend {md(s['backend'])}, {len(s['steps'])} steps, median step "
           f"{ms(None if rr.metrics.get('step_ms') is None else rr.metrics['step_ms'] * 1e6)}.", ""]
    if not s["steps"]:
        out += ["No step ranges in the trace (ProfilerStep#N, or NVTX `step N` ranges in an nsys export): "
                "per-step analyses (stragglers, phases, imbalance, what-if replay) cannot run.", ""]
    if s.get("clocks"):
        out += [md(s["clocks"][0].upper() + s["clocks"][1:]) + ".", ""]
    if s["pipeline"]:
        p = s["pipeline"]
        out += [f"Pipeline: {p['stages']} stages x {p['stages_per_rank']}, {p['microbatches']:g} micro-batches, "
                f"{md(p['schedule'])}; bubble theoretical {p['theoretical_bubble_pct']:.1f}%, measured "
                + (f"{p['measured_bubble_pct']:.1f}%." if p['measured_bubble_pct'] is not None else "unknown."), ""]
        if len(p.get("pipelines") or {}) > 1:
            out += [f"{len(p['pipelines'])} pipelines (PP x DP): " + "; ".join(
                f"pipeline {pid}: ranks {', '.join(str(v) for _, v in sorted(st.items()))} (stage order)"
                for pid, st in sorted(p["pipelines"].items())) + ".", ""]
    out += _table(["rank", "steps", "median step", "min", "max", "compute"],
                  [[int(r.rank), int(r.steps), ms(r.median_ns), ms(r.min_ns), ms(r.max_ns), ms(r.compute_ns)]
                   for r in rr.step_times.itertuples()])
    if rr.caveats:
        out += ["**Caveats:**", ""] + [f"- {md(c)}" for c in rr.caveats] + [""]
    out += ["### Findings, ranked by recoverable time per step", ""]
    step_ms = rr.metrics.get("step_ms")
    if rr.findings:
        out += [md(denominator(None if step_ms is None else step_ms * 1e6)), ""]
    if replay_note(rr.replay):
        out += [md(replay_note(rr.replay)), ""]
    if not rr.findings:
        out += ["No findings.", ""]
    for i, f in enumerate(rr.findings, start=1):
        out += [f"**#{i} {md(f.title)}**: {ms(f.recoverable_ns_per_step)} per step ({f.recoverable_pct:.1f}% of the step) "
                f"recoverable. {md(f.summary)}.", "", f"Where: {md(f.where_text or 'unknown')}.", ""] + \
            [f"- {md(e)}" for e in f.evidence] + [""]
        if f.evidence_rows:
            keys = list(f.evidence_rows[0])
            out += _table(keys, [[r[k] for k in keys] for r in f.evidence_rows])
    if rr.negatives:
        out += [f"- {md(n)}" for n in rr.negatives] + [""]
    for fig in rr.figures:
        if fig_dir is not None:
            name = f"{_safe_name(rr.run)}_{fig.name}.png"
            (fig_dir / name).write_bytes(fig.png)
            out += [f"![{md(fig.title)}]({quote(fig_rel)}/{quote(name)})", "", f"*{md(fig.caption)}*", ""]
    kb = rr.data.r("kernel_breakdown") if rr.data is not None else None
    if kb is not None and not kb.empty:
        kb = kb[kb["category"] == "compute"]
        top = kb.groupby("name")["total_ns"].sum().sort_values(ascending=False).head(10)
        out += ["### Top compute kernels / operators (all ranks, whole window)", ""]
        out += _table(["name", "total"], [[n, ms(v)] for n, v in top.items()])
    out += _table(["metric", "value"], [[k, "-" if rr.metrics.get(k) is None else f"{rr.metrics[k]:.2f}"] for k in METRICS])
    return out


def render_markdown(report: Report, out_path: str | Path | None = None) -> str:
    """Markdown text; with ``out_path``, the figures go to ``<stem>_figures/`` beside it."""
    fig_dir, fig_rel = None, ""
    if out_path is not None:
        out_path = Path(out_path)
        fig_rel = f"{out_path.stem}_figures"
        fig_dir = out_path.parent / fig_rel
        fig_dir.mkdir(parents=True, exist_ok=True)
    v = report.versions
    lines = ["# traceanalyzer report", "",
             f"Store {md(report.store)}, created {report.created}; traceanalyzer {v['traceanalyzer']}, store schema "
             f"{v['store_schema_version']}, results {v['results_version']}.", ""]
    for rr in report.runs:
        lines += _run(rr, fig_dir, fig_rel)
    return "\n".join(lines) + "\n"
