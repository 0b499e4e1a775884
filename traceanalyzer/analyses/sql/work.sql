-- Same work? Whether a rank ran the same compute operations, on the same input shapes, as its
-- peers: the rule imbalance.sql applies before it calls a rank imbalanced.
--
-- A rank whose compute takes well above its peers' is imbalanced (given more work: a bigger batch,
-- longer sequences, more tokens for its expert) only if it runs more, or bigger, operations. A rank
-- that runs exactly the operations its peers run, on the same input shapes, and takes longer, has
-- a slower host (a busier or slower core, a noisy neighbour): the fix is not to rebalance the work,
-- and if its peers waited for it long enough it is a straggler (stragglers.sql), which names it on
-- its own (issue 14: a no-overlap DDP run whose rank 1 ran every op ~15 % slower, on a quiet
-- 2-core host, was named beside the real cause).
--
-- The check: the run's main compute operations (the same_work_top_ops largest by time per step,
-- activity.sql's compute intervals) counted per (step, name, input shapes) from the recorded
-- `Input Dims` (Kineto record_shapes; shapes.sql), over the steps every rank of the group
-- recorded, compared between a rank and its peers (the ranks imbalance.sql compares its compute
-- with: in a pipeline the replicas of its stage, else every rank of the run). Ops that carry no
-- shapes (autograd's wrappers; kernels, on GPU ranks) tell nothing and are left out. The same
-- counts on every rank of a group: the same work. Unknown (NULL): no peer, or a rank of the group without recorded shapes
-- (record_shapes off, GPU kernels only, an op timeline).
--
-- Parameters (DuckDB variables set by traceanalyzer.analyses):
--   same_work_top_ops  how many of the run's largest compute ops (by time per step) are compared
--                      (default 8)
--
-- requires: shapes, activity, pipelines

-- Each rank's peers: every rank of the run, except in a pipeline (pipelines.sql), where a rank's
-- peers are the ranks holding the same stage in the other replicas (stages do different work by
-- design). imbalance.sql compares compute within these groups too.
-- Columns: run, rank, peers ('all' or 'stage N'), n_ranks (ranks of the group).
CREATE OR REPLACE TEMP VIEW _imbalance_peers AS
WITH ranks AS (
    SELECT a.run, a.rank, coalesce('stage ' || any_value(ps.stage), 'all') AS peers
    FROM (SELECT DISTINCT run, rank FROM _activity_steps) a
    LEFT JOIN pipeline_stages ps ON ps.run = a.run AND ps.rank = a.rank
    GROUP BY a.run, a.rank
)
SELECT *, count(*) OVER (PARTITION BY run, peers) AS n_ranks FROM ranks;

-- The run's main compute operations: the largest by time per step (summed over the ranks, median
-- over the steps), at most same_work_top_ops of them. Columns: run, name.
CREATE OR REPLACE TEMP VIEW _work_ops AS
WITH per_step AS (
    SELECT run, step, name, sum(ns) AS ns FROM _activity_ops WHERE category = 'compute' GROUP BY ALL
)
SELECT run, name FROM per_step GROUP BY run, name
QUALIFY row_number() OVER (PARTITION BY run ORDER BY median(ns) DESC, name) <= getvariable('same_work_top_ops');

-- Per rank: did it run the same work as its peers? true: the same count of every compared
-- (step, op, input shapes) as each of them; false: not; NULL: unknown (no peer, or a rank of its
-- group recorded no shapes of the compared ops in the steps they all recorded).
-- Columns: run, rank, same_work.
CREATE OR REPLACE TEMP VIEW _same_work AS
WITH common_steps AS (  -- the steps every rank of a group recorded
    SELECT p.run, p.peers, s.step
    FROM _imbalance_peers p JOIN (SELECT DISTINCT run, rank, step FROM _activity_steps WHERE step IS NOT NULL) s
         USING (run, rank)
    GROUP BY p.run, p.peers, s.step HAVING count(DISTINCT p.rank) = any_value(p.n_ranks)
),
compared AS (
    SELECT o.run, o.rank, p.peers, o.step, o.name, o.input_dims, o.n
    FROM _op_shapes o JOIN _imbalance_peers p USING (run, rank)
    SEMI JOIN _work_ops w USING (run, name)
    SEMI JOIN common_steps c USING (run, peers, step)
),
per_key AS (  -- one compared (step, op, shapes): run by every rank of the group, as often?
    SELECT c.run, c.peers, count(*) = any_value(p.n_ranks) AND min(c.n) = max(c.n) AS same
    FROM compared c JOIN (SELECT DISTINCT run, peers, n_ranks FROM _imbalance_peers) p USING (run, peers)
    GROUP BY c.run, c.peers, c.step, c.name, c.input_dims
),
per_group AS (
    SELECT g.run, g.peers, any_value(g.n_ranks) AS n_ranks, count(DISTINCT c.rank) AS with_shapes
    FROM _imbalance_peers g LEFT JOIN compared c USING (run, peers, rank)
    GROUP BY g.run, g.peers
),
verdict AS (
    SELECT g.run, g.peers,
           CASE WHEN g.n_ranks < 2 OR g.with_shapes < g.n_ranks THEN NULL ELSE k.same END AS same_work
    FROM per_group g LEFT JOIN (SELECT run, peers, bool_and(same) AS same FROM per_key GROUP BY ALL) k USING (run, peers)
)
SELECT p.run, p.rank, v.same_work FROM _imbalance_peers p JOIN verdict v USING (run, peers);
