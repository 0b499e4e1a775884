"""`traceanalyzer demo` on the shipped sample runs: its peak memory and the length of what it prints.

    python benchmarks/demo_bench.py [--limit-mb 1024] [--max-lines 60]

Runs the demo in a child process (a fresh store in a temporary folder) under ``/usr/bin/time -v``
when it exists (else the child's ru_maxrss) and prints the peak resident set size, the lines
printed and the wall time; exits 1 when the peak exceeds ``--limit-mb`` or the output
``--max-lines`` (issue 16: under 1 GB, at most 60 lines). Measured on the shared 2-core machine:
1.56 GB and 61 lines before, 0.58 GB and 25 lines after (pipeline_idle / pipeline_bubbles computed
once per connection; the summary trimmed to the findings and the next commands).
"""
from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit-mb", type=float, default=1024.0)
    ap.add_argument("--max-lines", type=int, default=60)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="demo-bench-") as tmp:
        cmd = [sys.executable, "-m", "traceanalyzer", "demo", "--store", os.path.join(tmp, "store")]
        timev = os.path.exists("/usr/bin/time")
        t0 = time.perf_counter()
        r = subprocess.run((["/usr/bin/time", "-v"] if timev else []) + cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
    if r.returncode != 0:
        print(r.stdout[-2000:], r.stderr[-2000:], file=sys.stderr)
        return 2
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr)
    peak_mb = (int(m.group(1)) if m else resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024
    lines = r.stdout.rstrip("\n").count("\n") + 1
    print(f"demo: peak RSS {peak_mb:.0f} MB (limit {args.limit_mb:.0f}), {lines} lines (max {args.max_lines}), "
          f"{wall:.1f} s wall")
    return 0 if peak_mb <= args.limit_mb and lines <= args.max_lines else 1


if __name__ == "__main__":
    sys.exit(main())
