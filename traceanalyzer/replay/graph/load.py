"""Stage 1 of the build: the run's events, communication and steps as DuckDB tables.

Every table lives on the caller's connection as a TEMP table with a name of this build's own
(``Scratch``), and is dropped when the build ends; nothing is left behind on the connection.
Times are clock-aligned here once (clock_offsets, only where clock_alignment applies them).

Tables made (columns):
* ``off``    rank, off: the applied clock offset per rank
* ``ev``     the run's complete events: rank, event_id, kind, name, ts, te, dur, tid, is_gpu, corr,
             nested (cpu_ops that ingest found nested are left in the store: nothing here reads them)
* ``cm``     communication with a key: the execution span (start, end), its instance ``inst``
             ((pg, seq) for collectives, (pg, src, dst, tag, p2p_seq) for p2p), the instance's last
             arrival ``c`` (clipped to the member's own span), where it runs (``on_cpu``: on the
             issuing thread; ``is_q``: on a runloop thread or, ``lazy``, a lane of its own), the
             enqueue cut point ``cut``; ``cm0`` is the same before the lazy members' ends are fixed
* ``lazy``   the lazily waited p2p members: rank, their thread ``tid``, their span's event ``exec_event_id``
* ``lazy_bounds`` rank, tid, b: the activity boundaries of the threads with lazily waited p2p
* ``inst``   one row per instance: key, op, bytes, is_p2p, n_ranks, last_arrival, transfer_ns
* ``cpu``    the CPU threads that get a lane (not a GPU stream, not a runloop thread)
* ``launch`` runtime calls on CPU lanes joined to the GPU ops they launched (rank, correlation)
* ``tops``   the top-level work of each CPU thread: intervals merged over its events in (start,
             longest first, event id) order (the rule events.nested is made by), named after the
             first event; ``nxt`` is the next interval's start
* ``kids``   rank, tid, a, b, before: the islands of the events nested in each CPU thread's top-level
             work, with the island time before each (pipelines only; ``_KIDS``)
* ``st``     steps (rank, step, start, end, dur_ns) and ``main`` (the thread recording ProfilerStep)
"""
from __future__ import annotations

import itertools
import re

_SCRATCH_IDS = itertools.count()


class Scratch:
    """TEMP tables of one build on a connection, named ``_replay<id>_<name>``, dropped by ``close``."""

    def __init__(self, con, params: dict):
        self.con, self.params = con, params
        self.prefix = f"_replay{next(_SCRATCH_IDS)}_"
        self.made: list[str] = []

    def t(self, name: str) -> str:
        return self.prefix + name

    def sql(self, text: str) -> str:
        """``text`` with every ``{name}`` replaced by the scratch table's name."""
        return re.sub(r"\{(\w+)\}", lambda m: self.t(m.group(1)), text)

    def make(self, name: str, text: str) -> None:
        self.con.execute(f"CREATE TEMP TABLE {self.t(name)} AS " + self.sql(text), self._used(text))
        self.made.append(self.t(name))

    def query(self, text: str):
        return self.con.execute(self.sql(text), self._used(text))

    def scalar(self, text: str):
        """The one value of a query (all rows fetched: the connection has no unfinished result)."""
        return self.query(text).fetchall()[0][0]

    def arrow(self, text: str):
        return self.con.sql(self.sql(text), params=self._used(text)).to_arrow_table()

    def _used(self, text: str) -> dict:
        return {k: v for k, v in self.params.items() if f"${k}" in text}

    def close(self) -> None:
        for t in reversed(self.made):
            self.con.execute(f"DROP TABLE IF EXISTS {t}")
        self.made.clear()


_EVENTS = """
SELECT e.rank::BIGINT AS rank, e.event_id, e.kind, e.name, coalesce(e.ts_ns, 0) + coalesce(o.off, 0) AS ts,
       coalesce(e.dur_ns, 0) AS dur, coalesce(e.ts_ns, 0) + coalesce(o.off, 0) + coalesce(e.dur_ns, 0) AS te,
       coalesce(e.tid, 0) AS tid, coalesce(e.is_gpu, false) AS is_gpu, e.correlation AS corr,
       {nested} AS nested
FROM events e LEFT JOIN {off} o ON o.rank = e.rank
WHERE e.run = $run AND e.ph = 'X' AND e.kind NOT IN ('instant', 'gpu_annotation')
  AND NOT (e.kind = 'other' AND e.name LIKE 'PyTorch Profiler%')
  AND NOT (e.kind = 'cpu_op' AND {nested})"""

