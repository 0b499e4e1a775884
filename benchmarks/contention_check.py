"""Contention check of the accuracy benchmark's magnitudes (a diagnostic: it scores nothing).

The accuracy corpus runs 2-8 ranks on 2 shared cores. A fault run's culprit that sleeps frees the
cores for its peers, which then compute faster than in the clean twin; ``T_fault - T_clean`` (the
effect the magnitude is scored against) then mixes the fault with that change of contention, while
the report's magnitude (the replay's saving: the fault run with the culprit idealised) keeps the
peers' fault-run durations. This script separates the two: per fault run it replays the culprit
idealised, and again with every other rank's compute scaled to its compute per step in the clean
twin (``imbalance.compute_ns_per_step``, the twin / fault ratio: the contention put back). Where the
second prediction lands among the twin's repeats, the magnitude's error against the measured effect
is the testbed's contention, not the analysis.

    PYTHONPATH=$PWD python benchmarks/contention_check.py --corpus /tmp/acc2/corpus --cache samework-2

Reads the cache a ``benchmarks/accuracy.py --cache NAME`` run left (its store and report JSONs);
prints a Markdown table. Scaling also stretches the peers' host gaps between ops by the same ratio
(the replay's ``scale`` action): an approximation, stated here.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import accuracy  # noqa: E402  (the corpus: fault runs and their clean twins)
import accuracy_score as sc  # noqa: E402


def _compute_per_rank(con, run: str) -> dict[int, float]:
    from traceanalyzer.analyses.results import compute
    im = compute(con, run=run, only=["imbalance"])["imbalance"]
    return {int(r): float(c) for r, c in zip(im["rank"], im["compute_ns_per_step"]) if c == c}


def check(corpus: Path, cache: str) -> list[dict]:
    from traceanalyzer import replay
    from traceanalyzer.analyses import connect
    root = corpus / f"analysis-{cache}"
    store = str(root / "store")
    docs = {p.stem: json.loads(p.read_text()) for p in (root / "reports").glob("*.json")}
    con = connect(store)
    rows = []
    try:
        for case in accuracy.CASES:
            doc = docs.get(case.name)
            t = sc.truth(doc["ground_truth"]) if doc and case.twin else None
            if t is None or not t.ranks:
                continue
            twins = [d for n, d in docs.items() if re.fullmatch(rf"{re.escape(case.twin)}(_r\d+)?", n)]  # the repeats
            t_clean = float(np.median([d["measured_step_ns"] for d in twins]))
            mine = [f for f in doc["report"]["findings"] if sc.names_culprit(f, t)]
            fault, twin = _compute_per_rank(con, case.name), _compute_per_rank(con, case.twin)
            g = replay.build_graph(store, case.name)
            ideal = [{"action": "idealize", "ranks": t.ranks}]
            base = replay.what_if(g, {"actions": ideal})
            scale = [{"action": "scale", "ranks": [r], "factor": twin[r] / fault[r]}
                     for r in sorted(fault) if r not in t.ranks and r in twin and fault[r] > 0]
            adj = replay.what_if(g, {"actions": ideal + scale})
            ident = base.job_step_ns("identity_ns")
            effect = doc["measured_step_ns"] - t_clean
            rows.append({"run": case.name, "effect_ms": effect / 1e6,
                         "magnitude_ms": mine[0]["recoverable_ns_per_step"] / 1e6 if mine else None,
                         "idealised_ms": base.job_step_ns() / 1e6, "with_twin_contention_ms": adj.job_step_ns() / 1e6,
                         "twin_repeats_ms": sorted(d["measured_step_ns"] / 1e6 for d in twins),
                         "saving_with_twin_contention_ms": (ident - adj.job_step_ns()) / 1e6,
                         "peer_ratios": {r: twin[r] / fault[r] for r in sorted(fault) if r not in t.ranks and r in twin}})
    finally:
        con.close()
    return rows


def render(rows: list[dict]) -> str:
    def err(a, b):
        return f"{100 * abs(a - b) / abs(b):.0f} %" if a is not None and b and b > 0 else "n/a"
    out = ["| fault run | effect ms | magnitude ms (err) | replay: culprit idealised ms | + peers' compute as in the twin ms | "
           "twin repeats ms | saving then ms (err) | peers' compute, twin / fault |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mag = f"{r['magnitude_ms']:.1f} ({err(r['magnitude_ms'], r['effect_ms'])})" if r["magnitude_ms"] is not None else "-"
        out.append(f"| {r['run']} | {r['effect_ms']:.1f} | {mag} | {r['idealised_ms']:.1f} | {r['with_twin_contention_ms']:.1f} | "
                   f"{', '.join(f'{x:.1f}' for x in r['twin_repeats_ms'])} | "
                   f"{r['saving_with_twin_contention_ms']:.1f} ({err(r['saving_with_twin_contention_ms'], r['effect_ms'])}) | "
                   f"{', '.join(f'r{k} {v:.2f}' for k, v in r['peer_ratios'].items())} |")
    return "\n".join(out)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--corpus", required=True, type=Path)
    p.add_argument("--cache", required=True, help="the --cache NAME of an accuracy.py run")
    p.add_argument("--only", default="*", help="fault runs to check (a glob)")
    a = p.parse_args(argv)
    import fnmatch
    accuracy.CASES = [c for c in accuracy.CASES if fnmatch.fnmatch(c.name, a.only)]
    print(render(check(a.corpus, a.cache)))


if __name__ == "__main__":
    main()
