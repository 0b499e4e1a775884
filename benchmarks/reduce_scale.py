#!/usr/bin/env python3
"""The reduce's driver memory at several rank counts, with and without its DuckDB cap (issue 18).

For each store (N-rank jobs of ``scale_bench.py --parts``, analyzed once so their per-rank
summaries are current), ``analyze`` again in a child process: the summaries are read, nothing per
rank is computed (the child fails if they are not current), so the process is the reduce alone: what
the driver of the first ``analyze`` holds after its map. Once with ``summaries.REDUCE_MEMORY_BYTES
= 0`` (no cap: DuckDB's default, 80 % of RAM; the code before the cap) and once per ``--caps`` value,
in the same run. Per child: wall and CPU seconds, peak RSS, result rows and a hash of the JSON
document (``to_json``: the caps must not change one byte). A script, not a test.

``--before DIR`` (issue 18 part 4): also the reduce of the code in DIR (a checkout of an earlier
commit, e.g. ``git archive ef68d65 | tar -x -C DIR``) on the same saved summaries, in the same run:
its child imports the package from DIR and reads the summaries whatever their key (the SQL changed,
the saved tables are a superset of what the earlier code reads: a measurement, not a result); the
JSON hashes of both must be equal.

    PYTHONPATH=$PWD python benchmarks/reduce_scale.py /tmp/drivermem/store-{128,512,1024} [--caps 1073741824] [--append]
"""
from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import harness  # noqa: E402


def child(store: str, cap: int, before: str | None = None, any_key: bool = False) -> dict:
    if before:
        sys.path.insert(0, before)       # the earlier code, on summaries saved by this one
    from traceanalyzer.analyses import summaries as sm
    from traceanalyzer.analyses.results import analyze, effective_params, to_json
    from traceanalyzer.store import files as st
    runs = sorted({t["run"] for t in st.read_manifest(st.location(store)).traces})
    if before or any_key:
        assert not before or sm.__file__.startswith(str(Path(before).resolve())), sm.__file__
        sm.current = lambda store, runs, params, manifest=None: list(runs)   # any key: no map
    elif sm.current(store, runs, effective_params({})) != runs:
        raise SystemExit(f"{store}: summaries not current (analyze it once first)")
    sm.REDUCE_MEMORY_BYTES = cap
    t0 = time.perf_counter()
    res = analyze(store)
    seconds = time.perf_counter() - t0
    peak_kb = harness.proc_status_kb("VmHWM")   # analyze's own peak (to_json below builds the whole document)
    doc = to_json(res, {})
    return {"seconds": seconds, "analyze_peak_kb": peak_kb, "rows": sum(len(d) for d in res.values()),
            "sha256": hashlib.sha256(doc.encode()).hexdigest()[:16]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stores", nargs="+")
    ap.add_argument("--caps", default="1073741824", help="comma-separated caps in bytes (0, no cap, always runs first)")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--append", action="store_true", help="append the table to benchmarks/RESULTS.md")
    ap.add_argument("--json-out", type=Path)
    ap.add_argument("--capped-only", action="store_true", help="leave out the run without a cap")
    ap.add_argument("--before", type=Path, help="also the reduce of the code in this folder (an earlier commit)")
    ap.add_argument("--any-key", action="store_true",
                    help="this code too reads the saved summaries whatever their key (reduce SQL changed, map the same)")
    args = ap.parse_args(argv)
    start = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    machine = harness.machine_line()
    caps = ([] if args.capped_only else [0]) + [int(float(c)) for c in args.caps.split(",") if int(float(c))]
    rows = []
    for store in args.stores:
        import traceanalyzer as ta
        con = ta.open(store)
        ranks = con.execute("SELECT count(DISTINCT rank) FROM ranks").fetchone()[0]
        con.close()
        for cap, code in [(c, k) for c in caps for k in ([str(args.before.resolve())] if args.before else []) + [""]]:
            load = harness.machine_info()["loadavg"][0]
            res = harness.run_child([sys.executable, str(Path(__file__).resolve()), "_child", store, str(cap), code,
                                     "any" if args.any_key else ""],
                                    Path(store).parent / f"reduce-{Path(store).name}-{cap}{'-before' if code else ''}.log",
                                    timeout_s=args.timeout, expect_result=True)
            row = {"store": store, "ranks": ranks, "cap": cap, "load_start": load, "code": "before" if code else "this",
                   **{k: res.get(k) for k in ("ok", "error", "seconds", "cpu_seconds", "child_maxrss_kb",
                                              "polled_peak_kb", "analyze_peak_kb", "rows", "sha256", "log_tail")}}
            print(json.dumps({k: v for k, v in row.items() if k != "log_tail"}), flush=True)
            rows.append(row)
            if args.json_out:
                args.json_out.write_text(json.dumps(rows, indent=1))
    text = render(rows, args, start, machine)
    print(text)
    if args.append:
        harness.append_results(text)
    return 0


def render(rows: list[dict], args, start: str, machine: str) -> str:
    out = [f"\n## The reduce's driver memory with and without its DuckDB cap (issue 18): `benchmarks/reduce_scale.py`, {start}\n",
           f"- command: `python benchmarks/reduce_scale.py {' '.join(args.stores)} --caps {args.caps}"
           f"{' --before ' + str(args.before) if args.before else ''}{' --any-key' if args.any_key else ''}`",
           f"- machine: {machine}",
           "- each row: `analyze` of a store whose summaries are current (the reduce alone) in its own process\n",
           "| ranks | code | cap | wall (s) | CPU (s) | peak RSS | analyze's peak | rows | JSON sha256 | load at start |",
           "|---:|---|---|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        kb = r.get("child_maxrss_kb") or 0
        cap = "none" if not r["cap"] else f"{r['cap'] / 2**20:.0f} MiB"
        t = f"{r['seconds']:.1f}" if r.get("ok") else f"failed ({r.get('error')})"
        out.append(f"| {r['ranks']} | {r.get('code', 'this')} | {cap} | {t} | {r.get('cpu_seconds') or 0:.1f} | {kb * 1024 / 1e9:.2f} GB | "
                   f"{(r.get('analyze_peak_kb') or 0) * 1024 / 1e9:.2f} GB | {r.get('rows') or ''} | {r.get('sha256') or ''} | {r['load_start']} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[1] == "_child":
        harness.emit_result(child(sys.argv[2], int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] else None,
                                  len(sys.argv) > 5 and sys.argv[5] == "any"))
    else:
        sys.exit(main())
