-- The SQL of pipeline_idle, pipeline_bubbles and pipeline_stall_causes before pipeline_idle's per-rank
-- part moved into the map (session 19, issue 17; analyses/sql/bubbles.sql at 8b2c53a), kept as the
-- reference tests/test_pipeline_idle_map.py compares the map/reduce views with: computed over every
-- rank's rows in one connection. Only the views' names differ.

-- Idle stretches of each stage in each step, classified.
-- Columns: run, rank, stage, step, kind (warmup/cooldown/stall/other), caused_by_rank (stalls),
-- lo_ns, hi_ns, dur_ns.
CREATE OR REPLACE TEMP VIEW _ref_pipeline_idle AS
WITH busy AS (  -- merged compute of the stage inside its step
    SELECT a.run, a.rank, s.aligned_step AS step, s.start_ts_ns AS s0, s.end_ts_ns AS s1, a.lo_ns, a.hi_ns
    FROM activity_segments a JOIN _aligned_steps s
      ON s.run = a.run AND s.rank = a.rank AND s.window_id = a.window_id AND s.aligned_step = a.step
    SEMI JOIN pipeline_stages ps ON ps.run = a.run AND ps.rank = a.rank
    WHERE a.n_compute > 0
),
ordered AS (  -- the busy time merged (intervals.sql's rule, one window): a segment that starts after every
    -- earlier one of its step ended opens a new busy stretch; the idle gap before it runs from that end
    SELECT *, max(hi_ns) OVER (PARTITION BY run, rank, step ORDER BY lo_ns, hi_ns
                               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_hi
    FROM busy
),
gaps AS MATERIALIZED (  -- read four times below
    SELECT run, rank, step, 'warmup' AS kind, s0 AS lo_ns, min(lo_ns) AS hi_ns FROM busy GROUP BY run, rank, step, s0
    UNION ALL
    SELECT run, rank, step, 'cooldown', max(hi_ns), s1 FROM busy GROUP BY run, rank, step, s1
    UNION ALL
    SELECT run, rank, step, 'gap', prev_hi, lo_ns FROM ordered WHERE prev_hi IS NOT NULL AND lo_ns > prev_hi
),
calls_all AS MATERIALIZED (  -- comms read once (thousands of ranks' files: a scan is seconds)
    SELECT run, rank, op, src_rank, dst_rank, enqueue_ts_ns, enqueue_dur_ns, end_ts_ns FROM comms
    WHERE enqueue_ts_ns IS NOT NULL
),
pending AS (  -- when each receive (or send, or collective) was outstanding, and the peer it waited on
    SELECT run, rank, CASE WHEN op = 'recv' THEN src_rank ELSE dst_rank END AS src_rank, op = 'send' AS is_send,
           enqueue_ts_ns AS lo_ns, enqueue_ts_ns + enqueue_dur_ns AS call_end_ns,
           greatest(coalesce(end_ts_ns, 0), enqueue_ts_ns + enqueue_dur_ns) AS hi_ns
    FROM calls_all WHERE op IN ('recv', 'send')
    UNION ALL
    -- a collective with the stage's data-parallel (or other) peers: waiting in it for the last peer
    -- to arrive is a stall charged to that peer (a fast replica waits for the slow one), not the
    -- stage's own time; the transfer after the last arrival is the same for every member
    SELECT r.run, r.rank, i.last_arriver, false, r.arrival_ns - coalesce(o.offset_ns, 0),
           r.arrival_ns - coalesce(o.offset_ns, 0), r.arrival_ns - coalesce(o.offset_ns, 0) + r.wait_ns
    FROM collective_ranks r JOIN collective_instances i USING (run, pg, seq)
    LEFT JOIN clock_offsets o ON o.run = r.run AND o.rank = r.rank
    WHERE r.wait_ns > 0   -- on the rank's own clock (collectives.sql aligns clocks; pipeline_idle does not)
),
calls AS (SELECT run, rank, enqueue_ts_ns AS ts_ns FROM calls_all),
pending_next AS (  -- a send, and the rank's first communication call after the send completed (only
    -- a send's is read: receives and collectives skip the search)
    SELECT p.*, c.ts_ns AS next_call_ns
    FROM (SELECT * FROM pending WHERE is_send) p
    ASOF LEFT JOIN calls c ON c.run = p.run AND c.rank = p.rank AND c.ts_ns >= p.hi_ns
    UNION ALL
    SELECT *, CAST(NULL AS BIGINT) FROM pending WHERE NOT is_send
),
gap_spans AS (  -- where each step's gaps lie (from the first one's start to the last one's end)
    SELECT run, rank, step, min(lo_ns) AS lo_ns, max(hi_ns) AS hi_ns FROM gaps WHERE kind = 'gap' GROUP BY ALL
),
pending_steps AS MATERIALIZED (  -- each pending call with the steps whose gaps it may overlap: the gaps
    -- are then matched per step (gaps x calls of one step), not every gap of a rank against every
    -- call of it (gaps x calls of the rank: quadratic in the steps; materialised so that the join
    -- order stays this one)
    SELECT p.*, s.step FROM pending_next p
    JOIN gap_spans s ON p.run = s.run AND p.rank = s.rank AND p.lo_ns < s.hi_ns AND p.hi_ns > s.lo_ns
),
charged AS (  -- the part of each gap during which a receive was pending (or the stage waited on a send), per peer
    -- gloo's send span stays open until the peer takes the data while the stage goes on with its own
    -- work (the next micro-batch, a delay of its own; torch's schedules wait on their sends only at the
    -- end of a phase): a gap under an open send is a wait on it for the part inside the send call,
    -- and up to the send's completion only when the stage was still idle then and did its next thing
    -- (compute, or a communication call) within p2p_wait_max_tail_ns of it -- blocked on the send,
    -- not busy with a delay of its own (a sleep right after an isend is the stage's own time); a
    -- receive is a wait up to its completion only when it completed before the gap ended (a stage
    -- that went back to work before the data came was not waiting on it)
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
                         c_lo AS lo_ns, c_hi AS hi_ns, src_rank FROM charged),
charged_islands AS (  -- the union of the charged parts of a gap (several sends and receives may overlap)
    SELECT grp.run AS run, grp.rank AS rank, grp.step AS step, grp.lo AS lo_ns, grp.hi AS hi_ns, src_rank,
           lo_ns AS c_lo, hi_ns AS c_hi, island
    FROM _interval_islands(charged_keyed)
),
per_gap AS (  -- the stall: the union of the charged parts, charged to the peer of its longest island (ties:
              -- the lowest rank, whatever order the rows come in)
    SELECT run, rank, step, lo_ns, hi_ns, arg_max(src_rank, (ns, -src_rank)) AS src_rank, least(sum(ns), hi_ns - lo_ns) AS stall_ns
    FROM (SELECT run, rank, step, lo_ns, hi_ns, island, arg_max(src_rank, (c_hi - c_lo, -src_rank)) AS src_rank,
                 max(c_hi) - min(c_lo) AS ns
          FROM charged_islands GROUP BY run, rank, step, lo_ns, hi_ns, island)
    GROUP BY run, rank, step, lo_ns, hi_ns
)
SELECT g.run, g.rank, st.stage, g.step, g.kind, CAST(NULL AS INTEGER) AS caused_by_rank, g.lo_ns, g.hi_ns,
       g.hi_ns - g.lo_ns AS dur_ns
FROM gaps g JOIN pipeline_stages st USING (run, rank) WHERE g.kind <> 'gap' AND g.hi_ns > g.lo_ns
UNION ALL
SELECT g.run, g.rank, st.stage, g.step, 'stall', p.src_rank, g.lo_ns, g.lo_ns + p.stall_ns, p.stall_ns
FROM gaps g JOIN pipeline_stages st USING (run, rank)
JOIN per_gap p USING (run, rank, step, lo_ns, hi_ns) WHERE g.kind = 'gap' AND p.stall_ns > 0
UNION ALL
SELECT g.run, g.rank, st.stage, g.step, 'other', NULL, g.lo_ns + coalesce(p.stall_ns, 0), g.hi_ns,
       g.hi_ns - g.lo_ns - coalesce(p.stall_ns, 0)
FROM gaps g JOIN pipeline_stages st USING (run, rank)
LEFT JOIN per_gap p USING (run, rank, step, lo_ns, hi_ns)
WHERE g.kind = 'gap' AND g.hi_ns - g.lo_ns - coalesce(p.stall_ns, 0) > 0;

-- Per stage and step. Columns: run, rank, pipeline_id, stage, step, step_ns, busy_ns, idle_ns, warmup_ns,
-- cooldown_ns, stall_ns, other_idle_ns, bubble_pct (idle / step), theoretical_bubble_pct, schedule,
-- microbatches.
CREATE OR REPLACE TEMP VIEW _ref_pipeline_bubbles AS
SELECT st.run, st.rank, st.pipeline_id, st.stage, s.aligned_step AS step, s.dur_ns AS step_ns,
       s.dur_ns - coalesce(sum(i.dur_ns), 0) AS busy_ns, coalesce(sum(i.dur_ns), 0) AS idle_ns,
       coalesce(sum(i.dur_ns) FILTER (WHERE i.kind = 'warmup'), 0) AS warmup_ns,
       coalesce(sum(i.dur_ns) FILTER (WHERE i.kind = 'cooldown'), 0) AS cooldown_ns,
       coalesce(sum(i.dur_ns) FILTER (WHERE i.kind = 'stall'), 0) AS stall_ns,
       coalesce(sum(i.dur_ns) FILTER (WHERE i.kind = 'other'), 0) AS other_idle_ns,
       100.0 * coalesce(sum(i.dur_ns), 0) / nullif(s.dur_ns, 0) AS bubble_pct,
       any_value(sh.theoretical_bubble_pct) AS theoretical_bubble_pct, any_value(sh.schedule) AS schedule,
       any_value(sh.microbatches) AS microbatches
FROM pipeline_stages st JOIN _aligned_steps s USING (run, rank) JOIN pipeline_shape sh USING (run, pipeline_id)
LEFT JOIN _ref_pipeline_idle i ON i.run = st.run AND i.rank = st.rank AND i.step = s.aligned_step
GROUP BY st.run, st.rank, st.pipeline_id, st.stage, s.aligned_step, s.dur_ns;

-- Which stage held the others up: stall time charged to each rank, summed over the stages that
-- waited for it, per step (median over steps). The slow stage comes first (per pipeline).
-- Columns: run, rank, pipeline_id, stage, stall_caused_ns_per_step, stall_caused_pct (of the
-- median step), other_idle_ns_per_step (its own host-side delays), rank_order (1 = the rank its
-- pipeline stalled on most).
CREATE OR REPLACE TEMP VIEW _ref_pipeline_stall_causes AS
WITH caused AS (
    SELECT run, caused_by_rank AS rank, step, sum(dur_ns) AS ns FROM _ref_pipeline_idle WHERE kind = 'stall' GROUP BY ALL
),
own AS (SELECT run, rank, step, sum(dur_ns) AS ns FROM _ref_pipeline_idle WHERE kind = 'other' GROUP BY ALL),
grid AS (SELECT DISTINCT b.run, b.rank, b.pipeline_id, b.stage, b.step, b.step_ns FROM _ref_pipeline_bubbles b)
SELECT g.run, g.rank, any_value(g.pipeline_id) AS pipeline_id, any_value(g.stage) AS stage, median(coalesce(c.ns, 0)) AS stall_caused_ns_per_step,
       100.0 * median(coalesce(c.ns, 0)) / nullif(median(g.step_ns), 0) AS stall_caused_pct,
       median(coalesce(o.ns, 0)) AS other_idle_ns_per_step,
       row_number() OVER (PARTITION BY g.run, any_value(g.pipeline_id) ORDER BY median(coalesce(c.ns, 0)) DESC, g.rank) AS rank_order
FROM grid g LEFT JOIN caused c USING (run, rank, step) LEFT JOIN own o USING (run, rank, step)
GROUP BY g.run, g.rank;
