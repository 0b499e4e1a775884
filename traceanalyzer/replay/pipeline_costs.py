"""Pipeline stage costs measured in a run: per rank and step its actions (one micro-batch on one
stage), the host work around them, and the p2p costs (what is measured: replay/pipeline.py)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from ..errors import TraceAnalyzerError
from .pipeline_schedules import schedule_order

_P2P_RE = r"^c10d::(send|recv_|batch_isend_irecv|isend|irecv)"
_BACKWARD_PREFIX = "autograd::engine::evaluate_function"
_SCHEDULE_ANN_RE = r"^(Forward \d+|Backward \d+|PP:.*)$"
_EXEC_SPAN_RE = r"^(gloo|nccl|ucc|mpi):"      # backend spans: the op in flight, not host work
_ACTION_RE = re.compile(r"^PP:(\d+)([FB])(\d+)$")


# -- measured costs ---------------------------------------------------------------------------------

@dataclass
class StageCosts:
    """What each rank spent per step: its actions, the host work around them, and the p2p costs."""
    run: str
    schedule: str
    n_ranks: int                 # p: pipeline ranks (rank position = stage order)
    stages_per_rank: int         # v
    microbatches: int            # m
    ranks: list                  # rank id at each pipeline position
    actions: pd.DataFrame        # rank, step, stage, kind (F/B), mb, start_ns, end_ns, cost_ns
    steps: pd.DataFrame          # rank, step, start_ns, end_ns, measured_ns, pre_ns, post_ns, overhead_ns, own_ns
    p2p_ns: dict                 # {"F": activations, "B": gradients}: ns from producer end to consumer start
    p2p_samples: dict = field(default_factory=dict)   # kind -> [(step, ns)]
    p2p_host_ns: dict = field(default_factory=dict)   # rank -> its host's cost of posting one p2p op (replay/pipeline_comm.py)

    def p2p_step_ns(self, step, kind: str) -> int:
        """The p2p cost used for one step: the mean of that step's samples (a slow step's slow
        transfers stay in it), else the run's median."""
        v = [x for s, x in self.p2p_samples.get(kind, ()) if s == step]
        return int(np.mean(v)) if v else int(self.p2p_ns[kind])

    def repartitioned(self, stages_per_rank: int) -> StageCosts:
        """The same work cut into ``stages_per_rank`` model chunks per rank (interleaved placement:
        chunk j of rank position r is stage j * p + r). A rank's forward (backward) of a micro-batch
        is shared evenly between its chunks -- the model assumption: its layers split evenly -- and
        each chunk's activations (gradients) cost one message of the recorded size; the host work
        around the actions and the overhead per action are the recorded ones."""
        v, p = int(stages_per_rank), self.n_ranks
        if v < 1:
            raise ValueError(f"stages_per_rank must be >= 1 (got {v})")
        a = self.actions.assign(pos=self.actions["stage"] % p)
        merged = a.groupby(["rank", "step", "pos", "kind", "mb"], as_index=False).agg(
            start_ns=("start_ns", "min"), end_ns=("end_ns", "max"), cost_ns=("cost_ns", "sum"))
        parts = []
        for j in range(v):
            share = merged["cost_ns"] // v + (merged["cost_ns"] % v if j == v - 1 else 0)
            parts.append(merged.assign(stage=merged["pos"] + j * p, cost_ns=share))
        actions = pd.concat(parts, ignore_index=True).drop(columns="pos")[list(self.actions.columns)]
        return replace(self, stages_per_rank=v, actions=actions)

    def per_stage(self) -> pd.DataFrame:
        """Median per stage over steps and micro-batches: forward_ns, backward_ns; and the rank."""
        a = self.actions.groupby(["stage", "kind"])["cost_ns"].median().unstack("kind")
        out = pd.DataFrame({"stage": a.index, "forward_ns": a.get("F"), "backward_ns": a.get("B")}).reset_index(drop=True)
        out["rank"] = [self.ranks[s % self.n_ranks] for s in out["stage"]]
        return out


