"""Replay benchmark: graph build time and simulated ops per second.

Usage (from the repo root): ``python benchmarks/replay_bench.py [--append]``. Ingests the committed
traces (and the external 8-rank DLRM trace when present) into a temp store, builds each run's graph
(timed apart: the store queries vs the numpy/pandas build), then replays it ``--repeat`` times.
Speed is given as simulated nodes/s and as a ratio to a baseline measured in the same process: one
plain numpy pass over the same arrays (a cumulative sum of the durations plus a max-reduce over the
edge CSR), i.e. what the arrays cost to touch at all. Goal: >= 1 M simulated ops/s.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RUNS = {"ddp_gloo_4rank": ROOT / "traces" / "ddp_gloo_4rank", "pp_1f1b_4rank": ROOT / "traces" / "pp_1f1b_4rank",
        "dlrm_8rank": ROOT.parent / "shared" / "traces" / "external" / "param_dlrm_8rank"}


def _baseline(g) -> float:
    t = time.perf_counter()
    cs = np.cumsum(g.dur)
    v = cs[g.src] + g.lag
    m = np.maximum.reduceat(v, g.ptr[:-1][np.diff(g.ptr) > 0]) if len(v) else v
    del m
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--append", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = ap.parse_args()
    import traceanalyzer as ta
    from traceanalyzer import replay
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        for run, path in RUNS.items():
            if path.exists():
                ta.ingest([str(path)], store, run=run, progress=False, workers=2)
        con = ta.open(store)
        from traceanalyzer.analyses import prepare
        t = time.perf_counter()
        prepare(con)
        prepare_s = time.perf_counter() - t
        for run in RUNS:
            if not RUNS[run].exists():
                continue
            g = replay.build_graph(con, run)
            sim = replay.Simulator(g)
            sim.run()
            ts = [0.0] * args.repeat
            for i in range(args.repeat):
                t = time.perf_counter()
                sim.run()
                ts[i] = time.perf_counter() - t
            bs = [_baseline(g) for _ in range(args.repeat)]
            sim_s, base_s = statistics.median(ts), statistics.median(bs)
            rows.append((run, g.n, sim.n_heads, len(g.src), g.stats["load_s"], g.stats["build_s"], sim_s,
                         g.n / sim_s, base_s, sim_s / base_s))
    head = ("| run | nodes | heads | edges | load s | build s | replay ms | simulated ops/s | numpy pass ms | replay / numpy pass |\n"
            "|---|---|---|---|---|---|---|---|---|---|")
    lines = [f"| {r[0]} | {r[1]:,} | {r[2]:,} | {r[3]:,} | {r[4]:.3f} | {r[5]:.3f} | {1e3 * r[6]:.2f} | "
             f"{r[7] / 1e6:.2f} M | {1e3 * r[8]:.3f} | {r[9]:.1f}x |" for r in rows]
    cpu = platform.processor() or platform.machine()
    text = (f"\n## Replay (what-if) simulator\n\n`python benchmarks/replay_bench.py --repeat {args.repeat}` on "
            f"{platform.node()} ({os.cpu_count()} CPUs, {cpu}, Python {platform.python_version()}; machine shared "
            f"with other work), {time.strftime('%Y-%m-%d')}. Store views loaded once: {prepare_s:.2f} s (not in "
            f"'load'). Replay time is the median of {args.repeat} identity replays of the built graph; the "
            f"baseline is one plain numpy pass over the same arrays in the same process.\n\n"
            + head + "\n" + "\n".join(lines) + "\n\nGoal >= 1 M simulated ops/s: "
            + ("met on every run." if all(r[7] >= 1e6 for r in rows) else "NOT met on every run.") + "\n")
    print(text)
    if args.append:
        with open(ROOT / "benchmarks" / "RESULTS.md", "a") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
