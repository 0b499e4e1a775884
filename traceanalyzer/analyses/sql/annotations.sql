-- User annotations: the time each rank spent inside its named record_function ranges, innermost
-- range only, per step and phase; and each rank's excess over its peers per range name. The
-- stragglers' 'where' (stragglers.sql) names the range in which a slow rank lost its time.
--
-- Which ranges: CPU events of kind 'annotation' (Kineto's user_annotation category), except the
-- ones that are not a user's region of code: ProfilerStep#N (the step itself), communication
-- backends' spans (gloo:*, nccl:*), and pipeline schedules' actions (PP:<stage><action><mb>,
-- GPipe's 'Forward <mb>' / 'Backward <mb>'). torch's own named regions (Optimizer.step#SGD.step,
-- DistributedDataParallel.forward) are kept: they are named regions a user recognises.
-- Innermost: a range's exclusive time is its duration minus the ranges nested directly in it on
-- the same thread, so a region's time counts once, in the deepest range that holds it.
-- Phase: the phase of the step (phases.sql) in which the range starts. Steps are aligned
-- (step_alignment.sql).
--
-- requires: phases, step_alignment

-- Columns: run, rank, step, phase, name, ns (exclusive time in the step), n (ranges).
-- scope: rank
CREATE OR REPLACE TEMP VIEW _user_annotation_time AS
WITH ranges AS (
    SELECT run, rank, window_id, tid, step, event_id, name, ts_ns AS lo, ts_ns + dur_ns AS hi
    FROM events
    WHERE kind = 'annotation' AND NOT is_gpu AND step IS NOT NULL AND dur_ns > 0
      AND name NOT LIKE 'ProfilerStep#%' AND name NOT LIKE 'gloo:%' AND name NOT LIKE 'nccl:%'
      AND name NOT LIKE 'PP:%' AND NOT regexp_matches(name, '^(Forward|Backward) \d+$')
),
depth AS (  -- how many ranges of the same thread enclose each range
    SELECT a.*, count(b.event_id) AS depth
    FROM ranges a LEFT JOIN ranges b
      ON b.run = a.run AND b.rank = a.rank AND b.window_id = a.window_id AND b.tid = a.tid
     AND b.event_id <> a.event_id AND b.lo <= a.lo AND b.hi >= a.hi
    GROUP BY ALL
),
exclusive AS (
    SELECT a.run, a.rank, a.window_id, a.step, a.name, a.lo,
           a.hi - a.lo - coalesce(sum(c.hi - c.lo), 0) AS ns
    FROM depth a LEFT JOIN depth c
      ON c.run = a.run AND c.rank = a.rank AND c.window_id = a.window_id AND c.tid = a.tid
     AND c.depth = a.depth + 1 AND c.lo >= a.lo AND c.hi <= a.hi
    GROUP BY a.run, a.rank, a.window_id, a.tid, a.step, a.event_id, a.name, a.lo, a.hi
)
SELECT x.run, x.rank, p.step,
       CASE WHEN x.lo < p.step_start_ns + p.forward_ns THEN 'forward'
            WHEN x.lo < p.step_start_ns + p.forward_ns + p.backward_ns THEN 'backward'
            WHEN x.lo < p.step_start_ns + p.forward_ns + p.backward_ns + p.sync_ns THEN 'sync'
            ELSE 'optimizer' END AS phase,
       x.name, sum(x.ns) AS ns, count(*) AS n
FROM exclusive x JOIN step_alignment sa USING (run, rank, window_id, step)
JOIN step_phases p ON p.run = x.run AND p.rank = x.rank AND p.step = sa.aligned_step
GROUP BY ALL;

-- Per rank, step and range name: the rank's exclusive time in excess of the median of the other
-- ranks of the step (a rank without the range counts 0: a range only the slow rank has is all
-- excess). Columns: run, rank, step, phase, name, ns, others_ns, excess_ns.
-- Why not a self-join (each rank against every other): at 128 ranks that is 127 rows per grid row
-- (~19 M), and DuckDB plans it inside the straggler joins badly enough to spill gigabytes. Instead
-- each (step, phase, name) sorts its values once (position i), and the median of the others of the
-- value at sorted position i is read from the group's values with position i left out:
-- others(k) = v[k] for k < i, v[k + 1] from i on; with c = n - 1 others, the median is others((c-1)/2)
-- for odd c, the mean of others(c/2 - 1) and others(c/2) for even c (as DuckDB's median). Those
-- positions (k1, k2) are the group's, so only the values at k1, k1 + 1, k2, k2 + 1 are needed: one
-- row per group (_middle), not the sorted list joined to every rank's row (that read n values per
-- row: n^2 per group, 1.2 G values at 1,024 ranks, and a hash table the reduce could not spill).
CREATE OR REPLACE TEMP VIEW _user_annotation_excess AS
WITH names AS (SELECT DISTINCT run, phase, name FROM _user_annotation_time),
grid AS (
    SELECT p.run, p.rank, p.step, n.phase, n.name, coalesce(t.ns, 0) AS ns
    FROM step_phases p JOIN names n USING (run)
    LEFT JOIN _user_annotation_time t USING (run, rank, step, phase, name)
),
_ranked AS (
    SELECT *, row_number() OVER (PARTITION BY run, step, phase, name ORDER BY ns, rank) - 1 AS i,
              count(*) OVER (PARTITION BY run, step, phase, name) - 1 AS c
    FROM grid
),
_mid AS (  -- 0-based positions among the others of the one or two middle values
    SELECT *, CASE WHEN c % 2 = 1 THEN (c - 1) // 2 ELSE c // 2 - 1 END AS k1, c // 2 AS k2 FROM _ranked WHERE c > 0
),
_middle AS (  -- per group: the values at sorted positions k1, k1 + 1, k2, k2 + 1
    SELECT run, step, phase, name,
           any_value(ns) FILTER (WHERE i = k1) AS v_k1, any_value(ns) FILTER (WHERE i = k1 + 1) AS v_k1_next,
           any_value(ns) FILTER (WHERE i = k2) AS v_k2, any_value(ns) FILTER (WHERE i = k2 + 1) AS v_k2_next
    FROM _mid GROUP BY run, step, phase, name
),
_pick AS (
    SELECT m.run, m.rank, m.step, m.phase, m.name, m.ns, m.c,
           CASE WHEN m.k1 < m.i THEN g.v_k1 ELSE g.v_k1_next END AS o1,
           CASE WHEN m.k2 < m.i THEN g.v_k2 ELSE g.v_k2_next END AS o2
    FROM _mid m JOIN _middle g USING (run, step, phase, name)
)
SELECT run, rank, step, phase, name, ns,
       CASE WHEN c % 2 = 1 THEN o1 ELSE (o1 + o2) / 2.0 END AS others_ns,
       ns - CASE WHEN c % 2 = 1 THEN o1 ELSE (o1 + o2) / 2.0 END AS excess_ns
FROM _pick;
