"""Export a run's events as a Chrome/Perfetto JSON trace, with the findings as overlay tracks.

    doc = export_trace("store", run="pp", rank=2)        # or rank=None: every rank of the run
    write_trace(doc, "pp_rank2.json")                     # open it in https://ui.perfetto.dev
    assert not validate_nesting(doc)

Time is exact: ``ts``/``dur`` are microseconds written as decimal text with three decimals, from
the store's int64 nanoseconds, relative to ``baseTimeNanoseconds`` (a whole second before the first
event) as Kineto writes them, so the numbers stay small enough that a float64 reader (Perfetto,
chrome://tracing) keeps every nanosecond, and re-ingesting the file gives back the same ``ts_ns``.

Perfetto's JSON importer needs the complete ('X') events of one track (pid, tid) to nest strictly:
an event that starts inside an open slice and ends after it is silently dropped. Real traces break
this (a ``gloo:send`` outlives the ``c10d::send`` that issued it), so such events are moved to an
extra track of the same thread ("... (overlapping spans)"); :func:`validate_nesting` checks a trace
against the rule. Each rank is one process per original process/device; the overlays are one more
process per rank ("rank K: findings") with tracks for pipeline bubbles, exposed communication,
waits for a late peer and the cross-rank critical path.
"""
from __future__ import annotations

import gzip
import json
import os
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd

from .. import __version__
from ..errors import TraceAnalyzerError
from ..store.runs import resolve_run
from .timefmt import ns_from_us as _ns
from .timefmt import us_from_ns as _us

#: Synthetic pids: rank K's processes are K * PID_STRIDE + i; its findings are K * PID_STRIDE + OVERLAY_PID.
PID_STRIDE = 1000
OVERLAY_PID = 999
NS_PER_S = 1_000_000_000

_OVERLAY_TRACKS = ("pipeline bubbles", "exposed communication", "waiting for a late peer", "critical path")


# -- nesting -------------------------------------------------------------------------------------

def validate_nesting(trace: dict) -> list[str]:
    """Perfetto's rule for complete events, per track (pid, tid): taken in timestamp order (file
    order for equal timestamps), each event must either lie inside every slice still open when it
    starts or start after it ended. Returns one line per event that breaks the rule (empty: valid)."""
    tracks: dict[tuple, list] = {}
    for i, e in enumerate(trace.get("traceEvents", [])):
        if e.get("ph") == "X":
            tracks.setdefault((e.get("pid"), e.get("tid")), []).append((_ns(e["ts"]), _ns(e.get("dur", 0)), i, e))
    bad = []
    for track, events in tracks.items():
        events.sort(key=lambda x: (x[0], x[2]))  # stable: file order for ties
        stack: list[tuple[int, dict]] = []
        for ts, dur, _, e in events:
            while stack and stack[-1][0] <= ts:
                stack.pop()
            if stack and ts + dur > stack[-1][0]:
                parent = stack[-1][1]
                bad.append(f"track {track}: {e.get('name')!r} [{ts}, {ts + dur}] ns starts inside {parent.get('name')!r} "
                           f"[{_ns(parent['ts'])}, {stack[-1][0]}] ns and outlives it")
                continue  # Perfetto drops it
            stack.append((ts + dur, e))
    return bad


def _lanes(events: pd.DataFrame) -> pd.Series:
    """Lane of each event of one track so that every lane nests strictly: lane 0 is the original
    track, an event that would break the nesting there goes to the first lane where it fits.
    ``events`` must be sorted by (lo_ns, -dur)."""
    stacks: list[list[int]] = []
    out = []
    for lo, hi in zip(events["lo_ns"].to_numpy(), events["hi_ns"].to_numpy()):
        for k, stack in enumerate(stacks):
            while stack and stack[-1] <= lo:
                stack.pop()
            if not stack or hi <= stack[-1]:
                stack.append(hi)
                out.append(k)
                break
        else:
            stacks.append([hi])
            out.append(len(stacks) - 1)
    return pd.Series(out, index=events.index, dtype="int64")


# -- reading the store ---------------------------------------------------------------------------

