"""Pipeline what-ifs: regenerate a pipeline schedule (GPipe, 1F1B, Interleaved1F1B, any number of
micro-batches) from the per-micro-batch stage costs measured in a run, and simulate it.

    costs = pipeline.stage_costs("store", run="pp")            # what each stage spends per micro-batch
    r = pipeline.predict("store", run="pp", schedule="1f1b", microbatches=8)
    r.steps            # rank, step, measured_ns, identity_ns, predicted_ns, delta_ns, identity_error
    r.identity_error   # the same model regenerating the recorded schedule, against the measurement
    r.bubbles          # per rank: bubble fraction predicted / identity / measured, and the theory

Why a graph of its own and not the recorded one (``replay.graph.build_graph``): the recorded graph
keeps the recorded actions and their dependencies; a new schedule or micro-batch count needs actions
that never ran. So each rank becomes an ordered list of actions, F(stage, mb) and B(stage, mb), in
the order torch's schedules run them (``schedule_order``); ``simulate_schedule`` makes them a graph
(``replay.graph.synthetic``) that the replay's one simulator runs: an action starts
when its rank is ready (previous action done, plus the host's own work between actions), its input
has arrived and the sends the schedule waits for there are complete (``send_waits``):

    F(s, mb) needs the activations of F(s-1, mb), B(s, mb) the gradients of B(s+1, mb),
    B(last, mb) follows F(last, mb) (the loss) on the same rank;
    a message arrives at max(producer end, consumer ready) + p2p cost

(gloo moves a message when both the send and the receive are posted, and a send completes when the
peer has it: the "max" is why GPipe's and 1F1B's stages wait longer than a free-p2p model says;
Interleaved1F1B posts its receives ahead, so there: producer end + p2p cost).

What is measured (``stage_costs``), per rank and step, on the thread that records ProfilerStep:
* actions: the compute of one micro-batch on one stage, from its first to its last operator (the
  wait for its input is outside). GPipe and 1F1B carry no usable per-action annotation for the
  compute alone, so the thread's top-level operators are cut at the p2p ops (``c10d::send`` /
  ``c10d::recv_``) and at the switches between autograd (``autograd::engine::evaluate_function:``:
  backward) and the rest (forward); the expected order of the schedule says which stretch is which
  micro-batch (the last stage's forward holds its loss). Interleaved1F1B annotates each action
  (``PP:<stage>F<mb>``, ``PP:<stage>B<mb>``); its range opens with the wait for the receive.
* the host's own work between actions (posting p2p, small ops, and idle time while no p2p op of the
  rank was in flight: the host descheduled, Python), mean per step: ``overhead_ns``; the step's own
  work before the first action (data, zero_grad, splitting the batch: ``pre_ns``) and after the last
  (gradient scaling, optimizer: ``post_ns``). Idle time while a p2p op was in flight is waiting.
  On the first stage no op separates the pre-step work from the first forward: the forward starts
  after the operators the next stage runs before its first receive (every rank runs the same loop;
  without them it gets the median of the step's other forwards).
* p2p cost per direction: start(consumer) - max(end(producer), consumer ready) over the actions
  with an input from a neighbour; the simulation uses each step's mean (a slow step's slow
  transfers stay in it), ``p2p_ns`` is the run's median.

Identity (``identity_ns``) is this model run with the recorded schedule and micro-batch count, the
same code path and cost rules as the prediction, so its error is a real model error. A what-if with
more micro-batches than recorded gives the new ones each stage's median forward/backward of the step.
Steps run back to back as in the recorded loop, after one warm-up step (the first step's costs)
started at each rank's recorded start of the first step. Not modelled: ranks sharing a core (the
4-rank traces on 2 cores: one rank's compute delays the other's), a different micro-batch size,
re-partitioning the layers into another number of stages per rank.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..errors import TraceAnalyzerError

SCHEDULES = ("gpipe", "1f1b", "interleaved1f1b")
_P2P_RE = r"^c10d::(send|recv_|batch_isend_irecv|isend|irecv)"
_BACKWARD_PREFIX = "autograd::engine::evaluate_function"
_SCHEDULE_ANN_RE = r"^(Forward \d+|Backward \d+|PP:.*)$"
_EXEC_SPAN_RE = r"^(gloo|nccl|ucc|mpi):"      # backend spans: the op in flight, not host work
_ACTION_RE = re.compile(r"^PP:(\d+)([FB])(\d+)$")


# -- schedules ------------------------------------------------------------------------------------

def schedule_order(schedule: str, n_ranks: int, microbatches: int, stages_per_rank: int = 1) -> dict:
    """Each rank's ordered compute actions ``(stage, "F"|"B", mb)``, as torch.distributed.pipelining
    runs them: GPipe all forwards then all backwards; 1F1B ``Schedule1F1B._step_microbatches``
    (stage s first runs min(m, p - s) forwards, then backward/forward pairs, then the remaining
    backwards); Interleaved1F1B ``ScheduleInterleaved1F1B._calculate_single_rank_operations``."""
    p, m, v = int(n_ranks), int(microbatches), int(stages_per_rank)
    if schedule not in SCHEDULES:
        raise TraceAnalyzerError(f"pipeline what-if: unknown schedule '{schedule}' (known: {', '.join(SCHEDULES)})")
    if p < 1 or m < 1 or v < 1:
        raise TraceAnalyzerError(f"pipeline what-if: need ranks, micro-batches and stages per rank >= 1 "
                                 f"(got {p}, {m}, {v})")
    if schedule != "interleaved1f1b":
        if v != 1:
            raise TraceAnalyzerError(f"pipeline what-if: {schedule} runs one stage per rank (got {v})")
        if schedule == "1f1b" and m < p:
            raise TraceAnalyzerError(f"pipeline what-if: 1f1b needs at least as many micro-batches as stages ({m} < {p})")
        return {r: (_gpipe(r, m) if schedule == "gpipe" else _one_f_one_b(r, p, m)) for r in range(p)}
    return {r: _interleaved(r, p, m, v) for r in range(p)}


def _gpipe(s: int, m: int) -> list:
    return [(s, "F", i) for i in range(m)] + [(s, "B", i) for i in range(m)]


def _one_f_one_b(s: int, p: int, m: int) -> list:
    warmup = min(m, p - s)
    out = [(s, "F", i) for i in range(warmup)]
    f, b = warmup, 0
    while True:
        out.append((s, "B", b))
        b += 1
        if f == m:
            break
        out.append((s, "F", f))
        f += 1
    out += [(s, "B", i) for i in range(b, m)]
    return out


def _interleaved(rank: int, p: int, m: int, v: int) -> list:
    rounds = max(1, m // p)
    per_round = m // rounds
    if m % rounds:
        raise TraceAnalyzerError(f"pipeline what-if: interleaved1f1b needs the micro-batches ({m}) to be a "
                                 f"multiple of the rounds ({rounds})")
    warmup = min((v - 1) * per_round + 2 * (p - 1 - rank), m * v)
    fwd_bwd = m * v - warmup
    total = warmup + fwd_bwd + warmup

    def fwd_stage(op):
        return ((op // per_round) % v) * p + rank

    def bwd_stage(op):
        return (v - 1 - ((op - warmup) // per_round) % v) * p + rank

    nf: dict = {}
    nb: dict = {}
    out = []
    for op in range(total):
        if op < warmup + fwd_bwd:
            s = fwd_stage(op)
            out.append((s, "F", nf.get(s, 0)))
            nf[s] = nf.get(s, 0) + 1
        if op >= warmup:
            s = bwd_stage(op)
            out.append((s, "B", nb.get(s, 0)))
            nb[s] = nb.get(s, 0) + 1
    return out


def theoretical_bubble(n_ranks: int, microbatches: int, stages_per_rank: int = 1) -> float:
    """(p-1)/(v*m+p-1): the idle share of a pipeline step with equal stages and free p2p."""
    return (n_ranks - 1) / (stages_per_rank * microbatches + n_ranks - 1)


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

    def p2p_step_ns(self, step, kind: str) -> int:
        """The p2p cost used for one step: the mean of that step's samples (a slow step's slow
        transfers stay in it), else the run's median."""
        v = [x for s, x in self.p2p_samples.get(kind, ()) if s == step]
        return int(np.mean(v)) if v else int(self.p2p_ns[kind])

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
    from .graph import resolve_run
    run = resolve_run(con, run, "pipeline what-if")
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
                      steps=steps, p2p_ns=p2p, p2p_samples=samples)


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


