#!/usr/bin/env python3
"""A store on S3 against a local store (issue 18, part 3): ingest + analyze of one shipped run.

Starts a real S3-compatible server (moto's server mode) on localhost in this process, then times,
each in a fresh process (the CLI, as a user runs it), ``traceanalyzer ingest RUN --store S`` and
``traceanalyzer analyze S`` for S a local folder and for ``s3://bench/store-N``, ``--repeat``
times each into a new store, alternating local and S3 so that both see the same machine load.
Prints the median wall seconds and the client's CPU seconds (user + system of the CLI process,
from ``wait4``; the server's own CPU is not in it) and the S3 / local ratios of the same run.
This is a script, not a test: it asserts nothing about time.

    PYTHONPATH=$PWD python benchmarks/s3_store_bench.py [--run ddp_gloo_4rank_slow2] [--repeat 3]
"""
from __future__ import annotations

import argparse
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def timed(cmd: list[str], env: dict) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one command in a fresh process."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{err[-2000:]}")
    return wall, ru.ru_utime + ru.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", default="ddp_gloo_4rank_slow2", help="a shipped run (folder of traces/)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    import boto3
    from moto.server import ThreadedMotoServer
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = dict(os.environ, PYTHONPATH=str(REPO), AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
               AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")
    boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id="bench",
                 aws_secret_access_key="bench", region_name="us-east-1").create_bucket(Bucket="bench")
    py = [sys.executable, "-m", "traceanalyzer"]
    times: dict[tuple[str, str], list[tuple[float, float]]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="ta-s3-bench-") as tmp:
            for i in range(args.repeat):
                for where, store in (("local", f"{tmp}/store-{i}"), ("s3", f"s3://bench/store-{i}")):
                    for step, cmd in (("ingest", ["ingest", str(REPO / "traces" / args.run), "--store", store, "--quiet"]),
                                      ("analyze", ["analyze", store])):
                        times.setdefault((where, step), []).append(timed(py + cmd, env))
    finally:
        server.stop()
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in times.items()}
    print(f"run {args.run}, median of {args.repeat}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print("| step | local wall s | s3 wall s | s3 / local wall | local CPU s | s3 CPU s |")
    print("|---|---|---|---|---|---|")
    for step in ("ingest", "analyze", "ingest + analyze"):
        parts = ("ingest", "analyze") if step == "ingest + analyze" else (step,)
        lw, sw = (sum(med[(w, p)][0] for p in parts) for w in ("local", "s3"))
        lc, sc = (sum(med[(w, p)][1] for p in parts) for w in ("local", "s3"))
        print(f"| {step} | {lw:.2f} | {sw:.2f} | {sw / lw:.2f} | {lc:.2f} | {sc:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
