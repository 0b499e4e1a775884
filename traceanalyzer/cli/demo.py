"""``traceanalyzer demo``: the main job end to end on the embedded default (DuckDB + local Parquet).

With ``--record`` it records a fresh, real 2-rank gloo DDP run with torchrun (needs the ``collect``
extra); otherwise it uses the real sample runs shipped inside the package (:mod:`traceanalyzer.samples`). Either way it ingests them into the
store, runs the analyses (stragglers, imbalance, pipeline bubbles, overlap, critical path), saves
their results, and prints a short summary (at most :data:`MAX_LINES` lines: one line per run, the
findings the report confirms by replay, with where and how much) ending with the commands to run next.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from ..analyses import connect
from ..analyses.summary import info
from ..ingest.batch import ingest
from ..store.runs import store_runs

#: The summary stays on one screen (the full tables: `traceanalyzer info STORE`, `analyze STORE`).
MAX_LINES = 60


def _run_lines(df) -> list[str]:
    """One line per run from ``info`` (the per-rank tables are ``traceanalyzer info``'s)."""
    out = []
    for run, g in df.groupby("run", sort=True):
        out.append(f"  {run}: {len(g)} ranks, {int(g['steps'].max())} steps, {int(g['events'].sum()):,} events, "
                   f"{int(g['collectives'].sum()):,} collectives, {int(g['p2p'].sum()):,} p2p ops")
    return out


def next_commands(store: str, runs: list[str]) -> list[str]:
    """What to run next, with this store and its real run names."""
    run = runs[0] if runs else "RUN"
    return ["next:",
            f"  traceanalyzer report {store} -o report.html      # findings ranked by recoverable time, with figures",
            f"  traceanalyzer analyze {store} --run {run}      # these analyses again, for one run",
            f"  traceanalyzer sql {store} \"SELECT run, rank, phase, annotation, delay_pct FROM result_stragglers\"",
            f"  traceanalyzer export {store} --run {run} --all-ranks -o trace.json   # open in ui.perfetto.dev",
            f"  traceanalyzer info {store}                         # what the store holds, per rank"]


def demo(store: str, record: bool = False) -> int:
    store_path = Path(store)
    if record:
        from ..workloads.launch import launch
        tmp = Path(tempfile.mkdtemp(prefix="traceanalyzer-demo-"))
        print(f"recording a real 2-rank gloo DDP run with torchrun into {tmp} ...")
        # 8 profiled steps, as the accuracy corpus records (benchmarks/accuracy.py PROFILE): the
        # medians over 3 steps of a shared 2-core host flagged clean runs' noise
        result = launch(2, ["ddp", "--run-name", "demo_ddp_2rank", "--steps", "11", "--prof-active", "8"], tmp)
        sources = {"demo_ddp_2rank": result.out_dir / "demo_ddp_2rank"}
    else:
        from .. import samples
        sources = samples.runs()
    con = connect(store_path) if (store_path / "_store.json").exists() else None
    have = set(store_runs(con)) if con else set()
    if con is not None:
        con.close()
    for run, folder in sources.items():
        if run in have:
            print(f"run '{run}' is already in {store_path}; skipped")
            continue
        print(ingest([folder], store_path, run=run, progress=False).summary().splitlines()[0])
    df = info(store_path)
    print(f"\nstore {store_path}:")
    print("\n".join(_run_lines(df)))
    from ..analyses.results import analyze
    analyze(store_path, run=None)   # every analysis, saved in the store (the tables: traceanalyzer analyze STORE)
    from ..report import build_report
    rep = build_report(store_path, figures=False)
    budget = MAX_LINES - 12 - len(sources) - df["run"].nunique()
    lines = _findings_lines(rep)
    print("\nfindings (confirmed by a replay what-if, largest recoverable time first; the analyses' full text: "
          "traceanalyzer analyze STORE):")
    print("\n".join(lines[:budget] + ([f"... ({len(lines) - budget} more lines: traceanalyzer report STORE)"]
                                      if len(lines) > budget else [])))
    print()
    print("\n".join(next_commands(str(store_path), sorted(df["run"].unique()))))
    return 0


def _findings_lines(rep) -> list[str]:
    """Per run: its findings, one line each (what, how much, where), or what was looked for."""
    out = []
    for rr in rep.runs:
        out.append(f"== run '{rr.run}': {len(rr.findings)} finding{'s' if len(rr.findings) != 1 else ''}")
        for i, f in enumerate(rr.findings, 1):
            src = "replay" if f.recoverable_source == "replay" else "estimate"
            out.append(f"  {i}. {f.title}: {f.how_much} ({src}); where: {f.where_text or 'n/a'}")
        if not rr.findings:
            out.append("  nothing worth acting on: " + "; ".join(n.split(":")[0] for n in rr.negatives))
    return out
