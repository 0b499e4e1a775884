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

-- The reduce's per-step compute of imbalance_steps and imbalance_ranks, and work.sql's _work_ops,
-- before they read the map's _activity_steps and _activity_ops (session 26, issue 17;
-- analyses/sql/imbalance.sql and work.sql at 2b39893): every rank's segments and intervals.

CREATE OR REPLACE TEMP VIEW _ref_imbalance_steps AS
WITH per_rank AS (
    SELECT run, rank, step, sum(dur_ns) FILTER (WHERE n_compute > 0) AS compute_ns
    FROM activity_segments GROUP BY ALL
)
SELECT run, step, count(*) AS n_ranks, avg(compute_ns) AS mean_ns, max(compute_ns) AS max_ns,
       min(compute_ns) AS min_ns, max(compute_ns) / nullif(avg(compute_ns), 0) AS max_over_mean,
       stddev_pop(compute_ns) / nullif(avg(compute_ns), 0) AS cv,
       arg_max(rank, (compute_ns, -rank)) FILTER (WHERE compute_ns IS NOT NULL) AS max_rank  -- (NULL, r) > (x, r)
FROM per_rank GROUP BY ALL;

CREATE OR REPLACE TEMP VIEW _ref_imbalance_ranks AS
WITH per_rank AS (
    SELECT a.run, a.rank, a.step, any_value(p.peers) AS peers,
           sum(a.dur_ns) FILTER (WHERE a.n_compute > 0) AS compute_ns
    FROM activity_segments a JOIN _imbalance_peers p USING (run, rank)
    GROUP BY a.run, a.rank, a.step
),
peer_steps AS (
    SELECT run, peers, step, avg(compute_ns) AS mean_ns,
           arg_max(rank, (compute_ns, -rank)) FILTER (WHERE compute_ns IS NOT NULL) AS max_rank
    FROM per_rank GROUP BY ALL
),
rel AS (
    SELECT p.* EXCLUDE (peers), p.compute_ns / nullif(s.mean_ns, 0) AS ratio, p.compute_ns - s.mean_ns AS excess_ns,
           s.max_rank = p.rank AS is_max
    FROM per_rank p JOIN peer_steps s USING (run, peers, step)
),
step_time AS (SELECT run, median(step_ns) AS step_ns FROM step_phases GROUP BY ALL),
agg AS (
    SELECT r.run, r.rank, median(r.compute_ns) AS compute_ns_per_step, median(r.ratio) AS ratio_to_mean,
           median(r.excess_ns) AS excess_ns_per_step,
           100.0 * median(r.excess_ns) / nullif(any_value(t.step_ns), 0) AS excess_pct,
           count(*) AS steps, count(*) FILTER (WHERE r.is_max) AS steps_max
    FROM rel r LEFT JOIN step_time t USING (run) GROUP BY ALL
)
SELECT a.*, a.ratio_to_mean >= getvariable('imbalance_min_ratio')
          AND coalesce(a.excess_pct, 100) >= getvariable('imbalance_min_excess_pct') AS above_thresholds,
       w.same_work, above_thresholds AND w.same_work IS NOT TRUE AS is_finding,
       row_number() OVER (PARTITION BY a.run ORDER BY a.excess_ns_per_step DESC, a.rank) AS rank_order
FROM agg a LEFT JOIN _same_work w USING (run, rank);

CREATE OR REPLACE TEMP VIEW _ref_work_ops AS
WITH per_step AS (
    SELECT run, step, name, sum(hi_ns - lo_ns) AS ns
    FROM activity_intervals WHERE category = 'compute' AND step IS NOT NULL GROUP BY ALL
)
SELECT run, name FROM per_step GROUP BY run, name
QUALIFY row_number() OVER (PARTITION BY run ORDER BY median(ns) DESC, name) <= getvariable('same_work_top_ops');
