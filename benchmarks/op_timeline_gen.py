"""An op timeline of a large PP x DP job, generated from the recorded one (issue 17's benchmark input).

The recorded run (``traces/pp_gpipe_2x2_dp_optimeline_slow1``: PP 2 x DP 2, GPipe, rank 1 slow)
gives the op sequence of each stage role and each op type's cost: the median duration over the
clean ranks of (first / last stage, op), and, for the injected slow worker, the recorded slow rank's
own forward-compute median (its 15 ms sleep per micro-batch). The grid is grown in DP and PP and
the micro-batches in a step so that a rank-step holds about ``ops_per_step`` ops (4 M + 3 ops on the
first and last stage, 6 M + 3 on a middle one). The times are not copied but simulated, vectorised
over the DP replicas, the way the recorded loop runs: blocking p2p (a send ends when its receive
does: max of both starts + the transfer time), a gradient all_reduce per stage over its DP group
(ends for everyone at the last arrival + its duration), then the optimizer. Each op gets a small
log-normal jitter (``jitter``). One worker (``slow``: its (dp, pp)) computes its forwards at the
recorded slow rank's cost: every other rank only waits for it (its pipeline through p2p, every
replica through the all_reduce).

Rows are written sorted by rank into one Parquet file, one row group per block of ranks (the
import reads it block by block), with the columns the light collector writes.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
RECORDED = REPO / "traces" / "pp_gpipe_2x2_dp_optimeline_slow1" / "op_timeline.parquet"
RECORDED_SLOW_RANK = 1
OPS = ["data-load", "forward-recv", "forward-compute", "forward-send", "backward-recv", "backward-compute",
       "backward-send", "grads-all-reduce", "optimizer"]
_CODE = {o: i for i, o in enumerate(OPS)}


def recorded_costs(path: Path = RECORDED) -> dict:
    """Per (role, op) median duration (ns) over the recorded clean ranks; role 'first'/'last';
    'xfer' the p2p transfer time (median of the sends that did not wait: the last stage's
    backward sends), 'allreduce' the fastest all_reduce, 'slow_forward' the slow rank's forward."""
    df = pq.read_table(path).to_pandas()
    clean = df[df["rank"] != RECORDED_SLOW_RANK]
    last = int(df["pp"].max())
    med = clean.groupby(["pp", "op"])["duration_ns"].median()
    costs = {("first" if pp == 0 else "last", op): float(v) for (pp, op), v in med.items()}
    costs["xfer"] = float(clean[(clean.pp == last) & (clean.op == "backward-send")]["duration_ns"].median())
    costs["allreduce"] = float(clean[clean.op == "grads-all-reduce"]["duration_ns"].min())
    slow = df[(df["rank"] == RECORDED_SLOW_RANK) & (df.op == "forward-compute")]
    costs["slow_forward"] = float(slow["duration_ns"].median())
    costs["t0"] = int(df["start_ns"].min())
    return costs


def microbatches_for(pp: int, ops_per_step: int) -> int:
    """Micro-batches so that a rank-step holds about ``ops_per_step`` ops on average."""
    per_mb = (2 * 4 + max(pp - 2, 0) * 6) / pp if pp > 1 else 2
    return max(1, int(round((ops_per_step - 3) / per_mb)))


def _cost(costs, s, p, op):
    """A middle stage costs what the first one does for compute; p2p ops take the transfer time."""
    role = "first" if s == 0 else "last" if s == p - 1 else "first"
    if op in ("forward-compute", "backward-compute") and 0 < s < p - 1:
        return (costs[("first", op)] + costs[("last", op)]) / 2
    return costs.get((role, op), costs.get(("last", op), 0.0))


def simulate(dp: int, pp: int, steps: int, microbatches: int, slow: tuple[int, int] | None = (0, 1),
             jitter: float = 0.05, seed: int = 0, costs: dict | None = None):
    """Per stage s: (ops, start_ns, dur_ns, mb) with start/dur arrays of shape (steps, slots, dp)
    and ops/mb lists of the slots' op names and micro-batch ids."""
    costs = costs or recorded_costs()
    rng = np.random.default_rng(seed)
    M, p = microbatches, pp

    def d(s, op, shape=(dp,)):
        return _cost(costs, s, p, op) * rng.lognormal(0.0, jitter, shape)

    slots = []
    for s in range(p):
        ops = [("data-load", -1)]
        for m in range(M):
            ops += ([("forward-recv", m)] if s > 0 else []) + [("forward-compute", m)] + (
                [("forward-send", m)] if s < p - 1 else [])
        for m in reversed(range(M)):
            ops += ([("backward-recv", m)] if s < p - 1 else []) + [("backward-compute", m)] + (
                [("backward-send", m)] if s > 0 else [])
        ops += [("grads-all-reduce", -1), ("optimizer", -1)]
        slots.append(ops)
    index = [{(op, m): i for i, (op, m) in enumerate(ops)} for ops in slots]
    start = [np.zeros((steps, len(ops), dp), np.int64) for ops in slots]
    dur = [np.zeros((steps, len(ops), dp), np.int64) for ops in slots]
    t = [np.full(dp, float(costs["t0"])) for _ in range(p)]
    xfer = costs["xfer"]

    def put(s, k, op, m, st, en):
        i = index[s][(op, m)]
        start[s][k, i] = np.round(st)
        dur[s][k, i] = np.round(en - st)

    for k in range(steps):
        for s in range(p):
            e = t[s] + d(s, "data-load")
            put(s, k, "data-load", -1, t[s], e)
            t[s] = e
        send_open = [None] * p
        for m in range(M):
            for s in range(p):
                if s > 0:   # receive from s - 1: closes its send
                    e = np.maximum(t[s], send_open[s - 1]) + xfer * rng.lognormal(0.0, jitter, dp)
                    put(s, k, "forward-recv", m, t[s], e)
                    put(s - 1, k, "forward-send", m, send_open[s - 1], e)
                    t[s] = e
                    t[s - 1] = e
                c = d(s, "forward-compute")
                if slow is not None and s == slow[1]:
                    c[slow[0]] = costs["slow_forward"] * rng.lognormal(0.0, jitter)
                put(s, k, "forward-compute", m, t[s], t[s] + c)
                t[s] = t[s] + c
                if s < p - 1:
                    send_open[s] = t[s].copy()
        for m in reversed(range(M)):
            for s in reversed(range(p)):
                if s < p - 1:
                    e = np.maximum(t[s], send_open[s + 1]) + xfer * rng.lognormal(0.0, jitter, dp)
                    put(s, k, "backward-recv", m, t[s], e)
                    put(s + 1, k, "backward-send", m, send_open[s + 1], e)
                    t[s] = e
                    t[s + 1] = e
                c = d(s, "backward-compute")
                put(s, k, "backward-compute", m, t[s], t[s] + c)
                t[s] = t[s] + c
                if s > 0:
                    send_open[s] = t[s].copy()
        for s in range(p):   # the stage's DP group all_reduce: everyone leaves at the last arrival
            e = t[s].max() + costs["allreduce"] * rng.lognormal(0.0, jitter)
            put(s, k, "grads-all-reduce", -1, t[s], np.full(dp, e))
            o = e + d(s, "optimizer")
            put(s, k, "optimizer", -1, np.full(dp, e), o)
            t[s] = o
    return slots, start, dur


