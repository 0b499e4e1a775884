"""Replay what-ifs for the report: what idealising a flagged rank would give back, by simulation.

For each straggler / imbalance / slow-stage finding (largest estimate first, until
:data:`REPLAY_MAX_FINDINGS` are confirmed, so a 128-rank report stays fast) the run's dependency graph is replayed with that rank
(for a slow stage: the stage's rank; with replicas, the slow worker, against its stage's other replicas) idealised -- its compute the mean over ranks of the same
operation, its communication the median transfer of its class (``traceanalyzer.replay``'s
``idealize``). The saving is the job step (per step the slowest rank, averaged over steps) of the
identity replay minus that of the what-if. It becomes the finding's recoverable time (negative
savings count as 0: idealising the rank would not shorten the step); the analyses' estimate (the
wait it imposes on its peers, or its excess) is kept beside it. Every replay result carries the
identity-replay error of the same run (how well the replay reproduces the measured steps).

Replay is best effort: when the graph cannot be built or a what-if fails, the findings keep their
estimates and the report says why (``RunReplay.reason``). Only public replay calls are used
(``build_graph``, ``what_if``, ``WhatIf.job_step_ns``, ``WhatIf.identity_error``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..analyses.params import default as _default
from .findings import median_step_ns, pct_of
from .load import RunData
from .record import RANK_KINDS, Finding, ms

#: At most this many rank findings (largest estimate first) are replayed; the others keep their
#: estimate. One what-if costs two replays of the whole graph plus the plan: ~0.6 s for 13 M events
#: on 2 cores (the first ~1.5 s: it also keys every operation across ranks once).
REPLAY_MAX_FINDINGS = _default("replay_max_findings")

#: The what-ifs of one report stop after this many times REPLAY_MAX_FINDINGS, confirmed or not:
#: a what-if that refutes its finding (idealising the rank gives nothing back) does not count
#: toward REPLAY_MAX_FINDINGS, so a finding the cap would have left unreplayed is replayed too,
#: up to this bound (an 8-rank DDP run on 2 cores flags 3 ranks of noise beside its straggler:
#: the 4th, unreplayed, was reported on its estimate; issue 14).
REPLAY_MAX_WHATIFS_FACTOR = 3

#: Findings whose estimate is below this % of the median step are not replayed (nothing worth a
#: what-if; a 128-rank DLRM job flags 16 ranks that each cost 0.07 % of a step).
REPLAY_MIN_PCT = _default("replay_min_pct")

#: Runs with more stored events than this are not replayed by the report (the estimates are kept
#: and the report says why; ``traceanalyzer report --replay-max-events N`` changes it). Building
#: the graph costs ~0.5 us per stored event on 2 cores (6.5-7 s for the 13 M events of the
#: 128-rank benchmark store, 2.3 GB), so graph + 3 what-ifs of a 20 M-event run stay inside the
#: report's 30 s budget beside the report's own ~11 s.
REPLAY_MAX_EVENTS = _default("replay_max_events")

#: Finding kinds a what-if applies to (the ones that name a rank).
REPLAY_KINDS = RANK_KINDS + ("structural",)


@dataclass
class RunReplay:
    """The replay side of one run's report."""
    status: str                         # ok, failed (graph or what-if error), skipped (run too large), off (not asked for), none (nothing to replay)
    reason: str = ""                    # why it failed / was not run
    identity_error: dict = field(default_factory=dict)   # median, p90 (fractions) of |identity - measured| / measured
    build_s: float = 0.0                # seconds to build the graph
    what_ifs: int = 0                   # what-ifs replayed

    def to_dict(self) -> dict:
        return {"status": self.status, "reason": self.reason, "identity_error": self.identity_error,
                "build_s": self.build_s, "what_ifs": self.what_ifs}


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _target_ranks(f: Finding, data: RunData) -> list[int]:
    """The ranks to idealise: the finding's rank. A slow stage is one rank too: without replicas
    the stage's only rank; with replicas (PP x DP) a slow stage is own time beyond its data-parallel
    peers' (pipeline_slow_stages), i.e. one slow worker, idealised against those peers (the replay's
    reference for a stage with peers not idealised). Idealising every rank of the stage also cut
    the healthy replicas' time of that stage down to the other stages': a saving the fault never cost
    (issue 14, accuracy corpus: a slow worker of a 2x2 PP x DP run, 44.9 ms claimed -> 41.3 for 36.0
    measured; of a 4x2 one, 16.8 -> 15.7 for 11.3, the rest the testbed's contention,
    benchmarks/contention_check.py)."""
    return [int(f.rank)]