_COMMS = """
WITH c AS (
    SELECT row_number() OVER (ORDER BY m.rank, m.comm_id) AS pos, m.rank::BIGINT AS rank, m.comm_id, m.op, m.is_p2p,
           coalesce(m.pg_name, '?') AS pg, m.seq, m.p2p_seq, m.src_rank, m.dst_rank, m.tag,
           coalesce(CASE WHEN m.op = 'all_gather' THEN m.out_bytes ELSE m.in_bytes END, 0) AS bytes,
           m.enqueue_ts_ns + coalesce(o.off, 0) AS enq_ts, coalesce(m.enqueue_dur_ns, 0) AS enq_dur,
           m.enqueue_tid AS enq_tid, coalesce(m.exec_event_id, -1) AS exec_event_id,
           m.start_ts_ns + coalesce(o.off, 0) AS start, m.end_ts_ns + coalesce(o.off, 0) AS "end", m.exec_tid,
           coalesce(m.on_gpu, false) AS on_gpu
    FROM comms m LEFT JOIN {off} o ON o.rank = m.rank
    WHERE m.run = $run AND m.start_ts_ns IS NOT NULL AND (m.seq IS NOT NULL OR (m.is_p2p AND m.p2p_seq IS NOT NULL))),
k AS (
    SELECT *, CASE WHEN is_p2p THEN 'p2p|' || pg || '|' || coalesce(src_rank::VARCHAR, '') || '>' ||
                   coalesce(dst_rank::VARCHAR, '') || '|' || coalesce(tag::VARCHAR, '') || '|' ||
                   coalesce(p2p_seq::VARCHAR, '')
              ELSE 'coll|' || pg || '|' || coalesce(seq::VARCHAR, '') END AS key
    FROM c),
f AS (SELECT *, min(pos) OVER (PARTITION BY key) AS first_pos, max(start) OVER (PARTITION BY key) AS last_arrival,
             min("end") OVER (PARTITION BY key) AS first_end
      FROM k),
-- a p2p run on its caller thread was waited for lazily (gloo's isend/irecv: the span stays open
-- until the work is waited for, while the thread does other work) when its span outlasts its
-- instance's first completion by more than $tail_ns (a send waited for at the end of the step) or
-- holds the start of the thread's next communication (an irecv posted ahead of the work it feeds);
-- or, rank by rank (_HELD), holds the start of other work of its thread that outlasts it.
-- It runs on a lane of its own (a queue lane, as a collective run by a runloop thread), so the
-- thread's own work inside the span stays the thread's; its end is fixed in _LAZY_ENDS
y AS (SELECT *, is_p2p AND NOT on_gpu AND coalesce(exec_tid = enq_tid, false)
                AND ("end" - first_end > $tail_ns
                     OR coalesce(lead(start) OVER (PARTITION BY rank, exec_tid ORDER BY start, comm_id) < "end", false))
           AS lazy
      FROM f)
SELECT * REPLACE (CASE WHEN lazy THEN -1 - comm_id ELSE exec_tid END AS exec_tid),
       CASE WHEN lazy THEN exec_tid END AS lazy_tid, "end" AS span_end, dense_rank() OVER (ORDER BY first_pos) - 1 AS inst,
       least(greatest(start, enq_ts), enq_ts + enq_dur) AS cut,
       NOT on_gpu AND coalesce(exec_tid = enq_tid, false) AND NOT lazy AS on_cpu,
       NOT on_gpu AND (NOT coalesce(exec_tid = enq_tid, false) OR lazy) AS is_q
FROM y"""

