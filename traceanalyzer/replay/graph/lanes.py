"""Stage 2 of the build: the waits, the cut points of every CPU lane and the node table.

A CPU lane is a thread's top-level work cut at every point where a dependency leaves or enters
it; the pieces between two points are its nodes (OP inside top-level work, GAP between). A queue
lane (a GPU stream, a gloo runloop thread) holds one node per kernel and an ARRIVE and a POST node
per collective executed on it. Each communication instance gets one virtual SYNC node.

Tables made (on top of load.py's):
* ``waits``  rank, tid, lo, hi, src_kind, ref: the CPU lane waits over [lo, hi) for ``ref`` (an
             instance's SYNC: 'sync'; a member's POST by comm_id: 'post'; a GPU op by event id:
             'gpu'; the node of thread ``ref`` of the rank that ends at hi: 'cpu')
* ``pt``     lane, rank, tid, t, k, np, base: the k-th of a CPU lane's np cut points; the node that
             ends at t is base + k - 1 (k >= 1), the one that starts at t is base + k (k < np - 1)
* ``lanes``  lane, rank, tid, is_gpu, type ('cpu', 'gpu', 'runloop')
* ``nd``     node, lane, rank, ms, me, kind, label, category, inst, event_id, comm_id, child (nodes in
             lane order: CPU lanes, queue lanes, then the SYNC nodes by instance; ``child``: the
             time of an OP node covered by events nested in it)
"""
from __future__ import annotations

from .load import Scratch

# waits for the completion of a collective run by a runloop thread on behalf of this thread: the
# completion falls in a gap of the thread's top-level work and the gap ends within $tail_ns of it
# (the thread waited for it) or starts within $tail_ns of the enqueue (the thread went idle in the
# call that enqueued it: a synchronous collective, however late the thread then woke up); or the
# op that enqueued it still runs and ends within $tail_ns (a synchronous collective, e.g. gloo's
# all_to_all_single: it waits from the enqueue cut on). Not for a lazily waited p2p: its wait is
# known (_LAZY_WAITS)
_RUNLOOP_WAITS = """
WITH q AS (SELECT m.rank, m.enq_tid AS tid, m."end" AS ce, m.c, m.cut, m.comm_id FROM {cm} m WHERE m.is_q AND NOT m.lazy),
a AS (SELECT q.*, t.start, t."end" AS top_end, t.nxt FROM q ASOF JOIN {tops} t
      ON t.rank = q.rank AND t.tid = q.tid AND q.ce >= t.start),
b AS (SELECT q.*, t."end" AS top_end, t.nxt FROM q ASOF JOIN {tops} t
      ON t.rank = q.rank AND t.tid = q.tid AND q.c >= t.start)
SELECT rank, tid, top_end AS lo, ce AS hi, 'post' AS src_kind, comm_id AS ref FROM a
WHERE ce > top_end AND ce < nxt AND (nxt - ce <= $tail_ns OR (cut >= start AND top_end - cut <= $tail_ns))
UNION ALL
SELECT rank, tid, cut AS lo, ce AS hi, 'post', comm_id FROM a
WHERE ce < top_end AND top_end - ce <= $tail_ns AND cut >= start AND cut < ce
UNION ALL
SELECT b.rank, b.tid, b.top_end, b.nxt, 'post', b.comm_id FROM b
WHERE b.c > b.top_end AND b.c < b.nxt AND b.ce >= b.nxt AND b.cut <= b.top_end"""

# a lazily waited p2p (load.py): its thread waited for it from its last activity before the span
# ended (the wait call) to the span's end; the work after waits for the transfer (its POST)
_LAZY_WAITS = """
SELECT m.rank, m.lazy_tid AS tid, b.b AS lo, m.span_end AS hi, 'post' AS src_kind, m.comm_id AS ref
FROM {cm} m ASOF JOIN {lazy_bounds} b ON b.rank = m.rank AND b.tid = m.lazy_tid AND m.span_end > b.b
WHERE m.lazy"""

# waits between the CPU threads of one rank: a gap of at least $min_gap_ns on one thread that ends
# at most $tail_ns after another thread finished top-level work inside the gap waits for the latest
# such end (ties: the lowest thread id). The cases this is for (GPU jobs): the main thread blocks in
# backward while autograd's device thread runs the backward pass; that thread sits idle through the
# forward pass until the main thread hands it the loss. Without these edges both gaps are fixed
# CPU time, and a faster forward/backward moves nothing.
_CROSS_THREAD_WAITS = """
SELECT g.rank, g.tid, g."end" AS lo, o."end" AS hi, 'cpu' AS src_kind, o.tid AS ref
FROM {tops} g JOIN {tops} o ON o.rank = g.rank AND o.tid <> g.tid AND o."end" <= g.nxt AND o."end" > g."end"
                             AND o."end" >= g.nxt - $tail_ns
WHERE g.nxt - g."end" >= $min_gap_ns
QUALIFY row_number() OVER (PARTITION BY g.rank, g.tid, g."end" ORDER BY o."end" DESC, o.tid) = 1"""

