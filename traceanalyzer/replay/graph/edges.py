"""Stage 3 of the build: the cross-lane edges, as joins over the node table.

Lane edges (each node after the one before it on its lane) are implicit in the node order and
added when the graph is finished (finish.py). The edges made here (``src`` -> ``dst``):

* launch -> GPU op: the CPU node ending where the launching runtime call ends -> the op's first
  node (a kernel, or a collective kernel's ARRIVE); ops launched by a runloop thread (gloo with
  CUDA tensors stages through host memory) depend on the collective running there: on its ARRIVE
  if launched before the last member arrived, else on its POST;
* ``cudaStreamWaitEvent``: the thread's next launch waits for the last op it launched on another
  stream before (the op's last node);
* runloop enqueue -> ARRIVE; every ARRIVE -> its instance's SYNC -> every queue-lane POST;
  collectives run on the CPU lane itself: the node ending at the arrival -> SYNC;
* waits (lanes.py): what was waited for -> the node starting where the wait ends.

Two node ranges are returned too: the CPU-lane nodes inside a wait (they become WAIT) and those
after a CPU-lane collective's last arrival up to its end (they become that instance's POST).
"""
from __future__ import annotations

from .load import Scratch

# per GPU op (rank, event id): its first node (KERNEL or ARRIVE) and its last (KERNEL or POST)
_GPU_OPS = """
SELECT rank, event_id, min(node) FILTER (WHERE kind IN ($KERNEL, $ARRIVE)) AS first, max(node) AS last
FROM {nd} WHERE kind IN ($KERNEL, $ARRIVE, $POST) AND event_id >= 0 GROUP BY rank, event_id"""

_LAUNCH_EDGES = """
SELECT p.base + p.k - 1 AS src, g.first AS dst
FROM {launch} l JOIN {gop} g ON g.rank = l.rank AND g.event_id = l.g_eid
JOIN {pt} p ON p.rank = l.rank AND p.tid = l.tid AND p.t = l.l_te AND p.k >= 1
WHERE g.first IS NOT NULL"""

# the launch after a cudaStreamWaitEvent (the first launch of the thread at or after it, in (start,
# correlation) order) waits for the launch before the run of launches onto its own stream
_STREAM_WAIT_EDGES = """
WITH l AS (
    SELECT l.rank, l.tid, l.l_ts, g.first, g.last, n.lane,
           row_number() OVER w - 1 AS i, lag(n.lane) OVER w IS DISTINCT FROM n.lane AS new_run
    FROM {launch} l JOIN {gop} g ON g.rank = l.rank AND g.event_id = l.g_eid JOIN {nd} n ON n.node = g.first
    WINDOW w AS (PARTITION BY l.rank, l.tid ORDER BY l.l_ts, l.corr, l.g_eid)),
r AS (SELECT *, max(CASE WHEN new_run THEN i END) OVER (PARTITION BY rank, tid ORDER BY i ROWS UNBOUNDED PRECEDING)
                AS run_start
      FROM l WHERE rank IN (SELECT rank FROM {ev} WHERE name = $stream_wait)),
k AS (SELECT rank, tid, l_ts, min(i) AS k FROM r GROUP BY rank, tid, l_ts),
w AS (SELECT s.rank, s.tid, s.ts FROM {ev} s SEMI JOIN {cpu} c ON c.rank = s.rank AND c.tid = s.tid
      WHERE NOT s.is_gpu AND s.name = $stream_wait),
m AS (SELECT w.rank, w.tid, k.k FROM w ASOF JOIN k ON k.rank = w.rank AND k.tid = w.tid AND w.ts <= k.l_ts)
SELECT a.last AS src, b.first AS dst
FROM m JOIN r b ON b.rank = m.rank AND b.tid = m.tid AND b.i = m.k
JOIN r a ON a.rank = m.rank AND a.tid = m.tid AND a.i = b.run_start - 1"""