# When a lazily waited p2p's transfer ended is not in the trace: a lazy span ends when its thread
# came to wait for it, long after the data moved if the thread was busy. Where a receiver was
# already waiting when the last member arrived, (first completion - last arrival) is the transfer;
# elsewhere it is longer by however late the wait came. So the transfer of a lazily waited
# instance is the smaller of that and the run's $transfer_q quantile of it over the p2p of the same
# size -- the instances whose receiver was waiting
_LAZY_ENDS = """
WITH i AS (SELECT inst, any_value(bytes) AS bytes, any_value(last_arrival) AS la, min("end") - any_value(last_arrival) AS x,
                  bool_or(lazy) AS lazy
           FROM {cm0} WHERE is_p2p GROUP BY inst),
q AS (SELECT bytes, quantile_cont(x, $transfer_q) AS typ FROM i WHERE x >= 0 GROUP BY bytes),
d AS (SELECT i.inst, i.la + least(greatest(i.x, 0), coalesce(q.typ, greatest(i.x, 0)))::BIGINT AS done
      FROM i LEFT JOIN q USING (bytes)),   -- every p2p's (lazy_end): one found lazy by its rank (_HELD) takes it then
e AS (SELECT m.* REPLACE (CASE WHEN m.lazy THEN greatest(coalesce(d.done, m."end"), m.start) ELSE m."end" END AS "end"),
             d.done AS lazy_end
      FROM {cm0} m LEFT JOIN d USING (inst))
SELECT *, least(last_arrival, greatest("end", start)) AS c FROM e"""

# A p2p span on its caller thread that holds the start of other work of the thread outlasting it was
# waited for lazily too: a blocking call holds all its thread did (the interleaved schedules post the
# next micro-batch's receive, then begin this one's forward while the data comes in). Read from the
# rank's events (load_ranks), so the run-wide part reads no events: over the thread's work (its
# events but the communication spans, which stay open while it goes on), the latest end of the work
# begun up to the span's start is within the span and that of the work begun before its end is
# beyond it (an enclosing range -- the work begun before the span outlasting it -- says nothing:
# such a span stays as it was). Columns: rank, comm_id.
_HELD = """
WITH p AS (SELECT rank, comm_id, exec_tid AS tid, start, "end" FROM {cm} WHERE on_cpu AND is_p2p),
x AS (SELECT e.rank, e.tid, e.ts, max(e.te) OVER (PARTITION BY e.rank, e.tid ORDER BY e.ts, e.event_id
                                                  ROWS UNBOUNDED PRECEDING) AS pm
      FROM {ev} e SEMI JOIN (SELECT DISTINCT rank, tid FROM p) t ON t.rank = e.rank AND t.tid = e.tid
      ANTI JOIN {cm} m ON m.rank = e.rank AND m.exec_event_id = e.event_id
      WHERE e.kind <> 'step' AND NOT e.is_gpu),
a AS (SELECT p.*, x.pm AS pm_start FROM p ASOF LEFT JOIN x ON x.rank = p.rank AND x.tid = p.tid AND x.ts <= p.start),
b AS (SELECT a.*, x.pm AS pm_end FROM a ASOF LEFT JOIN x ON x.rank = a.rank AND x.tid = a.tid AND x.ts < a."end")
SELECT rank, comm_id FROM b WHERE pm_end > "end" AND coalesce(pm_start, pm_end - 1) <= "end"
"""

# the activity of threads with lazily waited p2p: every start of an event (nested ones too) and
# every end but a lazy span's (that is the wait's end)
_LAZY_BOUNDS = """
WITH e AS (SELECT e.rank::BIGINT AS rank, coalesce(e.tid, 0) AS tid, e.event_id, e.ts_ns + coalesce(o.off, 0) AS ts,
             e.ts_ns + coalesce(o.off, 0) + coalesce(e.dur_ns, 0) AS te
      FROM events e LEFT JOIN {off} o ON o.rank = e.rank
      WHERE e.run = $run AND e.ph = 'X' AND e.kind NOT IN ('step', 'instant', 'gpu_annotation')
        AND NOT coalesce(e.is_gpu, false) AND (e.rank, coalesce(e.tid, 0)) IN (SELECT rank, tid FROM {lazy}))
SELECT rank, tid, ts AS b FROM e
UNION ALL
SELECT e.rank, e.tid, e.te FROM e ANTI JOIN {lazy} x ON x.rank = e.rank AND x.exec_event_id = e.event_id"""