def send_waits(schedule: str, actions: list, n_stages: int) -> tuple[list, list]:
    """Which sends a rank waits for before each of its actions, and before the post-step work, in
    torch's schedules (a gloo send completes when the peer has received it): messages are
    ("F", stage, mb) (activations to stage + 1) and ("B", stage, mb) (gradients to stage - 1).
    GPipe waits for all forward sends before the first backward and for all backward sends at the
    end; 1F1B waits for each send after the next compute or in the fused send/recv before it
    (Schedule1F1B._step_microbatches); Interleaved1F1B waits for all sends at the end."""
    last = n_stages - 1
    before = [[] for _ in actions]
    post = []

    def msg(k, s, mb):
        return [(k, s, mb)] if (k == "F" and s < last) or (k == "B" and s > 0) else []

    if schedule == "gpipe":
        n_f = sum(k == "F" for _, k, _ in actions)
        for s, k, mb in actions:
            (before[n_f] if k == "F" else post).extend(msg(k, s, mb))
        return before, post
    if schedule != "1f1b":
        for s, k, mb in actions:
            post.extend(msg(k, s, mb))
        return before, post
    s = actions[0][0]
    w = next(i for i, (_, k, _) in enumerate(actions) if k == "B")   # warm-up forwards
    for i in range(1, w):              # after F_i: wait for the send of F_{i-1}
        before[i + 1].extend(msg("F", s, actions[i - 1][2]))
    j = w
    last_f = actions[w - 1][2]
    while j < len(actions):
        if actions[j][1] != "B":
            break
        before[j].extend(msg("F", s, last_f))            # fused with the recv of this backward
        if j + 1 < len(actions) and actions[j + 1][1] == "F":
            before[j + 1].extend(msg("B", s, actions[j][2]))  # fused with the recv of the next forward
            last_f = actions[j + 1][2]
            j += 2
            continue
        break
    pending = msg("B", s, actions[j][2])                 # the 1F1B phase's last backward send
    for q in range(j + 1, len(actions)):                 # cool-down: wait after the next backward
        (before[q + 1] if q + 1 < len(actions) else post).extend(pending)
        pending = msg("B", s, actions[q][2])
    post.extend(pending)
    return before, post


