"""A rank finding's host: its wait for a CPU core as evidence (:func:`add_cpu_wait`), and a finding
its host explains made a ``slow_host`` (:func:`slow_hosts`), from the collector's CPU samples
(analyses/sql/host_cpu.sql)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..analyses.params import default
from .load import RunData
from .record import SPECIFICITY, TITLES, Finding, ms


def add_cpu_wait(data: RunData, found: list[Finding]) -> None:
    """A rank finding's evidence gets its rank's wait for a CPU core per step vs its peers'
    (host_cpu.sql, from the collector's samples): a rank that waited for a core is slow because of
    its host, which its trace cannot show. Nothing for a run recorded without samples (unknown)."""
    hc = data.r("host_cpu")
    if hc.empty:
        return
    rows = hc.set_index("rank")
    for f in found:
        if f.rank is None or f.kind not in SPECIFICITY:
            continue
        if f.rank not in rows.index:
            f.evidence.append("waited for a CPU core: unknown (the collector took no samples on this rank)")
            continue
        r = rows.loc[f.rank]
        f.cpu_wait_ns_per_step = float(r["wait_ns_per_step"])
        f.evidence.append(f"waited for a CPU core {ms(r['wait_ns_per_step'])} per step ({r['wait_pct']:.1f}% of its step, "
                          f"median) vs its peers' median {ms(r['peers_wait_ns_per_step'])}")
        if "run_ns_per_step" in r and pd.notna(r["run_ns_per_step"]):
            f.evidence.append(f"its training thread ran {ms(r['run_ns_per_step'])} of CPU per step (median) vs its peers' "
                              f"median {ms(r['peers_run_ns_per_step'])}")


def slow_hosts(data: RunData, found: list[Finding]) -> None:
    """A rank finding its host explains becomes ``slow_host`` (what to fix is the host: pinning,
    isolation, a node; the wait it imposes stays its recoverable time):

    * a straggler that ran the same operations on the same input shapes as its peers (work.sql)
      and whose extra CPU time plus extra wait for a core per step (host_cpu.sql: its training
      thread's CPU time, and the larger of its training thread's and its whole process's wait that
      its host can have caused -- not its threads' wait behind each other, a lower bound --
      beyond its peers' medians) covers at least ``straggler_host_min_pct`` of the phase it was
      slower in;
    * a straggler no phase of its own shows slower than its peers by ``straggler_min_excess_pct``
      of a step -- the analyses found it by its threads' extra wait for a core (stragglers.sql) --
      whatever its work (its CPU time is not compared);
    * a slow pipeline stage whose extra wait for a core alone covers that share of its excess own
      time (its CPU time is not compared: another stage runs other layers).

    What a straggler's own code did is not its host: its training thread's extra CPU time counts only
    as far as its operations took longer than its peers' (the rest ran outside every traced operation:
    its own untraced code on that thread -- Python, data loading, a busy-wait), and its threads' extra
    wait for a core less that rest (the time they waited behind it).

    Unknown (no samples, no work comparison): the finding stays as it is."""
    hc = data.r("host_cpu")
    if hc.empty or "run_ns_per_step" not in hc:
        return
    im, st = data.r("imbalance"), data.r("stragglers")
    min_pct = float(data.params.get("straggler_host_min_pct", default("straggler_host_min_pct")))
    own_pct = float(data.params.get("straggler_min_excess_pct", default("straggler_min_excess_pct")))
    hosts = hc.set_index("rank")
    same = im.set_index("rank")["same_work"] if not im.empty and "same_work" in im else pd.Series(dtype=object)
    ops = im.set_index("rank")["compute_ns_per_step"] if not im.empty and "compute_ns_per_step" in im \
        else pd.Series(dtype=float)
    st = st.set_index("rank") if not st.empty else pd.DataFrame(columns=["phase_excess_ns_per_step"])
    phase = st["phase_excess_ns_per_step"]
    # a straggler no phase of its own showed slow enough: the analyses admitted it by its wait for a core
    by_wait = st["phase_excess_pct"].fillna(0) < own_pct if "phase_excess_pct" in st else pd.Series(dtype=bool)
    for f in found:
        if f.kind not in ("straggler", "slow_stage") or f.also or f.rank not in hosts.index:
            continue
        h = hosts.loc[f.rank]
        extra_run = h["run_ns_per_step"] - h["peers_run_ns_per_step"]
        # the waits its host can have caused (host_cpu.sql: not its threads' wait behind each other)
        extra_wait = h.get("host_wait_ns_per_step", np.nan) - h.get("peers_host_wait_ns_per_step", np.nan)
        # its other threads' wait counts too (gloo's runloop threads run its collectives, OpenMP its
        # kernels: while they wait for a core the training thread sits idle, neither running nor waiting)
        extra_proc = h.get("host_proc_wait_ns_per_step", np.nan) - h.get("peers_host_proc_wait_ns_per_step", np.nan)
        if pd.notna(extra_wait) and pd.notna(extra_proc):
            extra_wait = max(extra_wait, extra_proc)
        own_cpu = 0.0   # CPU its training thread spent beyond its peers' outside its operations
        found_by_wait = f.kind == "straggler" and bool(by_wait.get(f.rank, False))
        if found_by_wait:
            ex, what, extra_run = float(st.loc[f.rank, "delay_ns_per_step"]), "the wait it cost each peer", 0.0
        elif f.kind == "straggler":
            if f.rank not in phase.index or not (same.get(f.rank) is True or same.get(f.rank) == 1):
                continue
            ex, what = float(phase[f.rank]), "its slower phase"
            ops_x = ops[f.rank] - ops.drop(f.rank).median() if f.rank in ops.index and len(ops) > 1 else np.nan
            if pd.notna(ops_x) and pd.notna(extra_run) and pd.notna(extra_wait):   # (unknown: as before)
                ops_x = max(float(ops_x), 0.0)
                own_cpu, extra_run = max(extra_run - ops_x, 0.0), min(extra_run, ops_x)
                extra_wait = max(extra_wait - own_cpu, 0.0)
        else:
            ex, what, extra_run = float(f.recoverable_ns_per_step), "its excess own time", 0.0
        # (found by its wait alone, a straggler is a slow host whatever share of its cost the wait covers)
        if pd.isna(extra_run) or pd.isna(extra_wait) or not ex > 0 \
                or not (found_by_wait or 100.0 * (extra_run + extra_wait) >= min_pct * ex):
            if own_cpu > 0.1 * ex:
                f.evidence.append(f"its training thread ran {ms(own_cpu)} more CPU per step than its peers' outside its "
                                  f"traced operations: its own untraced code on that thread (Python between operators, "
                                  f"data loading, a busy-wait), not its host")
            continue
        share = 100.0 * (extra_run + extra_wait) / ex
        parts = []
        if extra_run > 0 and h['peers_run_ns_per_step'] > 0:
            parts.append(f"ran the same work {100.0 * extra_run / h['peers_run_ns_per_step']:.0f}% slower "
                         f"(+{ms(extra_run)} of CPU per step)")
        if extra_wait > 0:
            parts.append(f"kept its threads waiting {ms(extra_wait)} more per step for a core (not counting their "
                         f"wait behind each other)")
        was = f"stage {f.stage} " if f.kind == "slow_stage" else ""
        f.kind, f.title = "slow_host", f"{TITLES['slow_host']}: rank {f.rank}"
        f.summary = (f"rank {f.rank}'s host {' and '.join(parts)}; its peers wait for it "
                     f"{ms(f.estimate_ns_per_step or f.recoverable_ns_per_step)} per step")
        alone = was != "" or found_by_wait     # its wait is the whole evidence
        cpu = (f"its extra wait for a core ({_signed(extra_wait)})" if alone
               else f"its extra CPU time ({_signed(extra_run)}) and extra wait for a core ({_signed(extra_wait)})")
        work = (f"as pipeline {was.strip()}" if was else
                f"with no phase of its own {own_pct:g}% of a step slower than its peers'" if alone else
                "running the same operations on the same input shapes as its peers")
        f.evidence.insert(0, f"{cpu} per step {'covers' if alone else 'cover'} {share:.0f}% of {what} (+{ms(ex)}), "
                             f"{work}: its host (a slower or shared core), not its work or the job, made it late "
                             f"(the wait counted is what other processes can have cost it: beyond what its own "
                             f"threads ran, at most the core time its process left unused)")


def _signed(ns: float) -> str:
    return ("+" if ns >= 0 else "-") + ms(abs(ns))
