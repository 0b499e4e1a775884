"""Results stay identical across refactors of the analyses (registry, private helper views, the
interval-union macro): ingest every shipped run of ``traces/`` into one store, compute every saved
analysis and every wrapper of :mod:`traceanalyzer.analyses`, and save them (``--save DIR``) or
compare them with a saved copy (``--compare DIR``; exit 1 on any difference).

    PYTHONPATH=$PWD python benchmarks/registry_parity.py --save /tmp/parity-before
    PYTHONPATH=$PWD python benchmarks/registry_parity.py --compare /tmp/parity-before
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]

#: wrappers of traceanalyzer.analyses beyond the saved results (helper views users query)
WRAPPERS = {
    "w_step_alignment": ("step_alignment", {}), "w_straggler_steps": ("straggler_steps", {}),
    "w_straggler_candidates": ("straggler_candidates", {}), "w_overlap_steps": ("overlap", {"per": "step"}),
    "w_exposed_intervals": ("exposed_intervals", {}), "w_imbalance_steps": ("imbalance_steps", {}),
    "w_stall_causes": ("stall_causes", {}), "w_hta_temporal": ("hta_temporal_breakdown", {}),
    "w_hta_overlap": ("hta_overlap", {}), "w_hta_kernel_type": ("hta_kernel_type_breakdown", {}),
    "w_hta_kernel_stats": ("hta_kernel_stats", {}), "w_hta_window": ("hta_window", {}),
    "w_temporal_ranks": ("temporal_breakdown", {"per": "rank"}),
    **{f"w_{fn}": (fn, {}) for fn in (
        "collectives", "clock_offsets", "phases", "stragglers", "overlap", "exposed_comm", "temporal_breakdown",
        "imbalance", "seqlen_signal", "launch_stats", "queue_length", "idle_breakdown", "bubbles", "pipeline_shape",
        "slow_stages", "all_to_all_balance", "imbalance_ops", "kernel_breakdown", "straggler_candidates")},
}


def compute_all(store: Path) -> dict[str, pd.DataFrame]:
    from traceanalyzer import analyses
    from traceanalyzer.analyses.results import compute
    con = analyses.connect(store)
    # one thread: DuckDB's parallel float sums (std, cv) and ties (imbalance_ops.max_rank = the rank
    # with the most most often, imbalance rank_order) differ from run to run with several
    con.execute("SET threads = 1")
    out = dict(compute(con))
    for key, (fn, kw) in WRAPPERS.items():
        out[key] = getattr(analyses, fn)(con, **kw)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--save", type=Path)
    g.add_argument("--compare", type=Path)
    ap.add_argument("--store", type=Path, help="reuse this store (ingested when missing)")
    args = ap.parse_args(argv)
    import traceanalyzer as ta
    store = args.store or Path(tempfile.mkdtemp(prefix="parity-")) / "s"
    if not (store / "_store.json").exists():
        runs = sorted(p for p in (ROOT / "traces").iterdir() if p.is_dir())
        for run in runs:
            ta.ingest([run], store, run=run.name)
    out = compute_all(store)
    if args.save:
        args.save.mkdir(parents=True, exist_ok=True)
        for name, df in out.items():
            df.to_pickle(args.save / f"{name}.pkl")
        print(f"saved {len(out)} tables ({sum(len(d) for d in out.values())} rows) in {args.save}")
        return 0
    bad = []
    for path in sorted(args.compare.glob("*.pkl")):
        want = pd.read_pickle(path)
        got = out.get(path.stem)
        if got is None:
            bad.append(f"{path.stem}: missing")
            continue
        try:
            pd.testing.assert_frame_equal(got.reset_index(drop=True), want.reset_index(drop=True), check_exact=True)
        except AssertionError as e:
            bad.append(f"{path.stem}: {str(e).splitlines()[0:3]}")
    print("\n".join(bad) if bad else f"identical: {len(list(args.compare.glob('*.pkl')))} tables")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