def stage_costs(store_or_con, run: str | None = None) -> StageCosts:
    """Measure a pipeline run's per-micro-batch stage costs (see the module docstring)."""
    from ..analyses import connect, prepare
    con = connect(store_or_con)
    # the analyses' views (pipeline_shape, pipeline_stages, clock_offsets): only their modules are
    # bound, and a connection that has them (an earlier call, the analyses) keeps them
    if not con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name IN ('pipeline_stages', 'clock_offsets')").fetchone()[0] == 2:
        from .graph import PIPELINE_VIEWS
        prepare(con, modules=PIPELINE_VIEWS)
    from ..store.runs import resolve_run
    run = resolve_run(con, run, where="pipeline what-if", table="steps", what="runs with steps")
    shape = con.execute("SELECT n_stages, stages_per_rank, microbatches, schedule FROM pipeline_shape WHERE run = $run",
                        {"run": run}).fetchall()
    if not shape:
        raise TraceAnalyzerError(f"pipeline what-if: run '{run}' is not a pipeline (no p2p traffic between ranks)")
    p, v, m, schedule = shape[0]
    p, v, m = int(p), int(v), int(m)
    order = con.execute("SELECT rank FROM pipeline_stages WHERE run = $run ORDER BY stage", {"run": run}).fetchall()
    ranks = [int(r) for (r,) in order]
    ev = con.execute(f"""
        WITH main AS (SELECT rank, any_value(tid) AS tid FROM events WHERE run = $run AND kind = 'step' GROUP BY rank)
        SELECT e.rank, e.step, e.name, e.kind, e.ts_ns, e.dur_ns
        FROM events e JOIN main USING (rank, tid)
        WHERE e.run = $run AND e.ph = 'X' AND NOT e.is_gpu AND e.step IS NOT NULL AND e.kind <> 'step'
          AND NOT regexp_matches(e.name, '{_EXEC_SPAN_RE}')""", {"run": run}).df()
    st = con.execute("SELECT rank, step, start_ts_ns, end_ts_ns, dur_ns FROM steps WHERE run = $run ORDER BY rank, step",
                     {"run": run}).df()
    # when each p2p op of a rank was in flight (posted, not complete): idle time then is waiting
    pend = con.execute("""SELECT rank, op, enqueue_ts_ns AS lo, greatest(coalesce(end_ts_ns, 0), enqueue_ts_ns + enqueue_dur_ns) AS hi
                          FROM comms WHERE run = $run AND is_p2p AND enqueue_ts_ns IS NOT NULL""", {"run": run}).df()
    off = dict(con.execute("SELECT rank, offset_ns FROM clock_offsets WHERE run = $run", {"run": run}).fetchall())
    for df, cols in ((ev, ["ts_ns"]), (st, ["start_ts_ns", "end_ts_ns"]), (pend, ["lo", "hi"])):
        o = df["rank"].map(off).fillna(0).astype("int64")
        for c in cols:
            df[c] = df[c] + o
    expected = schedule_order(schedule, p, m, v)
    tops = {}
    for (rank, step), g in ev.groupby(["rank", "step"], sort=True):
        if rank in ranks:
            tops[(rank, step)] = (g[g["name"].str.match(_ACTION_RE.pattern)],
                                  _top_level(g[~g["name"].str.match(_SCHEDULE_ANN_RE)]))
    pending = {r: _merge(g["lo"].to_numpy(np.int64), g["hi"].to_numpy(np.int64)) for r, g in pend.groupby("rank")}
    recv_end = {r: np.sort(g.loc[g["op"] == "recv", "hi"].to_numpy(np.int64)) for r, g in pend.groupby("rank")}
    empty = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    actions, steps = [], []
    # the host's cost of posting one transfer: per rank the median duration of its p2p ops
    host = {}
    for (rank, _), (_, ops) in tops.items():
        host.setdefault(rank, []).extend(ops.loc[ops["cls"] == "P", "dur_ns"].tolist())
    p2p_host = {r: int(np.median(v)) for r, v in host.items() if v}
    for (rank, step), (ann, ops) in tops.items():
        srow = st[(st["rank"] == rank) & (st["step"] == step)]
        if srow.empty:
            continue
        s0, s1 = int(srow["start_ts_ns"].iloc[0]), int(srow["end_ts_ns"].iloc[0])
        pos = ranks.index(rank)
        annotated = schedule == "interleaved1f1b" and len(ann)
        if annotated:
            acts = _from_annotations(ops, ann, recv_end.get(rank, np.zeros(0, np.int64)))
        else:
            nxt = tops.get((ranks[1], step)) if p > 1 else None
            n_pre = _common_prefix(ops["name"].tolist(), _pre_names(nxt[1])) if (pos == 0 and nxt) else 0
            acts = _from_order(ops, expected[pos], is_first=pos == 0, n_pre=n_pre, run=run, rank=rank, step=step)
        acts = acts.sort_values("start_ns").reset_index(drop=True)
        waits = _subtract(pending.get(rank, empty), _merge(ops["ts_ns"].to_numpy(np.int64), ops["te_ns"].to_numpy(np.int64)))
        pre, post, ovh = _host_work(acts, s0, s1, waits, between_waits=not annotated)
        acts["rank"], acts["step"] = rank, step
        actions.append(acts)
        steps.append((rank, step, s0, s1, s1 - s0, pre, post, ovh))
    if not actions:
        raise TraceAnalyzerError(f"pipeline what-if: run '{run}' has no steps with pipeline actions")
    acts = pd.concat(actions, ignore_index=True)
    acts["cost_ns"] = acts["end_ns"] - acts["start_ns"]
    steps = pd.DataFrame(steps, columns=["rank", "step", "start_ns", "end_ns", "measured_ns", "pre_ns", "post_ns", "overhead_ns"])
    own = acts.groupby(["rank", "step"])["cost_ns"].sum().rename("act_ns").reset_index()
    nact = acts.groupby(["rank", "step"]).size().rename("n").reset_index()
    steps = steps.merge(own, on=["rank", "step"]).merge(nact, on=["rank", "step"])
    steps["own_ns"] = steps["pre_ns"] + steps["post_ns"] + steps["act_ns"] + steps["overhead_ns"] * (steps["n"] - 1)
    steps = steps.drop(columns=["act_ns", "n"])
    p2p, samples = _p2p_costs(acts, ranks, p * v, steps)
    return StageCosts(run=run, schedule=schedule, n_ranks=p, stages_per_rank=v, microbatches=m, ranks=ranks,
                      actions=acts[["rank", "step", "stage", "kind", "mb", "start_ns", "end_ns", "cost_ns"]],
                      steps=steps, p2p_ns=p2p, p2p_samples=samples, p2p_host_ns=p2p_host)


