#!/usr/bin/env python3
"""Report benchmark: ``traceanalyzer report`` on a 128-rank store whose analyses are saved.

One run of this script

1. builds the same N-rank job as ``analyses_bench.py`` (default 128 ranks, the 8 DLRM ranks of
   ``/work/shared/traces/external/param_dlrm_8rank`` replicated, >= ``--events-per-rank`` events
   per rank; its helpers are reused, so the input and store layout are identical), ingests it and
   runs ``analyze`` once (saving every result in the store) -- none of this is timed here;
2. times, each in a fresh process, the baseline ``traceanalyzer info STORE`` (best of
   ``--repeat``) and ``traceanalyzer report STORE -o report.<fmt>`` (best of ``--repeat``): wall
   seconds and the process's peak RSS (``wait4``), and the report/baseline ratio measured in the
   same run; the report must not analyse again (checked: it says so on stderr when it does);
3. optionally (``--profile``) the report once more under cProfile, printing the top functions.

Target (issue 6): the report <= 30 s. This is a script, not a test: it asserts nothing about time.
Use a small ``--events-per-rank`` (e.g. 5000) for a quick run.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import analyses_bench as ab  # noqa: E402  (input generation, ingest/analyze phases)
import harness  # noqa: E402  (timing, memory, machine: benchmarks/harness.py)

TARGET_SECONDS = 30.0


def timed(cmd: list[str], log: Path) -> dict:
    """Run ``cmd`` (a fresh process) and return its wall seconds, exit code and peak RSS."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = harness.run_child(cmd, log, env=env, cwd=REPO)
    return {"seconds": r["wall_seconds"], "cpu_seconds": r["cpu_seconds"], "rc": r["returncode"],
            "peak_rss_kb": r["child_maxrss_kb"], "log": str(log),
            "output_tail": (r["stdout"] + log.read_text(errors="replace"))[-1500:]}


def best(cmd: list[str], log: Path, repeat: int) -> dict:
    runs = [timed(cmd, log.with_suffix(f".{i}.log")) for i in range(repeat)]
    out = min(runs, key=lambda r: r["seconds"])
    out["all_seconds"] = [round(r["seconds"], 2) for r in runs]
    out["peak_rss_kb"] = max(r["peak_rss_kb"] for r in runs)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--source-dir", default=ab.DEFAULT_SOURCE_DIR)
    p.add_argument("--ranks", type=int, default=128)
    p.add_argument("--events-per-rank", type=int, default=100_000)
    p.add_argument("--workers", type=int, default=2, help="ingest workers (default 2)")
    p.add_argument("--workdir", default=None, help="input and store folder (default: a temporary folder, deleted)")
    p.add_argument("--keep", action="store_true", help="keep the work folder")
    p.add_argument("--reuse-store", action="store_true", help="with --workdir: reuse the store (and its saved analyses)")
    p.add_argument("--format", default="html", choices=("html", "md", "json"))
    p.add_argument("--repeat", type=int, default=1, help="best of N for the report and the baseline (default 1)")
    p.add_argument("--profile", action="store_true", help="also profile one report (cProfile, top 25 by cumulative time)")
    p.add_argument("--json-out", default=None)
    args = p.parse_args(argv)

    started = _dt.datetime.now().astimezone()
    load_start = [round(x, 2) for x in os.getloadavg()]
    git = harness.git_state()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="ta-report-bench-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    try:
        man = ab._ensure_input(args, workdir)
        files = [f["path"] for f in man["files"]]
        store = workdir / f"store-{Path(man['dir']).parent.name}"
        saved = store / "_store.json"
        if not (args.reuse_store and saved.exists()):
            ing = ab.run_phase("ingest", {"files": files, "store": str(store), "run": f"job{args.ranks}",
                                          "workers": args.workers}, workdir / "ingest.log", workdir, 16.0, None)
            if not ing["ok"]:
                print(f"ingest FAILED: {ing['error']}\n{ing['log_tail']}")
                return 1
            print(f"ingest: {ing['seconds']:.1f} s (not timed for the report)", flush=True)
            an = ab.run_phase("analyze", {"store": str(store)}, workdir / "analyze.log", workdir, 16.0, 3600)
            if not an["ok"]:
                print(f"analyze FAILED: {an['error']}\n{an['log_tail']}")
                return 1
            print(f"analyze: {an['seconds']:.1f} s, results saved (not timed for the report)", flush=True)
        stats = ab.run_phase("stats", {"store": str(store)}, workdir / "stats.log", workdir, 16.0, None)
        ev = stats.get("events_total")
        print(f"store: {stats.get('ranks')} ranks, {ev:,} events" if ev else f"store stats failed: {stats.get('error')}",
              flush=True)

        base = best([py, "-m", "traceanalyzer", "info", str(store)], workdir / "info", args.repeat)
        out = workdir / f"report.{args.format}"
        rep = best([py, "-m", "traceanalyzer", "report", str(store), "-o", str(out)], workdir / "report", args.repeat)
        reanalysed = "results not saved in the store yet" in rep["output_tail"]
        ratio = rep["seconds"] / base["seconds"] if base["seconds"] else float("nan")
        print(f"baseline `traceanalyzer info`: {base['seconds']:.2f} s, peak RSS {base['peak_rss_kb'] * 1024 / 1e9:.2f} GB")
        print(f"`traceanalyzer report` ({args.format}): {rep['seconds']:.2f} s ({ratio:.1f}x the baseline), peak RSS "
              f"{rep['peak_rss_kb'] * 1024 / 1e9:.2f} GB, rc {rep['rc']}, {out.stat().st_size / 1e6 if out.exists() else 0:.1f} MB"
              f"{'; it ANALYSED AGAIN (results were not saved)' if reanalysed else ''}; target <= {TARGET_SECONDS:g} s: "
              f"{'met' if rep['seconds'] <= TARGET_SECONDS and rep['rc'] == 0 else 'MISSED'}", flush=True)
        print(rep["output_tail"])
        prof = None
        if args.profile:
            prof_out = workdir / "report.prof"
            prof = timed([py, "-m", "cProfile", "-o", str(prof_out), "-m", "traceanalyzer", "report", str(store),
                          "-o", str(workdir / f"report-prof.{args.format}")], workdir / "profile.log")
            import pstats
            pstats.Stats(str(prof_out)).sort_stats("cumulative").print_stats(25)
        payload = {"command": " ".join([py, *sys.argv]), "started": started.isoformat(timespec="seconds"),
                   "ended": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
                   "machine": harness.machine_info(),
                   "load_avg_start": load_start, "load_avg_end": [round(x, 2) for x in os.getloadavg()],
                   "git": git, "input": {k: man.get(k) for k in ("copies_per_rank", "dir", "reused")},
                   "store": stats, "baseline_info": base, "report": rep, "ratio_to_baseline": ratio,
                   "reanalysed": reanalysed, "target_seconds": TARGET_SECONDS, "profile": prof}
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(payload, indent=1, default=str))
        return 0 if rep["rc"] == 0 else 1
    finally:
        if not args.keep and args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
