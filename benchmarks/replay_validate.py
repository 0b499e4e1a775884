#!/usr/bin/env python3
"""Replay validation against real re-runs: predict a changed run from a recorded one, then run the
change for real and compare (issue "Replay", section "Validation against real re-runs").

Usage (from the repo root, on an otherwise idle machine; ~15 min with the defaults):

    python benchmarks/replay_validate.py [--repeats 5] [--only slow_rank,microbatches,...] [--append]

Each scenario is a pair of real ``torchrun`` + gloo runs of ``traceanalyzer.workloads`` (one thread
per rank, ranks pinned to cores): the *source* configuration A and the *target* configuration B.
Every repeat records A and B afresh (interleaved A, B, A, B, ... so that slow drift of the machine
hits both). Per scenario:

* measured step time of a run = the job step time (``replay.job_step_ns``: per rank the mean step
  time over the profiled window, then the slowest rank);
* predicted = the what-if of B applied to each A run (mean over the A runs);
* spread = the run-to-run spread of B, std / mean of its measured job step times (and of A, shown);
* error = |predicted - measured B| / measured B; goal: error <= max(5 %, 2 x spread).

Scenarios (2 ranks, one per core: this machine has 2 cores):

1. ``slow_rank``: DDP, rank 1 sleeps 10 ms per step  -> plan "idealise rank 1" vs a clean run;
2. ``microbatches``: 1F1B with m = 4 -> predict m = 8 (same micro-batch size) vs a real m = 8 run;
3. ``schedule``: GPipe (m = 4) -> predict 1F1B vs a real 1F1B run;
4. ``bucket``: DDP with 25 MB buckets -> predict 4 MB vs a real 4 MB run (a 28 MB model).

The pipeline and DDP predictions come from ``traceanalyzer.replay.pipeline`` and
``traceanalyzer.replay.ddp`` (structural what-ifs: the schedule / buckets are regenerated from
costs measured in the trace). The script prints one table and, with ``--append``, adds it to
``benchmarks/RESULTS.md``. It asserts nothing: the tests check direction and rough size on the
committed traces; this measures the error on fresh runs.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import harness  # noqa: E402  (RESULTS.md: benchmarks/harness.py; benchmarks/ is the script's folder)

STEPS = ["--steps", "9", "--prof-active", "6"]
BIG_DDP = ["--width", "1024", "--depth", "8"]   # 7.4 M params, 28 MB of gradients
PP = ["--microbatch-rows", "128", "--layers-per-stage", "4"]   # a few ms of compute per micro-batch

SCENARIOS = {
    "slow_rank": dict(
        what="DDP, rank 1 +10 ms/step -> idealise rank 1, vs a clean run",
        a=["ddp", *STEPS, "--slow-rank", "1", "--slow-ms", "10"],
        b=["ddp", *STEPS],
        predict=("graph", {"actions": [{"action": "idealize", "ranks": [1]}]})),
    "microbatches": dict(
        what="1F1B m=4 -> predict m=8 (same micro-batch size), vs a real m=8 run",
        a=["pipeline", "--schedule", "1f1b", "--microbatches", "4", *PP, *STEPS],
        b=["pipeline", "--schedule", "1f1b", "--microbatches", "8", *PP, *STEPS],
        predict=("pipeline", {"microbatches": 8})),
    "schedule": dict(
        what="GPipe m=4 -> predict 1F1B, vs a real 1F1B run",
        a=["pipeline", "--schedule", "gpipe", "--microbatches", "4", *PP, *STEPS],
        b=["pipeline", "--schedule", "1f1b", "--microbatches", "4", *PP, *STEPS],
        predict=("pipeline", {"schedule": "1f1b"})),
    "bucket": dict(
        what="DDP 25 MB buckets -> predict 4 MB, vs a real 4 MB run",
        a=["ddp", *STEPS, *BIG_DDP, "--bucket-mb", "25"],
        b=["ddp", *STEPS, *BIG_DDP, "--bucket-mb", "4"],
        predict=("ddp", {"bucket_mb": 4})),
}


def record(args: list[str], tmp: Path, name: str, extra: list[str]) -> Path:
    """One real 2-rank run, ingested into its own store; returns the store."""
    import traceanalyzer as ta
    from traceanalyzer.workloads.launch import launch
    res = launch(2, [*args, *extra, "--run-name", name], tmp / f"launch-{name}", timeout=300)
    store = tmp / f"store-{name}"
    ta.ingest([str(res.out_dir / name)], str(store), run=name, progress=False, workers=1)
    return store


def measured(store: Path, run: str) -> float:
    import traceanalyzer as ta
    from traceanalyzer.replay import job_step_ns
    st = ta.open(str(store)).execute("SELECT rank, step, dur_ns FROM steps WHERE run = $r", {"r": run}).df()
    return job_step_ns(st, "dur_ns")


def predict(kind: str, plan: dict, store: Path, run: str) -> tuple[float, float]:
    """(predicted job step ns, identity-model median error) of the what-if on the source run."""
    import traceanalyzer as ta
    from traceanalyzer import replay
    con = ta.open(str(store))
    if kind == "graph":
        r = replay.what_if(replay.build_graph(con, run), plan)
    elif kind == "pipeline":
        from traceanalyzer.replay import pipeline
        r = pipeline.predict(con, run, **plan)
    else:
        from traceanalyzer.replay import ddp
        r = ddp.predict(con, run, **plan)
    return r.job_step_ns(), r.identity_error["median"]


def cv(xs: list[float]) -> float:
    return statistics.pstdev(xs) / statistics.mean(xs) if len(xs) > 1 else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", default=",".join(SCENARIOS))
    ap.add_argument("--append", action="store_true")
    args = ap.parse_args()
    rows = []
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmpd:
        tmp = Path(tmpd)
        for name in args.only.split(","):
            sc = SCENARIOS[name]
            ma, mb, preds, ident = [], [], [], []
            note = ""
            for i in range(args.repeats):
                try:
                    sa = record(sc["a"], tmp, f"{name}_a{i}", [])
                    sb = record(sc["b"], tmp, f"{name}_b{i}", [])
                except Exception as exc:  # noqa: BLE001 - report and go on with the next scenario
                    note = f"run failed: {str(exc).splitlines()[0][:200]}"
                    break
                ma.append(measured(sa, f"{name}_a{i}"))
                mb.append(measured(sb, f"{name}_b{i}"))
                try:
                    p, e = predict(*sc["predict"], sa, f"{name}_a{i}")
                    preds.append(p)
                    ident.append(e)
                except Exception as exc:  # noqa: BLE001
                    note = f"prediction failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                print(f"{name} #{i}: A {ma[-1] / 1e6:.2f} ms, B {mb[-1] / 1e6:.2f} ms, "
                      f"predicted {preds[-1] / 1e6 if preds else float('nan'):.2f} ms", flush=True)
            if not mb:
                rows.append((name, sc["what"], None, None, None, None, None, None, None, note))
                continue
            p = statistics.mean(preds) if preds else float("nan")
            b = statistics.mean(mb)
            err = abs(p - b) / b
            spread = cv(mb)
            goal = max(0.05, 2 * spread)
            rows.append((name, sc["what"], statistics.mean(ma), cv(ma), b, spread, p, err,
                         statistics.median(ident) if ident else float("nan"), note or ("met" if err <= goal else "missed")))
    lines = ["| scenario | what | A measured ms (spread) | B measured ms (spread) | B predicted ms | error | goal | "
             "identity-model error (median) | verdict |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r[2] is None:
            lines.append(f"| {r[0]} | {r[1]} | - | - | - | - | - | - | {r[9]} |")
            continue
        lines.append(f"| {r[0]} | {r[1]} | {r[2] / 1e6:.2f} ({100 * r[3]:.1f} %) | {r[4] / 1e6:.2f} ({100 * r[5]:.1f} %) | "
                     f"{r[6] / 1e6:.2f} | {100 * r[7]:.1f} % | {100 * max(0.05, 2 * r[5]):.1f} % | {100 * r[8]:.1f} % | {r[9]} |")
    text = (f"\n## Replay validation against real re-runs\n\n`python benchmarks/replay_validate.py --repeats "
            f"{args.repeats}` on {platform.node()} ({os.cpu_count()} CPUs, Python {platform.python_version()}), "
            f"{time.strftime('%Y-%m-%d')}, {time.perf_counter() - t_all:.0f} s; 2 ranks (one per core, "
            f"OMP_NUM_THREADS=1), {args.repeats} runs of A and of B per scenario, interleaved. Spread = std/mean of "
            f"the runs' job step times; goal: error <= max(5 %, 2 x spread of B).\n\n" + "\n".join(lines) + "\n")
    print(text)
    if args.append:
        harness.append_results(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