def _top_level(g: pd.DataFrame) -> pd.DataFrame:
    """The thread's outermost operators, in time order, classed p2p / backward / other."""
    g = g.sort_values(["ts_ns", "dur_ns"], ascending=[True, False])
    ts = g["ts_ns"].to_numpy(np.int64)
    te = ts + g["dur_ns"].to_numpy(np.int64)
    prev = np.concatenate([[np.iinfo(np.int64).min], np.maximum.accumulate(te)[:-1]]) if len(te) else te
    top = g[ts >= prev].copy()
    top["te_ns"] = top["ts_ns"] + top["dur_ns"]
    cls = np.where(top["name"].str.match(_P2P_RE), "P",
                   np.where(top["name"].str.startswith(_BACKWARD_PREFIX), "B", "O"))
    top["cls"] = cls
    return top.reset_index(drop=True)


def _from_annotations(ops: pd.DataFrame, ann: pd.DataFrame, recv_end: np.ndarray) -> pd.DataFrame:
    """Interleaved1F1B: each PP:<stage><F|B><mb> range is one action. Its receive was posted ahead
    (a RECV action), and the range opens by waiting for it: the action starts when the last receive
    that completes inside the range before its first operator is done (else at the range start)
    and ends with its last operator."""
    rows = []
    work = ops[ops["cls"] != "P"]
    ts, te = work["ts_ns"].to_numpy(), work["te_ns"].to_numpy()
    for a in ann.itertuples():
        mt = _ACTION_RE.match(a.name)
        inside = (ts >= a.ts_ns) & (te <= a.ts_ns + a.dur_ns)
        if inside.any():
            first = int(ts[inside].min())
            k = np.searchsorted(recv_end, first, side="right") - 1
            start = max(int(a.ts_ns), int(recv_end[k])) if k >= 0 and recv_end[k] > a.ts_ns else int(a.ts_ns)
            rows.append((int(mt.group(1)), mt.group(2), int(mt.group(3)), min(start, first), int(te[inside].max())))
    return pd.DataFrame(rows, columns=["stage", "kind", "mb", "start_ns", "end_ns"])


