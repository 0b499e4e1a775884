-- Pipeline idle time, the per-rank part (issue 17): made by the map one rank at a time, so that the
-- reduce combines compact per-rank rows (linear in the ranks) instead of every rank's segments. See
-- bubbles.sql for what the kinds mean and ../shared/METRICS.md, "Pipeline bubbles".
-- Per rank that sends or receives point to point (a superset of the pipeline stages, which are
-- cross-rank: the cross-rank views keep the stages' rows): its idle stretches per aligned step, the
-- islands of the parts of each gap during which one of its own sends or receives was pending, and
-- their sums per step and kind. The waits in collectives need every member's arrival: the reduce adds
-- them (_pipeline_touched) and merges again only the gaps they fall in.
--
-- requires: activity, clock_offsets, collectives, intervals, pipelines, step_alignment

-- The compute of a rank that sends or receives point to point, inside its (aligned) step: the segments
-- with compute active. Columns: run, rank, step, s0, s1 (the step's start and end), lo_ns, hi_ns.
-- scope: rank
CREATE OR REPLACE TEMP VIEW _pipeline_busy AS
SELECT a.run, a.rank, s.aligned_step AS step, s.start_ts_ns AS s0, s.end_ts_ns AS s1, a.lo_ns, a.hi_ns
FROM activity_segments a JOIN _aligned_steps s
  ON s.run = a.run AND s.rank = a.rank AND s.window_id = a.window_id AND s.aligned_step = a.step
SEMI JOIN (SELECT DISTINCT run, rank FROM comms WHERE is_p2p) p ON p.run = a.run AND p.rank = a.rank
WHERE a.n_compute > 0;

-- Idle stretches: before the rank's first compute of the step (warmup), after its last (cooldown), and
-- the gaps between its merged compute. Columns: run, rank, step, kind (warmup/cooldown/gap), lo_ns, hi_ns.
-- (Made in numpy, pipeline_sweep.py, unless it declines.)
-- scope: rank
CREATE OR REPLACE TEMP VIEW _pipeline_gaps AS
WITH busy AS (SELECT * FROM _pipeline_busy),
ordered AS (  -- the busy time merged (intervals.sql's rule, one window): a segment that starts after every
    -- earlier one of its step ended opens a new busy stretch; the idle gap before it runs from that end
    SELECT *, max(hi_ns) OVER (PARTITION BY run, rank, step ORDER BY lo_ns, hi_ns
                               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_hi
    FROM busy
),
gaps AS (
    SELECT run, rank, step, 'warmup' AS kind, s0 AS lo_ns, min(lo_ns) AS hi_ns FROM busy GROUP BY run, rank, step, s0
    UNION ALL
    SELECT run, rank, step, 'cooldown', max(hi_ns), s1 FROM busy GROUP BY run, rank, step, s1
    UNION ALL
    SELECT run, rank, step, 'gap', prev_hi, lo_ns FROM ordered WHERE prev_hi IS NOT NULL AND lo_ns > prev_hi
)
SELECT * FROM gaps;

-- Where each step's gaps lie (from the first one's start to the last one's end): a pending call or a
-- collective wait is matched with the gaps of the steps it overlaps only (gaps x calls of one step, not
-- of the rank: quadratic in the steps). Columns: run, rank, step, lo_ns, hi_ns.
-- scope: rank
CREATE OR REPLACE TEMP VIEW _pipeline_gap_spans AS
SELECT run, rank, step, min(lo_ns) AS lo_ns, max(hi_ns) AS hi_ns FROM _pipeline_gaps WHERE kind = 'gap' GROUP BY ALL;

-- The parts of each gap during which one of the rank's own sends or receives was pending, merged into
-- islands (intervals.sql), per peer. gloo's send span stays open until the peer takes the data while
-- the stage goes on with its own work (the next micro-batch, a delay of its own; torch's schedules wait
-- on their sends only at the end of a phase): a gap under an open send is a wait on it for the part
-- inside the send call, and up to the send's completion only when the stage was still idle then and
-- did its next thing (compute, or a communication call) within p2p_wait_max_tail_ns of it -- blocked on
-- the send, not busy with a delay of its own (a sleep right after an isend is the stage's own time).
-- A receive posted ahead (the interleaved schedules post the next micro-batch's receives before they
-- compute this one) is a wait up to its completion only when it completed before the gap ended: a
-- stage that went back to work before the data came was not waiting on it (its gap under the open
-- receive is its own time, e.g. a sleep in its forward), only the receive call itself is.
-- Columns: run, rank, step, lo_ns, hi_ns (the gap), c_lo, c_hi (the island), src_rank (the peer of its
-- longest part; ties: the lowest rank), part_ns (that part's length).
-- scope: rank
CREATE OR REPLACE TEMP VIEW _pipeline_p2p_islands AS
WITH gaps AS (SELECT * FROM _pipeline_gaps),
calls_all AS MATERIALIZED (
    SELECT run, rank, op, src_rank, dst_rank, enqueue_ts_ns, enqueue_dur_ns, end_ts_ns FROM comms
    WHERE enqueue_ts_ns IS NOT NULL
),
pending AS (  -- when each receive (or send) was outstanding, and the peer it waited on
    SELECT run, rank, CASE WHEN op = 'recv' THEN src_rank ELSE dst_rank END AS src_rank, op = 'send' AS is_send,
           enqueue_ts_ns AS lo_ns, enqueue_ts_ns + enqueue_dur_ns AS call_end_ns,
           greatest(coalesce(end_ts_ns, 0), enqueue_ts_ns + enqueue_dur_ns) AS hi_ns
    FROM calls_all WHERE op IN ('recv', 'send')
),
calls AS (SELECT run, rank, enqueue_ts_ns AS ts_ns FROM calls_all),
pending_next AS (  -- a send, and the rank's first communication call after the send completed (only
    -- a send's is read: receives skip the search)
    SELECT p.*, c.ts_ns AS next_call_ns
    FROM (SELECT * FROM pending WHERE is_send) p
    ASOF LEFT JOIN calls c ON c.run = p.run AND c.rank = p.rank AND c.ts_ns >= p.hi_ns
    UNION ALL
    SELECT *, CAST(NULL AS BIGINT) FROM pending WHERE NOT is_send
),
gap_spans AS (  -- _pipeline_gap_spans (made here too: the join tests read this module's CTEs)
    SELECT run, rank, step, min(lo_ns) AS lo_ns, max(hi_ns) AS hi_ns FROM gaps WHERE kind = 'gap' GROUP BY ALL
),
pending_steps AS MATERIALIZED (  -- each pending call with the steps whose gaps it may overlap
    -- (materialised so that the join order stays this one)
    SELECT p.*, s.step FROM pending_next p
    JOIN gap_spans s ON p.run = s.run AND p.rank = s.rank AND p.lo_ns < s.hi_ns AND p.hi_ns > s.lo_ns
),
charged AS (
    SELECT run, rank, step, lo_ns, hi_ns, src_rank, c_lo, c_hi FROM (
        SELECT g.run, g.rank, g.step, g.lo_ns, g.hi_ns, p.src_rank, greatest(g.lo_ns, p.lo_ns) AS c_lo,
               CASE WHEN NOT p.is_send AND p.hi_ns <= g.hi_ns
                         OR (p.is_send AND g.hi_ns >= p.hi_ns
                             AND least(g.hi_ns, coalesce(p.next_call_ns, g.hi_ns))
                                 <= p.hi_ns + getvariable('p2p_wait_max_tail_ns'))
                    THEN least(g.hi_ns, p.hi_ns) ELSE least(g.hi_ns, p.call_end_ns) END AS c_hi
        FROM gaps g JOIN pending_steps p ON p.run = g.run AND p.rank = g.rank AND p.step IS NOT DISTINCT FROM g.step
         AND p.lo_ns < g.hi_ns AND p.hi_ns > g.lo_ns
        WHERE g.kind = 'gap')
    WHERE c_hi > c_lo
),
charged_keyed AS (SELECT {'run': run, 'rank': rank, 'step': step, 'lo': lo_ns, 'hi': hi_ns} AS grp,
                         c_lo AS lo_ns, c_hi AS hi_ns, src_rank FROM charged)
SELECT grp.run AS run, grp.rank AS rank, grp.step AS step, grp.lo AS lo_ns, grp.hi AS hi_ns,
       min(lo_ns) AS c_lo, max(hi_ns) AS c_hi, arg_max(src_rank, (hi_ns - lo_ns, -src_rank)) AS src_rank,
       max(hi_ns - lo_ns) AS part_ns
FROM _interval_islands(charged_keyed) GROUP BY grp, island;

-- The stall of each gap as the rank's own calls tell it: the union of its islands, charged to the peer
-- of its longest island (ties: the lowest rank, whatever order the rows come in). Only gaps with one.
-- Columns: run, rank, step, lo_ns, hi_ns, src_rank, stall_ns.
-- scope: rank
CREATE OR REPLACE TEMP VIEW _pipeline_p2p_stalls AS
SELECT run, rank, step, lo_ns, hi_ns, arg_max(src_rank, (c_hi - c_lo, -src_rank)) AS src_rank,
       least(sum(c_hi - c_lo), hi_ns - lo_ns) AS stall_ns
FROM _pipeline_p2p_islands GROUP BY run, rank, step, lo_ns, hi_ns;

-- The idle time of each rank and step per kind and peer, from its own calls (what pipeline_idle's rows
-- add up to before the collective waits: _pipeline_idle_steps corrects the gaps they fall in).
-- Columns: run, rank, step, kind (warmup/cooldown/stall/other), caused_by_rank (stalls), dur_ns.
-- (Made in numpy, pipeline_sweep.py, unless it declines.)
-- scope: rank
CREATE OR REPLACE TEMP VIEW _pipeline_idle_sums AS
SELECT run, rank, step, kind, caused_by_rank, sum(dur_ns) AS dur_ns FROM (
    SELECT run, rank, step, kind, CAST(NULL AS INTEGER) AS caused_by_rank, hi_ns - lo_ns AS dur_ns
    FROM _pipeline_gaps WHERE kind <> 'gap' AND hi_ns > lo_ns
    UNION ALL
    SELECT run, rank, step, 'stall', src_rank, stall_ns FROM _pipeline_p2p_stalls WHERE stall_ns > 0
    UNION ALL
    SELECT g.run, g.rank, g.step, 'other', NULL, g.hi_ns - g.lo_ns - coalesce(p.stall_ns, 0)
    FROM _pipeline_gaps g LEFT JOIN _pipeline_p2p_stalls p USING (run, rank, step, lo_ns, hi_ns)
    WHERE g.kind = 'gap' AND g.hi_ns - g.lo_ns - coalesce(p.stall_ns, 0) > 0)
GROUP BY ALL;

-- The gaps of the stages a collective wait falls in, their stall before (the rank's own calls alone)
-- and after the waits are added: waiting in a collective with the stage's data-parallel (or other)
-- peers for the last one to arrive is a stall charged to that peer (a fast replica waits for the slow
-- one), not the stage's own time; the transfer after the last arrival is the same for every member.
-- The waits are on the rank's own clock (collectives.sql aligns clocks; the gaps are not aligned).
-- Columns: run, rank, step, lo_ns, hi_ns, p2p_src_rank, p2p_stall_ns (NULL: none), src_rank, stall_ns.
CREATE OR REPLACE TEMP VIEW _pipeline_touched AS
WITH coll AS (
    SELECT r.run, r.rank, i.last_arriver AS src_rank, r.arrival_ns - coalesce(o.offset_ns, 0) AS lo_ns,
           r.arrival_ns - coalesce(o.offset_ns, 0) + r.wait_ns AS hi_ns
    FROM collective_ranks r JOIN collective_instances i USING (run, pg, seq)
    LEFT JOIN clock_offsets o ON o.run = r.run AND o.rank = r.rank
    SEMI JOIN pipeline_stages ps ON ps.run = r.run AND ps.rank = r.rank
    WHERE r.wait_ns > 0
),
coll_steps AS MATERIALIZED (  -- each wait with the steps whose gaps it may overlap
    SELECT p.*, s.step FROM coll p
    JOIN _pipeline_gap_spans s ON p.run = s.run AND p.rank = s.rank AND p.lo_ns < s.hi_ns AND p.hi_ns > s.lo_ns
),
coll_charged AS MATERIALIZED (
    SELECT * FROM (
        SELECT g.run, g.rank, g.step, g.lo_ns, g.hi_ns, p.src_rank, greatest(g.lo_ns, p.lo_ns) AS c_lo,
               least(g.hi_ns, p.hi_ns) AS c_hi
        FROM _pipeline_gaps g JOIN coll_steps p ON p.run = g.run AND p.rank = g.rank AND p.step IS NOT DISTINCT FROM g.step
         AND p.lo_ns < g.hi_ns AND p.hi_ns > g.lo_ns
        WHERE g.kind = 'gap')
    WHERE c_hi > c_lo
),
touched AS MATERIALIZED (SELECT DISTINCT run, rank, step, lo_ns, hi_ns FROM coll_charged),
p2p AS MATERIALIZED (SELECT i.* FROM _pipeline_p2p_islands i SEMI JOIN touched t USING (run, rank, step, lo_ns, hi_ns)),
parts AS (  -- the charged parts: the waits and the rank's own islands
    SELECT {'run': run, 'rank': rank, 'step': step, 'lo': lo_ns, 'hi': hi_ns} AS grp,
           c_lo AS lo_ns, c_hi AS hi_ns, src_rank, c_hi - c_lo AS part_ns FROM coll_charged
    UNION ALL
    SELECT {'run': run, 'rank': rank, 'step': step, 'lo': lo_ns, 'hi': hi_ns}, c_lo, c_hi, src_rank, part_ns FROM p2p
),
islands AS (  -- per gap and island: its length, the peer of its longest part
    SELECT grp.run AS run, grp.rank AS rank, grp.step AS step, grp.lo AS lo_ns, grp.hi AS hi_ns,
           arg_max(src_rank, (part_ns, -src_rank)) AS src_rank, max(hi_ns) - min(lo_ns) AS ns
    FROM _interval_islands(parts) GROUP BY grp, island
),
merged AS (
    SELECT run, rank, step, lo_ns, hi_ns, arg_max(src_rank, (ns, -src_rank)) AS src_rank,
           least(sum(ns), hi_ns - lo_ns) AS stall_ns
    FROM islands GROUP BY run, rank, step, lo_ns, hi_ns
),
own AS (
    SELECT run, rank, step, lo_ns, hi_ns, arg_max(src_rank, (c_hi - c_lo, -src_rank)) AS src_rank,
           least(sum(c_hi - c_lo), hi_ns - lo_ns) AS stall_ns
    FROM p2p GROUP BY run, rank, step, lo_ns, hi_ns
)
SELECT m.run, m.rank, m.step, m.lo_ns, m.hi_ns, o.src_rank AS p2p_src_rank, o.stall_ns AS p2p_stall_ns,
       m.src_rank, m.stall_ns
FROM merged m LEFT JOIN own o USING (run, rank, step, lo_ns, hi_ns);

-- pipeline_idle's rows added up per stage, step, kind and peer (what pipeline_bubbles and
-- pipeline_stall_causes read: compact rows, not one per gap): the map's sums, with the gaps a
-- collective wait falls in taken out as the rank's own calls had them and put back with the waits.
-- Columns: run, rank, step, kind, caused_by_rank, dur_ns.
CREATE OR REPLACE TEMP VIEW _pipeline_idle_steps AS
SELECT run, rank, step, kind, caused_by_rank, sum(dur_ns) AS dur_ns FROM (
    SELECT s.* FROM _pipeline_idle_sums s SEMI JOIN pipeline_stages ps ON ps.run = s.run AND ps.rank = s.rank
    UNION ALL
    SELECT run, rank, step, 'stall', p2p_src_rank, -p2p_stall_ns FROM _pipeline_touched WHERE p2p_stall_ns > 0
    UNION ALL
    SELECT run, rank, step, 'other', NULL, -(hi_ns - lo_ns - coalesce(p2p_stall_ns, 0)) FROM _pipeline_touched
    WHERE hi_ns - lo_ns - coalesce(p2p_stall_ns, 0) > 0
    UNION ALL
    SELECT run, rank, step, 'stall', src_rank, stall_ns FROM _pipeline_touched WHERE stall_ns > 0
    UNION ALL
    SELECT run, rank, step, 'other', NULL, hi_ns - lo_ns - stall_ns FROM _pipeline_touched WHERE hi_ns - lo_ns - stall_ns > 0)
GROUP BY ALL;
