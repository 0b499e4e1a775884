"""Findings a person can act on, ranked by the time per step they would give back.

Each analysis answers its own question (stragglers.sql, imbalance.sql, bubbles.sql, overlap.sql);
the report puts their findings on one scale, the **recoverable time per step** (ns, and % of the
median step), so the first finding is the one worth fixing first:

* straggler: the wait it imposes on its peers per step (``delay_ns_per_step``);
* imbalance: the compute the rank does beyond the mean of the ranks (``excess_ns_per_step``), or the
  wait it imposes on its peers if larger (extra work is *why* it makes them wait);
* slow pipeline stage: its own time beyond the other stages' (``excess_ns_per_step``);
* slow host: a straggler whose lateness its host explains (:func:`.hosts.slow_hosts`): the wait it imposes;
* exposed communication: what overlapping the data-parallel collectives issued only after the
  backward pass with that backward could save (see :func:`_exposed`; other exposed communication is
  waiting, a stall, or bound by the network, and is the evidence, not a finding).

One cause, one finding: a rank flagged both as a straggler and as imbalanced (or as a slow stage)
is reported once, as the more specific cause (slow stage > imbalance > straggler), with the
evidence of both. A straggler that does no more compute than its peers is slow for another
reason (its host, a sleep, contention) and stays a straggler; a rank that computes longer than its
peers while running the same operations on the same input shapes has a slower host, not more work,
and is no imbalance (the analysis decides: imbalance.sql's ``same_work``, analyses/sql/work.sql).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..analyses.params import default
from .hosts import add_cpu_wait, slow_hosts
from .load import RunData
from .record import SPECIFICITY, TITLES, Finding, ms

#: An exposed-communication finding needs at least this much recoverable time, in % of the median
#: step: below it, overlapping better is not worth a person's time (setting exposed_comm_min_pct).
EXPOSED_COMM_MIN_PCT = default("exposed_comm_min_pct")

#: Exposed intervals listed as evidence of an exposed-communication finding (setting exposed_evidence_top).
EXPOSED_EVIDENCE_TOP = default("exposed_evidence_top")

def median_step_ns(data: RunData) -> float:
    """Median over steps of the median over ranks of the step time (as stragglers.sql measures it)."""
    ph = data.r("phases")
    if ph.empty:
        return float("nan")
    return float(ph.groupby("step")["step_ns"].median().median())


def pct_of(ns: float, step_ns: float) -> float:
    """``ns`` in % of ``step_ns`` (NaN without a step time)."""
    return float(100.0 * ns / step_ns) if step_ns and not np.isnan(step_ns) else float("nan")


# -- one finding per analysis -------------------------------------------------------------------

def pipeline_waiters(data: RunData) -> set:
    """Pipeline ranks that did no more of their own work than their peers (pipeline_slow_stages:
    own time beyond the same stage in the other replicas, or host-side delays beyond the other
    stages): when such a rank arrives last at a data-parallel collective, it is late because its
    pipeline stalled on another rank -- a victim, not a straggler."""
    sl = data.r("pipeline_slow_stages")
    if sl.empty:
        return set()
    return {int(r.rank) for r in sl.itertuples() if not (r.is_finding is True or r.is_finding == 1)}


def _stragglers(data: RunData) -> list[Finding]:
    coll = data.r("collectives")
    waiters = pipeline_waiters(data)
    out = []
    for s in data.r("stragglers").itertuples():
        if int(s.rank) in waiters:
            continue
        ev = [f"costs each peer {ms(s.delay_ns_per_step)} of waiting per step ({s.delay_pct:.1f}% of the step), "
              f"{ms(s.imposed_wait_ns_per_step)} summed over its peers",
              f"{s.pattern}: above the thresholds in {s.steps_flagged} of {s.steps} steps",
              f"slower than its peers in {s.phase}, by {ms(s.phase_excess_ns_per_step)} per step (median)"]
        if not coll.empty:
            last = coll[coll["last_arriver"] == s.rank]
            ev.append(f"arrived last at {len(last)} of {len(coll)} collectives"
                      + (f", median arrival skew then {ms(last['arrival_skew_ns'].median())}" if len(last) else ""))
        out.append(Finding("straggler", f"{TITLES['straggler']}: rank {s.rank}", float(s.delay_ns_per_step),
                           float(s.delay_pct), f"rank {s.rank} makes its peers wait {ms(s.delay_ns_per_step)} per step "
                           f"({s.delay_pct:.1f}% of the step); it is slower in {s.phase}", rank=int(s.rank), evidence=ev))
    return out


def _imbalance(data: RunData) -> list[Finding]:
    im = data.r("imbalance")
    ops = data.r("imbalance_ops")
    a2a = data.r("all_to_all_balance")
    out = []
    for r in im[im["is_finding"].fillna(False).astype(bool)].itertuples() if not im.empty else ():
        ev = [f"computes {ms(r.compute_ns_per_step)} per step, {r.ratio_to_mean:.2f}x the mean of the ranks "
              f"(+{ms(r.excess_ns_per_step)}, {r.excess_pct:.1f}% of the step)",
              f"did the most work in {r.steps_max} of {r.steps} steps"]
        mine = ops[(ops["max_rank"] == r.rank) & (ops["category"] == "compute")].head(3) if not ops.empty else ops
        for o in mine.itertuples():
            ev.append(f"op {o.name}: {o.max_over_mean:.2f}x the mean (+{ms(o.excess_ns_per_step)} per step)")
        mine = a2a[a2a["rank"] == r.rank] if not a2a.empty else a2a
        for a in mine.itertuples():
            ev.append(f"all_to_all: sends {a.sent_over_mean:.2f}x and receives {a.recv_over_mean:.2f}x the mean bytes")
        out.append(Finding("imbalance", f"{TITLES['imbalance']}: rank {r.rank}", float(r.excess_ns_per_step),
                           float(r.excess_pct), f"rank {r.rank} computes {r.ratio_to_mean:.2f}x the mean of the ranks "
                           f"(+{ms(r.excess_ns_per_step)} per step)", rank=int(r.rank), evidence=ev))
    return out + _routing(data, {f.rank for f in out})


def _routing_ratio(a) -> float:
    return max(float(a.recv_over_mean or 0), float(a.sent_over_mean or 0), 1.0)


def routing_per_step(data: RunData) -> pd.DataFrame:
    """MoE routing skew, per flagged rank and step: what balanced routing would save.

    * ``transfer_excess_ns``: the all_to_all transfer time of the step that balanced routing would
      save if transfer scales with the largest rank's bytes (balanced: the mean), i.e.
      transfer x (1 - 1/ratio), ratio = the rank's bytes over the mean;
    * ``imposed_wait_ns``: the waits for a late peer at the collectives of the step where this rank
      arrived last, summed over its peers and divided by the number of ranks (per rank, as
      :func:`exposed_comm_per_step` counts exposed communication): time the other ranks sat in a
      collective because this rank was late, charged to its finding, not to exposed communication.
    Columns: rank, step, ratio, transfer_excess_ns, imposed_wait_ns.
    """
    a2a, coll = data.r("all_to_all_balance"), data.r("collectives")
    cols = ["rank", "step", "ratio", "transfer_excess_ns", "imposed_wait_ns"]
    if a2a.empty or "is_finding" not in a2a or coll.empty:
        return pd.DataFrame(columns=cols)
    coll = coll[coll["step"].notna()]
    n_ranks = max(int(data.ranks["rank"].nunique()) if not data.ranks.empty else 1, 1)
    transfer = coll[coll["op"] == "all_to_all"].groupby("step")["transfer_ns"].sum()
    steps = pd.Index(sorted(coll["step"].unique()), name="step")
    rows = []
    for a in a2a[a2a["is_finding"].fillna(False).astype(bool)].itertuples():
        ratio = _routing_ratio(a)
        waits = coll[coll["last_arriver"] == a.rank].groupby("step")["total_wait_ns"].sum() / n_ranks
        per = pd.DataFrame({"transfer_excess_ns": transfer.reindex(steps).fillna(0.0) * (1 - 1 / ratio),
                            "imposed_wait_ns": waits.reindex(steps).fillna(0.0)}).reset_index()
        rows.append(per.assign(rank=int(a.rank), ratio=ratio))
    return pd.concat(rows)[cols] if rows else pd.DataFrame(columns=cols)


def routing_min_pct(data: RunData) -> float:
    """A routing skew is a finding only when balancing it would save at least this % of the median
    step (the imbalance threshold, ``imbalance_min_excess_pct``): a skewed split whose all_to_all
    costs a hundredth of a millisecond is nothing to act on."""
    return float(data.params.get("imbalance_min_excess_pct", default("imbalance_min_excess_pct")))


def routing_estimates(data: RunData, per: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per rank above ``routing_min_ratio``: the ratio and what balanced routing would save per
    step (median over steps of :func:`routing_per_step`'s transfer excess + imposed waits, ``per``
    when the caller has it), in ns and in % of the median step. Columns: rank, ratio, rec_ns, rec_pct."""
    per = routing_per_step(data) if per is None else per
    if per.empty:
        return pd.DataFrame(columns=["rank", "ratio", "rec_ns", "rec_pct"])
    step_ns = median_step_ns(data)
    g = per.assign(rec=per["transfer_excess_ns"] + per["imposed_wait_ns"]).groupby("rank")
    out = pd.DataFrame({"ratio": g["ratio"].first(), "rec_ns": g["rec"].median()}).reset_index()
    out["rec_pct"] = [pct_of(v, step_ns) for v in out["rec_ns"]]
    return out