def _structural_plan(f: Finding, data: RunData, ranks: list[int]) -> dict:
    """The what-if of a structural imbalance: rebalancing the partition *moves* work, it does not
    remove it. The stage takes the mean over every stage of each operation (``reference: all``),
    and the work it gives up -- its own time beyond the mean of its pipeline's stages
    (``pipeline_slow_stages.own_ns_per_step``) -- is spread evenly over the other stages of the same
    pipeline, each rank's compute scaled up by its share over its own time. (Until issue 14 the plan
    only idealised the stage: the work vanished, and a clean 1F1B run whose stage 1 was slower on a
    shared core was told that rebalancing would save 10 % of the step; moved, 7 %.)"""
    actions = [{"action": "idealize", "ranks": ranks, "reference": "all"}]
    sl = data.r("pipeline_slow_stages")
    if sl.empty or f.stage is None:
        return {"actions": actions}
    me = sl[sl["rank"].isin(ranks) & (sl["stage"] == f.stage)]
    for pid, mine in me.groupby("pipeline_id"):
        pipe = sl[sl["pipeline_id"] == pid]
        others = pipe[pipe["stage"] != f.stage]
        moved = float(mine["own_ns_per_step"].mean()) - float(pipe["own_ns_per_step"].mean())
        if moved <= 0 or others.empty:
            continue
        for o in others.itertuples():
            if o.own_ns_per_step and o.own_ns_per_step > 0:
                actions.append({"action": "scale", "factor": 1.0 + moved / len(others) / float(o.own_ns_per_step),
                                "ranks": [int(o.rank)]})
    return {"actions": actions}


def apply_replay(store, data: RunData, findings: list[Finding], max_events: int = REPLAY_MAX_EVENTS,
                 con=None) -> RunReplay:
    """Replay the what-if of each rank finding (in place: ``Finding.replay``, and the recoverable
    time becomes the replay's saving), re-rank ``findings``, and return the run's replay status.
    ``store``: the store (or a connection over it); ``con``: a connection over the store already open,
    used for its views (the graph is then stitched from the pieces saved in the store)."""
    for f in findings:
        if f.kind == "exposed_comm" and data.events <= max_events:
            _overlap_whatif(store if con is None else con, data, f)
    targets = sorted([f for f in findings if f.kind in REPLAY_KINDS and f.rank is not None],
                     key=lambda f: -f.recoverable_ns_per_step)
    if not targets:
        return RunReplay("none", "no straggler, imbalance or slow-stage finding to replay")
    small = [f for f in targets if not f.recoverable_pct >= REPLAY_MIN_PCT]
    for f in small:
        f.replay = {"status": "skipped", "reason": f"its estimate is below {REPLAY_MIN_PCT:g}% of the step"}
    targets = [f for f in targets if f not in small]
    if not targets:
        return RunReplay("none", f"no rank finding worth {REPLAY_MIN_PCT:g}% of the step to replay")
    if data.events > max_events:
        out = RunReplay("skipped", f"the run has {data.events:,} events, more than the {max_events:,} the report "
                                   f"replays (traceanalyzer report --replay-max-events); recoverable times are the "
                                   f"analyses' estimates")
        for f in targets:
            f.replay = {"status": "skipped", "reason": out.reason}
        return out
    from .. import replay
    t0 = time.perf_counter()
    try:
        g = replay.build_graph(store, data.run, con=con)
    except Exception as exc:  # noqa: BLE001 -- the report must not fail because replay did
        out = RunReplay("failed", f"the replay graph could not be built ({_one_line(exc)}); recoverable times "
                                  f"are the analyses' estimates (wait imposed on the peers, or excess time)")
        for f in targets:
            f.replay = {"status": "failed", "reason": out.reason}
        return out
    out = RunReplay("ok", build_s=time.perf_counter() - t0)
    step_ns = median_step_ns(data)
    sim = replay.Simulator(g)    # one set-up for every what-if of the run
    confirmed = 0
    for i, f in enumerate(targets):
        if confirmed >= REPLAY_MAX_FINDINGS or i >= REPLAY_MAX_FINDINGS * REPLAY_MAX_WHATIFS_FACTOR:
            f.replay = {"status": "skipped", "reason": f"replay stops once {REPLAY_MAX_FINDINGS} rank findings are "
                                                      f"confirmed (or after {REPLAY_MAX_FINDINGS * REPLAY_MAX_WHATIFS_FACTOR} what-ifs)"}
            continue
        ranks = _target_ranks(f, data)
        plan = _structural_plan(f, data, ranks) if f.kind == "structural" else \
            {"actions": [{"action": "idealize", "ranks": ranks}]}
        try:
            r = replay.what_if(g, {"actions": [dict(a) for a in plan["actions"]]}, sim=sim)  # it may add keys
            f.replay = _replay_record(r, plan, ranks, step_ns)
        except Exception as exc:  # noqa: BLE001
            f.replay = {"status": "failed", "reason": f"what-if failed ({_one_line(exc)}); the estimate is kept"}
            out.status, out.reason = "failed", f.replay["reason"]
            continue
        out.what_ifs += 1
        out.identity_error = f.replay["identity_error"]
        saving = f.replay["saving_ns_per_step"]
        f.estimate_ns_per_step = f.recoverable_ns_per_step
        f.recoverable_ns_per_step = max(saving, 0.0)
        f.recoverable_pct = pct_of(f.recoverable_ns_per_step, step_ns)
        f.recoverable_source = "replay"
        f.evidence.insert(0, replay_sentence(f))
        _measured_wait_floor(f, data, step_ns)
        name, dflt = _THRESHOLDS[f.kind]
        confirmed += bool(f.recoverable_pct >= float(data.params.get(name, dflt)))
    findings.sort(key=lambda f: -f.recoverable_ns_per_step)
    return out


