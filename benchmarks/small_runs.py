#!/usr/bin/env python3
"""Small runs answer at once (issue 18, part 5): fixed costs, not data, used to dominate them.

One run of this script times, each in a fresh process and as CPU seconds (user + system of the
process and its children, from ``wait4``: on a shared 2-core VM wall time measures the neighbours),
the median of ``--repeat`` runs of:

- ``traceanalyzer --help``;
- the baseline: ``traceanalyzer sql STORE "SELECT count(*) FROM events"`` (open the store, one scan);
- ``traceanalyzer analyze STORE --run R --no-save``;
- ``traceanalyzer report STORE --run R -o report.json --no-replay`` on a store whose results are saved
  (and the same with the replay what-ifs, and as HTML, which draws the figures);
- a notebook's ``ta.open(store).report("r.json", run=R)`` (the same JSON report through the session);

on a store holding one shipped 4-rank run (``--run``, default ``ddp_gloo_4rank_slow2``), and prints
each against the baseline (ratios measured in the same run). With ``--against REV`` the same is
timed for an older commit (checked out in a temporary git worktree, run with the same Python) and
printed beside it. Each tree's modules run from bytecode compiled once (cached in its work folder,
one untimed run of each case first), as an installed wheel's do; ``--no-bytecode-cache`` compiles
them in every process. Targets (issue 18): analyze <= 2 s, report <= 3 s, --help <= 0.5 s. This is a
script, not a test: it asserts nothing about time.
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
import harness  # noqa: E402  (timing and memory of a child: benchmarks/harness.py)


def timed(cmd: list[str], env: dict, cwd: Path) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one command in a fresh process, children included."""
    with tempfile.NamedTemporaryFile("w+", suffix=".log") as log:
        r = harness.run_child(cmd, Path(log.name), env=env, cwd=cwd)
    if not r["ok"]:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{r['log_tail'][-2000:]}")
    return r["cpu_seconds"], r["wall_seconds"]


def measure(src: Path, run: str, repeat: int, work: Path, bytecode: bool = True) -> dict[str, tuple[float, float]]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(src)
    if bytecode:
        # as an installed wheel runs: its modules compiled once (pip compiles them at install), not
        # from source in every process (PYTHONDONTWRITEBYTECODE, set on some machines, compiles every
        # module of the tree at every start: ~0.3 s of a report here); cached in this tree's work
        # folder, not beside the sources, and warmed by one untimed run of each case
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
    py = [sys.executable, "-m", "traceanalyzer"]
    store = work / "store"
    subprocess.run(py + ["ingest", str(REPO / "traces" / run), "--store", str(store), "--quiet"], env=env, cwd=work,
                   check=True, capture_output=True)
    subprocess.run(py + ["analyze", str(store)], env=env, cwd=work, check=True, capture_output=True)
    cases = {
        "--help": py + ["--help"],
        "baseline: sql count(*)": py + ["sql", str(store), "SELECT count(*) FROM events"],
        "analyze": py + ["analyze", str(store), "--run", run, "--no-save"],
        "report (no replay)": py + ["report", str(store), "--run", run, "-o", str(work / "r.json"), "--no-replay"],
        "report": py + ["report", str(store), "--run", run, "-o", str(work / "r.json")],
        "report -o r.html": py + ["report", str(store), "--run", run, "-o", str(work / "r.html")],
        "notebook: ta.open(store).report(r.json)": [sys.executable, "-c", "import sys, traceanalyzer as ta; "
                                                    "ta.open(sys.argv[1]).report(sys.argv[2], run=sys.argv[3])",
                                                    str(store), str(work / "r.json"), run],
    }
    out = {}
    for name, cmd in cases.items():
        if bytecode:
            timed(cmd, env, work)
        runs = [timed(cmd, env, work) for _ in range(repeat)]
        out[name] = (statistics.median(c for c, _ in runs), statistics.median(w for _, w in runs))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", default="ddp_gloo_4rank_slow2", help="a shipped run (folder of traces/)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--against", metavar="REV", help="also time this older commit (a git worktree)")
    ap.add_argument("--no-bytecode-cache", action="store_true",
                    help="compile every module from source in every process (no .pyc written or read from the "
                         "work folder; the environment's PYTHONDONTWRITEBYTECODE kept as it is)")
    args = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="ta-small-") as tmp:
        tmp = Path(tmp)
        sources = {"this tree": REPO}
        if args.against:
            wt = tmp / "old"
            subprocess.run(["git", "worktree", "add", "--detach", str(wt), args.against], cwd=REPO, check=True,
                           capture_output=True)
            sources[args.against] = wt
        try:
            for label, src in sources.items():
                work = tmp / label.replace(" ", "_")
                work.mkdir()
                results[label] = measure(src, args.run, args.repeat, work, bytecode=not args.no_bytecode_cache)
        finally:
            if args.against:
                subprocess.run(["git", "worktree", "remove", "--force", str(tmp / "old")], cwd=REPO,
                               capture_output=True)
                shutil.rmtree(tmp / "old", ignore_errors=True)
    print(f"run {args.run}, median of {args.repeat}; CPU s (wall s); x = CPU / baseline CPU of the same tree; "
          + ("every module compiled in every process" if args.no_bytecode_cache
             else "bytecode cached (as installed), one warm-up run a case"))
    labels = list(results)
    print("| case | " + " | ".join(labels) + " |")
    print("|---|" + "---|" * len(labels))
    for case in results[labels[0]]:
        cells = []
        for label in labels:
            cpu, wall = results[label][case]
            base = results[label]["baseline: sql count(*)"][0]
            cells.append(f"{cpu:.2f} ({wall:.2f}), x{cpu / base:.1f}")
        print(f"| {case} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