def _routing(data: RunData, already: set) -> list[Finding]:
    """MoE routing skew: a rank that sends or receives far more all_to_all bytes than the mean
    (``routing_min_ratio``), when balancing it would save at least :func:`routing_min_pct` of the
    step. Recoverable time: per step, the all_to_all transfer balanced routing would save plus the
    waits the rank imposed on its peers by arriving late (:func:`routing_per_step`), median over steps."""
    a2a = data.r("all_to_all_balance")
    per = routing_per_step(data)
    if per.empty:
        return []
    est = routing_estimates(data, per).set_index("rank")
    min_pct = routing_min_pct(data)
    coll = data.r("collectives")
    n_ranks = max(int(data.ranks["rank"].nunique()) if not data.ranks.empty else 1, 1)
    steps = max(coll["step"].nunique(), 1)
    imposed_by = (coll.groupby("last_arriver")["total_wait_ns"].sum() / steps / n_ranks)
    out = []
    for a in a2a[a2a["is_finding"].fillna(False).astype(bool)].itertuples():
        if a.rank in already:
            continue
        mine = per[per["rank"] == a.rank]
        ratio = _routing_ratio(a)
        rec, rec_pct = float(est.loc[a.rank, "rec_ns"]), float(est.loc[a.rank, "rec_pct"])
        if not rec_pct >= min_pct:   # unknown (no step time) is no finding either
            continue
        last = coll[coll["last_arriver"] == a.rank]
        worst = imposed_by.drop(a.rank, errors="ignore")
        ev = [f"all_to_all: receives {a.recv_over_mean:.2f}x and sends {a.sent_over_mean:.2f}x the mean bytes of the "
              f"ranks over {a.n_all_to_all} all_to_all ops",
              f"balanced routing would cut the all_to_all transfer time by about 1 - 1/{ratio:.2f}: "
              f"{ms(mine['transfer_excess_ns'].median())} per step (median)",
              f"arrived last at {len(last)} of {len(coll)} collectives; the waits it imposed there, "
              f"{ms(mine['imposed_wait_ns'].median())} per step and rank (median), are charged here, not to exposed "
              f"communication"]
        if not worst.empty and worst.max() > imposed_by.get(a.rank, 0.0):
            ev.append(f"other ranks were late too: rank {int(worst.idxmax())} imposed {ms(worst.max())} per step and "
                      f"rank against {ms(imposed_by.get(a.rank, 0.0))} for rank {a.rank} (mean over steps)")
        out.append(Finding("imbalance", f"{TITLES['imbalance']}: rank {a.rank} (MoE routing)", rec, rec_pct,
                           f"rank {a.rank} gets {ratio:.2f}x the mean all_to_all traffic (routing skew)",
                           rank=int(a.rank), evidence=ev))
    return out


