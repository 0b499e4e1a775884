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
-- The idle stretches themselves, per rank and step, are made in pipeline_gaps.sql (per rank, in the map)
-- and added up per step and kind (_pipeline_idle_steps); pipeline_idle.sql lists them one by one.
--
-- requires: pipeline_gaps, pipelines, step_alignment

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
LEFT JOIN _pipeline_idle_steps i ON i.run = st.run AND i.rank = st.rank AND i.step = s.aligned_step
GROUP BY st.run, st.rank, st.pipeline_id, st.stage, s.aligned_step, s.dur_ns;

-- Which stage held the others up: stall time charged to each rank, summed over the stages that
-- waited for it, per step (median over steps). The slow stage comes first (per pipeline).
-- Columns: run, rank, pipeline_id, stage, stall_caused_ns_per_step, stall_caused_pct (of the
-- median step), other_idle_ns_per_step (its own host-side delays), rank_order (1 = the rank its
-- pipeline stalled on most).
CREATE OR REPLACE TEMP VIEW pipeline_stall_causes AS
WITH caused AS (
    SELECT run, caused_by_rank AS rank, step, sum(dur_ns) AS ns FROM _pipeline_idle_steps WHERE kind = 'stall' GROUP BY ALL
),
own AS (SELECT run, rank, step, sum(dur_ns) AS ns FROM _pipeline_idle_steps WHERE kind = 'other' GROUP BY ALL),
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
dp_known AS (  -- of the group's L known values in order (v), the five a median of the others can need
    -- (as stragglers.sql's _phase_excess): m = L - 1 others (the rank's own value known): v at
    -- (L-2)//2 + 1, + 2 and (L-1)//2 + 1, + 2; m = L (unknown): v at (L-1)//2 + 1 and L//2 + 1.
    -- Scalars, not the list: every replica joined to its group's list of 1,024 values: 9.7 s against 2.5 at 8,192 ranks.
    SELECT run, stage, step, len(v) AS n_v, v[(len(v) - 2) // 2 + 1] AS a1, v[(len(v) - 2) // 2 + 2] AS a2,
           v[(len(v) - 1) // 2 + 1] AS b1, v[(len(v) - 1) // 2 + 2] AS b2, v[len(v) // 2 + 1] AS c1
    FROM (SELECT run, stage, step, list(own_ns ORDER BY own_ns) FILTER (WHERE own_ns IS NOT NULL) AS v FROM own GROUP BY ALL)
),
dp_loo AS (  -- one row of the rank's step and of its pipeline's stage: the median of the other replicas
    -- from the sorted values without its own (a self-join of every replica with every other is
    -- quadratic in the replicas: 1,024 of them at 8,192 ranks)
    SELECT c.run, c.rank, c.step, c.own_ns, c.below, k.a1, k.a2, k.b1, k.b2, k.c1,
           coalesce(k.n_v, 0) - CASE WHEN c.own_ns IS NULL THEN 0 ELSE 1 END AS m
    FROM dp_counted c LEFT JOIN dp_known k USING (run, stage, step)
    WHERE c.n_pipe = 1 AND c.n_rank = 1 AND c.n_group > 1
),
dp_pos AS (  -- v[(m - 1) // 2 + 1 or + 2] and v[m // 2 + 1 or + 2], from the five above
    SELECT *, (m - 1) // 2 AS k1,  -- the median is at (m - 1) / 2 of the m others: between k1 and m // 2
           CASE WHEN own_ns IS NULL THEN b1 WHEN (m - 1) // 2 < below THEN a1 ELSE a2 END AS lo,
           CASE WHEN own_ns IS NULL THEN c1 WHEN m // 2 < below THEN b1 ELSE b2 END AS hi
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
