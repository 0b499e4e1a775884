#!/usr/bin/env python3
"""Collectors record into Parquet: what the per-rank conversion costs, and what it saves at ingest.

1. **Window**: a real torch.profiler window (CPU, record_shapes, a loop of small ops sized by
   ``--window-iters``) is exported with ``export_chrome_trace`` to ``.json.gz`` as the collector
   does (timed: torch's own export of the window), then converted to the store's Parquet parts by
   the collector's converter process (``python -m traceanalyzer.ingest.prebuilt build``, timed
   from start to exit, interpreter start included) and, for reference, in this process
   (:func:`traceanalyzer.ingest.prebuilt.write_parts`). The hand-off the training loop pays
   (:meth:`Converter.start`, a process start) is timed too.
2. **Shipped trace** (``traces/ddp_gloo_2rank`` rank 0): no export time was recorded with it, so
   the proxy is a Python ``json.dumps`` + gzip write of the same document (said so in the output).
3. **Ingest of an N-rank collector-written run** (``--ranks``, synthetic: a real trace replicated per
   rank by ``ingest_bench.generate``, ``--mb-per-rank`` each, renamed as the collector names them):
   ``ingest`` with every rank's parts vs the same folder with the parts moved away (parsing the JSON,
   ``--workers`` processes). Both stores are compared (row counts).

Every ratio is measured in the same run; this script asserts nothing about timings.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

WINDOW_SCRIPT = r"""
import json, os, sys, time, torch
from torch.profiler import profile, ProfilerActivity
iters, out = int(sys.argv[1]), sys.argv[2]
torch.set_num_threads(1)
x = torch.ones(4)
with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
    for i in range(iters):
        x = x.add(1.0).mul(0.5)