def _slow_stages(data: RunData) -> list[Finding]:
    sl = data.r("pipeline_slow_stages")
    out = []
    for r in sl[sl["is_finding"].fillna(False).astype(bool)].itertuples() if not sl.empty else ():
        ev = [f"own time (compute and its own delays) {ms(r.own_ns_per_step)} per step vs "
              f"{ms(r.others_own_ns_per_step)} for the other stages (median)",
              f"the other stages stalled {ms(r.stall_caused_ns_per_step)} per step waiting on it"]
        bub = data.r("pipeline_bubbles")
        if not bub.empty:
            ev.append(f"pipeline bubble: {bub['bubble_pct'].median():.1f}% of the step idle (median over stages and "
                      f"steps) against {bub['theoretical_bubble_pct'].iloc[0]:.1f}% in theory for the schedule")
        out.append(Finding("slow_stage", f"{TITLES['slow_stage']}: stage {r.stage} (rank {r.rank})",
                           float(r.excess_ns_per_step), float(r.excess_pct),
                           f"stage {r.stage} (rank {r.rank}) spends {ms(r.excess_ns_per_step)} more of its own time "
                           f"per step than the other stages ({r.excess_pct:.1f}% of the step)",
                           rank=int(r.rank), stage=int(r.stage), evidence=ev))
    return out


