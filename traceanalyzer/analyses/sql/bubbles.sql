-- Pipeline bubbles: per stage and step, how much of the step the stage sat idle, when, and
-- because of whom (see ../shared/METRICS.md, "Pipeline bubbles"). The pipelines, their shape and
-- the stage of each rank come from pipelines.sql.
-- A stage's busy time is its compute (activity.sql, merged); the idle time of the step is cut into
--   warmup   before its first compute of the step,
--   cooldown after its last compute,
--   stall    gaps in between during which a receive (or a send, which blocks on gloo until the
--            peer takes the data) was pending: charged to that peer (the upstream stage for
--            activations, the downstream one for gradients),
--   other    the rest of the gaps (the stage's own host-side delays).
-- Every comparison between stages (slow stage, stall causes) stays inside one pipeline. Steps are
-- aligned (step_alignment.sql): a stall is charged to the peer's same iteration.
--
-- requires: activity, clock_offsets, collectives, intervals, pipelines, step_alignment

-- pipeline_idle's per-rank part, made by the map one rank at a time (issue 17: the reduce then combines
-- compact per-rank rows, linear in the ranks): the idle stretches of every rank that sends or receives
-- point to point (a superset of the pipeline stages, which are cross-rank: pipeline_idle keeps the
-- stages' rows), per aligned step: before its first compute (warmup), after its last (cooldown), and the
-- gaps between its merged compute.
-- Columns: run, rank, step, kind (warmup/cooldown/gap), lo_ns, hi_ns.
-- scope: rank
CREATE OR REPLACE TEMP VIEW _pipeline_gaps AS
WITH busy AS (  -- merged compute of the rank inside its step
    SELECT a.run, a.rank, s.aligned_step AS step, s.start_ts_ns AS s0, s.end_ts_ns AS s1, a.lo_ns, a.hi_ns
    FROM activity_segments a JOIN _aligned_steps s
      ON s.run = a.run AND s.rank = a.rank AND s.window_id = a.window_id AND s.aligned_step = a.step
    SEMI JOIN (SELECT DISTINCT run, rank FROM comms WHERE is_p2p) p ON p.run = a.run AND p.rank = a.rank
    WHERE a.n_compute > 0
),
ordered AS (  -- the busy time merged (intervals.sql's rule, one window): a segment that starts after every
    -- earlier one of its step ended opens a new busy stretch; the idle gap before it runs from that end
    SELECT *, max(hi_ns) OVER (PARTITION BY run, rank, step ORDER BY lo_ns, hi_ns
                               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_hi
    FROM busy
)
SELECT run, rank, step, 'warmup' AS kind, s0 AS lo_ns, min(lo_ns) AS hi_ns FROM busy GROUP BY run, rank, step, s0
UNION ALL
SELECT run, rank, step, 'cooldown', max(hi_ns), s1 FROM busy GROUP BY run, rank, step, s1
UNION ALL
SELECT run, rank, step, 'gap', prev_hi, lo_ns FROM ordered WHERE prev_hi IS NOT NULL AND lo_ns > prev_hi;

-- The parts of each gap of _pipeline_gaps during which one of the rank's own sends or receives was
-- pending, merged into islands (intervals.sql), per peer: what the rank's own calls say of its stalls.
-- (The waits in collectives need every member's arrival: pipeline_idle adds them in the reduce.)
-- gloo's send span stays open until the peer takes the data while the stage goes on with its own
-- work (the next micro-batch, a delay of its own; torch's schedules wait on their sends only at the
-- end of a phase): a gap under an open send is a wait on it for the part inside the send call,
-- and up to the send's completion only when the stage was still idle then and did its next thing
-- (compute, or a communication call) within p2p_wait_max_tail_ns of it -- blocked on the send,
-- not busy with a delay of its own (a sleep right after an isend is the stage's own time).
-- Columns: run, rank, step, lo_ns, hi_ns (the gap), c_lo, c_hi (the island), src_rank (the peer of its
-- longest part; ties: the lowest rank), part_ns (that part's length).
-- scope: rank
CREATE OR REPLACE TEMP VIEW _pipeline_p2p_islands AS
WITH calls_all AS MATERIALIZED (
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
gap_spans AS (  -- where each step's gaps lie (from the first one's start to the last one's end)
    SELECT run, rank, step, min(lo_ns) AS lo_ns, max(hi_ns) AS hi_ns FROM _pipeline_gaps WHERE kind = 'gap' GROUP BY ALL
),
pending_steps AS MATERIALIZED (  -- each pending call with the steps whose gaps it may overlap: the gaps
    -- are then matched per step (gaps x calls of one step), not every gap of a rank against every
    -- call of it (materialised so that the join order stays this one)
    SELECT p.*, s.step FROM pending_next p
    JOIN gap_spans s ON p.run = s.run AND p.rank = s.rank AND p.lo_ns < s.hi_ns AND p.hi_ns > s.lo_ns
),
charged AS (
    SELECT run, rank, step, lo_ns, hi_ns, src_rank, c_lo, c_hi FROM (
        SELECT g.run, g.rank, g.step, g.lo_ns, g.hi_ns, p.src_rank, greatest(g.lo_ns, p.lo_ns) AS c_lo,
               CASE WHEN NOT p.is_send
                         OR (g.hi_ns >= p.hi_ns AND least(g.hi_ns, coalesce(p.next_call_ns, g.hi_ns))
                                                    <= p.hi_ns + getvariable('p2p_wait_max_tail_ns'))
                    THEN least(g.hi_ns, p.hi_ns) ELSE least(g.hi_ns, p.call_end_ns) END AS c_hi
        FROM _pipeline_gaps g JOIN pending_steps p ON p.run = g.run AND p.rank = g.rank AND p.step IS NOT DISTINCT FROM g.step
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

-- Idle stretches of each stage in each step, classified (the map's _pipeline_gaps of the stages), the
-- stalls charged to a peer: a gap's stall is the union of the parts during which a send or receive
-- (_pipeline_p2p_islands) or a collective was pending -- a collective with the stage's data-parallel (or
-- other) peers: waiting in it for the last peer to arrive is a stall charged to that peer (a fast replica
-- waits for the slow one), not the stage's own time; the transfer after the last arrival is the same for
-- every member -- charged to the peer of its longest island (ties: the lowest rank, whatever order the
-- rows come in). Only the gaps a collective wait falls in are merged again here; the others take their
-- islands as the map made them.
-- Columns: run, rank, stage, step, kind (warmup/cooldown/stall/other), caused_by_rank (stalls),
-- lo_ns, hi_ns, dur_ns.
CREATE OR REPLACE TEMP VIEW pipeline_idle AS
WITH gaps AS MATERIALIZED (
    SELECT g.* FROM _pipeline_gaps g SEMI JOIN pipeline_stages ps ON ps.run = g.run AND ps.rank = g.rank
),
coll AS (  -- the collective waits of the stages, on the rank's own clock (collectives.sql aligns clocks;
    -- pipeline_idle does not)
    SELECT r.run, r.rank, i.last_arriver AS src_rank, r.arrival_ns - coalesce(o.offset_ns, 0) AS lo_ns,
           r.arrival_ns - coalesce(o.offset_ns, 0) + r.wait_ns AS hi_ns
    FROM collective_ranks r JOIN collective_instances i USING (run, pg, seq)
    LEFT JOIN clock_offsets o ON o.run = r.run AND o.rank = r.rank
    SEMI JOIN pipeline_stages ps ON ps.run = r.run AND ps.rank = r.rank
    WHERE r.wait_ns > 0
),
gap_spans AS (
    SELECT run, rank, step, min(lo_ns) AS lo_ns, max(hi_ns) AS hi_ns FROM gaps WHERE kind = 'gap' GROUP BY ALL
),
coll_steps AS MATERIALIZED (  -- each wait with the steps whose gaps it may overlap (then gaps x waits per step)
    SELECT p.*, s.step FROM coll p
    JOIN gap_spans s ON p.run = s.run AND p.rank = s.rank AND p.lo_ns < s.hi_ns AND p.hi_ns > s.lo_ns
),
coll_charged AS (
    SELECT * FROM (
        SELECT g.run, g.rank, g.step, g.lo_ns, g.hi_ns, p.src_rank, greatest(g.lo_ns, p.lo_ns) AS c_lo,
               least(g.hi_ns, p.hi_ns) AS c_hi
        FROM gaps g JOIN coll_steps p ON p.run = g.run AND p.rank = g.rank AND p.step IS NOT DISTINCT FROM g.step
         AND p.lo_ns < g.hi_ns AND p.hi_ns > g.lo_ns
        WHERE g.kind = 'gap')
    WHERE c_hi > c_lo
),
touched AS MATERIALIZED (SELECT DISTINCT run, rank, step, lo_ns, hi_ns FROM coll_charged),
p2p AS (SELECT i.* FROM _pipeline_p2p_islands i SEMI JOIN pipeline_stages ps ON ps.run = i.run AND ps.rank = i.rank),
parts AS (  -- the charged parts of the gaps a collective wait falls in: the waits and the map's islands
    SELECT {'run': run, 'rank': rank, 'step': step, 'lo': lo_ns, 'hi': hi_ns} AS grp,
           c_lo AS lo_ns, c_hi AS hi_ns, src_rank, c_hi - c_lo AS part_ns FROM coll_charged
    UNION ALL
    SELECT {'run': i.run, 'rank': i.rank, 'step': i.step, 'lo': i.lo_ns, 'hi': i.hi_ns},
           i.c_lo, i.c_hi, i.src_rank, i.part_ns
    FROM p2p i SEMI JOIN touched t USING (run, rank, step, lo_ns, hi_ns)
),
islands AS (  -- per gap and island: its length, the peer of its longest part
    SELECT grp.run AS run, grp.rank AS rank, grp.step AS step, grp.lo AS lo_ns, grp.hi AS hi_ns,
           arg_max(src_rank, (part_ns, -src_rank)) AS src_rank, max(hi_ns) - min(lo_ns) AS ns
    FROM _interval_islands(parts) GROUP BY grp, island
    UNION ALL
    SELECT i.run, i.rank, i.step, i.lo_ns, i.hi_ns, i.src_rank, i.c_hi - i.c_lo
    FROM p2p i ANTI JOIN touched t USING (run, rank, step, lo_ns, hi_ns)
),
per_gap AS (  -- the stall: the union of the charged parts, charged to the peer of its longest island
    SELECT run, rank, step, lo_ns, hi_ns, arg_max(src_rank, (ns, -src_rank)) AS src_rank, least(sum(ns), hi_ns - lo_ns) AS stall_ns
    FROM islands GROUP BY run, rank, step, lo_ns, hi_ns
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
CREATE OR REPLACE TEMP VIEW pipeline_bubbles AS
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
LEFT JOIN pipeline_idle i ON i.run = st.run AND i.rank = st.rank AND i.step = s.aligned_step
GROUP BY st.run, st.rank, st.pipeline_id, st.stage, s.aligned_step, s.dur_ns;

-- Which stage held the others up: stall time charged to each rank, summed over the stages that
-- waited for it, per step (median over steps). The slow stage comes first (per pipeline).
-- Columns: run, rank, pipeline_id, stage, stall_caused_ns_per_step, stall_caused_pct (of the
-- median step), other_idle_ns_per_step (its own host-side delays), rank_order (1 = the rank its
-- pipeline stalled on most).
CREATE OR REPLACE TEMP VIEW pipeline_stall_causes AS
WITH caused AS (
    SELECT run, caused_by_rank AS rank, step, sum(dur_ns) AS ns FROM pipeline_idle WHERE kind = 'stall' GROUP BY ALL
),
own AS (SELECT run, rank, step, sum(dur_ns) AS ns FROM pipeline_idle WHERE kind = 'other' GROUP BY ALL),
grid AS (SELECT DISTINCT b.run, b.rank, b.pipeline_id, b.stage, b.step, b.step_ns FROM pipeline_bubbles b)
SELECT g.run, g.rank, any_value(g.pipeline_id) AS pipeline_id, any_value(g.stage) AS stage, median(coalesce(c.ns, 0)) AS stall_caused_ns_per_step,
       100.0 * median(coalesce(c.ns, 0)) / nullif(median(g.step_ns), 0) AS stall_caused_pct,
       median(coalesce(o.ns, 0)) AS other_idle_ns_per_step,
       row_number() OVER (PARTITION BY g.run, any_value(g.pipeline_id) ORDER BY median(coalesce(c.ns, 0)) DESC, g.rank) AS rank_order
FROM grid g LEFT JOIN caused c USING (run, rank, step) LEFT JOIN own o USING (run, rank, step)
GROUP BY g.run, g.rank;

-- The slow stage: a stage whose own time beyond its role in the pipeline exceeds its peers' by at
-- least slow_stage_min_excess_pct of the median step time (default 10), median over steps.
-- Own time is compute (busy) plus its own host-side delays (other_idle: a sleep, a descheduled
-- thread, a slow data loader), i.e. the step minus its stalls, warm-up and cool-down; waiting never
-- makes a stage slow (the stages it held up show the stalls charged to it, pipeline_stall_causes).
-- What is a fault and what is the pipeline's structure: stages compute different layers by design
-- (the last holds the loss and head, partitions are rarely even), so
--   * with replicas (PP x DP), a stage is compared with the ranks holding the same stage in the
--     other replicas (its data-parallel peers): own time beyond theirs is its own fault, which
--     finds the slow worker in its own stage and replica (the stages it holds up only stall);
--   * without, only host-side delays beyond the median of the other stages count (no stage's role
--     includes idling with nothing pending: a sleep, a descheduled thread); compute beyond the
--     other stages' is structural.
-- excess_ns_per_step = own time beyond the DP peers' (with replicas), else host-side excess; a
-- finding needs that excess in at least finding_min_steps_pct of the steps (a fault repeats, one
-- noisy step of a healthy run does not make a slow stage);
-- structural_ns_per_step = compute beyond the median of the other stages of its pipeline in every
-- step (the minimum over steps: a partition is the same every step, contention is not), a candidate
-- for rebalancing the partition, reported only when the replay says it is worth it.
-- Columns: run, rank, pipeline_id, stage, own_ns_per_step, others_own_ns_per_step,
-- excess_ns_per_step, excess_pct, structural_ns_per_step, structural_pct, stall_caused_ns_per_step,
-- steps, steps_in_excess, is_finding, is_structural, rank_order (1 = largest excess in the run, all pipelines together).
CREATE OR REPLACE TEMP VIEW pipeline_slow_stages AS
WITH own AS (SELECT run, rank, pipeline_id, stage, step, step_ns, busy_ns, other_idle_ns,
                    busy_ns + other_idle_ns AS own_ns FROM pipeline_bubbles),
cmp AS (
    SELECT a.run, a.rank, a.pipeline_id, a.stage, a.step, a.step_ns, a.own_ns, a.busy_ns, a.other_idle_ns,
           median(b.own_ns) AS others_ns, median(b.busy_ns) AS others_busy_ns, median(b.other_idle_ns) AS others_idle_ns
    FROM own a JOIN own b ON a.run = b.run AND a.pipeline_id = b.pipeline_id AND a.step = b.step AND a.rank <> b.rank
    GROUP BY a.run, a.rank, a.pipeline_id, a.stage, a.step, a.step_ns, a.own_ns, a.busy_ns, a.other_idle_ns
),
dp_counted AS (
    SELECT *, count(*) OVER (PARTITION BY run, stage, step) AS n_group,
           count(*) OVER (PARTITION BY run, stage, step, pipeline_id) AS n_pipe,
           count(*) OVER (PARTITION BY run, rank, step) AS n_rank,
           rank() OVER (PARTITION BY run, stage, step ORDER BY own_ns NULLS LAST) - 1 AS below  -- known values < own_ns
    FROM own
),
dp_known AS (SELECT run, stage, step, list(own_ns ORDER BY own_ns) FILTER (WHERE own_ns IS NOT NULL) AS v FROM own GROUP BY ALL),
dp_loo AS (  -- one row of the rank's step and of its pipeline's stage: the median of the other replicas
    -- from the sorted values without its own (a self-join of every replica with every other is
    -- quadratic in the replicas: 1,024 of them at 8,192 ranks)
    SELECT c.run, c.rank, c.step, c.own_ns, c.below, coalesce(k.v, []) AS v,
           len(coalesce(k.v, [])) - CASE WHEN c.own_ns IS NULL THEN 0 ELSE 1 END AS m
    FROM dp_counted c LEFT JOIN dp_known k USING (run, stage, step)
    WHERE c.n_pipe = 1 AND c.n_rank = 1 AND c.n_group > 1
),
dp_pos AS (
    SELECT *, (m - 1) // 2 AS k1,  -- the median is at (m - 1) / 2 of the m others: between k1 and m // 2
           CASE WHEN own_ns IS NULL OR (m - 1) // 2 < below THEN v[(m - 1) // 2 + 1] ELSE v[(m - 1) // 2 + 2] END AS lo,
           CASE WHEN own_ns IS NULL OR m // 2 < below THEN v[m // 2 + 1] ELSE v[m // 2 + 2] END AS hi
    FROM dp_loo
),
dp_peers AS (  -- the same stage in the other replicas, same step
    SELECT run, rank, step,
           CASE WHEN m > 0 THEN lo::DOUBLE * (1 - ((m - 1) / 2 - k1)) + hi::DOUBLE * ((m - 1) / 2 - k1) END AS peer_own_ns
    FROM dp_pos
    UNION ALL  -- several rows of one rank's step or of one pipeline's stage (rare): the self-join
    SELECT a.run, a.rank, a.step, median(b.own_ns) AS peer_own_ns
    FROM (SELECT * FROM dp_counted WHERE n_rank > 1 OR n_pipe > 1) a
    JOIN own b ON a.run = b.run AND a.stage = b.stage AND a.step = b.step AND a.pipeline_id <> b.pipeline_id
    GROUP BY a.run, a.rank, a.step
),
excess AS (
    SELECT c.*, coalesce(c.own_ns - d.peer_own_ns, c.other_idle_ns - c.others_idle_ns) AS excess_ns
    FROM cmp c LEFT JOIN dp_peers d USING (run, rank, step)
),
per_rank AS (
    SELECT c.run, c.rank, any_value(c.pipeline_id) AS pipeline_id, any_value(c.stage) AS stage,
           median(c.own_ns) AS own_ns_per_step, median(c.others_ns) AS others_own_ns_per_step,
           median(c.excess_ns) AS excess_ns_per_step,
           100.0 * median(c.excess_ns) / nullif(median(c.step_ns), 0) AS excess_pct,
           min(c.busy_ns - c.others_busy_ns) AS structural_ns_per_step,
           100.0 * min(c.busy_ns - c.others_busy_ns) / nullif(median(c.step_ns), 0) AS structural_pct,
           count(*) AS steps, count(*) FILTER (WHERE c.excess_ns > 0) AS steps_in_excess
    FROM excess c GROUP BY c.run, c.rank
)
SELECT p.* EXCLUDE (steps, steps_in_excess), c.stall_caused_ns_per_step, p.steps, p.steps_in_excess,
       p.excess_pct >= getvariable('slow_stage_min_excess_pct')
           AND 100.0 * p.steps_in_excess >= getvariable('finding_min_steps_pct') * p.steps AS is_finding,
       p.excess_pct < getvariable('slow_stage_min_excess_pct')
           AND p.structural_pct >= getvariable('slow_stage_min_excess_pct') AS is_structural,
       row_number() OVER (PARTITION BY p.run ORDER BY p.excess_ns_per_step DESC, p.rank) AS rank_order
FROM per_rank p LEFT JOIN pipeline_stall_causes c USING (run, rank);