# -- simulation -------------------------------------------------------------------------------------

@dataclass
class PipelineWhatIf:
    """A pipeline what-if: per rank and step the measured, identity (recorded plan through the model)
    and predicted (requested plan) step times; the predicted timeline; bubble fractions."""
    plan: dict                   # schedule, microbatches, stages_per_rank (requested), recorded
    steps: pd.DataFrame          # rank, step, measured_ns, identity_ns, predicted_ns, delta_ns, identity_error
    identity_error: dict         # median, p90, max, n (fractions)
    timeline: pd.DataFrame       # rank, step, stage, name, start_ns, end_ns (predicted plan)
    bubbles: pd.DataFrame        # rank, measured/identity/predicted bubble fraction (idle / step)
    theoretical_bubble: dict     # recorded, predicted: (p-1)/(v*m+p-1)
    costs: StageCosts

    def job_step_ns(self, column: str = "predicted_ns") -> float:
        """Job step time (``replay.simulate.job_step_ns``: per rank the mean step, the slowest rank)."""
        from .simulate import job_step_ns
        return job_step_ns(self.steps, column)

    @property
    def run(self) -> str:
        return self.costs.run

    def chrome_trace(self, name: str = "pipeline what-if") -> dict:
        """The predicted timeline as a Chrome/Perfetto trace (one process per rank, µs)."""
        from .chrome import timeline_chrome
        doc = timeline_chrome(self.timeline, self.costs.run, name=name)
        doc["otherData"]["plan"] = self.plan
        return doc


def _plan_costs(c: StageCosts, step, order: dict):
    """Per rank: [(stage, kind, mb, cost_ns)] for one step under ``order`` (recorded costs for the
    recorded micro-batches, the step's per-stage median for new ones), and pre/post/overhead."""
    a = c.actions[c.actions["step"] == step]
    cost = {(s, k, mb): int(x) for s, k, mb, x in zip(a["stage"], a["kind"], a["mb"], a["cost_ns"])}
    med = a.groupby(["stage", "kind"])["cost_ns"].median().to_dict()
    out = {}
    for pos, acts in order.items():
        out[pos] = [(s, k, mb, cost.get((s, k, mb), int(med.get((s, k), 0)))) for s, k, mb in acts]
    return out