def _structural(data: RunData, taken: set) -> list[Finding]:
    """Candidates for a structural imbalance of a pipeline: a stage that computes more than the other
    stages by design (the last holds the loss and head, an uneven partition). Not a fault: the report
    keeps one only when the replay says rebalancing it is worth the slow-stage threshold
    (:func:`traceanalyzer.report.whatif.confirm_by_replay`), never as a slow stage."""
    sl = data.r("pipeline_slow_stages")
    if sl.empty or "is_structural" not in sl:
        return []
    last = sl.groupby("pipeline_id")["stage"].transform("max")
    out = []
    for r, is_last in zip(sl.itertuples(), last == sl["stage"]):
        if not (r.is_structural is True or r.is_structural == 1) or int(r.rank) in taken:
            continue
        why = "holds the loss and head" if is_last else "holds more of the model (an uneven partition)"
        out.append(Finding("structural", f"{TITLES['structural']}: stage {r.stage} (rank {r.rank}) {why}",
                           float(r.structural_ns_per_step), float(r.structural_pct),
                           f"stage {r.stage} (rank {r.rank}) {why}: it computes {ms(r.structural_ns_per_step)} per step "
                           f"more than the other stages; rebalancing the partition could save up to that",
                           rank=int(r.rank), stage=int(r.stage),
                           evidence=[f"compute beyond the other stages' median: {ms(r.structural_ns_per_step)} per step "
                                     f"({r.structural_pct:.1f}% of the step); no host-side delay of its own beyond "
                                     f"theirs (this is the pipeline's structure, not a slow stage)"]))
    return out