_RUNLOOP_LAUNCH_EDGES = """
WITH rl AS (
    SELECT r.rank, r.tid, r.ts AS l_ts, g.event_id AS g_eid
    FROM {ev} r JOIN {ev} g ON g.rank = r.rank AND g.corr = r.corr AND g.is_gpu
    WHERE NOT r.is_gpu AND r.kind IN ('runtime', 'sync') AND r.corr IS NOT NULL
      AND (r.rank, r.tid) IN (SELECT rank, exec_tid FROM {cm} WHERE is_q)),
x AS (SELECT rank, exec_tid AS tid, start, "end", c, comm_id FROM {cm} WHERE is_q),
h AS (SELECT rl.*, x."end" AS x_end, x.c, x.comm_id FROM rl ASOF JOIN x
      ON x.rank = rl.rank AND x.tid = rl.tid AND rl.l_ts >= x.start),
a AS (SELECT rank, comm_id, kind, min(node) AS node FROM {nd} WHERE kind IN ($ARRIVE, $POST) AND comm_id >= 0
      GROUP BY rank, comm_id, kind)
SELECT a.node AS src, g.first AS dst
FROM h JOIN {gop} g ON g.rank = h.rank AND g.event_id = h.g_eid
JOIN a ON a.rank = h.rank AND a.comm_id = h.comm_id AND a.kind = CASE WHEN h.l_ts >= h.c THEN $POST ELSE $ARRIVE END
WHERE h.l_ts <= h.x_end AND g.first IS NOT NULL"""

_COMM_EDGES = """
SELECT p.base + p.k - 1 AS src, a.node AS dst
FROM {cm} m JOIN {nd} a ON a.kind = $ARRIVE AND a.rank = m.rank AND a.comm_id = m.comm_id
JOIN {pt} p ON p.rank = m.rank AND p.tid = m.enq_tid AND p.t = m.cut AND p.k >= 1
WHERE m.is_q
UNION ALL SELECT node, $n_lane_nodes + inst FROM {nd} WHERE kind = $ARRIVE
UNION ALL SELECT $n_lane_nodes + inst, node FROM {nd} WHERE kind = $POST
UNION ALL
SELECT p.base + p.k - 1, $n_lane_nodes + m.inst
FROM {cm} m JOIN {pt} p ON p.rank = m.rank AND p.tid = m.exec_tid AND p.t = m.start AND p.k >= 1 WHERE m.on_cpu"""

# a wait [lo, hi) on a CPU lane: its nodes from the one starting at lo to the one before hi
_WAIT_EDGES = """
WITH w AS (
    SELECT f.base + f.k AS first, t.base + t.k AS tgt,
           CASE w.src_kind WHEN 'sync' THEN $n_lane_nodes + w.ref WHEN 'post' THEN po.node
                           WHEN 'gpu' THEN g.last WHEN 'cpu' THEN c.base + c.k - 1 END AS src
    FROM {waits} w
    JOIN {pt} t ON t.rank = w.rank AND t.tid = w.tid AND t.t = w.hi AND t.k < t.np - 1
    JOIN {pt} f ON f.rank = w.rank AND f.tid = w.tid AND f.t = w.lo AND f.k < f.np - 1
    LEFT JOIN (SELECT rank, comm_id, max(node) AS node FROM {nd} WHERE kind = $POST GROUP BY rank, comm_id) po
           ON w.src_kind = 'post' AND po.rank = w.rank AND po.comm_id = w.ref
    LEFT JOIN {gop} g ON w.src_kind = 'gpu' AND g.rank = w.rank AND g.event_id = w.ref
    LEFT JOIN {pt} c ON w.src_kind = 'cpu' AND c.rank = w.rank AND c.tid = w.ref AND c.t = w.hi AND c.k >= 1)
SELECT first, tgt, src FROM w WHERE src IS NOT NULL"""

# a collective run on the CPU lane: the nodes from its last arrival to its end are its POST
_CPU_POST_RANGES = """
SELECT a.base + a.k AS lo, b.base + b.k - 1 AS hi, m.inst
FROM {cm} m JOIN {pt} a ON a.rank = m.rank AND a.tid = m.exec_tid AND a.t = m.c AND a.k < a.np - 1
JOIN {pt} b ON b.rank = m.rank AND b.tid = m.exec_tid AND b.t = m."end" AND b.k >= 1
WHERE m.on_cpu AND b.base + b.k - 1 >= a.base + a.k ORDER BY m.pos"""


def make_edges(s: Scratch):
    """(cross edges as an Arrow table src, dst; waits: first, tgt, src; CPU-lane POST ranges: lo, hi, inst)."""
    s.make("gop", _GPU_OPS)
    parts = [_LAUNCH_EDGES, _STREAM_WAIT_EDGES, _RUNLOOP_LAUNCH_EDGES, _COMM_EDGES]
    edges = s.arrow(" UNION ALL ".join(f"SELECT * FROM ({p})" for p in parts))
    waits = s.arrow(_WAIT_EDGES)
    posts = s.arrow(_CPU_POST_RANGES)
    return edges, waits, posts
