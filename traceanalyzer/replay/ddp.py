"""Data-parallel what-ifs: DDP bucket size, overlap on/off, DP degree, from one recorded run.

    r = ddp.predict("store", run="ddp_b25", bucket_mb=4)       # or overlap=False, dp=8
    r.steps            # rank, step, measured_ns, identity_ns, predicted_ns, delta_ns, identity_error
    r.identity_error   # {"median", "p90", "max", "n"}: the model with the recorded settings vs measured
    r.timeline         # rank, lane, name, start_ns, end_ns (the predicted step, for a viewer)
    r.job_step_ns()    # per step the slowest rank, averaged over steps

Why a generated graph and not the recorded one: a bucket change creates and removes collectives,
which the recorded dependency graph (replay.graph) cannot express. So each (rank, step) is rebuilt
from what the trace says about it, the communication is re-planned, and the step becomes a graph
(``ddp_graph``: backward pieces, buckets, resume) that the replay's one simulator runs:

* before backward (forward, zero_grad, ...): the recorded time from the step start to the first
  autograd function, kept as is;
* backward: the gradient-ready profile, the cumulative gradient bytes ready vs time since backward
  started: each parameter's ``AccumulateGrad`` end (with DDP's copy into its bucket, which runs
  inside it) and its bytes (from the recorded shapes). Without shapes, the profile is the recorded
  buckets' (enqueue time, bytes), linear in between (PROFILE_PIECES pieces per bucket);
* buckets: parameters in ready order, a bucket closes once it holds >= the cap (torch's
  ``compute_bucket_assignment_by_size``; after DDP's rebuild the order is the ready order). torch
  2.13 applies a 1 MiB first bucket only when ``bucket_cap_mb`` is left at its default
  (``_BucketCapacityConfig``): ``first_bucket_mb`` says which (default: the cap, as the reference
  workload passes ``--bucket-mb`` explicitly);
* the communication lane: one FIFO per process group (gloo runs a bucket after the previous one;
  the runloop threads share the rank's core and link); bucket k starts when every rank has it ready
  and bucket k-1 is done, and takes the alpha-beta time of ``alphabeta.fit`` on the same run
  (rescaled to ``dp`` ranks by the ring factors; ``center="tail"``: intercept = median residual,
  the residuals' tail above it charged per byte, so a step's summed transfers keep their mean);
* shared core (gloo, where the collectives run on the rank's CPU; the reference workloads pin each
  rank to one core): while a transfer is in flight, the rank's backward runs at half speed and so
  does the transfer (at its slowest member's speed). The recorded backward is first brought back
  to what it would take alone (``_pure_work``) and the alpha-beta fit uses the transfers' exclusive
  time (``alphabeta._exclusive`` with the backward passes as ``busy``);
* overlap off (the workload's ``--no-overlap``: ``no_sync()`` backward, then the buckets one after
  the other on the main thread): bucket k is enqueued after bucket k-1 completes plus the host time
  to copy it (HOST_COPY_PASSES passes over its bytes at the rate of DDP's own ``reducer::mul_out``
  copies, or, in a recorded no-overlap run, the measured gap between buckets per byte);
* the wait at the end of backward (DDP's finalize waits for the last bucket), then the recorded
  time from the optimizer's start to the step end, kept as is. The main thread resumes at
  max(its backward end, last bucket end + the run's median resume gap): on a shared core the
  runloop thread often records a collective's end ~2 ms after the main thread already resumed,
  so the gap can be negative.

Limits: one backward per step (no gradient accumulation), no find_unused_parameters, the
process group's collectives are all DDP buckets; rank-steps whose gradient count differs from
the run's usual one are left out (``stats["dropped_rank_steps"]``).

identity_ns is this model with the *recorded* settings (bucket size from the run's manifest, else
inferred from the recorded bucket bytes), so identity_error is the model's real error on the trace.
Ranks keep their recorded step starts: a what-if changes a step's length, it does not shift later
steps. Changing ``dp`` changes the communication cost only (weak scaling: same per-rank batch).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import TraceAnalyzerError
from . import alphabeta
from .ddp_graph import simulate as simulate_graph
from .graph import merge_intervals

MIB = 2 ** 20
#: how much of a rank's core a gloo transfer in flight takes: 1 = compute and transfer each at half
#: speed while both run, 0 = independent. gloo's runloop thread is busy (copies, reductions, socket
#: syscalls) only part of a transfer and waits for the peer the rest: 0.5. Checked on one quiet pair
#: of the 28 MB mlp (25 <-> 4 MB buckets): 1 over-predicts the 4 MB step by 22 %, 0 under by 5 %
#: and the reverse prediction over by 19 %; see benchmarks/RESULTS.md for fresh runs.
CORE_SHARE = 0.5
PROFILE_PIECES = 16        # without parameter shapes: pieces per recorded bucket in the linear profile
HOST_COPY_PASSES = 3       # overlap off: cat into the flat buffer, divide by world, copy back
_ELEM = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "half": 2, "bfloat16": 2, "long int": 8,
         "int": 4}
_GRAD = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"


@dataclass
class DDPWhatIf:
    run: str
    settings: dict             # recorded and what-if bucket_mb, first_bucket_mb, overlap, dp
    steps: pd.DataFrame        # rank, step, measured_ns, identity_ns, predicted_ns, delta_ns, identity_error
    identity_error: dict       # median, p90, max, n of identity_error
    timeline: pd.DataFrame     # rank, lane, name, start_ns, end_ns (predicted)
    buckets: pd.DataFrame      # scenario (recorded/identity/predicted), bucket, bytes, cost_ns
    alphabeta: alphabeta.AlphaBeta
    stats: dict = field(default_factory=dict)

    def job_step_ns(self, column: str = "predicted_ns") -> float:
        """Job step time (``replay.simulate.job_step_ns``: per rank the mean step, the slowest rank)."""
        from .simulate import job_step_ns
        return job_step_ns(self.steps, column)


# -- reading the trace -------------------------------------------------------------------------
def _load(con, run: str) -> dict:
    p = {"run": run}
    off = con.execute("SELECT rank, offset_ns FROM clock_offsets WHERE run = $run", p).df()
    offset = dict(zip(off["rank"], off["offset_ns"]))
    st = con.execute("""SELECT s.rank, s.step, s.start_ts_ns, s.end_ts_ns, s.dur_ns, m.tid
                        FROM steps s JOIN (SELECT rank, any_value(tid) AS tid FROM events
                                           WHERE run = $run AND kind = 'step' GROUP BY rank) m USING (rank)
                        WHERE s.run = $run ORDER BY s.rank, s.step""", p).df()
    cm = con.execute("""SELECT rank, seq, op, coalesce(in_bytes, 0) AS bytes, enqueue_ts_ns, start_ts_ns, end_ts_ns,
                               coalesce(group_size, 0) AS group_size
                        FROM comms WHERE run = $run AND NOT is_p2p AND op = 'all_reduce' AND start_ts_ns IS NOT NULL
                        ORDER BY rank, seq""", p).df()
    # backward: every autograd function on the main thread; grads: AccumulateGrad (outer: ends
    # after DDP's hook; inner: carries the shape) and DDP's copy into the bucket
    ev = con.execute("""SELECT e.rank, e.name, e.ts_ns, e.ts_ns + e.dur_ns AS end_ns, e.dur_ns,
                                CASE WHEN e.name IN ('torch::autograd::AccumulateGrad',
                                                     'torch::distributed::reducer::mul_out')
                                     THEN e.args_json END AS args_json
                         FROM events e JOIN (SELECT rank, any_value(tid) AS tid FROM events
                                             WHERE run = $run AND kind = 'step' GROUP BY rank) m
                              ON e.rank = m.rank AND e.tid = m.tid
                         WHERE e.run = $run AND e.ph = 'X'
                           AND (e.name LIKE 'autograd::engine::evaluate_function:%'
                                OR e.name IN ('torch::autograd::AccumulateGrad', 'torch::distributed::reducer::mul_out')
                                OR e.name LIKE 'Optimizer.step#%')
                         ORDER BY e.rank, e.ts_ns""", p).df()
    for df, cols in ((st, ("start_ts_ns", "end_ts_ns")), (cm, ("enqueue_ts_ns", "start_ts_ns", "end_ts_ns")),
                     (ev, ("ts_ns", "end_ns"))):
        o = df["rank"].map(offset).fillna(0).astype("int64")
        for c in cols:
            df[c] = df[c] + o
    return {"steps": st, "comms": cm, "events": ev}


def _bytes_of(args_json) -> float:
    """Bytes of the first input (dims x element size) from a Kineto args blob; NaN when unknown."""
    if not isinstance(args_json, str):
        return float("nan")
    try:
        a = json.loads(args_json)
        dims, typ = a["Input Dims"][0], a.get("Input type", ["float"])[0]
    except (ValueError, KeyError, IndexError, TypeError):
        return float("nan")
    if not isinstance(dims, list):
        return float("nan")
    return float(np.prod(dims, dtype=float) * _ELEM.get(typ, 4))


def _assign_step(df: pd.DataFrame, st: pd.DataFrame, t_col: str) -> pd.DataFrame:
    """Add the step (recorded window) each row's t_col falls in; rows outside every step are dropped."""
    parts = []
    for rank, g in df.groupby("rank"):
        s = st[st["rank"] == rank].sort_values("start_ts_ns")
        if s.empty:
            continue
        k = np.searchsorted(s["start_ts_ns"].to_numpy(), g[t_col].to_numpy(), side="right") - 1
        ok = (k >= 0) & (g[t_col].to_numpy() < s["end_ts_ns"].to_numpy()[np.maximum(k, 0)])
        parts.append(g[ok].assign(step=s["step"].to_numpy()[k[ok]]))
    return pd.concat(parts, ignore_index=True) if parts else df.iloc[:0].assign(step=0)