def exposed_comm_per_step(data: RunData) -> pd.DataFrame:
    """Per step (mean over ranks): exposed communication, the part of it spent waiting for peers,
    and what overlap could recover.

    Exposed communication (temporal_breakdown.comm_ns: communication with no compute running)
    includes the time a rank waits for a late peer inside the collective, and on a pipeline the
    time a stage waits in a receive. Those are charged to the straggler/imbalance (collective
    waits, from collectives.total_wait_ns) and to the pipeline (stalls, pipeline_bubbles.stall_ns),
    so they are subtracted here; so is the all_to_all transfer a MoE routing-skew finding claims
    (:func:`routing_per_step`, ``routing_ns``). What is left can be hidden under compute at best: it is capped
    by the step's compute that is not already overlapping communication (the overlap result is per
    rank over the window, so its overlapped time is spread evenly over the steps).
    Columns: step, exposed_ns, wait_ns, stall_ns, routing_ns, free_compute_ns, recoverable_ns.
    """
    tb = data.r("temporal_breakdown")
    tb = tb[tb["step"].notna()] if not tb.empty else tb
    cols = ["step", "exposed_ns", "wait_ns", "stall_ns", "routing_ns", "free_compute_ns", "recoverable_ns"]
    if tb.empty:
        return pd.DataFrame(columns=cols)
    n_ranks = max(tb["rank"].nunique(), 1)
    per = tb.groupby("step").agg(exposed_ns=("comm_ns", "mean"), compute_ns=("compute_ns", "mean"))
    coll = data.r("collectives")
    waits = (coll.groupby("step")["total_wait_ns"].sum() / n_ranks) if not coll.empty else pd.Series(dtype=float)
    bub = data.r("pipeline_bubbles")
    stalls = bub.groupby("step")["stall_ns"].mean() if not bub.empty else pd.Series(dtype=float)
    ov = data.r("overlap")
    steps_per_rank = max(tb.groupby("rank")["step"].nunique().max(), 1)
    overlapped = float(ov["overlapped_ns"].mean()) / steps_per_rank if not ov.empty else 0.0
    per["wait_ns"] = waits.reindex(per.index).fillna(0.0).astype(float)
    per["stall_ns"] = stalls.reindex(per.index).fillna(0.0).astype(float)
    per["free_compute_ns"] = (per["compute_ns"] - overlapped).clip(lower=0.0)
    rt = routing_per_step(data)
    per["routing_ns"] = rt.groupby("step")["transfer_excess_ns"].sum().reindex(per.index).fillna(0.0).astype(float) \
        if not rt.empty else 0.0
    transfer = (per["exposed_ns"] - per["wait_ns"] - per["stall_ns"] - per["routing_ns"]).clip(lower=0.0)
    per["recoverable_ns"] = np.minimum(transfer, per["free_compute_ns"])
    return per.reset_index()[cols]


def serialized_per_step(data: RunData) -> pd.DataFrame:
    """Per step (mean over ranks): the data-parallel collectives issued only after the backward
    pass (``serialized_comm``: n_serial, serial_transfer_ns, overlappable_ns). Empty when none."""
    sc = data.r("serialized_comm")
    cols = ["step", "n_serial", "serial_transfer_ns", "overlappable_ns"]
    if sc.empty:
        return pd.DataFrame(columns=cols)
    n_ranks = max(int(data.ranks["rank"].nunique()) if not data.ranks.empty else 1, 1)
    per = sc.groupby("step")[["n_serial", "serial_transfer_ns", "overlappable_ns"]].sum() / n_ranks
    return per.reset_index()[cols]


