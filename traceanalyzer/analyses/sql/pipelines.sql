-- Pipelines: which ranks form a pipeline, its shape (stages, micro-batches, schedule) and the stage
-- of each rank. Pipelines are the connected components of the point-to-point graph (ranks are
-- nodes, a send or receive between two ranks is an edge): a job of several pipeline replicas (PP x
-- DP) has one component per replica, identified by pipeline_id = its smallest global rank. Within
-- a pipeline the stage order is the order in which its ranks first send in a step: stage 0 starts
-- the pipeline. The schedule comes from the annotations torch.distributed.pipelining emits:
-- 'Forward i'/'Backward i' (GPipe), 'PP:<stage>F<mb>' (Interleaved1F1B); none at all is 1F1B. The
-- micro-batch count m is the number of sends of the pipeline's first stage in a step (or the
-- distinct micro-batch numbers annotated), v is the number of stages per rank, p the number of
-- ranks of the pipeline; the theoretical bubble is (p-1)/(v*m+p-1) of the step.
-- Kept apart from bubbles.sql (which reads these views) so that the replay can bind the stages
-- alone: they read only comms, events, steps and step_alignment (through the per-rank parts above).
--
-- requires: step_alignment

-- Each rank's point-to-point peers as its calls name them (src_rank, dst_rank; NULL when unknown):
-- the per-rank part of the p2p graph, made in the map (summaries.py) so that the cross-rank views
-- below read a few rows per rank, not every rank's comms. Columns: run, rank, src_rank, dst_rank.
-- scope: rank
CREATE OR REPLACE TEMP VIEW _p2p_links AS
SELECT DISTINCT run, rank, src_rank, dst_rank FROM comms WHERE is_p2p;

-- Each rank's sends per (aligned) step: how many, and the first one's enqueue (rank clock).
-- Columns: run, rank, step, n_sends, first_send_ns.
-- scope: rank
CREATE OR REPLACE TEMP VIEW _send_steps AS
SELECT c.run, c.rank, a.aligned_step AS step, count(*) AS n_sends, min(c.enqueue_ts_ns) AS first_send_ns
FROM comms c JOIN step_alignment a USING (run, rank, window_id, step)
WHERE c.op = 'send' GROUP BY ALL;

-- The names of each rank's pipeline-schedule annotations ('Forward i', 'PP:<stage>F<mb>'), once each.
-- Columns: run, rank, name.
-- scope: rank
CREATE OR REPLACE TEMP VIEW _pipeline_annotations AS
SELECT DISTINCT run, rank, name FROM events
WHERE NOT is_gpu AND (name LIKE 'Forward %' OR name LIKE 'PP:%')
  AND (regexp_matches(name, '^Forward \d+$') OR regexp_matches(name, '^PP:\d+F\d+$'));

-- Which pipeline each p2p rank belongs to: the connected component of the p2p graph, found by
-- following edges from every rank until nothing new is reached (UNION drops what was seen).
-- Columns: run, rank, pipeline_id (smallest global rank of the component).
CREATE OR REPLACE TEMP VIEW _pipeline_members AS
WITH RECURSIVE nodes AS (SELECT DISTINCT run, rank FROM _p2p_links),
edges AS (
    SELECT DISTINCT run, src_rank AS a, dst_rank AS b FROM _p2p_links
    WHERE src_rank IS NOT NULL AND dst_rank IS NOT NULL AND src_rank <> dst_rank
),
both_ways AS (
    SELECT e.run, e.a, e.b FROM edges e
    SEMI JOIN nodes na ON na.run = e.run AND na.rank = e.a SEMI JOIN nodes nb ON nb.run = e.run AND nb.rank = e.b
    UNION SELECT e.run, e.b, e.a FROM edges e
    SEMI JOIN nodes na ON na.run = e.run AND na.rank = e.a SEMI JOIN nodes nb ON nb.run = e.run AND nb.rank = e.b
),
reach(run, rank, other) AS (
    SELECT run, rank, rank FROM nodes
    UNION
    SELECT r.run, r.rank, w.b FROM reach r JOIN both_ways w ON w.run = r.run AND w.a = r.other
)
SELECT run, rank, min(other) AS pipeline_id FROM reach GROUP BY run, rank;

