"""The predicted timeline as a Chrome/Perfetto JSON trace: one process per rank, one track per lane.

Why: a what-if number is only believable when one can look at where the time went; the same
viewer as ``traceanalyzer export`` shows the recorded run, so the two can be compared side by side.
Zero-length bookkeeping nodes (waits, arrivals, the virtual collective joins) and host gaps are left
out; communication shows from the last member's arrival to its end.
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from .graph import KERNEL, KIND_NAMES, OP, POST, Graph
from .simulate import Schedule


def chrome_trace(g: Graph, sched: Schedule, name: str = "replay") -> dict:
    """A Chrome trace dict of the schedule (ts/dur in µs from the earliest simulated start)."""
    keep = np.isin(g.kind, [OP, KERNEL, POST]) & (sched.end > sched.start)
    t0 = int(sched.start[g.rank >= 0].min()) if g.n else 0
    lanes = g.lanes.set_index("lane")
    events = []
    for lane, row in lanes.iterrows():
        events.append({"ph": "M", "name": "thread_name", "pid": int(row["rank"]), "tid": int(lane),
                       "args": {"name": f"{row['type']} {row['tid']}"}})
    for r in np.unique(g.rank[g.rank >= 0]):
        events.append({"ph": "M", "name": "process_name", "pid": int(r), "args": {"name": f"rank {int(r)} ({name})"}})
    idx = np.flatnonzero(keep)
    for i, s, e in zip(idx.tolist(), sched.start[idx].tolist(), sched.end[idx].tolist()):
        events.append({"ph": "X", "name": g.labels[g.label[i]], "cat": KIND_NAMES[g.kind[i]],
                       "pid": int(g.rank[i]), "tid": int(g.lane[i]), "ts": (s - t0) / 1000.0, "dur": (e - s) / 1000.0})
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"run": g.run, "plan": name}}


def write_chrome_trace(g: Graph, sched: Schedule, path: str, name: str = "replay") -> int:
    """Write the trace; returns the number of slices written."""
    doc = chrome_trace(g, sched, name=name)
    with open(path, "w") as fh:
        json.dump(doc, fh)
    return sum(1 for e in doc["traceEvents"] if e["ph"] == "X")


def timeline_chrome(timeline, run: str, name: str = "replay") -> dict:
    """A Chrome trace of a structural what-if's predicted timeline (rank, [lane,] name, start_ns,
    end_ns, any other columns as args: ``replay.ddp`` / ``replay.pipeline`` results): one process
    per rank, one track per lane."""
    t = timeline
    t0 = int(t["start_ns"].min()) if len(t) else 0
    ranks = sorted(t["rank"].unique())
    lanes = t["lane"].astype(str) if "lane" in t else pd.Series("", index=t.index)
    tids = {v: i for i, v in enumerate(sorted(set(lanes)))}
    extra = [c for c in t.columns if c not in ("rank", "lane", "name", "start_ns", "end_ns")]
    ev = [{"ph": "M", "name": "process_name", "pid": int(r), "args": {"name": f"rank {int(r)} ({name})"}} for r in ranks]
    ev += [{"ph": "M", "name": "thread_name", "pid": int(r), "tid": tid, "args": {"name": lane}}
           for lane, tid in tids.items() if lane for r in ranks]
    for (i, x), lane in zip(t.iterrows(), lanes):
        ev.append({"ph": "X", "name": str(x["name"]), "cat": name, "pid": int(x["rank"]), "tid": tids[lane],
                   "ts": (int(x["start_ns"]) - t0) / 1000.0, "dur": (int(x["end_ns"]) - int(x["start_ns"])) / 1000.0,
                   "args": {c: (x[c].item() if hasattr(x[c], "item") else x[c]) for c in extra}})
    return {"traceEvents": ev, "displayTimeUnit": "ms", "otherData": {"run": run, "plan": name}}
