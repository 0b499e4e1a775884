"""Fuzzing with a longer budget than the suite's (tests/test_fuzz.py): seeded mutations of real
shipped traces (gloo CPU, gloo+CUDA, pipeline, the external NCCL DLRM trace when ../shared has it)
and a Flight Recorder dump, each ingested into a store that holds a good run; then ``info`` and
``analyze`` over every accepted input. Prints the reliability table row of benchmarks/RESULTS.md
and every crash (the input is kept under WORKDIR/crashes/ for a regression case).

    python benchmarks/fuzz_bench.py --budget 600 --seeds 1 2 3    # 10 minutes per seed

Also ``--named``: the named bad inputs of issue 15 (tests/hardening_cases.py), each refused with
one line or accepted and analysed, and ``--bomb``: the peak memory of ingesting a 2 MB gzip that
inflates to 2 GiB (streaming decompression; reported next to the inflated size, as a ratio).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))


def fuzz(budget: float, seeds: list[int], workdir: Path) -> int:
    import fuzzing
    total = fuzzing.Tally()
    for seed in seeds:
        t0 = time.perf_counter()
        t = fuzzing.run_fuzz(workdir / f"seed{seed}", budget, seed=seed)
        print(f"seed {seed}: {t.line()} in {time.perf_counter() - t0:.0f} s", flush=True)
        total.tried += t.tried
        total.clean += t.clean
        total.accepted += t.accepted
        total.crashes += t.crashes
    print(f"total: {total.line()}")
    for label, what, kept in total.crashes:
        print(f"CRASH {label}: {what} [{kept}]")
    return 1 if total.crashes else 0


def named(workdir: Path) -> int:
    import hardening_cases as hc
    counts: dict[str, int] = {}
    bad = 0
    for name, make in hc.CASES.items():
        d = workdir / name
        (d / "in").mkdir(parents=True)
        kind, msg = hc.outcome(make(d / "in"), d / "store")
        counts[kind] = counts.get(kind, 0) + 1
        bad += kind == "crash"
        print(f"{name:28s} {kind:9s} {msg.strip().splitlines()[-1][:150] if msg else ''}", flush=True)
    print(f"named cases: {len(hc.CASES)}: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    return 1 if bad else 0


def bomb(workdir: Path) -> int:
    """Peak RSS of a child that ingests the 2 GiB gzip bomb, against the inflated size."""
    import resource
    import subprocess

    import hardening_cases as hc
    (workdir / "bomb").mkdir(parents=True)
    path = hc.SLOW_CASES["gzip_bomb_2gib"](workdir / "bomb")[0]
    inflated = 2 * 1024**3
    code = ("import sys; sys.path.insert(0, %r); import hardening_cases as hc; from pathlib import Path;"
            "print(hc.outcome([Path(%r)], Path(%r)))") % (str(HERE.parent / "tests"), str(path), str(workdir / "bstore"))
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    print(f"gzip bomb: {path.stat().st_size:,} bytes -> {inflated:,} inflated; peak RSS {peak / 1e9:.2f} GB "
          f"= {peak / inflated:.2f}x the inflated size, in {time.perf_counter() - t0:.0f} s; "
          f"outcome: {out.stdout.strip()[:200]} {out.stderr.strip()[-300:]}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=300, help="seconds of fuzzing per seed (default 300)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1])
    ap.add_argument("--named", action="store_true", help="also the named bad inputs of issue 15")
    ap.add_argument("--bomb", action="store_true", help="also the 2 GiB gzip bomb's peak memory")
    ap.add_argument("--workdir", help="where inputs and stores go (default: a temporary folder)")
    args = ap.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="fuzz_bench-"))
    rc = 0
    if args.named:
        rc |= named(workdir / "named")
    if args.bomb:
        rc |= bomb(workdir)
    if args.budget > 0:
        rc |= fuzz(args.budget, args.seeds, workdir / "fuzz")
    return rc


if __name__ == "__main__":
    sys.exit(main())
