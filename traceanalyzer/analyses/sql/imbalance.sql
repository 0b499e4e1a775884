-- Load imbalance: is the work spread evenly over the ranks?
--
-- Per step, each rank's compute time (merged compute intervals, activity.sql: kernels on GPU
-- ranks, CPU operators on gloo ranks) and the spread over the ranks: max/mean and the coefficient
-- of variation. Waiting is not work: a slow rank that sleeps or stalls shows up as a straggler
-- (stragglers.sql), a rank given more work shows up here.
--
-- Parameters (DuckDB variables set by traceanalyzer.analyses):
--   imbalance_min_ratio       a rank is a finding when its compute is at least this times the mean
--                             of the ranks (median over steps) (default 1.1)
--   imbalance_min_excess_pct  ... and the excess over the mean is at least this % of the median
--                             step time (default 5)
--   seqlen_min_corr           forward and backward durations correlated at least this much across
--                             steps suggest sequence-length imbalance (default 0.9)
--   routing_min_ratio         MoE routing: a rank sending or receiving at least this times the mean
--                             all_to_all bytes is a routing-skew finding (default 1.25)
--
-- A rank above these thresholds that ran the same operations on the same input shapes as its peers
-- has a slower host, not more work: no finding (same_work, work.sql).
--
-- max_rank (the rank with the most): a tie goes to the lowest rank, whatever order the rows come in.
--
-- requires: activity, phases, work

-- Columns: run, step, n_ranks, mean_ns, max_ns, min_ns, max_over_mean, cv, max_rank.
CREATE OR REPLACE TEMP VIEW imbalance_steps AS
WITH per_rank AS (
    SELECT run, rank, step, sum(compute_ns) AS compute_ns FROM _activity_steps GROUP BY run, rank, step
)
SELECT run, step, count(*) AS n_ranks, avg(compute_ns) AS mean_ns, max(compute_ns) AS max_ns,
       min(compute_ns) AS min_ns, max(compute_ns) / nullif(avg(compute_ns), 0) AS max_over_mean,
       stddev_pop(compute_ns) / nullif(avg(compute_ns), 0) AS cv,
       arg_max(rank, (compute_ns, -rank)) FILTER (WHERE compute_ns IS NOT NULL) AS max_rank  -- (NULL, r) > (x, r)
FROM per_rank GROUP BY ALL;

-- Per rank: compute relative to the mean of its peers, median over steps; the finding rows.
-- Peers (work.sql's _imbalance_peers): every rank of the run, except in a pipeline (pipelines.sql),
-- where a rank is compared only with the ranks holding the same stage in the other replicas (its
-- data-parallel peers): stages do different work by design (the last one holds the loss and head,
-- a partition is rarely even), which is the pipeline's structure, not an imbalance (bubbles.sql
-- weighs the stages). A pipeline without replicas has no peers, hence no imbalance finding here.
-- Columns: run, rank, compute_ns_per_step, ratio_to_mean, excess_ns_per_step, excess_pct (of the
-- median step time), steps, steps_max (steps in which it did the most work), above_thresholds,
-- same_work (work.sql: the same ops on the same input shapes as its peers; NULL unknown),
-- is_finding (above the thresholds and not the same work), rank_order (1 = most excess work).
CREATE OR REPLACE TEMP VIEW imbalance_ranks AS
WITH per_rank AS (
    SELECT a.run, a.rank, a.step, any_value(p.peers) AS peers, sum(a.compute_ns) AS compute_ns
    FROM _activity_steps a JOIN _imbalance_peers p USING (run, rank)
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

-- Sequence-length imbalance signal: per rank, the correlation across steps of its forward and
-- backward durations (phases.sql). Columns: run, rank, steps, fwd_bwd_corr, signal.
CREATE OR REPLACE TEMP VIEW seqlen_signal AS
SELECT run, rank, count(*) AS steps, corr(forward_ns, backward_ns) AS fwd_bwd_corr,
       coalesce(corr(forward_ns, backward_ns) >= getvariable('seqlen_min_corr') AND count(*) >= getvariable('seqlen_min_steps'), false) AS signal
FROM step_phases GROUP BY ALL;

-- Each rank's all_to_all calls: how many, bytes sent and received. Columns: run, rank, n_all_to_all,
-- sent_bytes, recv_bytes.
-- scope: rank
CREATE OR REPLACE TEMP VIEW _all_to_all_ranks AS
SELECT run, rank, count(*) AS n_all_to_all, sum(in_bytes) AS sent_bytes, sum(out_bytes) AS recv_bytes
FROM comms WHERE op = 'all_to_all' GROUP BY ALL;

-- MoE routing: all_to_all bytes sent and received per rank (from the recorded sizes of each
-- rank's input and output). A rank whose received (or sent) bytes are at least routing_min_ratio
-- times the mean of the ranks is a finding: its experts get more tokens than the others'.
-- Columns: run, rank, n_all_to_all, sent_bytes, recv_bytes, sent_over_mean, recv_over_mean,
-- is_finding, rank_order (1 = most bytes over the mean).
CREATE OR REPLACE TEMP VIEW all_to_all_balance AS
WITH a AS (SELECT * FROM _all_to_all_ranks),  -- its per-rank part, made in the map
r AS (
    SELECT *, sent_bytes / nullif(avg(sent_bytes) OVER (PARTITION BY run), 0) AS sent_over_mean,
           recv_bytes / nullif(avg(recv_bytes) OVER (PARTITION BY run), 0) AS recv_over_mean
    FROM a
)
SELECT *, coalesce(greatest(sent_over_mean, recv_over_mean) >= getvariable('routing_min_ratio'), false) AS is_finding,
       row_number() OVER (PARTITION BY run ORDER BY greatest(sent_over_mean, recv_over_mean) DESC NULLS LAST, rank) AS rank_order
FROM r;

-- Imbalance per op type: for each kernel (GPU) or CPU operator name, its time per rank and step,
-- and how unevenly the ranks spend it (median over steps). Shows *which* work is unbalanced.
-- Columns: run, category, name, n_ranks, mean_ns_per_step (mean over ranks), max_ns_per_step,
-- max_rank (rank with the most, most often), max_over_mean, excess_ns_per_step (max - mean),
-- rank_order (1 = largest excess).
CREATE OR REPLACE TEMP VIEW imbalance_ops AS
WITH per_rank AS (SELECT * FROM _activity_ops),  -- its per-rank part, made in the map
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
