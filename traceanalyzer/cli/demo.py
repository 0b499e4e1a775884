"""``traceanalyzer demo``: the main job end to end on the embedded default (DuckDB + local Parquet).

With ``--record`` it records a fresh, real 2-rank gloo DDP run with torchrun (needs the ``collect``
extra); otherwise it uses the real sample runs shipped inside the package (:mod:`traceanalyzer.samples`). Either way it ingests them into the
store, runs the analyses (stragglers, imbalance, pipeline bubbles, overlap, critical path), saves
their results, and prints a short summary (at most :data:`MAX_LINES` lines: one line per run, the
findings with where and how much) ending with the commands to run next.
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
        result = launch(2, ["ddp", "--run-name", "demo_ddp_2rank", "--steps", "6"], tmp)
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
    from ..analyses.results import analyze, format_text
    text = format_text(analyze(store_path, run=None), {})
    budget = MAX_LINES - 12 - len(sources) - df["run"].nunique()
    lines = _findings_first(text.splitlines(), budget)
    print("\nanalyses (saved in the store; the full text: traceanalyzer analyze STORE):")
    print("\n".join(lines))
    print()
    print("\n".join(next_commands(str(store_path), sorted(df["run"].unique()))))
    return 0


#: Lines of ``analyze``'s text kept in the demo, by what they start with: the findings and the
#: denominator; the context lines (exposed intervals, overlap, collectives, ...) are analyze's.
_KEEP = ("== run", "median step", "straggler", "imbalance", "slow stage", "pipeline:", "all_to_all imbalance", "time:")


def _findings_first(lines: list[str], budget: int) -> list[str]:
    kept = [ln for ln in lines if ln.startswith(_KEEP)]
    return kept[:budget] + ([f"... ({len(kept) - budget} more lines: traceanalyzer analyze STORE)"] if len(kept) > budget else [])