def _resolve(con, store, run, rank) -> tuple[str, list[int]]:
    run = resolve_run(con, run, where=store)
    ranks = [int(r) for (r,) in con.execute("SELECT DISTINCT rank FROM ranks WHERE run = $run ORDER BY rank",
                                            {"run": run}).fetchall()]
    if rank is not None and rank not in ranks:
        raise TraceAnalyzerError(f"run '{run}' has no rank {rank} (ranks: {', '.join(map(str, ranks))})")
    return run, ranks if rank is None else [rank]


def _overlays(con, run: str, ranks: list[int]) -> pd.DataFrame:
    """Findings as intervals on each rank's (clock-aligned) time: rank, track, name, lo_ns, hi_ns, args."""
    from ..analyses import prepare
    from ..analyses.critical_path import _VIEWS as _CP_VIEWS
    from ..analyses.critical_path import critical_path
    prepare(con, views=["clock_offsets", "pipeline_idle", "exposed_comm", *_CP_VIEWS])
    args = {"run": run, "ranks": ranks}
    parts = []
    off = "coalesce((SELECT offset_ns FROM clock_offsets o WHERE o.run = x.run AND o.rank = x.rank), 0)"
    df = con.execute(f"""SELECT rank, kind, caused_by_rank, step, lo_ns + {off} AS lo_ns, hi_ns + {off} AS hi_ns
                         FROM pipeline_idle x WHERE run = $run AND list_contains($ranks, rank)""", args).df()
    parts += [dict(rank=r.rank, track="pipeline bubbles", lo_ns=r.lo_ns, hi_ns=r.hi_ns,
                   name=f"bubble: {r.kind}" + (f" (waiting on rank {int(r.caused_by_rank)})" if pd.notna(r.caused_by_rank) else ""),
                   args={"step": r.step, "kind": r.kind}) for r in df.itertuples()]
    con.execute("SET VARIABLE exposed_top = 2147483647")  # every interval of the exported ranks
    df = con.execute(f"""SELECT rank, step, op, pg, seq, bytes, comm_name, compute_before, compute_after,
                                lo_ns + {off} AS lo_ns, hi_ns + {off} AS hi_ns
                         FROM exposed_comm x WHERE run = $run AND list_contains($ranks, rank)""", args).df()
    parts += [dict(rank=r.rank, track="exposed communication", lo_ns=r.lo_ns, hi_ns=r.hi_ns,
                   name=f"exposed {r.op or 'communication'}",
                   args={"step": r.step, "pg": r.pg, "seq": r.seq, "bytes": r.bytes, "comm": r.comm_name,
                         "compute_before": r.compute_before, "compute_after": r.compute_after}) for r in df.itertuples()]
    df = con.execute("""SELECT r.rank, r.step, r.op, r.pg, r.seq, r.arrival_ns AS lo_ns, r.last_arrival_ns AS hi_ns,
                               i.last_arriver
                        FROM collective_ranks r JOIN collective_instances i USING (run, pg, seq)
                        WHERE r.run = $run AND list_contains($ranks, r.rank) AND r.wait_ns > 0
                          AND i.last_arriver <> r.rank""", args).df()
    parts += [dict(rank=r.rank, track="waiting for a late peer", lo_ns=r.lo_ns, hi_ns=r.hi_ns,
                   name=f"waiting for rank {int(r.last_arriver)}",
                   args={"step": r.step, "op": r.op, "pg": r.pg, "seq": r.seq}) for r in df.itertuples()]
    cp = critical_path(con, run=run)
    cp = cp[cp["rank"].isin(ranks)]
    parts += [dict(rank=r.rank, track="critical path", lo_ns=r.lo_ns, hi_ns=r.hi_ns,
                   name=f"critical path, step {r.step}",
                   args={"step": r.step, "hop": r.hop, "entered_via_pg": r.via_pg, "entered_via_seq": r.via_seq})
              for r in cp.itertuples()]
    out = pd.DataFrame(parts, columns=["rank", "track", "name", "lo_ns", "hi_ns", "args"])
    return out[out["hi_ns"] >= out["lo_ns"]]


def _plain(v):
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if v is None or (not isinstance(v, (str, list)) and pd.isna(v)):
        return None
    return v.item() if hasattr(v, "item") else v


