"""`traceanalyzer demo` on the shipped sample runs: its peak memory and the length of what it prints.

    python benchmarks/demo_bench.py [--limit-mb 1024] [--max-lines 60]

Runs the demo in a child process (a fresh store in a temporary folder; ``harness.run_child``: the
child's ru_maxrss from wait4) and prints the peak resident set size, the lines
printed and the wall time; exits 1 when the peak exceeds ``--limit-mb`` or the output
``--max-lines`` (issue 16: under 1 GB, at most 60 lines). Measured on the shared 2-core machine:
1.56 GB and 61 lines before, 0.58 GB and 25 lines after (pipeline_idle / pipeline_bubbles computed
once per connection; the summary trimmed to the findings and the next commands).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402  (timing and memory of a child: benchmarks/harness.py)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit-mb", type=float, default=1024.0)
    ap.add_argument("--max-lines", type=int, default=60)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="demo-bench-") as tmp:
        cmd = [sys.executable, "-m", "traceanalyzer", "demo", "--store", os.path.join(tmp, "store")]
        r = harness.run_child(cmd, Path(tmp) / "demo.log")
        if not r["ok"]:
            print(r["stdout"][-2000:], r["log_tail"][-2000:], file=sys.stderr)
            return 2
    wall, peak_mb = r["wall_seconds"], r["child_maxrss_kb"] / 1024
    lines = r["stdout"].rstrip("\n").count("\n") + 1
    print(f"demo: peak RSS {peak_mb:.0f} MB (limit {args.limit_mb:.0f}), {lines} lines (max {args.max_lines}), "
          f"{wall:.1f} s wall")
    return 0 if peak_mb <= args.limit_mb and lines <= args.max_lines else 1


if __name__ == "__main__":
    sys.exit(main())
