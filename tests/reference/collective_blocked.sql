-- _collective_blocked as it was before its compute was found through time buckets (session 19,
-- issue 18): every clipped wait joined with every compute segment of its rank. Frozen here as the
-- reference of tests/test_collective_blocked.py; reads collective_ranks, clock_offsets, step_phases,
-- activity_segments and the _union_intervals macro (intervals.sql).
CREATE OR REPLACE TEMP VIEW _ref_collective_blocked AS
WITH w AS (  -- from its arrival to the last member's, on the rank's own clock (the offset taken back out)
    SELECT {'run': r.run, 'rank': r.rank} AS grp, r.arrival_ns - coalesce(o.offset_ns, 0) AS lo_ns,
           r.arrival_ns - coalesce(o.offset_ns, 0) + r.wait_ns AS hi_ns
    FROM collective_ranks r LEFT JOIN clock_offsets o ON o.run = r.run AND o.rank = r.rank
    WHERE r.wait_ns > 0
),
u AS (SELECT grp.run AS run, grp.rank AS rank, lo_ns, hi_ns FROM _union_intervals(w)),
ph AS (
    SELECT run, rank, step, 'forward' AS phase, step_start_ns AS lo, step_start_ns + forward_ns AS hi FROM step_phases
    UNION ALL
    SELECT run, rank, step, 'backward', step_start_ns + forward_ns, step_start_ns + forward_ns + backward_ns FROM step_phases
    UNION ALL
    SELECT run, rank, step, 'optimizer', step_end_ns - optimizer_ns, step_end_ns FROM step_phases
),
clip AS (
    SELECT p.run, p.rank, p.step, p.phase, greatest(u.lo_ns, p.lo) AS lo, least(u.hi_ns, p.hi) AS hi
    FROM u JOIN ph p ON p.run = u.run AND p.rank = u.rank AND u.lo_ns < p.hi AND u.hi_ns > p.lo
),
busy AS (  -- compute inside each clipped wait (activity segments are disjoint)
    SELECT c.run, c.rank, c.step, c.phase, c.lo, sum(least(a.hi_ns, c.hi) - greatest(a.lo_ns, c.lo)) AS busy_ns
    FROM clip c JOIN activity_segments a
      ON a.run = c.run AND a.rank = c.rank AND a.n_compute > 0 AND a.lo_ns < c.hi AND a.hi_ns > c.lo
    GROUP BY ALL
)
SELECT c.run, c.rank, c.step, c.phase, sum(c.hi - c.lo - coalesce(b.busy_ns, 0)) AS wait_ns
FROM clip c LEFT JOIN busy b USING (run, rank, step, phase, lo)
GROUP BY ALL;