_INSTANCES = """
SELECT inst, first(key ORDER BY pos) AS key, first(op ORDER BY pos) AS op, max(bytes) AS bytes,
       first(is_p2p ORDER BY pos) AS is_p2p, count(DISTINCT rank) AS n_ranks, max(start) AS last_arrival,
       greatest(min("end") - max(start), 0) AS transfer_ns
FROM {cm} GROUP BY inst"""

_CPU_THREADS = """
SELECT DISTINCT rank, tid FROM {ev} WHERE NOT is_gpu
EXCEPT SELECT DISTINCT rank, exec_tid FROM {cm} WHERE is_q AND exec_tid IS NOT NULL"""

# runtime calls with a correlation id, joined to the GPU ops of their rank with the same id
_LAUNCHES = """
SELECT r.rank, r.tid, r.ts AS l_ts, r.te AS l_te, r.corr, g.event_id AS g_eid, g.te AS g_te
FROM {ev} r JOIN {ev} g ON g.rank = r.rank AND g.corr = r.corr AND g.is_gpu
WHERE NOT r.is_gpu AND r.kind IN ('runtime', 'sync') AND r.corr IS NOT NULL
  AND (r.rank, r.tid) {members} (SELECT rank, tid FROM {cpu})"""

# top-level work: an event that starts at or after the latest end before it (in the thread's
# (start, longest first, event id) order) opens an interval; the interval is named after it
_TOPS = """
WITH w AS (
    SELECT e.rank, e.tid, e.ts, e.te, e.dur, e.event_id, e.name, e.kind,
           max(e.te) OVER (PARTITION BY e.rank, e.tid ORDER BY e.ts, e.dur DESC, e.event_id
                           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_max
    FROM {ev} e SEMI JOIN {cpu} c ON c.rank = e.rank AND c.tid = e.tid
    ANTI JOIN {lazy} z ON z.rank = e.rank AND z.exec_event_id = e.event_id
    WHERE NOT e.is_gpu AND e.kind <> 'step'
      -- work nested in a lazily waited p2p span is the thread's own once the span is left out
      AND (NOT e.nested OR (e.rank, e.tid) IN (SELECT rank, tid FROM {lazy}))),
i AS (
    SELECT *, sum(CASE WHEN prev_max IS NULL OR ts >= prev_max THEN 1 ELSE 0 END)
              OVER (PARTITION BY rank, tid ORDER BY ts, dur DESC, event_id ROWS UNBOUNDED PRECEDING) AS island
    FROM w),
t AS (
    SELECT rank, tid, min(ts) AS start, max(te) AS "end",
           first(name ORDER BY ts, dur DESC, event_id) AS name, first(kind ORDER BY ts, dur DESC, event_id) AS kind
    FROM i GROUP BY rank, tid, island)
SELECT *, lead(start) OVER (PARTITION BY rank, tid ORDER BY start) AS nxt FROM t"""

# how much of a thread's top-level work its nested events cover (pipelines only, ``$with_kids``):
# the islands of the events inside a top-level event (in the thread's (start, longest first, event
# id) order: an event that starts before the latest end before it), each with the island time before
# it on the thread (``before``), so the covered time up to t is before + min(t, b) - a of the last
# island starting at or before t. A top-level node's own ("self") time -- not covered by any nested
# event: an unannotated sleep inside a "Forward" range, Python between ops -- is its time less that
_KIDS = """
WITH e AS (
    SELECT e.rank::BIGINT AS rank, coalesce(e.tid, 0) AS tid, e.ts_ns + coalesce(o.off, 0) AS ts,
           e.ts_ns + coalesce(o.off, 0) + coalesce(e.dur_ns, 0) AS te, coalesce(e.dur_ns, 0) AS dur, e.event_id
    FROM events e LEFT JOIN {off} o ON o.rank = e.rank
    WHERE e.run = $run AND $with_kids AND e.ph = 'X' AND NOT coalesce(e.is_gpu, false)
      AND e.kind NOT IN ('instant', 'gpu_annotation', 'step')
      AND NOT (e.kind = 'other' AND e.name LIKE 'PyTorch Profiler%')
      AND (e.rank, coalesce(e.tid, 0)) IN (SELECT rank, tid FROM {cpu})
      -- a lazily waited p2p span is no top-level work (_TOPS): it covers the thread's next work
      AND (e.rank, e.event_id) NOT IN (SELECT rank, exec_event_id FROM {lazy})),
w AS (SELECT *, max(te) OVER (PARTITION BY rank, tid ORDER BY ts, dur DESC, event_id
                              ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_max FROM e),
k AS (SELECT rank, tid, ts, te, dur, event_id,
             max(te) OVER (PARTITION BY rank, tid ORDER BY ts, dur DESC, event_id
                           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS pm
      FROM w WHERE ts < prev_max),
i AS (SELECT *, sum(CASE WHEN pm IS NULL OR ts >= pm THEN 1 ELSE 0 END)
                OVER (PARTITION BY rank, tid ORDER BY ts, dur DESC, event_id ROWS UNBOUNDED PRECEDING) AS island
      FROM k),
j AS (SELECT rank, tid, min(ts) AS a, max(te) AS b FROM i GROUP BY rank, tid, island)
SELECT rank, tid, a, b, coalesce(sum(b - a) OVER (PARTITION BY rank, tid ORDER BY a
                                                  ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before
FROM j"""

