#!/usr/bin/env python3
"""Op timelines of huge jobs (issue 17): ingest, analyze, replay, report and export at N ranks.

For each size (``--sizes``, ranks; ``--steps`` steps, ``--ops-per-step`` ops per rank-step) an op
timeline is generated at run time from the recorded one (:mod:`op_timeline_gen`: the PP x DP grid
grown, GPipe times simulated from the recorded op costs with a small jitter, one injected slow
worker), written as one Parquet file sorted by rank, then each phase runs as its own process
(``python -m traceanalyzer ...``; wall, CPU seconds and the peak RSS of its process tree):

- ``ingest``  ``ingest DIR --store S``
- ``analyze`` ``analyze S`` (saves the results)
- ``replay``  ``replay S --plan idealize-all --straggler-metrics`` (T, T_ideal, S, S_w per rank,
  S_t per op type, worst 3 % / last stage recovered; one whole-graph simulation per rank)
- ``report``  ``report S -o report.json``
- ``export``  ``export S --rank SLOW -o slow.json.gz``

The result checked at each size (not a timing): the analysis's ``imbalance #1`` and ``slow stage #1``,
the report's first finding, and the replay's largest S_w name the injected slow worker. A phase over
``--limit-gb`` (process tree) or ``--timeout`` is killed and reported as such. Nothing is asserted
about times; ``--append`` adds the table to RESULTS.md.

Below the table, per size: ingest + analyze in minutes (the issue's goal: 10 at 8,192 x 50) and as a
multiple of the same run's ``generate`` phase, the yardstick of this machine's speed at that hour
(the generator's own numpy and pyarrow work, one process): the shared machine's speed swings by
~1.5x between hours (session 30's ingest took 159-171 s, session 31's 111 s on the same code, with
generate 59.7 and 41.7 s), so the minutes of two runs compare only with their ratios beside them.

    PYTHONPATH=. python benchmarks/op_timeline_scale.py --sizes 512,1024,2048 --steps 50
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

import harness  # noqa: E402
import op_timeline_gen as gen  # noqa: E402

PHASES = ("ingest", "analyze", "replay", "report", "export")


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def pp_for(ranks: int) -> int:
    """Pipeline depth grown with the job: 2 stages up to 64 ranks, 4 to 1,024, 8 above."""
    return 2 if ranks <= 64 else 4 if ranks <= 1024 else 8


def slow_found(phase: str, out: str, slow: int) -> bool | None:
    """Whether the phase's output names the injected slow worker first (None: the phase says nothing)."""
    if phase == "analyze":
        imb = re.search(r"imbalance #1: rank (\d+)", out)
        stage = re.search(r"slow stage #1: stage \d+ \(rank (\d+)\)", out)
        hits = [int(m.group(1)) == slow for m in (imb, stage) if m]
        return bool(hits) and all(hits)
    if phase == "replay":
        m = re.search(r"S_w: (.*)", out)
        if not m:
            return None
        sw = {int(r): float(v) for r, v in re.findall(r"rank (\d+) ([0-9.]+)", m.group(1))}
        return bool(sw) and max(sw, key=sw.get) == slow
    if phase == "report":
        m = re.search(r"#1 [^\n]*?\(rank (\d+)\)|#1 [^\n]*?rank (\d+)", out)
        return bool(m) and int(m.group(1) or m.group(2)) == slow
    return None


def one_size(ranks: int, steps: int, ops: int, work: Path, phases, limit_gb: float, timeout: float) -> dict:
    data, store = work / f"optl_{ranks}", work / f"store_{ranks}"
    shutil.rmtree(data, ignore_errors=True)
    shutil.rmtree(store, ignore_errors=True)
    with harness.timed() as t:
        truth = gen.write(data / "op_timeline.parquet", ranks, pp_for(ranks), steps, ops)
    slow = truth["slow_rank"]
    res = {"ranks": ranks, "steps": steps, "pp": truth["pp"], "dp": truth["dp"], "microbatches": truth["microbatches"],
           "rows": truth["rows"], "slow_rank": slow, "input_bytes": (data / "op_timeline.parquet").stat().st_size,
           "generate": {"wall_seconds": t.wall_s, "cpu_seconds": t.cpu_s}}
    plan = work / "idealize_all.json"
    plan.write_text(json.dumps({"actions": [{"action": "idealize", "ranks": "all"}]}))
    py = [sys.executable, "-m", "traceanalyzer"]
    cmds = {"ingest": py + ["ingest", str(data), "--store", str(store)],
            "analyze": py + ["analyze", str(store)],
            "replay": py + ["replay", str(store), "--plan", str(plan), "--straggler-metrics"],
            "report": py + ["report", str(store), "-o", str(work / f"report_{ranks}.json")],
            "export": py + ["export", str(store), "--rank", str(slow), "-o", str(work / f"slow_{ranks}.json.gz")]}
    for phase in phases:
        r = harness.run_child(cmds[phase], log_path=work / f"{phase}_{ranks}.log", limit_gb=limit_gb,
                              timeout_s=timeout, env=_env())
        out = r.pop("stdout", "")
        r["found_slow"] = slow_found(phase, out + (work / f"{phase}_{ranks}.log").read_text(errors="replace"), slow) \
            if r["ok"] else None
        r["rows_per_cpu_s"] = truth["rows"] / max(r["cpu_seconds"], 1e-9) if r["ok"] else None
        r["output_head"], r["output_tail"] = out[:1500], out[-1500:]
        res[phase] = r
        print(f"  {ranks} ranks {phase}: {'ok' if r['ok'] else r['error']} {r['wall_seconds']:.1f} s wall, "
              f"{r['cpu_seconds']:.1f} s CPU, tree peak {r['max_tree_rss_kb'] / 1e6:.2f} GB, found slow: {r['found_slow']}",
              file=sys.stderr, flush=True)
        if not r["ok"] and phase == "ingest":
            break
    shutil.rmtree(data, ignore_errors=True)
    return res