def simulate_schedule(c: StageCosts, order: dict, steps: list, schedule: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run ``order`` (rank position -> actions) for a warm-up step and then ``steps``, back to back,
    as a graph (graph/synthetic.py) that the replay's simulator runs. Each rank is a lane: per step
    its host work before the actions, then per action its overhead and its compute, then its host
    work after. A compute starts when its rank is ready (the overhead before it is done), its input
    has arrived and the sends it waits for (``send_waits``) are complete. A message (activations
    to stage + 1, gradients to stage - 1) is a node of its own lasting the step's p2p cost, after
    the producer's compute and the consumer being ready (a rendezvous; Interleaved1F1B posts its
    receives ahead, so there after the producer alone). Returns (per rank and step: start_ns,
    end_ns, own_ns, sim_ns) and the timeline (rank, step, stage, name, start_ns, end_ns)."""
    from .graph.synthetic import GraphSpec
    from .simulate import Simulator
    n_stages = c.n_ranks * c.stages_per_rank
    last = n_stages - 1
    early_recv = schedule == "interleaved1f1b"
    srow = c.steps.set_index(["rank", "step"])
    plan = [("warmup", steps[0])] + [(s, s) for s in steps]
    lat = {(label, k): c.p2p_step_ns(st, k) for label, st in plan for k in ("F", "B")}
    spec = GraphSpec(c.run)
    ready, compute = {}, {}          # action (label, stage, kind, mb) -> its overhead node, its compute node
    waits_of, own_forward = [], []   # (node, label, messages it waits for); (last stage's forward, its backward)
    step_nodes, own, timeline = [], {}, []
    for pos in order:
        rank = c.ranks[pos]
        lane = spec.lane(rank, int(srow.loc[(rank, steps[0]), "start_ns"]))
        before, post_waits = send_waits(schedule, order[pos], n_stages)
        for label, st in plan:
            w = srow.loc[(rank, st)]
            acts = _plan_costs(c, st, {pos: order[pos]})[pos]
            pre = spec.node(lane, int(w["pre_ns"]))
            own[(pos, label)] = int(w["pre_ns"]) + int(w["post_ns"])
            for i, (s, k, mb, dur) in enumerate(acts):
                ovh = int(w["overhead_ns"]) if i else 0
                key = (label, s, k, mb)
                ready[key] = spec.node(lane, ovh)
                compute[key] = spec.node(lane, dur)
                own[(pos, label)] += dur + ovh
                timeline.append((rank, label, s, f"{k}{mb}", compute[key]))
                waits_of.append((compute[key], label, before[i]))
                if k == "B" and s == last:
                    own_forward.append(((label, s, "F", mb), compute[key]))
                elif not (k == "F" and s == 0):
                    waits_of.append((compute[key], label, [(k, s - 1 if k == "F" else s + 1, mb)]))
            post = spec.node(lane, int(w["post_ns"]))
            waits_of.append((post, label, post_waits))
            step_nodes.append((rank, label, pos, pre, post))
    msgs = {}

    def message(label, k, s, mb):
        """The node of the message produced by (label, s, k, mb): created once."""
        key = (label, s, k, mb)
        if key not in msgs:
            consumer = (label, s + 1, "F", mb) if k == "F" else (label, s - 1, "B", mb)
            if key not in compute or consumer not in ready:
                raise TraceAnalyzerError("pipeline what-if: the schedule deadlocks (an action waits for one that "
                                         "never runs); check the schedule and micro-batch count")
            msgs[key] = m = spec.node(-1, lat[(label, k)])
            spec.edge(compute[key], m)
            if not early_recv:
                spec.edge(ready[consumer], m)
        return msgs[key]

    for node, label, ms in waits_of:
        for k, s, mb in ms:
            spec.edge(message(label, k, s, mb), node)
    for prod, node in own_forward:
        if prod not in compute:
            raise TraceAnalyzerError("pipeline what-if: the schedule deadlocks (an action waits for one that "
                                     "never runs); check the schedule and micro-batch count")
        spec.edge(compute[prod], node)
    g, new = spec.build("pipeline what-if")
    sched = Simulator(g).run()
    start, end = sched.start[new], sched.end[new]
    rows = [(rank, label, int(start[pre]), int(end[post]), own[(pos, label)])
            for rank, label, pos, pre, post in step_nodes if label != "warmup"]
    st = pd.DataFrame(rows, columns=["rank", "step", "start_ns", "end_ns", "own_ns"])
    st["sim_ns"] = st["end_ns"] - st["start_ns"]
    tl = pd.DataFrame([(r, label, s, name, int(start[x]), int(end[x])) for r, label, s, name, x in timeline],
                      columns=["rank", "step", "stage", "name", "start_ns", "end_ns"])
    tl = tl[tl["step"] != "warmup"].astype({"step": "int64"}).sort_values(["start_ns", "rank"], kind="stable")
    return st, tl.reset_index(drop=True)


def predict(store_or_con, run: str | None = None, schedule: str | None = None, microbatches: int | None = None,
            stages_per_rank: int | None = None, costs: StageCosts | None = None) -> PipelineWhatIf:
    """Predict the run's step time under another schedule and/or micro-batch count (same micro-batch
    size), beside the identity (the recorded plan through the same model) and the measurement."""
    c = costs if costs is not None else stage_costs(store_or_con, run)
    sched = schedule or c.schedule
    m = int(c.microbatches if microbatches is None else microbatches)
    v = int(stages_per_rank if stages_per_rank is not None else (c.stages_per_rank if sched == c.schedule else 1))
    if v != c.stages_per_rank:
        raise TraceAnalyzerError(f"pipeline what-if: run '{c.run}' has {c.stages_per_rank} stage(s) per rank; "
                                 f"re-partitioning the model into {v} is not modelled")
    per_step = c.steps.groupby("step")["rank"].nunique()
    steps = sorted(per_step.index[per_step == c.n_ranks])    # steps every pipeline rank recorded
    if not steps:
        raise TraceAnalyzerError(f"pipeline what-if: run '{c.run}' has no step recorded on all {c.n_ranks} pipeline ranks")
    rec = schedule_order(c.schedule, c.n_ranks, c.microbatches, c.stages_per_rank)
    new = schedule_order(sched, c.n_ranks, m, v)
    ident, _ = simulate_schedule(c, rec, steps, c.schedule)
    pred, tl = simulate_schedule(c, new, steps, sched)
    out = c.steps[["rank", "step", "measured_ns", "own_ns"]].rename(columns={"own_ns": "measured_own_ns"})
    out = out.merge(ident[["rank", "step", "sim_ns", "own_ns"]].rename(columns={"sim_ns": "identity_ns", "own_ns": "identity_own_ns"}),
                    on=["rank", "step"])
    out = out.merge(pred[["rank", "step", "sim_ns", "own_ns"]].rename(columns={"sim_ns": "predicted_ns", "own_ns": "predicted_own_ns"}),
                    on=["rank", "step"])
    out["delta_ns"] = out["predicted_ns"] - out["identity_ns"]
    out["identity_error"] = (out["identity_ns"] - out["measured_ns"]).abs() / out["measured_ns"]
    bub = pd.DataFrame({"rank": out["rank"],
                        "measured": 1 - out["measured_own_ns"] / out["measured_ns"],
                        "identity": 1 - out["identity_own_ns"] / out["identity_ns"],
                        "predicted": 1 - out["predicted_own_ns"] / out["predicted_ns"]}).groupby("rank").mean().reset_index()
    e = out["identity_error"]
    steps_df = out[["rank", "step", "measured_ns", "identity_ns", "predicted_ns", "delta_ns", "identity_error"]]
    return PipelineWhatIf(
        plan={"schedule": sched, "microbatches": m, "stages_per_rank": v,
              "recorded": {"schedule": c.schedule, "microbatches": c.microbatches, "stages_per_rank": c.stages_per_rank}},
        steps=steps_df.sort_values(["step", "rank"]).reset_index(drop=True),
        identity_error={"median": float(e.median()), "p90": float(e.quantile(0.9)), "max": float(e.max()), "n": int(len(e))},
        timeline=tl, bubbles=bub,
        theoretical_bubble={"recorded": theoretical_bubble(c.n_ranks, c.microbatches, c.stages_per_rank),
                            "predicted": theoretical_bubble(c.n_ranks, m, v)},
        costs=c)
