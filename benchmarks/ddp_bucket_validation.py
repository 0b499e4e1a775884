"""Validate the DDP bucket what-if against real re-runs: record N back-to-back pairs of the big-mlp
DDP job at two bucket sizes, predict each pair's second size from its first, print the table.

    PYTHONPATH=$PWD python benchmarks/ddp_bucket_validation.py --pairs 5 --out /tmp/ddpval
    PYTHONPATH=$PWD python benchmarks/ddp_bucket_validation.py --reuse --out /tmp/ddpval   # no recording

Per pair: measured job step (per step the slowest rank, mean over the 3 active steps) at --from-mb
and --to-mb, the identity model of each, the prediction of --to-mb from the --from-mb run, and its
error. At the end: the median prediction error and the run-to-run spread of each size (max/min - 1
of the measured job steps), the goal being error <= max(5 %, 2 x spread). A script, not a test:
run it on a quiet machine (2 ranks, each pinned to a core, OMP_NUM_THREADS=1).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

WIDTH, DEPTH = 1024, 8


def record(out: Path, name: str, bucket_mb: float) -> None:
    cmd = [str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc_per_node=2",
           "-m", "traceanalyzer.workloads", "ddp", "--out", str(out), "--run-name", name,
           "--width", str(WIDTH), "--depth", str(DEPTH), "--bucket-mb", str(bucket_mb)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for _ in range(2):   # gloo runs fail rarely (a rank SIGABRT): retry once
        if subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:
            return
    raise SystemExit(f"recording {name} failed twice: {' '.join(cmd)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--from-mb", type=float, default=25.0)
    p.add_argument("--to-mb", type=float, default=4.0)
    p.add_argument("--reuse", action="store_true", help="use runs already under --out")
    a = p.parse_args()
    import pandas as pd

    import traceanalyzer as ta
    from traceanalyzer.replay import ddp
    runs = a.out / "runs"
    store = a.out / "store"
    rows = []
    for i in range(1, a.pairs + 1):
        if not a.reuse:
            record(runs, f"from_{i}", a.from_mb)
            record(runs, f"to_{i}", a.to_mb)
    have = set(ta.info(str(store))["run"]) if store.exists() else set()
    for i in range(1, a.pairs + 1):
        for n in (f"from_{i}", f"to_{i}"):
            if n not in have:
                ta.ingest([str(runs / n)], str(store), run=n, progress=False)
    con = ta.open(str(store))
    for i in range(1, a.pairs + 1):
        src = ddp.predict(con, f"from_{i}", bucket_mb=a.to_mb)
        dst = ddp.predict(con, f"to_{i}")
        rows.append({"pair": i, "from_meas_ms": src.job_step_ns("measured_ns") / 1e6,
                     "from_ident_ms": src.job_step_ns("identity_ns") / 1e6,
                     "to_meas_ms": dst.job_step_ns("measured_ns") / 1e6,
                     "to_ident_ms": dst.job_step_ns("identity_ns") / 1e6,
                     "to_pred_ms": src.job_step_ns() / 1e6,
                     "ident_err_median": max(src.identity_error["median"], dst.identity_error["median"])})
    df = pd.DataFrame(rows)
    df["pred_err"] = df["to_pred_ms"] / df["to_meas_ms"] - 1
    print(df.round(3).to_string(index=False))
    spread = {c: df[c].max() / df[c].min() - 1 for c in ("from_meas_ms", "to_meas_ms")}
    med_err = float(df["to_pred_ms"].median() / df["to_meas_ms"].median() - 1)
    print(f"median(predicted) / median(measured) - 1 = {med_err:+.3f}; |pair error| median {df['pred_err'].abs().median():.3f}")
    print(f"run-to-run spread (max/min - 1): {a.from_mb:g} MB {spread['from_meas_ms']:.3f}, {a.to_mb:g} MB {spread['to_meas_ms']:.3f}")
    print(f"goal: |error| <= max(5 %, 2 x spread) = {max(0.05, 2 * spread['to_meas_ms']):.3f}")


if __name__ == "__main__":
    main()
