"""Is a rank's extra compute more *work*, or the same work on a slower host?

imbalance.sql flags a rank whose compute time is well above its peers'. That is an imbalance (a
rank given more work: a bigger batch, longer sequences, more tokens for its expert) only if it
runs more, or bigger, operations. A rank that runs exactly the operations its peers run, on the
same input shapes, and takes longer, has a slower host (a busier or slower core, a noisy
neighbour): its fix is not to rebalance the work, and if its peers waited for it long enough it is
a straggler (stragglers.sql), which names it on its own. Reporting it as imbalanced names a rank
the workload never gave more work (issue 14: a no-overlap DDP run whose rank 1 ran every op ~15 %
slower, on a quiet 2-core host, was named beside the real cause).

The check, per flagged rank: the run's main compute operations (``imbalance_ops``: the top
:data:`SHAPE_OPS` by time per step) counted per (name, input shapes) from the recorded
``Input Dims`` (Kineto ``record_shapes``), against each of its peers (the same ranks imbalance.sql
compares it with: in a pipeline the replicas of its stage, else every rank). Same counts and shapes
as every peer: the same work (ops that carry no shapes, autograd's wrappers, are left out). Unknown
(no shapes recorded, no peer, no op) is ``None``: the finding stands on its times.
"""
from __future__ import annotations

from collections import Counter

from ..analyses.params import default

#: Compute ops compared per flagged rank: the run's largest by time per step (``imbalance_ops``), the
#: bulk of the compute; those that carry no shapes are left out.
SHAPE_OPS = 8


def _peers(results: dict, run_ranks: list[int], rank: int) -> list[int]:
    sl = results.get("pipeline_slow_stages")
    if sl is not None and not sl.empty and rank in set(sl["rank"].astype(int)):
        stage = sl.loc[sl["rank"].astype(int) == rank, "stage"].iloc[0]
        return sorted(int(r) for r in sl.loc[sl["stage"] == stage, "rank"] if int(r) != rank)
    return [r for r in run_ranks if r != rank]


def same_work(con, run: str, results: dict) -> dict[int, bool | None]:
    """Per rank flagged by imbalance.sql: True when it ran the same compute ops on the same input
    shapes as every peer (a slower host, not more work), False when not, None when unknown."""
    im = results.get("imbalance")
    ops = results.get("imbalance_ops")
    if im is None or im.empty or "is_finding" not in im:
        return {}
    flagged = [int(r) for r in im.loc[im["is_finding"].fillna(False).astype(bool), "rank"]]
    if not flagged:
        return {}
    run_ranks = sorted(int(r) for r in im["rank"])
    names = [] if ops is None or ops.empty else \
        ops[ops["category"] == "compute"].nlargest(SHAPE_OPS, "mean_ns_per_step")["name"].tolist()
    peers = {rank: _peers(results, run_ranks, rank) for rank in flagged}
    if not names:
        return {rank: None for rank in flagged}
    # one pass over the run's events for every flagged rank and its peers (a 128-rank run may flag 16)
    rows = con.execute("""
        SELECT rank, name, json_extract_string(args_json, '$."Input Dims"') AS dims, count(*) AS n
        FROM events
        WHERE run = $run AND ph = 'X' AND step IS NOT NULL AND name IN (SELECT unnest($names))
          AND rank IN (SELECT unnest($ranks))
        GROUP BY ALL""", {"run": run, "names": names,
                          "ranks": sorted(set(flagged) | {p for ps in peers.values() for p in ps})}).df()
    rows = rows[rows["dims"].notna()]   # ops that carry no shapes (autograd's wrappers) tell nothing
    per = {int(r): Counter(dict(zip(zip(g["name"], g["dims"]), g["n"]))) for r, g in rows.groupby("rank")}
    out: dict[int, bool | None] = {}
    for rank in flagged:
        mine, ps = per.get(rank), peers[rank]
        # unknown: no shapes recorded (record_shapes off), no peer, or a peer without them
        out[rank] = None if mine is None or not ps or any(p not in per for p in ps) else all(per[p] == mine for p in ps)
    return out


def same_work_note(data, rank: int) -> str:
    """The line the report gives for a rank whose extra compute is not extra work."""
    im = data.r("imbalance")
    row = im[im["rank"] == rank]
    ratio = f"{float(row['ratio_to_mean'].iloc[0]):.2f}x" if not row.empty else "more than"
    return (f"Rank {rank} computes {ratio} the mean of its peers but runs the same operations on the same input "
            f"shapes: a slower host, not more work, so not an imbalance (a straggler if its peers wait for it at "
            f"least {float(data.params.get('straggler_min_delay_pct', default('straggler_min_delay_pct'))):g}% "
            f"of a step).")