def _exposed(data: RunData, step_ns: float) -> list[Finding]:
    """Exposed communication that overlap could hide: data-parallel collectives issued only after
    the backward pass (:func:`serialized_per_step`), worth at least EXPOSED_COMM_MIN_PCT of the step.

    Communication that is exposed for other reasons is not a finding of its own: waiting for a late
    peer is the straggler's, a pipeline stall the slow stage's, an all_to_all's transfer is needed
    by the compute after it, and a collective issued from inside backward that outlasts the compute
    beside it is bound by the network (faster communication would help, not more overlap). The
    evidence gives the exposed time and what it is made of (:func:`exposed_comm_per_step`)."""
    ser = serialized_per_step(data)
    if ser.empty:
        return []
    rec = float(ser["overlappable_ns"].median())
    pct = pct_of(rec, step_ns)
    if not pct >= EXPOSED_COMM_MIN_PCT:
        return []
    per = exposed_comm_per_step(data)
    n = float(ser["n_serial"].median())
    ev = [f"{n:g} data-parallel collective(s) per step (median, per rank) are issued only after the backward pass "
          f"ended, one after another: {ms(ser['serial_transfer_ns'].median())} of transfer per step; issued from "
          f"inside backward as each bucket's gradients are ready (DDP/FSDP bucketing), all but the last would run "
          f"under the backward compute",
          f"what that could save: their transfer less the last one's (which no overlap hides): {ms(rec)} per step "
          f"(median); the backward compute they would run beside: "
          f"{ms(data.r('serialized_comm')['backward_ns'].median())} per step"]
    if not per.empty:
        ev.append(f"exposed communication (no compute running): {ms(per['exposed_ns'].median())} per step and rank "
                  f"({pct_of(per['exposed_ns'].median(), step_ns):.1f}% of the step), of which waiting for late peers "
                  f"{ms(per['wait_ns'].median())} (charged to the straggler, not counted here)")
    ov = data.r("overlap")
    if not ov.empty and ov["overlap_pct"].notna().any():
        lo = ov.loc[ov["overlap_pct"].astype(float).idxmin()]
        ev.append(f"{ov['overlap_pct'].mean():.1f}% of communication overlapped with compute on average "
                  f"(lowest: rank {int(lo['rank'])}, {lo['overlap_pct']:.1f}%)")
    rows = []
    for r in data.r("exposed_comm").head(EXPOSED_EVIDENCE_TOP).itertuples():
        rows.append({"rank": int(r.rank), "step": None if pd.isna(r.step) else int(r.step), "exposed": ms(r.exposed_ns),
                     "op": r.op, "pg": r.pg, "seq": None if pd.isna(r.seq) else int(r.seq),
                     "bytes": None if pd.isna(r.bytes) else int(r.bytes), "compute before": r.compute_before,
                     "compute after": r.compute_after})
    return [Finding("exposed_comm", TITLES["exposed_comm"], rec, pct,
                    f"gradient communication is not overlapped with backward: up to {ms(rec)} per step ({pct:.1f}% "
                    f"of the step) could be hidden by issuing it during the backward pass", evidence=ev,
                    evidence_rows=rows)]


# -- merging and ranking ------------------------------------------------------------------------

def _merge_by_rank(found: list[Finding]) -> list[Finding]:
    """One finding per rank: the most specific cause, its recoverable time the largest of the parts."""
    by_rank: dict[int, list[Finding]] = {}
    out = []
    for f in found:
        (by_rank.setdefault(f.rank, []) if f.rank is not None else out).append(f)
    for parts in by_rank.values():
        parts.sort(key=lambda f: -SPECIFICITY[f.kind])
        head = parts[0]
        for other in parts[1:]:
            head.also.append(other.kind)
            head.evidence += [f"also flagged as {other.kind.replace('_', ' ')}: {other.summary}"] + other.evidence
            if other.recoverable_ns_per_step > head.recoverable_ns_per_step:
                head.recoverable_ns_per_step, head.recoverable_pct = other.recoverable_ns_per_step, other.recoverable_pct
                head.summary += f"; it makes its peers wait {ms(other.recoverable_ns_per_step)} per step"
        out.append(head)
    return out


def rank_findings(data: RunData) -> list[Finding]:
    """Every finding of a run, the largest recoverable time first."""
    step_ns = median_step_ns(data)
    found = _merge_by_rank(_stragglers(data) + _imbalance(data) + _slow_stages(data))
    found += _structural(data, {f.rank for f in found if f.rank is not None}) + _exposed(data, step_ns)
    add_cpu_wait(data, found)
    slow_hosts(data, found)
    return sorted(found, key=lambda f: -f.recoverable_ns_per_step)