t0 = time.perf_counter()
p.export_chrome_trace(out)   # ".gz": torch writes the JSON, then gzips it
print(json.dumps({"export_s": time.perf_counter() - t0}))
"""


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def window(iters: int, work: Path) -> dict:
    run = work / "window"
    run.mkdir()
    trace = run / "rank0.window0.pt.trace.json.gz"
    out = subprocess.run([sys.executable, "-c", WINDOW_SCRIPT, str(iters), str(trace)], capture_output=True,
                         text=True, env=_env(), check=True)
    export_s = json.loads(out.stdout.strip().splitlines()[-1])["export_s"]
    raw = len(gzip.open(trace).read())
    from traceanalyzer.collect.parquet import Converter
    conv = Converter(0)
    t0 = time.perf_counter()
    conv.start(trace)
    handoff_s = time.perf_counter() - t0
    rc = conv.jobs[0][1].wait()
    convert_s = time.perf_counter() - t0
    assert rc == 0, (run / "parquet").glob("*.log")
    from traceanalyzer.ingest import prebuilt
    shutil.rmtree(run / "parquet")
    t0 = time.perf_counter()
    folder = prebuilt.write_parts(trace)
    inproc_s = time.perf_counter() - t0
    doc = json.loads((folder / prebuilt.SUMMARY).read_text())
    parts_bytes = sum(f.stat().st_size for f in folder.glob("*.parquet"))
    return {"iters": iters, "json_gz_bytes": trace.stat().st_size, "json_bytes": raw, "events": doc["counts"]["events"],
            "parquet_bytes": parts_bytes, "torch_export_s": export_s, "handoff_s": handoff_s,
            "convert_process_s": convert_s, "convert_in_process_s": inproc_s,
            "convert_over_export": convert_s / export_s}


def shipped(work: Path) -> dict:
    from traceanalyzer.ingest import prebuilt
    run = work / "shipped"
    shutil.copytree(REPO / "traces" / "ddp_gloo_2rank", run)
    trace = run / "rank0.window0.pt.trace.json.gz"
    doc = json.loads(gzip.open(trace).read())
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        with gzip.open(work / "proxy.json.gz", "wt") as fh:
            fh.write(json.dumps(doc, indent=1))
        times.append(time.perf_counter() - t0)
    proxy_s = min(times)
    times = []
    for _ in range(3):   # the first call also imports the parser: take the best of 3
        t0 = time.perf_counter()
        prebuilt.write_parts(trace)
        times.append(time.perf_counter() - t0)
    conv_s = min(times)
    return {"trace": "traces/ddp_gloo_2rank/rank0.window0.pt.trace.json.gz", "json_gz_bytes": trace.stat().st_size,
            "proxy_json_write_s": proxy_s, "convert_in_process_s": conv_s, "convert_over_proxy": conv_s / proxy_s,
            "note": "proxy: Python json.dumps + gzip of the same document (torch's own export time is not recorded)"}


def _convert_one(path: str) -> None:
    from traceanalyzer.ingest import prebuilt
    prebuilt.write_parts(path)


def many_ranks(ranks: int, mb: float, workers: int, source: str, work: Path, parse: bool = True) -> dict:
    from concurrent.futures import ProcessPoolExecutor

    import ingest_bench

    import traceanalyzer as ta
    run = work / "nrank"
    run.mkdir()
    gen = ingest_bench.generate(source, run, ranks, mb)
    paths = []
    for f in gen["files"]:
        p = Path(f["path"])
        paths.append(p.rename(run / f"rank{f['rank']}.window0.pt.trace.json"))
    t0 = time.perf_counter()
    with ProcessPoolExecutor(workers) as pool:   # every rank converts its own: here `workers` at a time
        list(pool.map(_convert_one, map(str, paths)))
    convert_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    rep_parts = ta.ingest([run], work / "store_parts", run="n")
    parts_s = time.perf_counter() - t0
    assert not any(t.notes for t in rep_parts.traces), "parts were not used"
    t0 = time.perf_counter()   # what a user runs: `traceanalyzer ingest` in a fresh process (imports included)
    subprocess.run([sys.executable, "-m", "traceanalyzer.cli.main", "ingest", str(run), "--store",
                    str(work / "store_cli"), "--run", "n", "--quiet"], check=True, env=_env(), capture_output=True)
    cli_s = time.perf_counter() - t0
    json_s = None
    if parse:
        shutil.move(str(run / "parquet"), str(work / "parquet_aside"))
        t0 = time.perf_counter()
        rep_json = ta.ingest([run], work / "store_json", run="n", workers=workers)
        json_s = time.perf_counter() - t0
        assert rep_json.n_events == rep_parts.n_events
    return {"ranks": ranks, "mb_per_rank": mb, "events": rep_parts.n_events, "workers": workers,
            "source": source, "convert_all_s": convert_s, "ingest_with_parts_s": parts_s,
            "cli_ingest_with_parts_s": cli_s, "ingest_parsing_json_s": json_s, "json_over_parts": json_s / parts_s if json_s else None,
            "parts_s_per_rank": parts_s / ranks}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--window-iters", type=int, default=45_000, help="loop iterations of the window (2 ops each)")
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--mb-per-rank", type=float, default=2.0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--source", default="/work/shared/traces/external/hta/ddp_2rank_rank1.json.gz")
    p.add_argument("--no-parse", action="store_true", help="ranks: time ingest with the parts only")
    p.add_argument("--skip", nargs="*", default=[], choices=["window", "shipped", "ranks"])
    p.add_argument("--json-out", default=None)
    args = p.parse_args(argv)
    out = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                       "load": os.getloadavg()},
           "command": " ".join([Path(sys.executable).name, *sys.argv])}
    with tempfile.TemporaryDirectory(prefix="collector-parquet-") as tmp:
        work = Path(tmp)
        if "shipped" not in args.skip:
            out["shipped"] = shipped(work)
            print(json.dumps(out["shipped"]), flush=True)
        if "window" not in args.skip:
            out["window"] = window(args.window_iters, work)
            print(json.dumps(out["window"]), flush=True)
        if "ranks" not in args.skip:
            out["ranks"] = many_ranks(args.ranks, args.mb_per_rank, args.workers, args.source, work,
                                      not args.no_parse)
            print(json.dumps(out["ranks"]), flush=True)
    out["machine"]["load_end"] = os.getloadavg()
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