-- Columns: run, pipeline_id, n_stages (p), stages_per_rank (v), microbatches (m), schedule,
-- theoretical_bubble_pct.
CREATE OR REPLACE TEMP VIEW pipeline_shape AS
WITH ann AS (
    SELECT m.run, m.pipeline_id,
           count(DISTINCT regexp_extract(name, '^Forward (\d+)$', 1)) FILTER (WHERE regexp_matches(name, '^Forward \d+$')) AS gpipe_mb,
           count(DISTINCT regexp_extract(name, '^PP:\d+F(\d+)$', 1)) FILTER (WHERE regexp_matches(name, '^PP:\d+F\d+$')) AS pp_mb,
           count(DISTINCT regexp_extract(name, '^PP:(\d+)F\d+$', 1)) FILTER (WHERE regexp_matches(name, '^PP:\d+F\d+$')) AS pp_stages
    FROM _pipeline_annotations e JOIN _pipeline_members m USING (run, rank)
    GROUP BY m.run, m.pipeline_id
),
first_stage_sends AS (  -- sends per step of the rank that sends first (the first stage), per pipeline
    SELECT run, pipeline_id, median(n) AS m FROM (
        SELECT run, pipeline_id, step, rank, n,
               row_number() OVER (PARTITION BY run, pipeline_id, step ORDER BY first_ts, rank) AS k
        FROM (SELECT c.run, m.pipeline_id, c.step, c.rank, c.n_sends AS n, c.first_send_ns AS first_ts
              FROM _send_steps c JOIN _pipeline_members m USING (run, rank)))
    WHERE k = 1 GROUP BY run, pipeline_id
),
shape AS (
    SELECT p.run, p.pipeline_id, count(*) AS n_stages,
           CASE WHEN coalesce(any_value(a.pp_mb), 0) > 0 THEN 'interleaved1f1b'
                WHEN coalesce(any_value(a.gpipe_mb), 0) > 0 THEN 'gpipe' ELSE '1f1b' END AS schedule,
           coalesce(nullif(any_value(a.pp_mb), 0), nullif(any_value(a.gpipe_mb), 0), any_value(f.m)) AS microbatches,
           greatest(coalesce(any_value(a.pp_stages), 0) // count(*), 1) AS stages_per_rank
    FROM _pipeline_members p LEFT JOIN ann a USING (run, pipeline_id) LEFT JOIN first_stage_sends f USING (run, pipeline_id)
    GROUP BY p.run, p.pipeline_id
)
SELECT run, pipeline_id, n_stages, stages_per_rank, microbatches, schedule,
       100.0 * (n_stages - 1) / (stages_per_rank * microbatches + n_stages - 1) AS theoretical_bubble_pct
FROM shape WHERE n_stages > 1;

-- Stage order: rank -> position in its pipeline (0 = first): the order in which the pipeline's ranks
-- first send in each (aligned) step, on the shared clock, median over steps. Data flows from stage 0,
-- so no stage sends before the stages upstream of it have sent -- however late the step of a rank
-- starts or however long stage 0 takes before its first send (a slow first stage). Times relative to
-- each rank's own step start are not comparable: a rank whose step starts late (it waited for a
-- data-parallel collective) would look upstream of the stage that feeds it.
-- Columns: run, rank, pipeline_id, stage.
CREATE OR REPLACE TEMP VIEW pipeline_stages AS
WITH first_sends AS (SELECT run, rank, step, first_send_ns AS first_send FROM _send_steps),
positions AS (
    SELECT f.run, f.rank, m.pipeline_id,
           row_number() OVER (PARTITION BY f.run, m.pipeline_id, f.step ORDER BY f.first_send, f.rank) AS pos
    FROM first_sends f JOIN _pipeline_members m USING (run, rank)
)
SELECT run, rank, pipeline_id,
       row_number() OVER (PARTITION BY run, pipeline_id ORDER BY median(pos), rank) - 1 AS stage
FROM positions
SEMI JOIN pipeline_shape USING (run, pipeline_id)
GROUP BY run, rank, pipeline_id;
