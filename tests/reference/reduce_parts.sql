-- The reduce's SQL of imbalance_ops before its per-rank part moved into the map (session 18, issue
-- 18 part 4; analyses/sql/imbalance.sql at ef68d65), kept as the reference tests/test_reduce_parts.py
-- compares the map/reduce view with: computed over every rank's intervals in one connection. Only
-- the view's name differs.

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
