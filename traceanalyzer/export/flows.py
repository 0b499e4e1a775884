"""Flow arrows for the Chrome/Perfetto export: which slice led to which.

Three kinds, each an arrow from one exported slice to another (Chrome trace flow events: a
``ph: "s"`` and a ``ph: "f"`` with the same ``cat`` and ``id``, both ``bp: "e"`` -- bound to the
slice that encloses their ``ts`` on their track):

* the flows the trace recorded (``flows`` table: ``ac2g`` launch -> kernel, ``fwdbwd`` forward ->
  backward, ...): each endpoint is bound to the innermost stored slice of its thread/stream that
  encloses its time (Kineto puts the endpoint at the start of the slice it belongs to);
* ``p2p``: each send to the matching receive (same process group, source, destination, tag and
  p2p_seq), between the two execution slices (``gloo:send`` -> ``gloo:recv``, or the kernels);
* ``collective wait`` (with the overlays): from the last arriver's execution slice of a
  collective to every peer's "waiting for rank K" overlay slice, at the end of the wait.

Arrows whose two ends are not both exported (a peer rank not in the export) are left out, so every
flow refers to slices in the file; :func:`validate_flows` checks that.
"""
from __future__ import annotations

from decimal import Decimal

import pandas as pd

from .timefmt import ns_from_us, us_from_ns

#: Flow categories of the arrows made here (the stored ones keep their trace category).
P2P_CAT = "p2p"
WAIT_CAT = "collective wait"


def stored_flows(con, run: str, ranks: list[int]) -> pd.DataFrame:
    """Recorded flow arrows with both endpoints bound to a stored complete event.
    Columns: cat, src_rank, src_window, src_event, dst_rank, dst_window, dst_event."""
    return con.execute("""
        WITH f AS (
            SELECT rank, window_id, cat, flow_id, ph, ts_ns, pid, tid FROM flows
            WHERE run = $run AND list_contains($ranks, rank) AND ph IN ('s', 'f')),
        -- each endpoint -> the innermost complete event of its thread/stream that encloses it
        bound AS (
            SELECT f.rank, f.window_id, f.cat, f.flow_id, f.ph, arg_min(e.event_id, e.dur_ns) AS event_id
            FROM f JOIN events e
              ON e.run = $run AND e.rank = f.rank AND e.window_id = f.window_id AND e.pid = f.pid
             AND e.tid = f.tid AND e.ph = 'X' AND e.ts_ns <= f.ts_ns AND f.ts_ns < e.ts_ns + greatest(e.dur_ns, 1)
            GROUP BY ALL)
        SELECT s.cat, s.rank AS src_rank, s.window_id AS src_window, s.event_id AS src_event,
               d.rank AS dst_rank, d.window_id AS dst_window, d.event_id AS dst_event
        FROM bound s JOIN bound d USING (rank, window_id, cat, flow_id)
        WHERE s.ph = 's' AND d.ph = 'f'
        ORDER BY s.rank, s.window_id, s.cat, s.flow_id""", {"run": run, "ranks": ranks}).df()


def p2p_flows(con, run: str, ranks: list[int]) -> pd.DataFrame:
    """Each send -> its receive, both ranks exported. Same columns as :func:`stored_flows`."""
    return con.execute("""
        SELECT 'p2p' AS cat, s.rank AS src_rank, s.window_id AS src_window, s.exec_event_id AS src_event,
               r.rank AS dst_rank, r.window_id AS dst_window, r.exec_event_id AS dst_event
        FROM comms s JOIN comms r
          ON r.run = s.run AND r.is_p2p AND r.op = 'recv' AND r.rank = r.dst_rank
         AND r.pg_name IS NOT DISTINCT FROM s.pg_name AND r.src_rank = s.src_rank AND r.dst_rank = s.dst_rank
         AND r.tag IS NOT DISTINCT FROM s.tag AND r.p2p_seq = s.p2p_seq AND r.window_id = s.window_id
        WHERE s.run = $run AND s.is_p2p AND s.op = 'send' AND s.rank = s.src_rank
          AND list_contains($ranks, s.rank) AND list_contains($ranks, r.rank)
          AND s.exec_event_id IS NOT NULL AND r.exec_event_id IS NOT NULL
        ORDER BY s.rank, s.window_id, s.enqueue_ts_ns""", {"run": run, "ranks": ranks}).df()


