"""Replay benchmark: graph build time and simulated ops per second.

Usage (from the repo root): ``python benchmarks/replay_bench.py [--append]``. Ingests the committed
traces (and the external 8-rank DLRM trace when present) into a temp store, builds each run's graph
(timed apart: the load stage's store queries vs the rest of the build), then replays it ``--repeat`` times.
Speed is given as simulated nodes/s and as a ratio to a baseline measured in the same process: one
plain numpy pass over the same arrays (a cumulative sum of the durations plus a max-reduce over the
edge CSR), i.e. what the arrays cost to touch at all. Goal: >= 1 M simulated ops/s.

``--store DIR`` instead times one big store (e.g. the 128-rank replicated DLRM job that
``benchmarks/analyses_bench.py --workdir DIR --keep --ingest-only`` builds): ``build_graph`` on a fresh
connection (graph load = its store queries, build = the lanes, edges and finish stages), the whole suite's analysis
views apart (build_graph binds them only for a pipeline), simulator set-up and one identity replay,
peak RSS, with a plain DuckDB scan of the same events (count + sum of durations) as the baseline
measured in the same process. Goal (issue): a 128-rank step of >= 100 k ops per rank built and
simulated in < 5 s. Build, set-up and first replay run in one ``array_workspace`` as
``traceanalyzer replay`` runs them (the set-up reuses the memory the build freed); ``--separate``
times them as three separate API calls instead.
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
import harness  # noqa: E402  (RESULTS.md: benchmarks/harness.py; benchmarks/ is the script's folder)

RUNS = {"ddp_gloo_4rank": ROOT / "traces" / "ddp_gloo_4rank", "pp_1f1b_4rank": ROOT / "traces" / "pp_1f1b_4rank",
        "dlrm_8rank": ROOT.parent / "shared" / "traces" / "external" / "param_dlrm_8rank"}


def _baseline(g) -> float:
    t = time.perf_counter()
    cs = np.cumsum(g.dur)
    v = cs[g.src] + g.lag
    m = np.maximum.reduceat(v, g.ptr[:-1][np.diff(g.ptr) > 0]) if len(v) else v
    del m
    return time.perf_counter() - t


def big_store(store: str, append: bool, straggler: bool = True, separate: bool = False) -> int:
    import resource
    from contextlib import nullcontext

    import traceanalyzer as ta
    from traceanalyzer import replay
    from traceanalyzer.analyses import prepare
    from traceanalyzer.replay._jit import sweep_kernel
    con = ta.open(store)
    t = time.perf_counter()
    n_ev, n_rank, n_steps = con.execute("SELECT count(*), count(DISTINCT rank), (SELECT count(*) FROM steps) "
                                        "FROM events").fetchone()
    con.execute("SELECT count(*), sum(dur_ns) FROM events").fetchone()
    scan_s = time.perf_counter() - t
    # build_graph on the fresh connection: it binds only the views it needs (clock offsets; the
    # pipeline views only for a pipeline); the whole suite's views are timed apart, after
    # build, set-up and first replay as `traceanalyzer replay` runs them (the library leaves the
    # allocator alone: session 11's array workspace was removed in session 12)
    with nullcontext():
        t = time.perf_counter()
        g = replay.build_graph(con)
        build_total = time.perf_counter() - t
        t = time.perf_counter()
        sim = replay.Simulator(g)
        setup_s = time.perf_counter() - t
        t = time.perf_counter()
        sim.run()
        sim_s = time.perf_counter() - t      # the first replay of the process (numba loads its cached code)
    end_to_end = build_total + setup_s + sim_s
    t = time.perf_counter()
    sim.run()
    sim2_s = time.perf_counter() - t
    # the same again in this process: the first build also pays the process' first touch of fresh
    # memory and DuckDB's first reads of the files
    t = time.perf_counter()
    g2 = replay.build_graph(con)
    warm_s = time.perf_counter() - t
    del g2
    straggler_s, n_replays = float("nan"), 0
    if straggler:
        t = time.perf_counter()
        m = replay.straggler_metrics(g, sim)
        straggler_s = time.perf_counter() - t
        n_replays = 3 + len(m["per_rank"]) + len(m["per_op_type"]) + (1 if m["last_stage_ranks"] else 0)
    t = time.perf_counter()
    prepare(con)
    prepare_s = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    how = "three API calls, as `traceanalyzer replay` runs them"
    steps_per_rank = n_steps / max(n_rank, 1)
    phases = ", ".join(f"{k} {v:.2f}" for k, v in g.stats.get("phases_s", {}).items())
    (nested,) = con.execute("SELECT count(*) FILTER (WHERE nested AND kind = 'cpu_op') FROM events").fetchone() \
        if "nested" in {d[0] for d in con.execute("SELECT * FROM events LIMIT 0").description} else (0,)
    loop = "compiled by numba" if sweep_kernel() is not None else "plain Python (numba not installed)"
    text = (f"\n## Replay at scale: {n_rank} ranks, {n_ev:,} events ({n_ev / max(n_rank, 1):,.0f} per rank, "
            f"{steps_per_rank:.0f} steps per rank)\n\n`python benchmarks/replay_bench.py --store {store}` on "
            f"{platform.node()} ({os.cpu_count()} CPUs, Python {platform.python_version()}; load average "
            f"{os.getloadavg()[0]:.1f} at the end), {time.strftime('%Y-%m-%d %H:%M')}; head sweep {loop}; "
            f"{nested:,} nested cpu_ops (events.nested) left in the store by the builder.\n\n"
            f"| phase | seconds | vs baseline scan |\n|---|---|---|\n"
            f"| baseline: DuckDB scan of the events (count, sum) | {scan_s:.2f} | 1.0x |\n"
            f"| graph load (store queries) | {g.stats['load_s']:.2f} | {g.stats['load_s'] / scan_s:.0f}x |\n"
            f"| graph build (DuckDB lanes and edges, numpy finish: {phases}) | {g.stats['build_s']:.2f} | {g.stats['build_s'] / scan_s:.0f}x |\n"
            f"| build_graph in all (fresh process and connection) | {build_total:.2f} | {build_total / scan_s:.0f}x |\n"
            f"| simulator set-up | {setup_s:.2f} | {setup_s / scan_s:.1f}x |\n"
            f"| first identity replay ({g.n:,} nodes, {len(g.src):,} edges) | {sim_s:.2f} | {sim_s / scan_s:.1f}x |\n"
            f"| **build + set-up + first replay** ({how}) | **{end_to_end:.2f}** "
            f"| {end_to_end / scan_s:.0f}x |\n"
            f"| another replay | {sim2_s:.3f} | {sim2_s / scan_s:.1f}x |\n"
            f"| build_graph again, same process | {warm_s:.2f} | {warm_s / scan_s:.0f}x |\n"
            + (f"| straggler metrics ({n_replays} replays: identity, all idealised, one per rank left out, "
               f"per op type, top 3 %) | {straggler_s:.1f} | {straggler_s / scan_s:.0f}x |\n" if straggler else "")
            + f"| all analysis views (prepare; not needed by build_graph here) | {prepare_s:.2f} | {prepare_s / scan_s:.0f}x |\n\n"
            f"Simulated {g.n / sim2_s / 1e6:.1f} M ops/s (goal >= 1 M: {'met' if g.n / sim2_s >= 1e6 else 'NOT met'}); "
            f"peak RSS {rss:.1f} GB. Build + simulate {end_to_end:.1f} s "
            f"(goal < 5 s for one 128-rank step of >= 100 k ops per rank: "
            f"{'met' if end_to_end < 5 else 'NOT met'}).\n")
    print(text)
    if append:
        harness.append_results(text)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--store", default=None, help="time one big store instead of the committed traces")
    ap.add_argument("--append", action="store_true", help="append the table to benchmarks/RESULTS.md")
    ap.add_argument("--no-straggler", action="store_true", help="with --store: skip timing the straggler metrics")
    ap.add_argument("--separate", action="store_true",
                    help="with --store: build, set up and replay as separate API calls (each trims the memory it freed)")
    args = ap.parse_args()
    if args.store:
        return big_store(args.store, args.append, straggler=not args.no_straggler, separate=args.separate)
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
        harness.append_results(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