def table(results: list[dict], phases) -> str:
    lines = ["| ranks | rows | phase | wall s | CPU s | peak RSS (tree) | rows per CPU s | slow worker named |",
             "|---:|---:|---|---:|---:|---:|---:|---|"]
    for r in results:
        g = r["generate"]
        lines.append(f"| {r['ranks']:,} (PP {r['pp']} x DP {r['dp']}, {r['microbatches']} mb) | {r['rows']:,} | generate | "
                     f"{g['wall_seconds']:.1f} | {g['cpu_seconds']:.1f} | | | |")
        for p in phases:
            x = r.get(p)
            if x is None:
                continue
            if not x["ok"]:
                lines.append(f"| {r['ranks']:,} | {r['rows']:,} | {p} | {x['wall_seconds']:.1f} | {x['cpu_seconds']:.1f} | "
                             f"{harness.fmt_bytes(x['max_tree_rss_kb'] * 1024)} | | FAILED: {x['error']} |")
                continue
            found = {True: "yes", False: "NO", None: "n/a"}[x["found_slow"]]
            lines.append(f"| {r['ranks']:,} | {r['rows']:,} | {p} | {x['wall_seconds']:.1f} | {x['cpu_seconds']:.1f} | "
                         f"{harness.fmt_bytes(x['max_tree_rss_kb'] * 1024)} | {r['rows'] / max(x['cpu_seconds'], 1e-9):,.0f} | {found} |")
    return "\n".join(lines + yardstick(results))


def yardstick(results: list[dict]) -> list[str]:
    """Per size with ingest and analyze done: their wall time together, in minutes and as a multiple
    of the same run's generate phase (the machine's speed at that hour; see the module's docstring)."""
    out = []
    for r in results:
        i, a = r.get("ingest"), r.get("analyze")
        if i and a and i["ok"] and a["ok"]:
            total = i["wall_seconds"] + a["wall_seconds"]
            out.append(f"\n{r['ranks']:,} ranks: ingest + analyze {total:.0f} s = {total / 60:.1f} minutes = "
                       f"{total / max(r['generate']['wall_seconds'], 1e-9):.1f} x this run's generate "
                       f"({r['generate']['wall_seconds']:.1f} s)")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="512,1024,2048", help="comma-separated rank counts")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--ops-per-step", type=int, default=300)
    p.add_argument("--phases", default=",".join(PHASES), help="comma-separated, of " + ", ".join(PHASES))
    p.add_argument("--limit-gb", type=float, default=12.0, help="kill a phase whose process tree exceeds this")
    p.add_argument("--timeout", type=float, default=1800.0, help="kill a phase after this many seconds")
    p.add_argument("--work", help="working folder (default: a temporary one, removed)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--append", action="store_true", help="append the table to RESULTS.md")
    p.add_argument("--render", nargs="+", metavar="JSON", help="no run: the table of these --json files")
    a = p.parse_args(argv)
    phases = [x for x in a.phases.split(",") if x]
    if a.render:
        docs = [json.loads(Path(f).read_text()) for f in a.render]
        text = table([r for d in docs for r in d["results"]], PHASES)
        print(text)
        if a.append:
            harness.append_results(f"\n{text}\n")
        return 0
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="optl_scale_"))
    work.mkdir(parents=True, exist_ok=True)
    info = harness.machine_info()
    results = []
    try:
        for n in (int(x) for x in a.sizes.split(",")):
            results.append(one_size(n, a.steps, a.ops_per_step, work, phases, a.limit_gb, a.timeout))
            if a.json:
                Path(a.json).write_text(json.dumps({"machine": info, "results": results}, indent=1, default=str))
    finally:
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)
    text = table(results, phases)
    print(text)
    if a.append:
        cmd = "PYTHONPATH=. python benchmarks/op_timeline_scale.py " + " ".join(argv or sys.argv[1:])
        harness.append_results(f"\n## Op timelines at scale (issue 17), {time.strftime('%Y-%m-%d')}\n\n`{cmd}`\n\n"
                               f"{harness.machine_line(info)}\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