def wait_sources(con, run: str, ranks: list[int]) -> pd.DataFrame:
    """Per collective (pg, seq) of the run: the last arriver's execution event (rank, window, event id)."""
    return con.execute("""
        SELECT i.pg, i.seq, c.rank AS src_rank, c.window_id AS src_window, c.exec_event_id AS src_event
        FROM collective_instances i JOIN comms c
          ON c.run = i.run AND coalesce(c.pg_name, '?') = i.pg AND c.seq = i.seq AND c.rank = i.last_arriver
        WHERE i.run = $run AND list_contains($ranks, i.last_arriver) AND NOT c.is_p2p
          AND c.exec_event_id IS NOT NULL""", {"run": run, "ranks": ranks}).df()


def _us(ns: int, base: int) -> Decimal:
    return us_from_ns(int(ns) - base)


def flow_events(arrows: pd.DataFrame, slots: dict, base: int, first_id: int = 1) -> list[dict]:
    """Chrome flow events for ``arrows`` (cat, src_*, dst_*); ``slots`` maps (rank, window, event_id)
    -> (pid, tid, lo_ns, hi_ns) of the exported slice. The 's' sits at the source slice's start, the
    'f' at the destination slice's start; arrows with an end not exported are skipped."""
    out, fid = [], first_id
    for a in arrows.itertuples():
        src = slots.get((int(a.src_rank), int(a.src_window), int(a.src_event)))
        dst = slots.get((int(a.dst_rank), int(a.dst_window), int(a.dst_event)))
        if src is None or dst is None:
            continue
        out.append({"ph": "s", "cat": a.cat, "name": a.cat, "id": fid, "pid": src[0], "tid": src[1],
                    "ts": _us(src[2], base), "bp": "e"})
        out.append({"ph": "f", "cat": a.cat, "name": a.cat, "id": fid, "pid": dst[0], "tid": dst[1],
                    "ts": _us(dst[2], base), "bp": "e"})
        fid += 1
    return out


def wait_flow_events(sources: pd.DataFrame, waits: dict, slots: dict, base: int, first_id: int) -> list[dict]:
    """Last arriver -> each waiter: ``waits`` maps (rank, pg, seq) -> (pid, tid, lo_ns, hi_ns) of the
    waiter's "waiting for rank K" overlay slice; the 'f' sits 1 ns before the wait ends (inside it)."""
    src_of = {(s.pg, int(s.seq)): (int(s.src_rank), int(s.src_window), int(s.src_event)) for s in sources.itertuples()}
    out, fid = [], first_id
    for (rank, pg, seq), (pid, tid, lo, hi) in sorted(waits.items(), key=lambda kv: (kv[1][2], kv[0][0])):
        src = slots.get(src_of.get((pg, seq), (None, None, None)))
        if src is None:
            continue
        out.append({"ph": "s", "cat": WAIT_CAT, "name": WAIT_CAT, "id": fid, "pid": src[0], "tid": src[1],
                    "ts": _us(src[2], base), "bp": "e", "args": {"pg": pg, "seq": seq}})
        out.append({"ph": "f", "cat": WAIT_CAT, "name": WAIT_CAT, "id": fid, "pid": pid, "tid": tid,
                    "ts": _us(max(hi - 1, lo), base), "bp": "e", "args": {"pg": pg, "seq": seq}})
        fid += 1
    return out


def validate_flows(trace: dict) -> list[str]:
    """Every flow id has exactly one 's' and one 'f' of the same category, each inside a complete
    slice of its own track (pid, tid). Returns one line per problem (empty: valid)."""
    spans: dict[tuple, list[tuple[int, int]]] = {}
    ends: dict[tuple, list[dict]] = {}
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "X":
            lo = ns_from_us(e["ts"])
            spans.setdefault((e.get("pid"), e.get("tid")), []).append((lo, lo + ns_from_us(e.get("dur", 0))))
        elif e.get("ph") in ("s", "t", "f"):
            ends.setdefault((e.get("cat"), e.get("id")), []).append(e)
    bad = []
    for key, evs in ends.items():
        phs = sorted(e["ph"] for e in evs)
        if phs != ["f", "s"]:
            bad.append(f"flow {key}: endpoints {phs}, expected one 's' and one 'f'")
        for e in evs:
            ts = ns_from_us(e["ts"])
            if not any(lo <= ts < max(hi, lo + 1) for lo, hi in spans.get((e.get("pid"), e.get("tid")), [])):
                bad.append(f"flow {key}: '{e['ph']}' at {ts} ns on track ({e.get('pid')}, {e.get('tid')}) "
                           f"is inside no slice of that track")
    return bad
