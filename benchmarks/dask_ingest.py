#!/usr/bin/env python3
"""Ingest on a Dask LocalCluster vs. the local process pool (issue 18 part 2).

One run of this script

1. builds N per-rank Kineto trace files from one shipped rank file (``ingest_bench.generate``:
   its events repeated to ``--mb-per-rank`` MB, shifted in time, ``distributedInfo.rank`` and the
   world rewritten per file);
2. ingests them, each phase in its own subprocess, into a fresh store:

   * ``pool`` - ``ingest(files, store, workers=W)``: the local process pool (one process per file);
   * ``dask`` - ``ingest(files, store, dask="local:W")``: a LocalCluster of W single-threaded
     worker processes, started and closed inside the call (its start is part of the wall time);

3. prints, per phase, the wall time, the CPU time of the client process and of all the processes
   it started (``getrusage``), the client's peak RSS, and the rows stored (which must be equal).

A script, not a test: it asserts nothing about timings. The ratio dask/pool is measured in the same
run; on a shared machine both are noisy.

    PYTHONPATH=. python benchmarks/dask_ingest.py --ranks 32 --mb-per-rank 4 --workers 2
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_SOURCE = str(REPO / "traces" / "ddp_gloo_4rank_slow2" / "rank0.window0.pt.trace.json.gz")
PHASES = ("pool", "dask")


def phase(name: str, files_dir: str, store: str, workers: int) -> dict:
    """One ingest in this process; what it cost (the caller runs this in a fresh interpreter)."""
    import traceanalyzer as ta
    files = sorted(str(p) for p in Path(files_dir).glob("*.json"))
    t0 = time.perf_counter()
    rep = ta.ingest(files, store, run="bench", workers=workers, dask=f"local:{workers}" if name == "dask" else None)
    wall = time.perf_counter() - t0
    sys.path.insert(0, str(HERE))
    from ingest_bench import _stop_forkserver
    _stop_forkserver()  # the pool's workers are the forkserver's children: reaped with it, counted below
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    con = ta.open(store)
    rows = {t: con.sql(f"SELECT count(*) FROM {t}").fetchall()[0][0] for t in ("events", "comms", "ranks")}
    return {"phase": name, "wall_s": round(wall, 2), "client_cpu_s": round(me.ru_utime + me.ru_stime, 2),
            "children_cpu_s": round(kids.ru_utime + kids.ru_stime, 2), "client_peak_rss_mb": round(me.ru_maxrss / 1024),
            "traces": len(rep.traces), "rows": rows}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=32)
    ap.add_argument("--mb-per-rank", type=float, default=4.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--source", default=DEFAULT_SOURCE)
    ap.add_argument("--repeats", type=int, default=1, help="runs of each phase, alternating (best wall kept)")
    ap.add_argument("--phase", choices=PHASES, help=argparse.SUPPRESS)  # internal: one phase, JSON on stdout
    ap.add_argument("--files-dir", help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.phase:
        print(json.dumps(phase(args.phase, args.files_dir, args.store, args.workers)))
        return

    sys.path.insert(0, str(HERE))
    from ingest_bench import generate, machine_info
    work = Path(tempfile.mkdtemp(prefix="dask-ingest-"))
    try:
        gen = generate(args.source, work / "in", args.ranks, args.mb_per_rank)
        mb = sum(f["bytes"] for f in gen["files"]) / 1e6
        print(f"input: {args.ranks} ranks x {gen['files'][0]['events']:,} events ({mb:.0f} MB of JSON) from {args.source}")
        results = {p: [] for p in PHASES}
        for _ in range(args.repeats):
            for p in PHASES:
                store = work / f"store-{p}"
                shutil.rmtree(store, ignore_errors=True)
                out = subprocess.run([sys.executable, __file__, "--phase", p, "--files-dir", str(work / "in"),
                                      "--store", str(store), "--workers", str(args.workers)],
                                     capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
                if out.returncode:
                    raise SystemExit(f"phase {p} failed:\n{out.stderr[-3000:]}")
                results[p].append(json.loads(out.stdout.strip().splitlines()[-1]))
        best = {p: min(rs, key=lambda r: r["wall_s"]) for p, rs in results.items()}
        print(f"machine: {json.dumps(machine_info())}")
        print("| phase | wall s | client CPU s | workers' CPU s | client peak RSS MB | events stored |")
        print("|---|---|---|---|---|---|")
        for p, r in best.items():
            print(f"| {p} (W={args.workers}) | {r['wall_s']} | {r['client_cpu_s']} | {r['children_cpu_s']} | "
                  f"{r['client_peak_rss_mb']} | {r['rows']['events']:,} |")
        print(f"dask / pool wall: {best['dask']['wall_s'] / best['pool']['wall_s']:.2f}; every wall: "
              + "; ".join(f"{p} {[r['wall_s'] for r in rs]}" for p, rs in results.items()))
        if best["dask"]["rows"] != best["pool"]["rows"]:
            raise SystemExit(f"the stores differ: {best['dask']['rows']} vs {best['pool']['rows']}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
