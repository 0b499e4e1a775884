"""File names the collector writes; the ingest side reads the same names.

One run folder holds, per rank R:
  rank{R}.window{K}.pt.trace.json.gz   Kineto trace of profiling cycle K (gzipped)
  rank{R}.fr.json                      Flight Recorder dump
  rank{R}.manifest.json                this rank's part of the manifest
  rank{R}.cpu_sched.json               CPU run / wait samples per step boundary (collect/cpu_sched.py)
  parquet/rank={R}/window={K}/         the window's canonical Parquet parts (traceanalyzer.ingest.prebuilt)
  rank{R}.op_timeline.parquet          the light mode's op timeline (profile(op_timeline=True))
and once per run (written by rank 0):
  manifest.json                        run-level part of the manifest
"""

from __future__ import annotations

from pathlib import Path

RUN_MANIFEST = "manifest.json"


def trace_name(rank: int, window: int) -> str:
    return f"rank{rank}.window{window}.pt.trace.json.gz"


def op_timeline_name(rank: int) -> str:
    return f"rank{rank}.op_timeline.parquet"


def fr_name(rank: int) -> str:
    return f"rank{rank}.fr.json"


def cpu_sched_name(rank: int) -> str:
    return f"rank{rank}.cpu_sched.json"


def rank_manifest_name(rank: int) -> str:
    return f"rank{rank}.manifest.json"


def run_dir(out_dir: str | Path, run: str) -> Path:
    return Path(out_dir) / run
