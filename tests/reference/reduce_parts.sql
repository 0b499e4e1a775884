-- The reduce's SQL of imbalance_ops and _collective_blocked before their per-rank parts moved into
-- the map (session 18, issue 18 part 4; analyses/sql/imbalance.sql, stragglers.sql at ef68d65), kept
-- as the reference tests/test_reduce_parts.py compares the map/reduce views with: each computed
-- over every rank's intervals and segments in one connection. Only the view names differ.

-- Imbalance per op type: for each kernel (GPU) or CPU operator name, its time per rank and step,
-- and how unevenly the ranks spend it (median over steps). Shows *which* work is unbalanced.
-- Columns: run, category, name, n_ranks, mean_ns_per_step (mean over ranks), max_ns_per_step,
-- max_rank (rank with the most, most often), max_over_mean, excess_ns_per_step (max - mean),
-- rank_order (1 = largest excess).
CREATE OR REPLACE TEMP VIEW _ref_imbalance_ops AS
WITH per_rank AS (
    SELECT run, step, category, name, rank, sum(hi_ns - lo_ns) AS ns
    FROM activity_intervals WHERE step IS NOT NULL GROUP BY ALL
),
ranks_per_run AS (SELECT run, count(DISTINCT rank) AS n FROM per_rank GROUP BY run),
per_step AS (
    SELECT p.run, p.step, p.category, p.name, sum(p.ns) / any_value(r.n) AS mean_ns, max(p.ns) AS max_ns,
           arg_max(p.rank, (p.ns, -p.rank)) AS max_rank, any_value(r.n) AS n_ranks
    FROM per_rank p JOIN ranks_per_run r USING (run) GROUP BY p.run, p.step, p.category, p.name
),
most_often AS (  -- the rank with the most, most often; a tie goes to the lowest rank (mode() picks any)
    SELECT run, category, name, first(max_rank ORDER BY n DESC, max_rank) AS max_rank
    FROM (SELECT run, category, name, max_rank, count(*) AS n FROM per_step WHERE n_ranks > 1 GROUP BY ALL)
    GROUP BY ALL
)
SELECT s.run, s.category, s.name, any_value(s.n_ranks) AS n_ranks, median(s.mean_ns) AS mean_ns_per_step,
       median(s.max_ns) AS max_ns_per_step, any_value(m.max_rank) AS max_rank,
       median(s.max_ns / nullif(s.mean_ns, 0)) AS max_over_mean, median(s.max_ns - s.mean_ns) AS excess_ns_per_step,
       row_number() OVER (PARTITION BY s.run ORDER BY median(s.max_ns - s.mean_ns) DESC, s.category, s.name) AS rank_order
FROM per_step s JOIN most_often m USING (run, category, name) WHERE s.n_ranks > 1 GROUP BY s.run, s.category, s.name;

-- Per rank, step and phase: the time the rank sat blocked in a collective waiting for its last
-- member -- between its own call and the last member's arrival, with none of its compute running
-- (FSDP's all_gather in forward blocks the rank; DDP's all_reduce runs beside backward and blocks
-- nothing). Columns: run, rank, step, phase, wait_ns.
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