def _manifest(con, run: str) -> dict:
    """The run's ground truth from the manifest.json beside its trace files, if still there."""
    files = con.execute("SELECT DISTINCT trace_file FROM ranks WHERE run = $run", {"run": run}).fetchall()
    for (f,) in files:
        m = Path(str(f)).parent / "manifest.json"
        try:
            return json.loads(m.read_text()).get("ground_truth") or {}
        except (OSError, ValueError):
            continue
    return {}


# -- the model ---------------------------------------------------------------------------------
def assign_buckets(sizes: np.ndarray, cap_bytes: float, first_cap_bytes: float | None = None) -> list[int]:
    """Indices (into ``sizes``, in ready order) of each bucket's last parameter: a bucket closes
    once it holds >= its cap (the first bucket: ``first_cap_bytes``), the remainder is the last."""
    ends, cur = [], 0.0
    for i, b in enumerate(sizes):
        cur += b
        if cur >= (first_cap_bytes if (first_cap_bytes is not None and not ends) else cap_bytes):
            ends.append(i)
            cur = 0.0
    if len(sizes) and (not ends or ends[-1] != len(sizes) - 1):
        ends.append(len(sizes) - 1)
    return ends


@dataclass
class _RankStep:
    rank: int
    step: int
    start: int            # step start (ns, aligned)
    end: int              # recorded step end
    bw0: int              # backward start
    ready: np.ndarray     # per gradient (ready order): recorded ready time offset from bw0 (ns)
    sizes: np.ndarray     # bytes per gradient
    copy: np.ndarray      # DDP copy time (mul_out) in each gradient's piece (ns, recorded)
    post: int             # recorded step end - the optimizer's start (the main thread resumed)
    comm: np.ndarray      # recorded all_reduce (start, end) on this rank in this step, aligned
    gap: int              # recorded resume - recorded finalize (max of last gradient, last bucket end)
    work: np.ndarray | None = None   # compute per piece with the core to itself (see _pure_work)