def _pre_names(ops) -> list:
    """Names of a stage's operators before its first p2p op: the step's own work before the
    schedule (every rank runs the same loop, so the first stage runs them too)."""
    cls = ops["cls"].tolist()
    k = cls.index("P") if "P" in cls else 0
    return ops["name"].tolist()[:k]


def _common_prefix(a: list, b: list) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _from_order(ops, expected, is_first, n_pre, run, rank, step) -> pd.DataFrame:
    """GPipe / 1F1B: backward actions are the runs of autograd operators (cut at p2p ops); the
    forwards between two backwards are the longest runs of other operators there, as many as the
    schedule puts there."""
    kinds = [k for _, k, _ in expected]
    n_b = kinds.count("B")
    # blocks: maximal runs of one class; p2p ops end every block
    blocks = []   # [cls, first_idx, last_idx]
    for i, c in enumerate(ops["cls"]):
        if c != "P" and blocks and blocks[-1][0] == c and blocks[-1][2] == i - 1:
            blocks[-1][2] = i
        else:
            blocks.append([c, i, i])
    ts, te = ops["ts_ns"].to_numpy(), ops["te_ns"].to_numpy()
    bblocks = [b for b in blocks if b[0] == "B"]
    if len(bblocks) != n_b:
        raise TraceAnalyzerError(f"pipeline what-if: run '{run}' rank {rank} step {step}: found {len(bblocks)} "
                                 f"backward stretches, the {('first ' if is_first else '')}stage's schedule has {n_b}")
    # forwards expected before each backward (gap g: before the g-th backward)
    per_gap, n = [], 0
    for k in kinds:
        if k == "F":
            n += 1
        else:
            per_gap.append(n)
            n = 0
    per_gap.append(n)
    first_p2p = next((b[1] for b in blocks if b[0] == "P"), len(ops))
    chosen = []
    bpos = [blocks.index(b) for b in bblocks]
    bounds = [-1] + bpos + [len(blocks)]
    for g, want in enumerate(per_gap):
        if not want:
            continue
        cand = [b for b in blocks[bounds[g] + 1:bounds[g + 1]] if b[0] == "O" and (is_first or b[1] > first_p2p)]
        if len(cand) < want:
            raise TraceAnalyzerError(f"pipeline what-if: run '{run}' rank {rank} step {step}: found {len(cand)} "
                                     f"forward stretches before backward {g}, the schedule has {want}")
        span = [te[b[2]] - ts[b[1]] for b in cand]
        keep = sorted(np.argsort(span, kind="stable")[::-1][:want])
        chosen.append([cand[i] for i in keep])
    f_blocks = [b for gap in chosen for b in gap]
    rows = []
    fi = bi = 0
    for s, k, mb in expected:
        b = f_blocks[fi] if k == "F" else bblocks[bi]
        fi, bi = fi + (k == "F"), bi + (k == "B")
        rows.append((s, k, mb, int(ts[b[1]]), int(te[b[2]])))
    out = pd.DataFrame(rows, columns=["stage", "kind", "mb", "start_ns", "end_ns"])
    if is_first:
        # the first forward runs on from the pre-step work with no op between: it starts at the
        # first operator after the ones the next stage runs before its first recv (n_pre); without
        # them, it gets the median of the step's other forwards (see the module docstring)
        f = out[out["kind"] == "F"]
        i0 = f["start_ns"].idxmin()
        if 0 < n_pre < len(ops) and ts[n_pre] < out.loc[i0, "end_ns"]:
            out.loc[i0, "start_ns"] = max(out.loc[i0, "start_ns"], int(ts[n_pre]))
        elif len(f) > 1:
            med = int((f["end_ns"] - f["start_ns"]).drop(i0).median())
            out.loc[i0, "start_ns"] = max(out.loc[i0, "start_ns"], out.loc[i0, "end_ns"] - med)
    return out