_STEPS = """
SELECT s.rank::BIGINT AS rank, s.step, s.start_ts_ns + coalesce(o.off, 0) AS start,
       s.end_ts_ns + coalesce(o.off, 0) AS "end", s.dur_ns
FROM steps s LEFT JOIN {off} o ON o.rank = s.rank WHERE s.run = $run"""


def load(s: Scratch) -> None:
    """Make the tables listed in the module docstring."""
    load_comms(s)
    load_ranks(s)


def load_comms(s: Scratch) -> None:
    """The run-wide part (reads ``comms`` and the clock offsets, no events): ``off``, ``cm0``, ``cm``
    and ``inst``. What a rank's part (``load_ranks``) needs of the other ranks is all in ``cm``."""
    applied = s.scalar("SELECT count(*) FROM clock_alignment WHERE run = $run AND applied")
    s.make("off", "SELECT rank::BIGINT AS rank, offset_ns::BIGINT AS off FROM clock_offsets "
                  "WHERE run = $run AND offset_ns IS NOT NULL" + ("" if applied else " AND false"))
    s.make("cm0", _COMMS)
    s.make("cm", _LAZY_ENDS)
    s.make("inst", _INSTANCES)


def load_ranks(s: Scratch) -> None:
    """The rank-local part, given ``off`` and ``cm`` (of these ranks): ``ev``, ``lazy``,
    ``cpu``, ``tops``, ``lazy_bounds``, ``launch``, ``st``, ``main``."""
    con = s.con
    cur = con.execute("SELECT * FROM events LIMIT 0")
    cols = {d[0] for d in cur.description}
    cur.fetchall()
    # stores before schema 1.3 have no events.nested: every event is fetched (the same top-level work)
    nested = "coalesce(e.nested, false)" if "nested" in cols else "false"
    s.make("ev", _EVENTS.replace("{nested}", nested))
    s.make("held", _HELD)
    # (_COMMS's lazy members, their ends fixed as in _LAZY_ENDS; every right-hand side reads the old row)
    s.query("""UPDATE {cm} SET lazy = true, lazy_tid = exec_tid, exec_tid = -1 - comm_id, on_cpu = false, is_q = true,
                 "end" = greatest(coalesce(lazy_end, "end"), start),
                 c = least(last_arrival, greatest(coalesce(lazy_end, "end"), start))
               WHERE (rank, comm_id) IN (SELECT rank, comm_id FROM {held})""").fetchall()
    s.make("lazy", "SELECT rank, lazy_tid AS tid, exec_event_id FROM {cm} WHERE lazy")
    s.make("cpu", _CPU_THREADS)
    s.make("tops", _TOPS)
    # a pipeline's idealise compares a stage's own time inside its ops with the other stages' (plans.py)
    s.params["with_kids"] = bool(s.scalar("SELECT count(*) > 0 FROM {cm} WHERE is_p2p"))
    s.make("kids", _KIDS)
    s.make("lazy_bounds", _LAZY_BOUNDS)
    s.make("launch", _LAUNCHES.replace("{members}", "IN"))
    s.make("st", _STEPS)
    # the thread that records ProfilerStep is each rank's main thread
    s.make("main", "SELECT rank, arg_min(tid, event_id) AS tid FROM {ev} WHERE kind = 'step' GROUP BY rank")
