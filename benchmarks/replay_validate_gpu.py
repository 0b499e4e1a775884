#!/usr/bin/env python3
"""Replay validation on GPU runs: "idealise the slow rank" on a CUDA DDP job vs real clean runs.

The runs are made on a GPU machine by ``traces/record_gpu.sh`` (gloo ranks sharing one GPU: the
model, the gradients and DDP's buckets live on the GPU, gloo stages each bucket through host
memory); this script only reads them, so it runs anywhere:

    # on the GPU machine, from the repo root:
    ONLY="ddp_gloo_cuda_2rank ddp_gloo_cuda_2rank_slow1" REPEATS=4 traces/record_gpu.sh OUTDIR
    # anywhere:
    python benchmarks/replay_validate_gpu.py OUTDIR [--append]

A = ``ddp_gloo_cuda_2rank_slow1*`` (rank 1 sleeps 20 ms in every forward), B = ``ddp_gloo_cuda_2rank``
and its re-runs ``*_r1`` ... (clean). As in ``replay_validate.py``: measured = the job step time
(per rank the mean step of the window, then the slowest rank); predicted = plan "idealise rank 1"
on each A run, averaged; spread = std / mean of B's measured job steps; error = |predicted - B| / B;
goal: error <= max(5 %, 2 x spread). It asserts nothing.
"""
from __future__ import annotations

import argparse
import datetime
import re
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import harness  # noqa: E402  (RESULTS.md: benchmarks/harness.py; benchmarks/ is the script's folder)
from replay_validate import cv, measured  # noqa: E402 - benchmarks/ is the script's folder

PLAN = {"actions": [{"action": "idealize", "ranks": [1]}]}


def runs(folder: Path, base: str) -> list[Path]:
    pat = re.compile(re.escape(base) + r"(_r\d+)?$")
    return sorted(p for p in folder.iterdir() if p.is_dir() and pat.fullmatch(p.name) and (p / "manifest.json").exists())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("folder", type=Path, nargs="+", help="folder(s) with record_gpu.sh output (run folders)")
    ap.add_argument("--append", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = ap.parse_args()
    import traceanalyzer as ta
    from traceanalyzer import replay

    a_runs = [p for f in args.folder for p in runs(f, "ddp_gloo_cuda_2rank_slow1")]
    b_runs = [p for f in args.folder for p in runs(f, "ddp_gloo_cuda_2rank")]
    if not a_runs or not b_runs:
        print(f"need ddp_gloo_cuda_2rank_slow1* and ddp_gloo_cuda_2rank* run folders in {args.folder}", file=sys.stderr)
        return 2
    ma, mb, pred, ident = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i, p in enumerate(a_runs + b_runs):
            store = Path(tmp) / f"s{i}"
            ta.ingest([str(p)], str(store), run=p.name, workers=1)
            m = measured(store, p.name)
            if p in a_runs:
                ma.append(m)
                w = replay.what_if(replay.build_graph(ta.open(str(store)), p.name), PLAN)
                pred.append(w.job_step_ns("predicted_ns"))
                ident.append(w.identity_error["median"])
            else:
                mb.append(m)
    b, p = statistics.mean(mb), statistics.mean(pred)
    err, goal = abs(p - b) / b, max(0.05, 2 * cv(mb))
    a = statistics.mean(ma)
    recovered = (a - p) / (a - b) if a != b else float("nan")
    row = (f"| slow_rank (GPU) | DDP on CUDA, rank 1 +20 ms/forward -> idealise rank 1, vs clean runs | "
           f"{a / 1e6:.2f} ({100 * cv(ma):.1f} %, n={len(ma)}) | {b / 1e6:.2f} ({100 * cv(mb):.1f} %, n={len(mb)}) | "
           f"{p / 1e6:.2f} | {100 * err:.1f} % | {100 * goal:.1f} % | {100 * statistics.median(ident):.1f} % | "
           f"{'met' if err <= goal else 'missed'} |")
    head = ("| scenario | what | A measured ms (spread) | B measured ms (spread) | B predicted ms | error | goal | "
            "identity-model error (median) | verdict |\n|---|---|---|---|---|---|---|---|---|")
    text = (f"`python benchmarks/replay_validate_gpu.py {' '.join(map(str, args.folder))}`, "
            f"{datetime.date.today()}: runs recorded by traces/record_gpu.sh on one NVIDIA H200 (2 gloo ranks "
            f"sharing it, torch 2.11.0+cu130); the predicted step recovers {100 * recovered:.0f} % of the real "
            f"A -> B difference.\n\n{head}\n{row}\n")
    print(text)
    if args.append:
        harness.append_results("\n## Replay validation on GPU runs (idealise the slow rank)\n\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