def _pure_work(x: _RankStep, shared_core: bool) -> np.ndarray:
    """Compute time of each backward piece (between two gradients) had the core been free: where a
    recorded transfer was in flight on this rank, the piece ran at half speed (shared core)."""
    edges = x.bw0 + np.concatenate([[0], x.ready]).astype(float)
    rec = np.diff(edges)
    if not shared_core or not len(x.comm):
        return np.maximum(rec, 0)
    # overlap of each piece with the union of transfers
    m = merge_intervals(x.comm.astype(float))
    lo, hi = edges[:-1, None], edges[1:, None]
    ov = np.clip(np.minimum(hi, m[None, :, 1]) - np.maximum(lo, m[None, :, 0]), 0, None).sum(axis=1)
    return np.maximum(rec - ov * float(shared_core) / 2, 0)


def _rank_steps(d: dict, overlap_rec: bool) -> tuple[list[_RankStep], dict]:
    st, cm, ev = d["steps"], d["comms"], d["events"]
    cm = _assign_step(cm, st, "enqueue_ts_ns")
    ev = _assign_step(ev, st, "ts_ns")
    outer = ev[ev["name"] == _GRAD]
    inner = ev[ev["name"] == "torch::autograd::AccumulateGrad"].copy()
    inner["bytes"] = [_bytes_of(a) for a in inner["args_json"]]
    mul = ev[ev["name"] == "torch::distributed::reducer::mul_out"].copy()
    mul["bytes"] = [_bytes_of(a) for a in mul["args_json"]]
    bw = ev[ev["name"].str.startswith("autograd::engine::evaluate_function:")]
    bw0 = bw.groupby(["rank", "step"])["ts_ns"].min()
    opt = ev[ev["name"].str.startswith("Optimizer.step#")].groupby(["rank", "step"])["ts_ns"].min()
    out, used_shapes = [], True
    for r in st.itertuples():
        key = (r.rank, r.step)
        c = cm[(cm["rank"] == r.rank) & (cm["step"] == r.step)].sort_values("seq")
        if c.empty or key not in bw0.index:
            continue
        b0 = int(bw0[key])
        o = outer[(outer["rank"] == r.rank) & (outer["step"] == r.step)].sort_values("ts_ns")
        i = inner[(inner["rank"] == r.rank) & (inner["step"] == r.step)].sort_values("ts_ns")
        m = mul[(mul["rank"] == r.rank) & (mul["step"] == r.step)].sort_values("ts_ns")
        if len(o) and len(o) == len(i) and i["bytes"].notna().all():
            ready = o["end_ns"].to_numpy(np.int64) - b0
            sizes = i["bytes"].to_numpy(float)
            # DDP's copy of each gradient into its bucket, attributed to the gradient it follows
            k = np.searchsorted(o["ts_ns"].to_numpy(), m["ts_ns"].to_numpy(), side="right") - 1
            copy = np.zeros(len(o))
            np.add.at(copy, np.clip(k, 0, len(o) - 1), m["dur_ns"].to_numpy(float))
        else:   # no shapes: the recorded buckets as a piecewise-linear profile
            used_shapes = False
            t = np.concatenate([[0.0], c["enqueue_ts_ns"].to_numpy(float) - b0])
            t = np.maximum.accumulate(np.maximum(t, 0))
            frac = (np.arange(PROFILE_PIECES) + 1) / PROFILE_PIECES
            ready = np.concatenate([t[j] + (t[j + 1] - t[j]) * frac for j in range(len(c))]).astype(np.int64)
            sizes = np.repeat(c["bytes"].to_numpy(float) / PROFILE_PIECES, PROFILE_PIECES)
            copy = np.zeros(len(sizes))
        last_grad = b0 + int(ready[-1])
        fin = max(last_grad, int(c["end_ts_ns"].max())) if overlap_rec else int(c["end_ts_ns"].max())
        # the main thread goes on at the optimizer: what follows is kept as is; the gap between the
        # recorded finalize and it (DDP's copies back; negative when the runloop thread, sharing the
        # core, records the end of the collective after the main thread already resumed) is taken
        # as the run's median, so that one late span does not set a step's prediction
        resume = int(opt[key]) if key in opt.index and opt[key] >= b0 else max(fin, b0)
        out.append(_RankStep(int(r.rank), int(r.step), int(r.start_ts_ns), int(r.end_ts_ns), b0, ready, sizes,
                             copy, int(r.end_ts_ns) - resume,
                             c[["start_ts_ns", "end_ts_ns"]].to_numpy(np.int64), resume - fin))
    return out, {"cm": cm, "mul": mul, "used_shapes": used_shapes}


