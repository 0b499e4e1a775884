#!/usr/bin/env python3
"""What the reduce of ``analyze`` holds (issue 18, driver memory): per cross-rank view, its rows x
columns, the time and the RSS step while it is made, DuckDB's own memory after it; then the results.

The reduce is ``analyze``'s driver: it attaches every rank's saved summaries (``STORE/_summaries``)
and binds the cross-rank SQL modules, each view materialised into a temporary table
(:func:`traceanalyzer.analyses.modules.bind`). This script does the same binding one statement at a
time (a copy of ``bind``'s loop, instrumented) on a store whose summaries are current
(``analyze`` once first; ``--any-key`` attaches them even when the code changed since: a
measurement, not a result), then runs ``compute`` as ``analyze`` does. A script, not a test.

    PYTHONPATH=$PWD python benchmarks/reduce_memory.py /tmp/drivermem/store-128 [--top 25] [--json-out F]

``--run R``: the reduce of one run, as ``analyze --run R`` makes it (a connection over that run's
files only, :func:`traceanalyzer.analyses.connect` with ``run``); with ``--whole-store``, over every
run's files as before session 19 (a store of many runs: the cross-rank views read them all).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time


def rss_mb() -> float:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mb() -> float:
    with open(f"/proc/{os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def duck_mb(con) -> float:
    return con.execute("SELECT sum(memory_usage_bytes) FROM duckdb_memory()").fetchone()[0] / 2**20


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--any-key", action="store_true", help="attach the saved summaries even if their key is stale")
    ap.add_argument("--no-compute", action="store_true")
    ap.add_argument("--json-out")
    ap.add_argument("--memory-limit", help="SET memory_limit on the connection (e.g. 256MB), temp_directory in /tmp")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--by-cpu", action="store_true", help="list the views by CPU s (default: by RSS step)")
    ap.add_argument("--run", help="the reduce of this run only (as `analyze --run`)")
    ap.add_argument("--whole-store", action="store_true", help="with --run: a connection over every run's files")
    args = ap.parse_args(argv)

    from traceanalyzer.analyses import connect, prepare
    from traceanalyzer.analyses import modules as M
    from traceanalyzer.analyses import registry as R
    from traceanalyzer.analyses import summaries as sm
    from traceanalyzer.analyses.results import compute, effective_params
    from traceanalyzer.store.runs import store_runs

    t0, r0 = time.perf_counter(), rss_mb()
    con = connect(args.store, run=args.run if not args.whole_store else None)
    if args.memory_limit:
        import shutil
        import tempfile
        import weakref
        spill = tempfile.mkdtemp(prefix="reduce-spill-")
        weakref.finalize(con, shutil.rmtree, spill, True)
        con.execute(f"SET temp_directory = '{spill}'")
        con.execute(f"SET memory_limit = '{args.memory_limit}'")
    if args.threads:
        con.execute(f"SET threads = {args.threads}")
    runs = [args.run] if args.run else store_runs(con)
    params = effective_params({})
    if args.any_key:
        sm.current = lambda store, runs, params, manifest=None: list(runs)  # noqa: E731 (measurement only)
    views = sm.attach(con, args.store, runs, params)
    if not views:
        print("summaries not current: run analyze first (or --any-key)", file=sys.stderr)
        return 2
    rows = [{"view": "(open + attach)", "seconds": time.perf_counter() - t0, "rss_step_mb": rss_mb() - r0,
             "rss_mb": rss_mb(), "duck_mb": duck_mb(con)}]
    ranks = con.execute("SELECT count(DISTINCT (run, rank)) FROM ranks WHERE list_contains($runs, run)",
                        {"runs": runs}).fetchone()[0]

    # the views the analyses read, in bind's order (as compute() binds them)
    names = M.modules_for([a.view for a in R.analyses() if a.view])
    prepare(con, modules=[])
    given = M.provided(con)
    rank = {v for v, sc in M._scope_map().items() if sc == "rank"}
    if given & rank:
        given |= rank
    tables = set()
    for name in M.closure(names, given):
        for statement in con.extract_statements(M.modules()[name].text):
            m = M._VIEW_RE.match(statement.query)
            if m and m.group(1) in given:
                continue
            t, r, c = time.perf_counter(), rss_mb(), time.process_time()
            table, made = M._AS_TABLE_RE.subn(r"CREATE OR REPLACE TEMP TABLE \1 AS", statement.query, count=1)
            try:
                con.execute(table if m and made else statement)
            except Exception as e:
                print(f"{m.group(1) if m else name}: {str(e).splitlines()[0]}", file=sys.stderr)
                raise
            if m:
                view = m.group(1)
                n, ncols = con.execute(f"SELECT count(*) FROM {view}").fetchone()[0], len(con.execute(
                    f"DESCRIBE {view}").fetchall())
                rows.append({"view": view, "module": name, "rows": n, "columns": ncols, "cells": n * ncols,
                             "seconds": time.perf_counter() - t, "cpu_s": time.process_time() - c,
                             "rss_step_mb": rss_mb() - r, "rss_mb": rss_mb(),
                             "duck_mb": duck_mb(con)})
                tables.add(view)
        con.execute("INSERT INTO _ta_bound VALUES (?, ?)", [name, M._variables(con)])
    bind_peak = peak_mb()
    if not args.no_compute:
        t, r, c = time.perf_counter(), rss_mb(), time.process_time()
        res = compute(con, run=args.run)
        rows.append({"view": "(compute: results to pandas)", "seconds": time.perf_counter() - t,
                     "cpu_s": time.process_time() - c,
                     "rss_step_mb": rss_mb() - r, "rss_mb": rss_mb(), "duck_mb": duck_mb(con),
                     "rows": sum(len(d) for d in res.values())})
    mem = con.execute("SELECT tag, memory_usage_bytes, temporary_storage_bytes FROM duckdb_memory() "
                      "WHERE memory_usage_bytes + temporary_storage_bytes > 0 ORDER BY 2 DESC").fetchall()
    settings = dict(con.execute("SELECT name, value FROM duckdb_settings() WHERE name IN "
                                "('memory_limit', 'threads', 'temp_directory', 'preserve_insertion_order')").fetchall())
    con.close()
    doc = {"store": args.store, "run": args.run, "whole_store": args.whole_store, "ranks": ranks,
           "peak_mb": peak_mb(), "bind_peak_mb": bind_peak, "rows": rows, "duckdb_memory": mem, "settings": settings}
    print(f"{args.store}: {ranks} ranks; peak RSS {doc['peak_mb']:.0f} MB (after binding {bind_peak:.0f} MB); {settings}")
    print("duckdb_memory at the end:", ", ".join(f"{t} {b / 2**20:.0f} MB" for t, b, _ in mem))
    print(f"{'view':36} {'rows':>10} {'cols':>5} {'s':>7} {'CPU s':>7} {'RSS step MB':>11} {'RSS MB':>8} {'duck MB':>8}")
    order = (lambda r: -r.get("cpu_s", 0)) if args.by_cpu else (lambda r: -abs(r["rss_step_mb"]))
    for r in sorted(rows, key=order)[:args.top]:
        print(f"{r['view'][:36]:36} {r.get('rows', ''):>10} {r.get('columns', ''):>5} {r['seconds']:7.2f} "
              f"{r.get('cpu_s', float('nan')):7.2f} {r['rss_step_mb']:11.1f} {r['rss_mb']:8.0f} {r['duck_mb']:8.0f}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
