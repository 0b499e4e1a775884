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
-- each (step, phase, name) keeps its values sorted once (_sorted), and the median of the others
-- of the value at sorted position i is read from that list with position i left out:
-- others(k) = v[k] for k < i, v[k + 1] from i on; with c = n - 1 others, the median is others((c-1)/2)
-- for odd c, the mean of others(c/2 - 1) and others(c/2) for even c (as DuckDB's median).
CREATE OR REPLACE TEMP VIEW _user_annotation_excess AS
WITH names AS (SELECT DISTINCT run, phase, name FROM _user_annotation_time),
grid AS (
    SELECT p.run, p.rank, p.step, n.phase, n.name, coalesce(t.ns, 0) AS ns
    FROM step_phases p JOIN names n USING (run)
    LEFT JOIN _user_annotation_time t USING (run, rank, step, phase, name)
),
_ranked AS (
    SELECT *, row_number() OVER (PARTITION BY run, step, phase, name ORDER BY ns, rank) - 1 AS i
    FROM grid
),
_sorted AS (
    SELECT run, step, phase, name, list(ns ORDER BY ns, rank) AS v, count(*) AS n
    FROM grid GROUP BY ALL
),
_others AS (
    SELECT r.run, r.rank, r.step, r.phase, r.name, r.ns, r.i, s.v, s.n - 1 AS c
    FROM _ranked r JOIN _sorted s USING (run, step, phase, name)
    WHERE s.n > 1
),
_mid AS (  -- 0-based positions among the others of the one or two middle values
    SELECT *, CASE WHEN c % 2 = 1 THEN (c - 1) // 2 ELSE c // 2 - 1 END AS k1, c // 2 AS k2 FROM _others
)
SELECT run, rank, step, phase, name, ns,
       CASE WHEN c % 2 = 1 THEN v[(CASE WHEN k1 < i THEN k1 ELSE k1 + 1 END) + 1]
            ELSE (v[(CASE WHEN k1 < i THEN k1 ELSE k1 + 1 END) + 1] + v[(CASE WHEN k2 < i THEN k2 ELSE k2 + 1 END) + 1]) / 2.0
       END AS others_ns,
       ns - CASE WHEN c % 2 = 1 THEN v[(CASE WHEN k1 < i THEN k1 ELSE k1 + 1 END) + 1]
                 ELSE (v[(CASE WHEN k1 < i THEN k1 ELSE k1 + 1 END) + 1] + v[(CASE WHEN k2 < i THEN k2 ELSE k2 + 1 END) + 1]) / 2.0
            END AS excess_ns
FROM _mid;