def _host_ns_per_byte(d: dict, extra: dict, overlap_rec: bool) -> float:
    """Main-thread copy cost per bucket byte when buckets are reduced after backward."""
    if not overlap_rec:
        # recorded no-overlap: gap between a bucket's end and the next one's enqueue, per byte
        cm = extra["cm"].sort_values(["rank", "step", "seq"])
        prev_end = cm.groupby(["rank", "step"])["end_ts_ns"].shift()
        gap = (cm["enqueue_ts_ns"] - prev_end).clip(lower=0)
        ok = gap.notna() & (cm["bytes"] > 0)
        if ok.any():
            return float(gap[ok].sum() / cm.loc[ok, "bytes"].sum())
    mul = extra["mul"]
    mul = mul[mul["bytes"] > 0]
    if len(mul):
        # ratio of sums: the many tiny bias copies are per-call overhead, not per-byte cost
        return HOST_COPY_PASSES * float(mul["dur_ns"].sum() / mul["bytes"].sum())
    return 0.0


def predict(store_or_con, run: str | None = None, bucket_mb: float | None = None, overlap: bool | None = None,
            dp: int | None = None, first_bucket_mb: float | None = None,
            recorded_bucket_mb: float | None = None, shared_core: bool | None = None) -> DDPWhatIf:
    """Predict the DDP step time of ``run`` with another bucket cap (MiB), overlap on/off, or DP
    degree; ``None`` keeps the recorded setting. ``first_bucket_mb``: the first bucket's cap (default:
    the cap; 1 for torch's default ``bucket_cap_mb``). ``recorded_bucket_mb`` overrides the manifest.
    ``shared_core``: a rank's compute and its collectives share one core (default: True on gloo,
    where collectives run on the CPU; the reference workloads pin each rank to one core)."""
    con = alphabeta.prepare_comm_views(store_or_con)
    from ..store.runs import resolve_run
    run = resolve_run(con, run, where="ddp what-if", table="steps", what="runs with steps")
    for name, v in (("bucket_mb", bucket_mb), ("first_bucket_mb", first_bucket_mb), ("recorded_bucket_mb", recorded_bucket_mb)):
        if v is not None and not v > 0:
            raise TraceAnalyzerError(f"ddp what-if: {name} must be > 0, got {v}")
    if dp is not None and (not isinstance(dp, (int, np.integer)) or dp < 1):
        raise TraceAnalyzerError(f"ddp what-if: dp must be an integer >= 1, got {dp}")
    d = _load(con, run)
    if d["steps"].empty:
        raise TraceAnalyzerError(f"ddp what-if: run '{run}' has no steps in the store")
    if d["comms"].empty:
        raise TraceAnalyzerError(f"ddp what-if: run '{run}' has no all_reduce (not a DDP run?)")
    gt = _manifest(con, run)
    cm = _assign_step(d["comms"], d["steps"], "enqueue_ts_ns")
    # recorded settings: the manifest, else inferred from the trace
    if recorded_bucket_mb is None:
        recorded_bucket_mb = gt.get("bucket_mb")
    inferred = recorded_bucket_mb is None
    inferred_first = None
    if inferred:   # a bucket closed once it held >= the cap: the cap is at most the smallest closed bucket
        per = cm.sort_values("seq").groupby(["rank", "step"])["bytes"].apply(list)
        middle = [b for lst in per for b in lst[1:-1]]          # closed, not the (maybe smaller) first
        firsts = [lst[0] for lst in per if len(lst) > 1]
        if middle:
            recorded_bucket_mb = min(middle) / MIB
        elif firsts:
            recorded_bucket_mb = min(firsts) / MIB
        else:
            recorded_bucket_mb = max(b for lst in per for b in lst) / MIB
        if firsts and min(firsts) / MIB < recorded_bucket_mb:   # torch's small first bucket (default cap)
            inferred_first = min(firsts) / MIB
    overlap_rec = gt.get("overlap")
    if overlap_rec is None:   # overlap: the first bucket is enqueued before backward ends
        overlap_rec = True
    rs, extra = _rank_steps(d, bool(overlap_rec))
    if not rs:
        raise TraceAnalyzerError(f"ddp what-if: run '{run}' has no step with both a backward and an all_reduce")
    if gt.get("overlap") is None:
        first_enq = cm.groupby(["rank", "step"])["enqueue_ts_ns"].min()
        last_grad = {(x.rank, x.step): x.bw0 + x.ready[-1] for x in rs}
        votes = [first_enq[k] < v for k, v in last_grad.items() if k in first_enq.index]
        overlap_rec = bool(np.mean(votes) >= 0.5) if votes else True
        rs, extra = _rank_steps(d, overlap_rec)
    n_rec = int(cm["group_size"].max()) or int(d["steps"]["rank"].nunique())
    # every rank and step must see the same gradients (one bucketing for all); drop the odd ones
    # (a step cut by the profiling window, a missing shape)
    n_grads = pd.Series([len(x.sizes) for x in rs]).mode().iloc[0]
    dropped = [(x.rank, x.step) for x in rs if len(x.sizes) != n_grads]
    rs = [x for x in rs if len(x.sizes) == n_grads]
    if shared_core is True:
        shared_core = CORE_SHARE
    if shared_core is None:
        backend = con.execute("SELECT any_value(backend) FROM runs WHERE run = $run", {"run": run}).fetchone()[0]
        shared_core = CORE_SHARE if str(backend or "").lower() == "gloo" else 0.0
    for x in rs:
        x.work = _pure_work(x, shared_core)
    busy = [(x.bw0, x.bw0 + int(x.ready[-1])) for x in rs] if (shared_core and overlap_rec) else None
    ab = alphabeta.fit(con, run, busy=busy, center="tail")
    host = _host_ns_per_byte(d, extra, overlap_rec)
    fin_gap = float(np.median([x.gap for x in rs]))
    rec_first = (first_bucket_mb if (first_bucket_mb is not None and bucket_mb is None) else
                 inferred_first if inferred_first is not None else recorded_bucket_mb)
    rec = dict(bucket_mb=float(recorded_bucket_mb), first_bucket_mb=float(rec_first), overlap=bool(overlap_rec), dp=n_rec)
    new = dict(bucket_mb=float(bucket_mb if bucket_mb is not None else rec["bucket_mb"]),
               overlap=bool(overlap if overlap is not None else rec["overlap"]), dp=int(dp if dp is not None else n_rec))
    new["first_bucket_mb"] = float(first_bucket_mb if first_bucket_mb is not None else
                                   (new["bucket_mb"] if bucket_mb is not None else rec["first_bucket_mb"]))
    ident, b_ident = simulate_graph(rs, rec["bucket_mb"], rec["first_bucket_mb"], rec["overlap"], rec["dp"], ab,
                               overlap_rec, host, shared_core, fin_gap, None)
    timeline: list = []
    pred, b_pred = simulate_graph(rs, new["bucket_mb"], new["first_bucket_mb"], new["overlap"], new["dp"], ab,
                             overlap_rec, host, shared_core, fin_gap, timeline)
    steps = pd.DataFrame([{"rank": x.rank, "step": x.step, "measured_ns": x.end - x.start,
                           "identity_ns": int(round(ident[(x.rank, x.step)])),
                           "predicted_ns": int(round(pred[(x.rank, x.step)]))} for x in rs])
    steps["delta_ns"] = steps["predicted_ns"] - steps["identity_ns"]
    steps["identity_error"] = (steps["identity_ns"] - steps["measured_ns"]).abs() / steps["measured_ns"]
    steps = steps.sort_values(["step", "rank"]).reset_index(drop=True)
    e = steps["identity_error"]
    err = {"median": float(e.median()), "p90": float(e.quantile(0.9)), "max": float(e.max()), "n": int(len(e))}
    rec_b = cm[cm["rank"] == cm["rank"].min()]
    rec_b = rec_b[rec_b["step"] == rec_b["step"].min()].sort_values("seq")
    buckets = pd.concat([pd.DataFrame({"scenario": "recorded", "bucket": range(len(rec_b)), "bytes": rec_b["bytes"].to_numpy(float),
                                       "cost_ns": np.nan}),
                         pd.DataFrame(b_ident, columns=["bucket", "bytes", "cost_ns"]).assign(scenario="identity"),
                         pd.DataFrame(b_pred, columns=["bucket", "bytes", "cost_ns"]).assign(scenario="predicted")],
                        ignore_index=True)[["scenario", "bucket", "bytes", "cost_ns"]]
    tl = pd.DataFrame(timeline, columns=["rank", "lane", "name", "start_ns", "end_ns"])
    tl[["start_ns", "end_ns"]] = tl[["start_ns", "end_ns"]].round().astype("int64")
    return DDPWhatIf(run=run, settings={"recorded": rec, "what_if": new, "bucket_mb_inferred": inferred},
                     steps=steps, identity_error=err, timeline=tl, buckets=buckets, alphabeta=ab,
                     stats={"used_shapes": extra["used_shapes"], "host_ns_per_byte": host,
                            "shared_core": shared_core, "resume_gap_ns": fin_gap,
                            "dropped_rank_steps": dropped})
