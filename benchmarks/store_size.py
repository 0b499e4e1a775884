#!/usr/bin/env python3
"""A small run costs the same in a store of many runs as in a store of its own (issue 17's "no
fixed costs on small inputs", session 28).

Until session 28 a store's every write rewrote one manifest and swept the whole store, and every
open bound every run's files and results: the first report of a 4-rank run took ~2 s in a store of
its own and ~20 s beside 141 other runs. This script measures it, in one run:

1. a *crowded* store: ``--runs`` runs (the shipped runs of ``traces/`` under numbered names, each
   ingested and analysed, as an experiment's store is), built once, untimed;
2. for each of ``--repeat`` rounds, in a fresh process each and as CPU seconds (user + system of the
   process and its children, ``wait4``): ``ingest`` then ``report --run R`` (with the replay's
   what-ifs) of one shipped run (``--run``) into an empty store, and the same into a copy of the
   crowded store.

It prints the medians and the ratio crowded / alone (target: <= 1.5, flat in the number of runs).
A script, not a test: it asserts nothing about time.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
import harness  # noqa: E402  (timing and memory of a child: benchmarks/harness.py)

#: shipped runs that fill the crowded store (small, of several kinds)
FILLERS = ("ddp_gloo_2rank", "ddp_gloo_4rank_slow2", "pp_1f1b_4rank", "fsdp_gloo_2rank", "ddp_gloo_2rank_noisy0",
           "moe_a2a_4rank_skew")


def _cpu(cmd: list[str], env: dict) -> float:
    with tempfile.NamedTemporaryFile("w+", suffix=".log") as log:   # (cwd: not a source tree, whose
        # traceanalyzer/ `python -m` would import ahead of PYTHONPATH's)
        r = harness.run_child(cmd, Path(log.name), env=env, cwd=Path(tempfile.gettempdir()))
    if not r["ok"]:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{r['log_tail'][-2000:]}")
    return r["cpu_seconds"]


def first_report(store: Path, run: str, out: Path, env: dict) -> float:
    """CPU seconds of ``ingest`` + ``report`` (JSON, with the replay) of shipped run ``run`` into ``store``."""
    py = [sys.executable, "-m", "traceanalyzer"]
    return (_cpu(py + ["ingest", str(REPO / "traces" / run), "--store", str(store), "--run", "probe", "--quiet"], env)
            + _cpu(py + ["report", str(store), "--run", "probe", "-o", str(out)], env))


def crowd(store: Path, n: int) -> None:
    """``n`` shipped runs under numbered names, ingested and analysed (results and summaries saved)."""
    import traceanalyzer as ta
    from traceanalyzer.analyses.results import analyze
    for i in range(n):
        src = FILLERS[i % len(FILLERS)]
        ta.ingest([str(REPO / "traces" / src)], str(store), run=f"{src}-{i}", progress=False)
    analyze(str(store))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", default="ddp_gloo_4rank_slow2", help="the shipped run reported (a folder of traces/)")
    ap.add_argument("--runs", type=int, default=60, help="runs already in the crowded store")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--src", default=str(REPO), help="the source tree timed (e.g. a git worktree of an older "
                                                     "commit; default this one)")
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = args.src
    with tempfile.TemporaryDirectory(prefix="ta-store-size-") as tmp:
        tmp = Path(tmp)
        env["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")     # bytecode compiled once, as installed
        crowded = tmp / "crowded"
        crowd(crowded, args.runs)
        files = sum(1 for _ in crowded.rglob("*.parquet"))
        alone, beside = [], []
        first_report(tmp / "warm", args.run, tmp / "r.json", env)       # untimed: compiles the bytecode
        for i in range(args.repeat):
            alone.append(first_report(tmp / f"alone-{i}", args.run, tmp / "r.json", env))
            shutil.copytree(crowded, tmp / f"crowded-{i}")
            beside.append(first_report(tmp / f"crowded-{i}", args.run, tmp / "r.json", env))
            shutil.rmtree(tmp / f"crowded-{i}")
    a, b = statistics.median(alone), statistics.median(beside)
    print(f"{args.src}: ingest + first report of {args.run} (CPU s, median of {args.repeat}): in a store of its own {a:.2f}; "
          f"beside {args.runs} runs ({files} Parquet files) {b:.2f}; ratio {b / a:.2f} (target <= 1.5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
