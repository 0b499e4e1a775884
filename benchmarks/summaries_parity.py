"""The map/reduce path gives the same results as the one-connection path: ingest every shipped run
of ``traces/`` into one store (or reuse ``--store``), compute every saved analysis and every
wrapper of :mod:`traceanalyzer.analyses` (benchmarks/registry_parity.py's list) once over all
events in one connection, once from the per-rank summaries (:mod:`traceanalyzer.analyses.summaries`),
and compare them row for row (exit 1 on any difference).

    PYTHONPATH=$PWD python benchmarks/summaries_parity.py [--store DIR] [--runs a,b]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def both(store: Path, runs: list[str] | None = None) -> tuple[dict, dict, dict]:
    """(one connection, from summaries, timings) for ``store``."""
    from registry_parity import WRAPPERS

    from traceanalyzer import analyses
    from traceanalyzer.analyses import summaries as sm
    from traceanalyzer.analyses.results import compute, effective_params
    from traceanalyzer.store.runs import store_runs

    def run_all(con):
        # one thread: DuckDB's parallel float sums and ties differ from run to run with several
        con.execute("SET threads = 1")
        out = dict(compute(con))
        for key, (fn, kw) in WRAPPERS.items():
            out[key] = getattr(analyses, fn)(con, **kw)
        return out

    times = {}
    t = time.perf_counter()
    con = analyses.connect(store)
    runs = runs or store_runs(con)
    one = run_all(con)
    con.close()
    times["one_connection_s"] = time.perf_counter() - t
    params = effective_params({})
    t = time.perf_counter()
    sm.ensure(store, runs, params)
    times["map_s"] = time.perf_counter() - t
    t = time.perf_counter()
    con = analyses.connect(store)
    provided = sm.attach(con, store, runs, params)
    assert provided, "no summaries attached"
    two = run_all(con)
    con.close()
    times["reduce_s"] = time.perf_counter() - t
    return one, two, times


#: floating-point results may differ in the last bits: the rows reach a float sum (std, cv,
#: correlation, a mean) in another order when read from the per-rank files
FLOAT_RTOL = 1e-9


def differences(one: dict, two: dict, rtol: float = FLOAT_RTOL) -> tuple[list[str], list[str]]:
    """(tables that differ, tables equal only within ``rtol`` on float columns)."""
    bad, close = [], []
    for name, want in one.items():
        got, want = two.get(name).reset_index(drop=True), want.reset_index(drop=True)
        try:
            pd.testing.assert_frame_equal(got, want, check_exact=True)
            continue
        except AssertionError:
            pass
        try:
            pd.testing.assert_frame_equal(got, want, check_exact=False, rtol=rtol, atol=0)
            floats = [c for c in want.columns if want[c].dtype.kind == "f"]
            rel = max(((got[c] - want[c]).abs() / want[c].abs().where(want[c] != 0)).max() for c in floats)
            close.append(f"{name} (max relative difference {rel:.1e})")
        except AssertionError as e:
            bad.append(f"{name}: {' '.join(str(e).split())[:300]}")
    return bad, close


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, help="reuse this store (ingested when missing)")
    args = ap.parse_args(argv)
    import traceanalyzer as ta
    store = args.store or Path(tempfile.mkdtemp(prefix="summaries-parity-")) / "s"
    if not (store / "_store.json").exists():
        for run in sorted(p for p in (ROOT / "traces").iterdir() if p.is_dir()):
            ta.ingest([run], store, run=run.name)
    one, two, times = both(store)
    bad, close = differences(one, two)
    print("\n".join(bad))
    print(f"{len(one)} tables, {sum(len(d) for d in one.values())} rows: {len(one) - len(close) - len(bad)} identical, "
          f"floats within {FLOAT_RTOL:g} in {', '.join(close) or 'none'}; differ: {len(bad)}")
    print(", ".join(f"{k} {v:.1f}" for k, v in times.items()))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