# -- the trace -----------------------------------------------------------------------------------

def export_trace(store: str | os.PathLike, run: str | None = None, rank: int | None = None,
                 overlays: bool = True, flows: bool = True, replay_plan=None) -> dict:
    """The Chrome/Perfetto trace of ``rank`` (None: every rank) of ``run`` as a dict; ``ts``/``dur``
    are exact :class:`~decimal.Decimal` microseconds (:func:`write_trace` writes them as text).
    With ``flows``, flow arrows (export_flows.py): recorded flows, send -> recv and, with the
    overlays, last arriver -> waiters of each collective. With ``replay_plan`` (a duration plan:
    dict or JSON path, see ``replay.plans``), each exported rank also gets the replay's predicted
    timeline as its own process beside the measured one (``add_replay``)."""
    from ..analyses import connect
    con = connect(store)
    try:
        run, ranks = _resolve(con, store, run, rank)
        q = {"run": run, "ranks": ranks}
        ev = con.execute("""SELECT rank, window_id, event_id, ph, cat, name, ts_ns AS lo_ns, ts_ns + dur_ns AS hi_ns, dur_ns,
                                   pid, tid, is_gpu, args_json
                            FROM events WHERE run = $run AND list_contains($ranks, rank)""", q).df()
        threads = con.execute("""SELECT rank, pid, tid, any_value(is_gpu) AS is_gpu, max(name) AS name FROM threads
                                 WHERE run = $run AND list_contains($ranks, rank) GROUP BY ALL""", q).df()
        info = con.execute("""SELECT rank, any_value(host) AS host, max(world_size) AS world_size,
                                     any_value(backend) AS backend FROM ranks
                              WHERE run = $run AND list_contains($ranks, rank) GROUP BY rank""", q).df().set_index("rank")
        ov = _overlays(con, run, ranks) if overlays else pd.DataFrame(columns=["rank", "track", "name", "lo_ns", "hi_ns", "args"])
        arrows = wait_src = None
        if flows:
            from . import flows as xf
            arrows = pd.concat([xf.stored_flows(con, run, ranks), xf.p2p_flows(con, run, ranks)], ignore_index=True)
            wait_src = xf.wait_sources(con, run, ranks) if overlays else None
    finally:
        con.close()
    doc = _assemble(run, ranks, ev, threads, info, ov, str(store), arrows, wait_src)
    if replay_plan is not None:
        add_replay(doc, store, replay_plan)
    return doc


#: process ids of the predicted timelines: far above the measured ones (rank * PID_STRIDE + i)
REPLAY_PID_BASE = 10 ** 9


def add_replay(doc: dict, store, plan) -> int:
    """Add the predicted timeline of a duration plan (``replay.what_if``) for the document's ranks:
    one process per rank ("rank R: predicted (plan)"), one track per replay lane (CPU thread, GPU
    stream, gloo runloop), on the same clock as the measured events. Lanes are FIFO in the replay,
    so the tracks nest. Returns the number of slices added."""
    from .. import replay
    from ..replay.graph import KERNEL, OP, POST
    plan = replay.load_plan(plan)
    if plan["actions"][0]["action"] in replay.STRUCTURAL:
        raise TraceAnalyzerError(f"export: plan '{plan['name']}' regenerates the step ({plan['actions'][0]['action']}); "
                                 "export its timeline with `traceanalyzer replay --chrome-trace`")
    run, ranks, base = doc["otherData"]["run"], doc["otherData"]["ranks"], int(doc["baseTimeNanoseconds"])
    g = replay.build_graph(store, run=run)
    r = replay.what_if(g, plan)
    # the graph's clock is offset-aligned across hosts (clock_offsets, loaded by build_graph): back to each rank's own
    offs = dict(g.source.execute("SELECT rank, offset_ns FROM clock_offsets WHERE run = $run", {"run": run}).fetchall())
    lanes = g.lanes.set_index("lane")
    keep = np.isin(g.kind, [OP, KERNEL, POST]) & (r.schedule.end > r.schedule.start)
    meta, out = [], []
    for rank in ranks:
        pid = REPLAY_PID_BASE + int(rank)
        meta += [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                  "args": {"name": f"rank {rank}: predicted ({plan['name']})"}},
                 {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}]
        idx = np.flatnonzero(keep & (g.rank == rank))
        o = int(offs.get(rank, 0) or 0)
        for lane in np.unique(g.lane[idx]):
            row = lanes.loc[int(lane)]
            meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": int(lane),
                         "args": {"name": f"{row['type']} {row['tid']} (predicted)"}})
        for i in idx.tolist():
            s0, e0 = int(r.schedule.start[i]) - o, int(r.schedule.end[i]) - o
            out.append({"ph": "X", "cat": "replay", "name": g.labels[g.label[i]], "pid": pid, "tid": int(g.lane[i]),
                        "ts": _us(s0 - base), "dur": _us(e0 - s0)})
    doc["traceEvents"] += meta + out
    doc["otherData"]["replay"] = {"plan": plan, "identity_error": r.identity_error,
                                  "job_step_ns": {"identity": r.job_step_ns("identity_ns"), "predicted": r.job_step_ns()}}
    return len(out)


