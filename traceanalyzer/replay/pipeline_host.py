"""What a pipeline plan cannot know about the host: ranks that share its CPUs (replay/pipeline.py).

A pipeline plan keeps each rank's recorded compute per micro-batch and its recorded host work per
action; it gains by filling the pipeline's bubbles. On CPU-only ranks sharing a host, a rank's
bubble is time its core-mate may already use: filling it makes the two compete for the core (each
op slower, the host work between actions too) instead of shortening the step, and which ranks share
a core (their pinning) is not in the trace. So the plan says so, with the one number the recorded
run gives: how many of the host's ranks were busy at once on average (their own work, the waits
left out, over the step), to hold against the host's cores. Measured on a 4-rank 1F1B run on 2
cores (docs/replay.md): 1.8 ranks busy at once, and its Interleaved1F1B re-run was slower, not
faster, than the 1F1B run (the plan predicted a gain).
"""
from __future__ import annotations

import pandas as pd


def busy_at_once(steps: pd.DataFrame, ranks_on_host: list) -> float:
    """Of ``ranks_on_host``, how many were busy at once on average over the recorded steps: the
    sum of their own work per step (``own_ns``) over the step (the mean of their step times)."""
    s = steps[steps["rank"].isin(ranks_on_host)].groupby("step").agg(own_ns=("own_ns", "sum"), step_ns=("measured_ns", "mean"))
    s = s[s["step_ns"] > 0]
    return float((s["own_ns"] / s["step_ns"]).mean()) if len(s) else float("nan")


def shared_cpu_hosts(ranks: pd.DataFrame) -> dict[str, list[int]]:
    """The hosts where several CPU-only ranks run (``ranks``: the store's ranks table, columns rank,
    host, device): host -> its ranks. The one test of "ranks share a host's cores" (the report's
    caveat uses it too)."""
    if ranks.empty or not {"rank", "host", "device"} <= set(ranks.columns):
        return {}
    cpu = ranks[ranks["device"].astype(str).str.lower() == "cpu"]
    out = {}
    for host, g in cpu.groupby(cpu["host"].fillna("").astype(str)):
        members = sorted({int(r) for r in g["rank"]})
        if len(members) > 1:
            out[host] = members
    return out


def shared_host_limits(con, run: str, steps: pd.DataFrame, changed: bool) -> list[str]:
    """One line per host whose CPU-only ranks of ``run`` share it, when the plan changes the
    recorded schedule (``changed``); empty otherwise. ``steps``: StageCosts.steps."""
    if not changed:
        return []
    try:
        ranks = con.execute("SELECT rank, host, device FROM ranks WHERE run = $run", {"run": run}).df()
    except Exception:   # noqa: BLE001 - a connection without the ranks table: nothing to say
        return []
    out = []
    for host, on_host in shared_cpu_hosts(ranks).items():
        members = [r for r in on_host if r in set(steps["rank"])]
        if len(members) < 2:
            continue
        busy = busy_at_once(steps, members)
        out.append(f"{len(members)} CPU-only ranks share host {host or '(unnamed)'}, {busy:.1f} of them busy at once on "
                   "average in the recorded steps: the plan keeps each rank's recorded compute and host work per "
                   "action, so on a host with about that many cores or fewer it cannot know that the new schedule "
                   "makes core-mates compete instead of filling bubbles (the step may grow where it predicts a gain), nor "
                   "the new schedule's own host work per action.")
    return out