def _overlap_whatif(store, data: RunData, f: Finding) -> None:
    """The what-if of an exposed-communication finding (data-parallel collectives issued only after
    backward): the DDP step model (``replay.ddp``) with the buckets issued during backward as their
    gradients are ready (plan ``{"action": "ddp", "overlap": true}``). The finding keeps the analyses'
    estimate as its recoverable time (what the trace measured); the replay's prediction is its
    evidence and its ``replay`` record. A run the model cannot take (no all_reduce, no backward
    gradients in the trace) says why and keeps the estimate."""
    from ..replay import ddp
    plan = {"actions": [{"action": "ddp", "overlap": True}]}
    try:
        f.replay = _replay_record(ddp.predict(store, run=data.run, overlap=True), plan, [], median_step_ns(data))
    except Exception as exc:  # noqa: BLE001 -- the report must not fail because replay did
        f.replay = {"status": "failed", "plan": plan,
                    "reason": f"the DDP step model could not replay overlap ({_one_line(exc)}); the estimate is kept"}
        return
    f.evidence.insert(0, replay_sentence(f))


def _replay_record(r, plan: dict, ranks: list[int], step_ns: float) -> dict:
    """A finding's ``replay`` from a what-if result (``job_step_ns``, ``identity_error``): the
    identity and predicted job steps, the saving (ns and % of the median step ``step_ns``) and the
    identity error (median, p90)."""
    ident_ns, pred_ns = r.job_step_ns("identity_ns"), r.job_step_ns()
    saving = ident_ns - pred_ns
    return {"status": "ok", "plan": plan, "ranks": ranks, "identity_step_ns": ident_ns, "predicted_step_ns": pred_ns,
            "saving_ns_per_step": saving, "saving_pct": pct_of(saving, step_ns),
            "identity_error": {k: float(r.identity_error[k]) for k in ("median", "p90") if k in r.identity_error}}


