#!/usr/bin/env python3
"""_collective_blocked in the reduce, the old SQL against this one (issue 18, session 19): CPU s of
each, alternated ``--repeats`` times in one connection over a store's saved summaries (a store
analyzed once: the reduce's inputs are the map's tables, ``--any-key`` attaches them even when the
code changed since), and whether their rows are identical.

The old SQL is tests/reference/collective_blocked.sql (every clipped wait joined with every compute
segment of its rank); this one (analyses/sql/stragglers.sql: ``_collective_waits``, then
``_collective_blocked``, both timed) finds the compute inside each wait through time buckets.
A script, not a test.

    PYTHONPATH=$PWD python benchmarks/collective_blocked.py /tmp/sb/store-128 [--repeats 3] [--any-key]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--any-key", action="store_true", help="attach the saved summaries even if their key is stale")
    args = ap.parse_args(argv)

    from traceanalyzer.analyses import connect
    from traceanalyzer.analyses import modules as M
    from traceanalyzer.analyses import summaries as sm
    from traceanalyzer.analyses.results import effective_params
    from traceanalyzer.store.runs import store_runs

    con = connect(args.store)
    sm.limit_memory(con, args.store)                      # as the reduce: capped, spilling
    runs, params = store_runs(con), effective_params({})
    if args.any_key:
        sm.current = lambda store, runs, params, manifest=None: list(runs)  # noqa: E731 (measurement only)
    if not sm.attach(con, args.store, runs, params):
        print("summaries not current: run analyze first (or --any-key)", file=sys.stderr)
        return 2
    M.bind(con, M.modules_for(["collective_ranks", "clock_offsets", "step_phases", "activity_segments"]) + ["intervals"])
    ref = (ROOT / "tests" / "reference" / "collective_blocked.sql").read_text()
    old = [s.query for s in con.extract_statements(ref)][0].replace("TEMP VIEW _ref_collective_blocked AS",
                                                                     "TEMP TABLE _old AS", 1)
    statements = [s.query for s in con.extract_statements(M.modules()["stragglers"].text)]
    # as bind makes them: _collective_waits a table, then _collective_blocked over it
    (waits,) = [q.replace("TEMP VIEW _collective_waits AS", "TEMP TABLE _collective_waits AS", 1)
                for q in statements if "VIEW _collective_waits AS" in q]
    (new,) = [q.replace("TEMP VIEW _collective_blocked AS", "TEMP TABLE _new AS", 1)
              for q in statements if "VIEW _collective_blocked AS" in q]
    cpu = {"old": [], "new": []}
    for _ in range(args.repeats):
        for name, sqls in (("old", [old]), ("new", [waits, new])):
            t = time.process_time()
            for sql in sqls:
                con.execute(sql)
            cpu[name].append(time.process_time() - t)
    same = [con.execute(f"SELECT count(*) FROM (SELECT * FROM {a} EXCEPT ALL SELECT * FROM {b})").fetchone()[0] == 0
            for a, b in (("_old", "_new"), ("_new", "_old"))]
    n, total = con.execute("SELECT count(*), sum(wait_ns) FROM _new").fetchone()
    ranks = con.execute("SELECT count(*) FROM (SELECT DISTINCT run, rank FROM ranks)").fetchone()[0]
    segs = con.execute("SELECT count(*) FROM activity_segments WHERE n_compute > 0").fetchone()[0]
    con.close()
    print(f"{args.store}: {ranks} ranks, {segs:,} compute segments, {n:,} rows (sum wait_ns {total}); "
          f"identical: {all(same)}")
    for name, xs in cpu.items():
        print(f"  {name}: CPU s {', '.join(f'{x:.2f}' for x in xs)} (min {min(xs):.2f})")
    return 0 if all(same) else 1


if __name__ == "__main__":
    sys.exit(main())