def _host_work(acts, s0, s1, waits, between_waits=True):
    """Own host work of a step outside the actions: before the first (pre), after the last (post),
    and the mean between two actions. Own = elapsed minus waiting, where waiting is idle time while
    one of the rank's p2p ops was in flight; idle time with nothing in flight (the host descheduled,
    Python between ops) is the rank's own. Interleaved1F1B waits only inside its actions (for the
    receive) and at the end (sends): its time between actions is all its own (between_waits=False)."""
    a0, a1 = int(acts["start_ns"].iloc[0]), int(acts["end_ns"].iloc[-1])
    pre = (a0 - s0) - _measure(waits, s0, a0)
    post = (s1 - a1) - _measure(waits, a1, s1)
    gaps = [max(0, s - e) - (_measure(waits, e, s) if between_waits else 0) for e, s in
            zip(acts["end_ns"].to_numpy()[:-1], acts["start_ns"].to_numpy()[1:])]
    return int(pre), int(post), int(np.mean(gaps)) if gaps else 0


def _merge(lo: np.ndarray, hi: np.ndarray):
    """Union of intervals as sorted disjoint (lo, hi) arrays (:func:`.graph.merge_intervals`)."""
    from .graph.model import merge_intervals
    if not len(lo):
        return lo, hi
    m = merge_intervals(np.column_stack([lo, hi]))
    return m[:, 0], m[:, 1]


def _subtract(a, b):
    """Parts of the disjoint intervals a not covered by the disjoint intervals b."""
    out_lo, out_hi = [], []
    blo, bhi = b
    for lo, hi in zip(*a):
        k = max(int(np.searchsorted(bhi, lo, side="right")), 0)
        cur = lo
        while k < len(blo) and blo[k] < hi:
            if blo[k] > cur:
                out_lo.append(cur)
                out_hi.append(blo[k])
            cur = max(cur, bhi[k])
            k += 1
        if cur < hi:
            out_lo.append(cur)
            out_hi.append(hi)
    return np.asarray(out_lo, np.int64), np.asarray(out_hi, np.int64)


def _measure(iv, x: int, y: int) -> int:
    """Length of the disjoint intervals iv inside [x, y]."""
    lo, hi = iv
    if y <= x or not len(lo):
        return 0
    return int(np.clip(np.minimum(hi, y) - np.maximum(lo, x), 0, None).sum())


def _p2p_costs(acts, ranks, n_stages, steps):
    """Median p2p cost per direction: start(consumer) - max(end(producer), consumer ready), where
    ready is when the consumer was done with its previous action and the host work after it (the
    step start plus its pre-step work for the first action): a gloo transfer starts when both the
    send and the receive are posted."""
    a = acts.set_index(["step", "stage", "kind", "mb"])["end_ns"]
    a = a[~a.index.duplicated()]
    srow = steps.set_index(["rank", "step"])
    samples = {"F": [], "B": []}
    for (r, step), g in acts.sort_values("start_ns").groupby(["rank", "step"]):
        w = srow.loc[(r, step)]
        prev = np.concatenate([[w["start_ns"] + w["pre_ns"]], g["end_ns"].to_numpy()[:-1] + w["overhead_ns"]])
        for row, ready in zip(g.itertuples(), prev):
            src = row.stage - 1 if row.kind == "F" else row.stage + 1
            key = (step, src, row.kind, row.mb)
            if 0 <= src < n_stages and key in a.index:
                samples[row.kind].append((step, max(0, int(row.start_ns - max(a[key], ready)))))
    med = {k: int(np.median([x for _, x in v])) if v else 0 for k, v in samples.items()}
    return med, samples