def write(out: Path, ranks: int, pp: int, steps: int, ops_per_step: int = 300, slow: tuple[int, int] | None = None,
          jitter: float = 0.05, seed: int = 0, ranks_per_group: int = 64) -> dict:
    """Generate and write ``out`` (one Parquet file, sorted by rank; rank = dp x pp + stage, as
    recorded). ``slow``: the slow worker's (dp, pp), default the middle replica's last stage.
    Returns the ground truth (also in the file's metadata ``ground_truth``)."""
    if ranks % pp:
        raise ValueError(f"{ranks} ranks do not split into {pp} stages")
    dp = ranks // pp
    M = microbatches_for(pp, ops_per_step)
    slow = slow if slow is not None else (dp // 2, pp - 1)
    slots, start, dur = simulate(dp, pp, steps, M, slow, jitter, seed)
    slow_rank = slow[0] * pp + slow[1]
    truth = {"workload": "pipeline", "schedule": "gpipe (generated from the recorded op timeline)", "dp": dp, "pp": pp,
             "microbatches": M, "steps": steps, "slow_rank": slow_rank, "slow_dp": slow[0], "slow_stage": slow[1],
             "ops_per_rank_step": [len(x) for x in slots], "jitter": jitter, "seed": seed}
    schema = pa.schema([("rank", pa.int32()), ("dp", pa.int32()), ("pp", pa.int32()), ("tp", pa.int32()),
                        ("cp", pa.int32()), ("ep", pa.int32()), ("op", pa.dictionary(pa.int8(), pa.string())),
                        ("step", pa.int32()), ("microbatch", pa.int32()), ("vpp", pa.int32()), ("seq", pa.int32()),
                        ("start_ns", pa.int64()), ("duration_ns", pa.int64())],
                       metadata={"ground_truth": json.dumps(truth, sort_keys=True)})
    per = []   # per stage: the slot columns of one rank-step
    for s, ops in enumerate(slots):
        codes = np.array([_CODE[o] for o, _ in ops], np.int8)
        mbs = np.array([m for _, m in ops], np.int32)
        seq = np.zeros(len(ops), np.int32)
        seen: dict = {}
        for i, (o, _) in enumerate(ops):
            seq[i] = seen.get(o, 0)
            seen[o] = seq[i] + 1
        per.append((codes, mbs, seq))
    rows = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(out, schema, compression="zstd") as w:
        for lo in range(0, ranks, ranks_per_group):
            parts = []
            for r in range(lo, min(ranks, lo + ranks_per_group)):
                d_, s = divmod(r, pp)
                codes, mbs, seq = per[s]
                n_slots = len(codes)
                n = n_slots * steps
                one = lambda v: np.full(n, v, np.int32)  # noqa: E731
                parts.append(pa.table({
                    "rank": one(r), "dp": one(d_), "pp": one(s), "tp": one(0), "cp": one(0), "ep": one(0),
                    "op": pa.DictionaryArray.from_arrays(pa.array(np.tile(codes, steps)), pa.array(OPS)),
                    "step": np.repeat(np.arange(steps, dtype=np.int32), n_slots),
                    "microbatch": np.tile(mbs, steps), "vpp": one(0), "seq": np.tile(seq, steps),
                    "start_ns": start[s][:, :, d_].reshape(-1), "duration_ns": dur[s][:, :, d_].reshape(-1)},
                    schema=schema))
                rows += n
            w.write_table(pa.concat_tables(parts), row_group_size=1 << 30)
    truth["rows"] = rows
    return truth


if __name__ == "__main__":
    import argparse
    a = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a.add_argument("out")
    a.add_argument("--ranks", type=int, default=64)
    a.add_argument("--pp", type=int, default=4)
    a.add_argument("--steps", type=int, default=3)
    a.add_argument("--ops-per-step", type=int, default=300)
    args = a.parse_args()
    print(json.dumps(write(Path(args.out), args.ranks, args.pp, args.steps, args.ops_per_step)))
