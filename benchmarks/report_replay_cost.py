"""What the report's replay costs on a big store: the graph, then one "idealise rank r" what-if per
rank given (the report replays at most 3 rank findings, sharing one simulator, as here).

Usage (from the repo root): ``python benchmarks/report_replay_cost.py STORE [--ranks 3 11 19]``,
e.g. on the 128-rank store that ``benchmarks/analyses_bench.py --workdir DIR --keep --ingest-only``
builds. Prints one Markdown line with the seconds and the peak RSS. This is what
``traceanalyzer report`` adds to its own time for a run with rank findings worth >= 1 % of a step
(traceanalyzer/report/whatif.py: REPLAY_MAX_EVENTS).
"""
from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("store")
    ap.add_argument("--ranks", type=int, nargs="+", default=[3, 11, 19])
    args = ap.parse_args()
    import traceanalyzer as ta
    from traceanalyzer import replay
    con = ta.open(args.store)
    (n_ev,) = con.execute("SELECT count(*) FROM events").fetchone()
    t0 = time.perf_counter()
    g = replay.build_graph(con)
    graph_s = time.perf_counter() - t0
    sim = replay.Simulator(g)
    what_ifs = []
    for r in args.ranks:
        t = time.perf_counter()
        replay.what_if(g, {"actions": [{"action": "idealize", "ranks": [r]}]}, sim=sim)
        what_ifs.append(time.perf_counter() - t)
    total = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    print(f"| {n_ev:,} events, {g.n:,} nodes | graph {graph_s:.2f} s | what-ifs "
          f"{', '.join(f'{x:.2f}' for x in what_ifs)} s | total {total:.2f} s | peak RSS {rss:.1f} GB | "
          f"{platform.node()}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
