#!/usr/bin/env python3
"""Where analyze's CPU goes, per view (issue 17): one ``analyze(store)`` inline in this process (align,
the map's tasks, the reduce), each SQL statement ``modules.bind`` makes timed with
``time.process_time`` (user + system CPU of every DuckDB thread), and each view a map task saves
(``summaries._write``) timed with its rows. The store's saved summaries are dropped first, so the whole
analyze runs. Prints the total (CPU s, wall, peak RSS) and the largest entries as
``CPU-s  calls  phase/module/view``; ``--json FILE`` writes the analyze results (to compare two codes
byte for byte: run this with each code's PYTHONPATH on copies of one store).

A timing copy of ``modules.bind`` (it follows bind's own steps: the module's statements one by one,
views materialised as tables), for measurement only; nothing is asserted.

    PYTHONPATH=. python benchmarks/op_timeline_scale.py --sizes 256 --steps 50 --phases ingest --work W
    PYTHONPATH=. python benchmarks/op_timeline_views.py W/store_256 --top 45 --json W/analyze_256.json
"""
from __future__ import annotations

import argparse
import collections
import json
import resource
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from traceanalyzer.analyses import modules as M  # noqa: E402
from traceanalyzer.analyses import results as R  # noqa: E402
from traceanalyzer.analyses import summaries as sm  # noqa: E402

CPU: dict[tuple, float] = collections.defaultdict(float)
CALLS: collections.Counter = collections.Counter()
PHASE = ["driver"]


def _timed_make(con, statement, view, module):
    """modules.make, each statement timed under (phase, module, view)."""
    t0 = time.process_time()
    try:
        _MAKE(con, statement, view, module)
    finally:
        key = (PHASE[0], module, view or "-")
        CPU[key] += time.process_time() - t0
        CALLS[key] += 1


_MAKE = M.make


def _phase(fn, name):
    def run(*a, **k):
        PHASE[0], t0 = name, time.process_time()
        try:
            return fn(*a, **k)
        finally:
            CPU[(name, "TOTAL", "")] += time.process_time() - t0
            CALLS[(name, "TOTAL", "")] += 1
            PHASE[0] = "reduce"
    return run


def _timed_write(write):
    def run(con, view, path):
        t0 = time.process_time()
        try:
            return write(con, view, path)
        finally:
            rows = con.execute(f"SELECT count(*) FROM {view}").fetchone()[0]
            CPU[("write", view, str(rows))] += time.process_time() - t0
            CALLS[("write", view, str(rows))] += 1
    return run


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("store")
    p.add_argument("--top", type=int, default=45, help="entries printed")
    p.add_argument("--json", help="write the analyze results here")
    a = p.parse_args(argv)
    M.make = _timed_make
    sm.align_task, sm.map_task = _phase(sm.align_task, "align_task"), _phase(sm.map_task, "map_task")
    sm._write = _timed_write(sm._write)
    shutil.rmtree(Path(a.store) / sm.FOLDER, ignore_errors=True)
    sm.forget(a.store)
    t0, w0 = time.process_time(), time.time()
    res = R.analyze(a.store, n_workers=1)  # inline: the timed functions are this process's
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    print(f"TOTAL cpu {time.process_time() - t0:.1f} wall {time.time() - w0:.1f} maxrss {peak:.2f} GB")
    for k, v in sorted(CPU.items(), key=lambda kv: -kv[1])[:a.top]:
        print(f"{v:8.2f} {CALLS[k]:5d} {'/'.join(k)}")
    if a.json:
        Path(a.json).write_text(json.dumps({k: json.loads(df.to_json(orient="records")) for k, df in res.items()},
                                           sort_keys=True, indent=0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
