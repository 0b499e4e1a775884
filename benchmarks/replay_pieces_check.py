#!/usr/bin/env python3
"""The replay graph from per-rank pieces against the one-connection build, on every run of a store
(issue 18 part 4; what tests/test_replay_pieces.py checks on three runs, here on any store: the
shipped traces, the external GPU traces, a 128-rank scale store).

Per run: the one-connection build (every event in one DuckDB); the pieces built (one map task per
rank with ``--per-rank``, else the default tasks of ``rank_chunks``) and saved; the pieces read back
by a second build. Prints per run whether the arrays are equal (``assert_same_graph``), whether the
identity replay is equal, and an ``idealize`` what-if of the last rank on both. A script, not a
test: it asserts nothing and exits 1 if any run differs.

    PYTHONPATH=$PWD python benchmarks/replay_pieces_check.py STORE [--run R] [--per-rank]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def check(store: str, run: str, per_rank: bool) -> list[str]:
    from test_replay_pieces import assert_same_graph

    from traceanalyzer import replay
    from traceanalyzer.analyses import bind_views, connect
    from traceanalyzer.replay.graph import _params, _stages, pieces
    g0 = replay.build_graph(connect(store), run)
    con = connect(store)
    bind_views(con, ["clock_offsets", "clock_alignment"])
    ranks = sorted(r for (r,) in con.execute("SELECT DISTINCT rank FROM events WHERE run = $r", {"r": run}).fetchall())
    pieces.forget(store, [run])
    built = pieces.build(store, con, run, _params(run), chunks=[[r] for r in ranks] if per_rank else None,
                         stages=lambda: _stages(con, run, set()))
    read = replay.build_graph(store, run)
    out = [f"{len(ranks)} ranks, {g0.n:,} nodes"]
    for g in (built, read):
        try:
            assert_same_graph(g0, g)
            out.append(f"{g.stats['pieces']}: equal")
        except AssertionError as e:
            out.append(f"{g.stats['pieces']}: DIFFERENT ({str(e)[:200]})")
    out.append("identity equal" if replay.identity(g0).equals(replay.identity(read)) else "identity DIFFERENT")
    plan = {"actions": [{"action": "idealize", "ranks": [ranks[-1]]}]}
    a, b = replay.what_if(g0, plan).job_step_ns(), replay.what_if(read, plan).job_step_ns()
    out.append(f"idealize rank {ranks[-1]}: {a:,.0f} / {b:,.0f} ns ({'equal' if a == b else 'DIFFERENT'})")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store")
    ap.add_argument("--run", help="this run only (default: every run with steps)")
    ap.add_argument("--per-rank", action="store_true", help="one map task per rank (default: rank_chunks)")
    args = ap.parse_args(argv)
    from traceanalyzer.analyses import connect
    runs = [args.run] if args.run else \
        [r for (r,) in connect(args.store).execute("SELECT DISTINCT run FROM steps ORDER BY run").fetchall()]
    bad = 0
    for run in runs:
        out = check(args.store, run, args.per_rank)
        bad += any("DIFFERENT" in x for x in out)
        print(f"{run}: " + "; ".join(out), flush=True)
    print(f"{len(runs) - bad} of {len(runs)} runs equal")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