# a blocking sync call waits for the latest-ending GPU op of its rank launched before the call
# started that ended inside the call
_SYNC_WAITS = """
SELECT s.rank, s.tid, s.ts AS lo, max(l.g_te) AS hi, 'gpu' AS src_kind, arg_max(l.g_eid, l.g_te) AS ref
FROM {ev} s SEMI JOIN {cpu} c ON c.rank = s.rank AND c.tid = s.tid
JOIN {launch} l ON l.rank = s.rank AND l.l_ts <= s.ts AND l.g_te <= s.te AND l.g_te > s.ts
WHERE NOT s.is_gpu AND s.kind = 'sync' AND contains(s.name, $sync_name)
GROUP BY s.rank, s.tid, s.event_id, s.ts"""

_WAITS = """
SELECT rank, exec_tid AS tid, start AS lo, c AS hi, 'sync' AS src_kind, inst AS ref FROM {cm} WHERE on_cpu
UNION ALL SELECT * FROM {w_runloop} UNION ALL SELECT * FROM {w_cross} UNION ALL SELECT * FROM {w_sync}
UNION ALL SELECT * FROM {w_lazy}"""

# every point where a CPU lane is cut
_POINTS = """
WITH p AS (
    SELECT rank, tid, start AS t FROM {tops} UNION ALL SELECT rank, tid, "end" FROM {tops}
    UNION ALL SELECT rank, tid, lo FROM {waits} UNION ALL SELECT rank, tid, hi FROM {waits}
    UNION ALL SELECT s.rank, m.tid, s.start FROM {st} s JOIN {main} m USING (rank)
    UNION ALL SELECT s.rank, m.tid, s."end" FROM {st} s JOIN {main} m USING (rank)
    UNION ALL SELECT rank, tid, l_te FROM {launch}
    UNION ALL SELECT rank, enq_tid, cut FROM {cm} WHERE is_q
    UNION ALL SELECT rank, exec_tid, c FROM {cm} WHERE on_cpu),
d AS (SELECT DISTINCT l.lane, p.rank, p.tid, p.t FROM p JOIN {cpu_lanes} l ON l.rank = p.rank AND l.tid = p.tid
      WHERE p.t IS NOT NULL),
k AS (SELECT *, row_number() OVER (PARTITION BY lane ORDER BY t) - 1 AS k, count(*) OVER (PARTITION BY lane) AS np
      FROM d),
b AS (SELECT lane, coalesce(sum(np - 1) OVER (ORDER BY lane ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)
             AS base FROM (SELECT lane, any_value(np) AS np FROM k GROUP BY lane))
SELECT k.*, b.base FROM k JOIN b USING (lane)"""

# ``child``: the node's time covered by events nested in its top-level work (load.py's ``kids``:
# covered time up to me less that up to ms; 0 outside pipelines)
_CPU_NODES = """
WITH s AS (SELECT lane, rank, tid, base + k AS node, t AS ms,
                  lead(t) OVER (PARTITION BY lane ORDER BY k) AS me FROM {pt}),
n AS (
    SELECT s.node, s.lane, s.rank, s.tid, s.ms, s.me,
           CASE WHEN s.ms < t."end" THEN $OP ELSE $GAP END AS kind,
           CASE WHEN s.ms < t."end" THEN t.name ELSE '(gap)' END AS label,
           CASE WHEN s.ms < t."end" THEN t.kind ELSE 'gap' END AS category,
           -1 AS inst, -1 AS event_id, -1 AS comm_id
    FROM s ASOF LEFT JOIN {tops} t ON t.rank = s.rank AND t.tid = s.tid AND s.ms >= t.start
    WHERE s.me IS NOT NULL)
SELECT n.*, CASE WHEN n.kind = $OP THEN coalesce(e.before + least(n.me, e.b) - e.a, 0)
                                        - coalesce(b.before + least(n.ms, b.b) - b.a, 0) ELSE 0 END AS child
FROM n ASOF LEFT JOIN {kids} e ON e.rank = n.rank AND e.tid = n.tid AND n.me >= e.a
       ASOF LEFT JOIN {kids} b ON b.rank = n.rank AND b.tid = n.tid AND n.ms >= b.a"""

_QUEUE_THREADS = """
WITH g AS (SELECT DISTINCT rank, tid FROM {ev} WHERE is_gpu),
r AS (SELECT DISTINCT rank, exec_tid AS tid FROM {cm} WHERE is_q AND exec_tid IS NOT NULL)
SELECT u.rank, u.tid, g.rank IS NOT NULL AS is_gpu FROM (SELECT * FROM g UNION SELECT * FROM r) u
LEFT JOIN g ON g.rank = u.rank AND g.tid = u.tid"""

