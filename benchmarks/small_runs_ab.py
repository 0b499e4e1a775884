#!/usr/bin/env python3
"""One command of ``small_runs.py``, timed for this tree and an older commit *in turns* (A, B, A,
B, ...): on a shared machine the load drifts over minutes, and ``small_runs.py`` times all of one
tree's cases before the other's, so a 0.2 s change drowns in the drift. Here both trees see the
same load; the medians and minimums of ``--repeat`` turns each are printed (CPU s: user + system of
the process and its children; wall s beside them). Not a test: it asserts nothing about time.

    python benchmarks/small_runs_ab.py --against 417894f --run pp_1f1b_4rank_slow1 --repeat 10
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from small_runs import timed  # noqa: E402  (one command in a fresh process: CPU s, wall s)

#: the commands (after ``python -m traceanalyzer``); STORE and RUN are filled in
COMMANDS = {"analyze": ["analyze", "STORE", "--run", "RUN", "--no-save"],
            "report": ["report", "STORE", "--run", "RUN", "-o", "OUT/r.json", "--no-replay"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", required=True, metavar="REV", help="the older commit (a git worktree)")
    ap.add_argument("--run", default="pp_1f1b_4rank_slow1", help="a shipped run (folder of traces/)")
    ap.add_argument("--command", choices=sorted(COMMANDS), default="analyze")
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ta-ab-") as tmp:
        tmp = Path(tmp)
        old = tmp / "old"
        subprocess.run(["git", "worktree", "add", "--detach", str(old), args.against], cwd=REPO, check=True,
                       capture_output=True)
        try:
            trees = {"this tree": REPO, args.against: old}
            cmds, envs = {}, {}
            for label, src in trees.items():
                work = tmp / label.replace(" ", "_")
                work.mkdir()
                envs[label] = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(src)}
                py = [sys.executable, "-m", "traceanalyzer"]
                store = work / "store"
                subprocess.run(py + ["ingest", str(REPO / "traces" / args.run), "--store", str(store), "--quiet"],
                               env=envs[label], cwd=work, check=True, capture_output=True)
                subprocess.run(py + ["analyze", str(store)], env=envs[label], cwd=work, check=True, capture_output=True)
                fill = {"STORE": str(store), "RUN": args.run}
                cmds[label] = (py + [fill.get(a, a).replace("OUT", str(work)) for a in COMMANDS[args.command]], work)
            times: dict[str, list[tuple[float, float]]] = {label: [] for label in trees}
            for _ in range(args.repeat):
                for label in trees:
                    cmd, work = cmds[label]
                    times[label].append(timed(cmd, envs[label], work))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=REPO, capture_output=True)
            shutil.rmtree(old, ignore_errors=True)
    print(f"`{args.command}` on {args.run}, {args.repeat} turns each; CPU s median (min); wall s median")
    print("| tree | CPU s | wall s |")
    print("|---|---|---|")
    for label, ts in times.items():
        cpu = [c for c, _ in ts]
        print(f"| {label} | {statistics.median(cpu):.2f} ({min(cpu):.2f}) | {statistics.median(w for _, w in ts):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