def _xtid(tid, lane) -> int:
    """Track id of ``lane`` of thread ``tid``: lanes of one thread sit next to each other; hashed
    (negative) tids are folded into a positive range."""
    tid = int(tid)
    return (tid if 0 <= tid < 2**40 else abs(tid) % 2**40) * 100 + int(lane)


def _assemble(run, ranks, ev, threads, info, ov, store, arrows=None, wait_src=None) -> dict:
    ev = ev.copy()
    ev["dur"] = (ev["hi_ns"] - ev["lo_ns"]).astype("int64")
    los = [int(ev["lo_ns"].min())] if not ev.empty else []
    los += [int(ov["lo_ns"].min())] if not ov.empty else []
    base = (min(los) // NS_PER_S) * NS_PER_S if los else 0
    meta, out = [], []
    slots: dict = {}   # (rank, window_id, event_id) -> (pid, tid, lo_ns, hi_ns) of each exported slice
    waits: dict = {}   # (rank, pg, seq) -> (pid, tid, lo_ns, hi_ns) of each "waiting for a late peer" slice
    tnames = {(int(t.rank), int(t.pid), int(t.tid)): t.name for t in threads.itertuples()}
    for rank in ranks:
        host = info.loc[rank, "host"] if rank in info.index else ""
        mine = ev[ev["rank"] == rank]
        procs = mine[["pid", "is_gpu"]].drop_duplicates().sort_values(["is_gpu", "pid"])
        pid_of = {}
        for i, p in enumerate(procs.itertuples()):
            pid_of[int(p.pid)] = xpid = rank * PID_STRIDE + i
            label = f"rank {rank}: GPU {p.pid}" if p.is_gpu else f"rank {rank}: CPU pid {p.pid}" + (f" on {host}" if host else "")
            meta += [{"ph": "M", "name": "process_name", "pid": xpid, "tid": 0, "args": {"name": label}},
                     {"ph": "M", "name": "process_sort_index", "pid": xpid, "tid": 0, "args": {"sort_index": xpid}}]
        for (pid, tid), g in mine.groupby(["pid", "tid"], sort=True):
            g = g.sort_values(["lo_ns", "dur"], ascending=[True, False], kind="stable")
            xs = g[g["ph"] == "X"]
            lanes = _lanes(xs) if not xs.empty else pd.Series(dtype="int64")
            lane = pd.Series(0, index=g.index, dtype="int64")
            lane.loc[lanes.index] = lanes
            tname = tnames.get((rank, int(pid), int(tid))) or f"thread {tid}"
            for k in sorted(lane.unique()):
                xtid = _xtid(tid, k)
                name = tname if k == 0 else f"{tname} (overlapping spans {k}: they outlive an enclosing span)"
                meta.append({"ph": "M", "name": "thread_name", "pid": pid_of[int(pid)], "tid": xtid, "args": {"name": name}})
                meta.append({"ph": "M", "name": "thread_sort_index", "pid": pid_of[int(pid)], "tid": xtid,
                             "args": {"sort_index": xtid}})
            for r, k in zip(g.itertuples(), lane.to_numpy()):
                xtid = _xtid(tid, k)
                e = {"ph": r.ph, "cat": r.cat, "name": r.name, "pid": pid_of[int(pid)], "tid": xtid,
                     "ts": _us(int(r.lo_ns) - base)}
                if r.ph == "X":
                    e["dur"] = _us(int(r.dur))
                    slots[(rank, int(r.window_id), int(r.event_id))] = (e["pid"], xtid, int(r.lo_ns), int(r.hi_ns))
                else:
                    e["s"] = "t"
                e["args"] = json.loads(r.args_json) if isinstance(r.args_json, str) and r.args_json else {}
                out.append(e)
        out += _overlay_events(rank, ov[ov["rank"] == rank], base, meta, waits)
    if arrows is not None:
        from .flows import flow_events, wait_flow_events
        fl = flow_events(arrows, slots, base)
        out += fl
        if wait_src is not None:
            out += wait_flow_events(wait_src, waits, slots, base, first_id=len(fl) // 2 + 1)
    doc = {"traceEvents": meta + out, "displayTimeUnit": "ms", "baseTimeNanoseconds": base,
           "otherData": {"run": run, "ranks": ranks, "store": store, "exported_by": f"traceanalyzer {__version__}",
                         "time": "ts, dur: microseconds (exact, 3 decimals) since baseTimeNanoseconds (epoch ns)"}}
    if len(ranks) == 1 and ranks[0] in info.index:
        i = info.loc[ranks[0]]
        doc["distributedInfo"] = {"rank": ranks[0], "world_size": _plain(i["world_size"]), "backend": _plain(i["backend"])}
    return doc


def _overlay_events(rank: int, ov: pd.DataFrame, base: int, meta: list, waits: dict | None = None) -> list[dict]:
    if ov.empty:
        return []
    xpid = rank * PID_STRIDE + OVERLAY_PID
    meta += [{"ph": "M", "name": "process_name", "pid": xpid, "tid": 0, "args": {"name": f"rank {rank}: findings"}},
             {"ph": "M", "name": "process_sort_index", "pid": xpid, "tid": 0, "args": {"sort_index": xpid}}]
    out = []
    for t, track in enumerate(_OVERLAY_TRACKS):
        g = ov[ov["track"] == track].assign(dur=lambda d: d["hi_ns"] - d["lo_ns"])
        if g.empty:
            continue
        g = g.sort_values(["lo_ns", "dur"], ascending=[True, False], kind="stable")
        lanes = _lanes(g)
        for k in sorted(lanes.unique()):
            meta.append({"ph": "M", "name": "thread_name", "pid": xpid, "tid": t * 100 + int(k),
                         "args": {"name": track if k == 0 else f"{track} ({k})"}})
        for r, k in zip(g.itertuples(), lanes.to_numpy()):
            out.append({"ph": "X", "cat": "traceanalyzer", "name": r.name, "pid": xpid, "tid": t * 100 + int(k),
                        "ts": _us(int(r.lo_ns) - base), "dur": _us(int(r.dur)), "args": _plain(r.args)})
            if waits is not None and track == "waiting for a late peer":
                waits[(rank, r.args["pg"], int(r.args["seq"]))] = (xpid, t * 100 + int(k), int(r.lo_ns), int(r.hi_ns))
    return out


def _dumps_event(e: dict) -> str:
    """One event as JSON, Decimal times written as their exact text."""
    return "{" + ",".join(f"{json.dumps(k)}:{v if isinstance(v, Decimal) else json.dumps(v, default=str)}"
                          for k, v in e.items()) + "}"


def write_trace(doc: dict, path: str | os.PathLike) -> Path:
    """Write the trace (``.json``, or gzip-compressed when the name ends in ``.gz``)."""
    path = Path(path)
    head = {k: v for k, v in doc.items() if k != "traceEvents"}
    text = ("{" + ",".join(f"{json.dumps(k)}:{json.dumps(v, default=str)}" for k, v in head.items())
            + ',"traceEvents":[\n' + ",\n".join(_dumps_event(e) for e in doc["traceEvents"]) + "\n]}\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    if path.suffix == ".gz":
        with gzip.open(tmp, "wt", encoding="utf-8") as fh:
            fh.write(text)
    else:
        tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path