# a queue lane's nodes in recorded order (ties: arrivals before completions, kernels first)
_QUEUE_ITEMS = """
WITH x AS (
    SELECT e.rank, e.tid, e.ts AS ms, e.te AS me, $KERNEL AS kind, e.name AS label, e.kind AS category, -1 AS inst,
           e.event_id, -1 AS comm_id, 0 AS post, 0 AS part, e.event_id AS seq
    FROM {ev} e ANTI JOIN (SELECT rank, exec_event_id FROM {cm} WHERE on_gpu) k
         ON k.rank = e.rank AND k.exec_event_id = e.event_id
    WHERE e.is_gpu
    UNION ALL
    SELECT m.rank, m.exec_tid, m.start, m.c, $ARRIVE, m.op, 'comm', m.inst, m.exec_event_id, m.comm_id, 0, 1, m.pos
    FROM {cm} m JOIN {qthreads} q ON q.rank = m.rank AND q.tid = m.exec_tid AND q.is_gpu = m.on_gpu WHERE NOT m.on_cpu
    UNION ALL
    SELECT m.rank, m.exec_tid, m.c, m."end", $POST, m.op, 'comm', m.inst, m.exec_event_id, m.comm_id, 1, 2, m.pos
    FROM {cm} m JOIN {qthreads} q ON q.rank = m.rank AND q.tid = m.exec_tid AND q.is_gpu = m.on_gpu WHERE NOT m.on_cpu),
q AS (SELECT rank, tid, $n_cpu_lanes + row_number() OVER (ORDER BY rank, tid) - 1 AS lane
      FROM (SELECT DISTINCT rank, tid FROM x))
SELECT $n_cpu_nodes + row_number() OVER (ORDER BY q.lane, x.ms, x.post, x.part, x.seq) - 1 AS node, q.lane, x.rank, x.tid,
       x.ms, x.me, x.kind, x.label, x.category, x.inst, x.event_id, x.comm_id, 0 AS child
FROM x JOIN q ON q.rank = x.rank AND q.tid = x.tid"""

_SYNC_NODES = """
SELECT $n_lane_nodes + inst AS node, -1 AS lane, -1 AS rank, -1 AS tid, last_arrival AS ms, last_arrival AS me, $SYNC AS kind,
       op AS label, 'sync' AS category, inst, -1 AS event_id, -1 AS comm_id, 0 AS child
FROM {inst}"""


def make_lanes(s: Scratch, sync_base: int | None = None) -> None:
    """Make the tables listed in the module docstring. With ``sync_base`` (a piece of the graph
    built for some ranks, pieces.py), ``nd`` has no SYNC nodes and instance ``i``'s SYNC node is
    numbered ``sync_base + i`` in the edges (the stitch numbers it)."""
    s.make("w_runloop", _RUNLOOP_WAITS)
    s.make("w_cross", _CROSS_THREAD_WAITS)
    s.make("w_sync", _SYNC_WAITS)
    s.make("w_lazy", _LAZY_WAITS)
    s.make("waits", _WAITS)
    s.make("cpu_lanes", "SELECT rank, tid, dense_rank() OVER (ORDER BY rank, tid) - 1 AS lane "
                        "FROM (SELECT DISTINCT rank, tid FROM {tops})")
    s.make("pt", _POINTS)
    s.make("cpu_nodes", _CPU_NODES)
    n_cpu_lanes = s.scalar("SELECT count(*) FROM {cpu_lanes}")
    n_cpu_nodes = s.scalar("SELECT count(*) FROM {cpu_nodes}")
    s.params.update(n_cpu_lanes=n_cpu_lanes, n_cpu_nodes=n_cpu_nodes)
    s.make("qthreads", _QUEUE_THREADS)
    s.make("queue_nodes", _QUEUE_ITEMS)
    n_q = s.scalar("SELECT count(*) FROM {queue_nodes}")
    s.params["n_lane_nodes"] = n_cpu_nodes + n_q if sync_base is None else sync_base
    sync = "" if sync_base is not None else f"UNION ALL ({_SYNC_NODES})"
    s.make("nd", f"SELECT node, lane, rank, tid, ms, greatest(me, ms) AS me, kind, label, category, inst, event_id, comm_id, "
                 f"greatest(child, 0) AS child "
                 f"FROM (SELECT * FROM {{cpu_nodes}} UNION ALL SELECT * FROM {{queue_nodes}} "
                 f"{sync}) ORDER BY node")      # kept in node order: read back as it is
    s.make("lanes", """
        SELECT lane, rank, tid, false AS is_gpu, 'cpu' AS type FROM {cpu_lanes}
        UNION ALL
        SELECT DISTINCT n.lane, n.rank, n.tid, q.is_gpu, CASE WHEN q.is_gpu THEN 'gpu' ELSE 'runloop' END
        FROM {queue_nodes} n JOIN {qthreads} q ON q.rank = n.rank AND q.tid = n.tid
        ORDER BY lane""")
