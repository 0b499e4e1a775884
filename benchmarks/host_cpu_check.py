"""Host CPU contention on a real DDP run: how long each rank's training thread waited for a core per
step (the collector's schedstat samples, ``host_cpu`` analysis) and what sampling costs per step.

    PYTHONPATH=$PWD python benchmarks/host_cpu_check.py --ranks 4 [--no-pin] [--op-timeline] [--append]

Launches ``ddp`` on gloo (``traceanalyzer.workloads``; ranks pinned one per core modulo the cores
unless ``--no-pin``), lets rank 0 ingest it, runs ``host_cpu`` and prints a Markdown section: per
rank the median step, its training thread's CPU wait per step and share, the process's (every
thread) wait, and the sampler's own cost per step (the rank manifest's ``cpu_sched.cost_ns`` /
``cost_cpu_ns`` / ``n_samples`` and each sample's ``sample_ns``, measured in the rank). The machine's load before and after is in the section: the wait is what that load does.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import append_results, machine_line  # noqa: E402


def _span(values) -> str:
    lo, hi = int(values.min()), int(values.max())
    return str(lo) if lo == hi else f"{lo}-{hi}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--active", type=int, default=10, help="profiled steps (one window)")
    p.add_argument("--no-pin", action="store_true", help="do not pin each rank to a core")
    p.add_argument("--op-timeline", action="store_true", help="the light collector instead of the profiler")
    p.add_argument("--append", action="store_true", help="append the section to benchmarks/RESULTS.md")
    a = p.parse_args(argv)
    from traceanalyzer.analyses import connect, prepare
    from traceanalyzer.workloads.launch import launch
    load0 = os.getloadavg()
    steps = a.active + 3
    args = ["ddp", "--run-name", "hc", "--steps", str(steps), "--prof-active", str(a.active), "--store", "{attempt}/store"]
    args += ["--no-pin"] * a.no_pin + ["--op-timeline"] * a.op_timeline
    with tempfile.TemporaryDirectory(prefix="host_cpu_check.") as tmp:
        res = launch(a.ranks, args, Path(tmp), timeout=600)
        load1 = os.getloadavg()
        folder, store = res.out_dir / "hc", res.out_dir.parent / "store"
        cost, cpu, mids = {}, {}, {}
        for r in range(a.ranks):
            summary = json.loads((folder / f"rank{r}.manifest.json").read_text())["cpu_sched"]
            cs = json.loads((folder / summary["file"]).read_text())
            cost[r] = summary["cost_ns"] / max(1, summary["n_samples"])
            cpu[r] = summary["cost_cpu_ns"] / max(1, summary["n_samples"])
            mids[r] = statistics.median(s[cs["columns"].index("sample_ns")] for s in cs["samples"])
        con = connect(store)
        prepare(con, views=["host_cpu_ranks"])
        ranks = con.execute("SELECT * FROM host_cpu_ranks ORDER BY rank").df()
    mode = "op timeline (light)" if a.op_timeline else "profiler"
    lines = [f"\n## Host CPU contention: {a.ranks}-rank gloo DDP, {mode}, ranks {'not ' if a.no_pin else ''}pinned "
             f"(benchmarks/host_cpu_check.py)\n",
             f"{machine_line()}; load before the run {load0[0]:.1f}, after {load1[0]:.1f} (1-min averages; other "
             f"helpers' jobs share the 2 cores). {steps} steps; medians over each rank's {_span(ranks['steps'])} "
             f"traced steps (an op timeline records every step).\n",
             "| rank | cores usable / host | step (ms) | main thread CPU wait (ms/step) | wait % of step | "
             "process wait, all threads (ms/step) | peers' median wait (ms/step) | sampler cost: mean wall / median wall / mean CPU (us/step) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in ranks.itertuples():
        lines.append(f"| {r.rank} | {r.cores} / {r.cpu_count} | {r.step_ns_per_step / 1e6:.1f} | {r.wait_ns_per_step / 1e6:.2f} "
                     f"| {r.wait_pct:.1f} | {r.proc_wait_ns_per_step / 1e6:.2f} | {r.peers_wait_ns_per_step / 1e6:.2f} "
                     f"| {cost[int(r.rank)] / 1e3:.0f} / {mids[int(r.rank)] / 1e3:.0f} / {cpu[int(r.rank)] / 1e3:.0f} |")
    med = ranks["wait_pct"].median()
    wall, own, mid = (sum(x.values()) / len(x) for x in (cost, cpu, mids))
    lines.append(f"\nMedian over ranks of the per-rank median wait share: {med:.1f} %. Sampler cost per step (mean over "
                 f"ranks): {wall / 1e3:.0f} us wall ({100 * wall / ranks['step_ns_per_step'].median():.2f} % of the median "
                 f"step; median {mid / 1e3:.0f} us), {own / 1e3:.0f} us of CPU (the wall time includes waiting for a core).\n")
    text = "\n".join(lines)
    print(text)
    if a.append:
        append_results(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