def _measured_wait_floor(f: Finding, data: RunData, step_ns: float) -> None:
    """An imbalance (a rank given more work) that its peers measurably waited for (also flagged by
    stragglers.sql): what fixing it gives back is at least that wait (``delay_ns_per_step``: what
    each peer waited for it per step). The replay keeps every other rank's recorded durations, and
    extra work on a shared host also slows what shares it -- the rank's own communication threads,
    its core-mates, the transfers it is part of -- so the replay cannot give that back and comes out
    short (issue 14: a 2x-sequence rank, replay 3.9 ms vs the step's 21.4 ms, its peers' wait 20.2
    ms; a 3x-batch rank 4.6 vs 7.4, wait 7.9). A straggler (a sleep, a slow host) frees its core
    while it lags, so for it the replay stands (an 8-rank sleeper: replay 13.8 ms vs the step's 13.2
    ms, its peers' wait 24.9 ms, inflated by the cores it left to them)."""
    if f.kind != "imbalance" or "straggler" not in f.also:
        return
    st = data.r("stragglers")
    mine = st[st["rank"] == f.rank] if not st.empty else st
    if mine.empty:
        return
    wait = float(mine["delay_ns_per_step"].iloc[0])
    if not wait > f.recoverable_ns_per_step:
        return
    f.recoverable_ns_per_step, f.recoverable_pct = wait, pct_of(wait, step_ns)
    f.recoverable_source = "estimate"
    f.evidence.insert(1, f"recoverable time: the wait its peers measurably spent on it, {ms(wait)} per step, more "
                         f"than the replay's saving: its extra work also slowed what shares its host (its communication, "
                         f"its core-mates), which a replay keeping the other ranks' recorded durations cannot give back")


def replay_sentence(f: Finding) -> str:
    """'replay: idealising rank 2 would cut the step by 15.60 ms (37.0 %) ...' for one finding."""
    r = f.replay or {}
    if r.get("status") != "ok":
        return f"replay: not used ({r.get('reason', 'not run')})"
    who = ("rank " if len(r["ranks"]) == 1 else "ranks ") + ", ".join(map(str, r["ranks"]))
    if f.kind == "structural":
        who += " (its extra work spread over the other stages)"
    doing = ("issuing each bucket's all_reduce during backward as its gradients are ready (DDP step model)"
             if f.kind == "exposed_comm" else f"idealising {who}")
    err = r.get("identity_error") or {}
    err_txt = (f" (identity-replay error: median {100 * err['median']:.1f} %, p90 {100 * err['p90']:.1f} %)"
               if "median" in err and "p90" in err else "")
    s = r["saving_ns_per_step"]
    if s > 0:
        head = f"replay: {doing} would cut the step by {ms(s)} ({r['saving_pct']:.1f}% of the median step)"
    else:
        head = f"replay: {doing} would not shorten the step ({ms(-s)} longer)"
    return (head + f"; replayed job step (slowest rank, mean over steps) {ms(r['identity_step_ns'])} → "
            f"{ms(r['predicted_step_ns'])}" + err_txt
            + (f"; the analyses' estimate was {ms(f.estimate_ns_per_step)}" if f.estimate_ns_per_step is not None else ""))


def replay_note(rp: RunReplay) -> str:
    """One line on how the run's rank findings were valued (replay, or why not)."""
    if rp.status == "ok":
        err = rp.identity_error
        return (f"Recoverable times of rank findings are replay what-ifs ({rp.what_ifs} replayed; identity-replay "
                f"error median {100 * err.get('median', float('nan')):.1f} %, p90 {100 * err.get('p90', float('nan')):.1f} %).")
    if rp.status in ("failed", "skipped"):
        return f"Replay not used: {rp.reason}."
    return ""


#: The finding threshold of each rank-finding kind (an analysis parameter, % of the median step).
_THRESHOLDS = {kind: (p, _default(p)) for kind, p in (
    ("straggler", "straggler_min_delay_pct"), ("slow_host", "straggler_min_delay_pct"), ("imbalance", "imbalance_min_excess_pct"),
    ("slow_stage", "slow_stage_min_excess_pct"), ("structural", "slow_stage_min_excess_pct"))}


def confirm_by_replay(data: RunData, findings: list[Finding]) -> list[Finding]:
    """The findings worth acting on. A rank finding whose what-if was replayed is kept only when
    idealising its rank saves at least its kind's finding threshold (% of the median step): a rank
    that looked slow but whose idealisation gives nothing back (a pipeline stage doing its role, a
    rank that only waited) is not an alarm. A structural-imbalance candidate (findings._structural)
    needs that replay: without one (off, failed, skipped) it is not reported; other findings
    without a replay keep their estimates."""
    out = []
    for f in findings:
        r = f.replay or {}
        if f.kind in _THRESHOLDS and (r.get("status") == "ok" or f.kind == "structural"):
            name, default = _THRESHOLDS[f.kind]
            if not (r.get("status") == "ok" and f.recoverable_pct >= float(data.params.get(name, default))):
                continue
        out.append(f)
    return out
