"""``traceanalyzer demo``: the main job end to end on the embedded default (DuckDB + local Parquet).

With ``--record`` it records a fresh, real 2-rank gloo DDP run with torchrun (needs the ``collect``
extra); otherwise it uses the real sample runs shipped inside the package (:mod:`traceanalyzer.samples`). Either way it ingests them into the
store, prints what the store holds and how the collectives line up across ranks, and runs the
analyses (stragglers, imbalance, pipeline bubbles, overlap, critical path), saving their results.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from ..analyses import connect
from ..analyses.summary import format_info, info
from ..ingest.batch import ingest

_JOINED = """
SELECT run, op, count(DISTINCT (pg_name, seq)) AS collectives, count(DISTINCT rank) AS ranks,
       round(median(in_bytes) / 1e6, 3) AS median_mb,
       round(median(dur_ns) / 1e6, 3) AS median_ms
FROM comms WHERE NOT is_p2p GROUP BY run, op ORDER BY run, op
"""

_STEP_TIMES = """
SELECT run, rank, round(median(dur_ns) / 1e6, 2) AS median_step_ms, round(max(dur_ns) / 1e6, 2) AS max_step_ms
FROM steps GROUP BY run, rank ORDER BY run, rank
"""


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
    have = {r for (r,) in con.execute("SELECT DISTINCT run FROM ranks").fetchall()} if con else set()
    for run, folder in sources.items():
        if run in have:
            print(f"run '{run}' is already in {store_path}; skipped")
            continue
        print(ingest([folder], store_path, run=run, progress=False).summary())
    print()
    print(format_info(info(store_path), str(store_path)))
    con = connect(store_path)
    print("\ncollectives joined across ranks (per run and op):")
    print(con.sql(_JOINED).df().to_string(index=False))
    print("\nstep time per rank:")
    print(con.sql(_STEP_TIMES).df().to_string(index=False))
    from ..analyses.results import analyze, format_text
    print("\nanalyses (saved in the store; `traceanalyzer analyze STORE --json` for bots):")
    print(format_text(analyze(store_path), {}))
    print(f"\nquery it yourself: traceanalyzer sql {store_path} \"SELECT * FROM result_stragglers\"")
    return 0
