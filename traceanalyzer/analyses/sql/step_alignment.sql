-- Step alignment: which ProfilerStep of each rank is the same training step as the others'.
--
-- Step numbers are the profiler's (ProfilerStep#N), counted by each process: ranks that start
-- profiling at different iterations, or a rank with several profiling windows, number the same
-- iteration differently. The synchronisation points say which steps belong together: a collective
-- instance (the same (pg, seq) on every member, collectives.sql) or a point-to-point transfer (a
-- send and its receive, p2p.sql) is one moment of one iteration on every rank it involves.
--
-- How: nodes are trace windows (run, rank, window_id); two windows are linked when they share a
-- synchronisation point, with d = (step of the first) - (step of the second), the most common d
-- over their shared points (a collective links each member to the group's lowest member; a receive
-- links to its send: a window's receives of one step from one peer are matched in one row with the
-- send window's group of the same p2p_seq range when that group holds each of them once, the rest
-- transfer by transfer, so that the join is per group, not per transfer: 50x fewer rows on an op
-- timeline of thousands of ranks). Each window's reference is the lowest (rank, window) within
-- step_alignment_max_hops (32) links of it
-- (one round of taking the neighbours' lowest per link: linear in the windows, where walking from
-- every window was quadratic); from each reference we walk the links (at most as many), adding up
-- d: delta(w), by the shortest walk, is what to add to w's step numbers to get the numbering of its
-- reference. Each set of windows with one reference is then shifted so that the most common delta
-- of the set is 0: ranks that agree keep their numbers, the odd ones are renumbered.
-- Windows with no synchronisation point keep their own numbers, and so do the runs that are op
-- timelines alone (ingest/op_timeline: their `step` is the training loop's iteration on every rank,
-- as the format says; linking their millions of transfers would only confirm it). Note: gloo collectives joined
-- without a Flight Recorder dump get their seq from the order in the window (seq_source =
-- 'order'), which is itself only right when every rank's window starts at the same iteration.
--
-- requires: (nothing: reads the canonical tables only)

-- Columns: run, rank, window_id, step (the profiler's), aligned_step (the same iteration's number
-- on every rank).
-- scope: align
CREATE OR REPLACE TEMP VIEW step_alignment AS
WITH RECURSIVE aligned_runs AS (  -- all but the runs of op timelines only (their steps: as given)
    SELECT run FROM ranks GROUP BY run
    HAVING NOT bool_and(coalesce(json_extract_string(trace_meta_json, '$.step_source') = 'op_timeline', false))
),
sync AS MATERIALIZED (  -- comms read once (a run of thousands of files: a scan is seconds); a semi join, so
    -- that nothing of them is read when no run needs them (an empty build side)
    SELECT run, is_p2p, op, coalesce(pg_name, '?') AS pg, seq, src_rank, dst_rank, tag, p2p_seq, rank, window_id, step
    FROM comms SEMI JOIN aligned_runs USING (run)
    WHERE step IS NOT NULL AND (NOT is_p2p AND seq IS NOT NULL
                                OR is_p2p AND op IN ('send', 'recv') AND src_rank IS NOT NULL AND dst_rank IS NOT NULL)
),
coll AS MATERIALIZED (SELECT run, pg, seq, rank, window_id, step FROM sync WHERE NOT is_p2p),
anchor AS (SELECT run, pg, seq, min(rank::BIGINT * 1000000 + window_id) AS node FROM coll GROUP BY ALL),
p2p AS (SELECT run, op, pg, src_rank, dst_rank, tag, p2p_seq, rank, window_id, step FROM sync WHERE is_p2p),
p2p_groups AS MATERIALIZED (  -- each side's transfers of one window and step with one peer: a range of p2p_seq
    -- (n: those with a p2p_seq; n_seqs: how many distinct, for sends only: a list per group costs half
    -- of count(DISTINCT))
    SELECT run, op, pg, src_rank, dst_rank, tag, rank, window_id, step,
           min(p2p_seq) AS lo, max(p2p_seq) AS hi, count(p2p_seq) AS n,
           list_unique(list(p2p_seq) FILTER (WHERE op = 'send')) AS n_seqs
    FROM p2p WHERE op = 'recv' AND rank = dst_rank OR op = 'send' AND rank = src_rank GROUP BY ALL
),
send_ranges AS (  -- send groups holding each p2p_seq of lo..hi once, and the only sends of their pair there
    SELECT * FROM (
        SELECT *, max(hi) OVER (PARTITION BY run, pg, src_rank, dst_rank, tag ORDER BY lo, hi
                                ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_hi,
                  lead(lo) OVER (PARTITION BY run, pg, src_rank, dst_rank, tag ORDER BY lo, hi) AS next_lo
        FROM p2p_groups WHERE op = 'send')
    WHERE n = n_seqs AND n = hi - lo + 1 AND (prev_hi IS NULL OR prev_hi < lo) AND (next_lo IS NULL OR next_lo > hi)
),
recv_groups AS (  -- receive groups, with the send group of the same range when there is one such
    SELECT r.*, s.rank AS s_rank, s.window_id AS s_win, s.step AS s_step
    FROM p2p_groups r LEFT JOIN send_ranges s ON s.run = r.run AND s.pg = r.pg AND s.src_rank = r.src_rank
     AND s.dst_rank = r.dst_rank AND s.tag IS NOT DISTINCT FROM r.tag AND s.lo = r.lo AND s.hi = r.hi
    WHERE r.op = 'recv'
),
slow_recv AS MATERIALIZED (  -- the receives of the other groups, joined transfer by transfer
    SELECT p.* FROM p2p p SEMI JOIN (SELECT * FROM recv_groups WHERE s_rank IS NULL) g
      ON g.run = p.run AND g.pg = p.pg AND g.src_rank = p.src_rank AND g.dst_rank = p.dst_rank
     AND g.tag IS NOT DISTINCT FROM p.tag AND g.rank = p.rank AND g.window_id IS NOT DISTINCT FROM p.window_id AND g.step = p.step
    WHERE p.op = 'recv' AND p.rank = p.dst_rank
),
links AS (  -- (window a, window b, d = step on a - step on b, n: shared synchronisation points)
    SELECT c.run, c.rank AS a_rank, c.window_id AS a_win, b.rank AS b_rank, b.window_id AS b_win, c.step - b.step AS d, 1 AS n
    FROM coll c JOIN anchor x USING (run, pg, seq)
    JOIN coll b ON b.run = c.run AND b.pg = c.pg AND b.seq = c.seq AND b.rank::BIGINT * 1000000 + b.window_id = x.node
    WHERE c.rank <> b.rank
    UNION ALL  -- a receive group fed by one send group of the same range: each of its n transfers is one link
    SELECT run, rank, window_id, s_rank, s_win, step - s_step, n FROM recv_groups WHERE s_rank IS NOT NULL
    UNION ALL
    SELECT r.run, r.rank, r.window_id, s.rank, s.window_id, r.step - s.step, 1
    FROM slow_recv r JOIN (SELECT p.* FROM p2p p SEMI JOIN slow_recv q ON q.run = p.run AND q.pg = p.pg
                            AND q.src_rank = p.src_rank AND q.dst_rank = p.dst_rank AND q.tag IS NOT DISTINCT FROM p.tag
                           WHERE p.op = 'send' AND p.rank = p.src_rank) s
      ON s.run = r.run AND s.pg = r.pg AND s.src_rank = r.src_rank AND s.dst_rank = r.dst_rank
     AND s.tag IS NOT DISTINCT FROM r.tag AND s.p2p_seq = r.p2p_seq
),
edges AS (  -- the most common d of each pair of windows (a tie: the smallest d)
    SELECT run, a_rank, a_win, b_rank, b_win, arg_max(d, (n, -d)) AS d FROM (
        SELECT run, a_rank, a_win, b_rank, b_win, d, sum(n) AS n FROM links GROUP BY ALL)
    GROUP BY ALL
),
both_ways AS (
    SELECT run, a_rank, a_win, b_rank, b_win, d FROM edges
    UNION ALL SELECT run, b_rank, b_win, a_rank, a_win, -d FROM edges
),
nodes AS (SELECT DISTINCT run, rank, window_id FROM steps),
label(run, rank, window_id, root, hop) AS (  -- after round k: the lowest window within k links
    SELECT run, rank, window_id, rank::BIGINT * 1000000 + window_id, 0 FROM nodes
    UNION ALL
    SELECT x.run, x.rank, x.window_id, min(x.root), any_value(x.hop) + 1
    FROM (SELECT run, rank, window_id, root, hop FROM label
          UNION ALL
          SELECT l.run, e.b_rank, e.b_win, l.root, l.hop
          FROM label l JOIN both_ways e ON e.run = l.run AND e.a_rank = l.rank AND e.a_win = l.window_id) x
    WHERE x.hop < getvariable('step_alignment_max_hops')
    GROUP BY x.run, x.rank, x.window_id
),
reference AS (SELECT run, rank, window_id, min(root) AS root FROM label GROUP BY ALL),
reach(run, root, rank, window_id, delta, hop) AS (  -- walks from the references only
    SELECT n.run, n.rank::BIGINT * 1000000 + n.window_id, n.rank, n.window_id, 0, 0
    FROM nodes n SEMI JOIN reference r ON r.run = n.run AND r.root = n.rank::BIGINT * 1000000 + n.window_id
    UNION
    SELECT r.run, r.root, e.b_rank, e.b_win, r.delta + e.d, r.hop + 1
    FROM reach r JOIN both_ways e ON e.run = r.run AND e.a_rank = r.rank AND e.a_win = r.window_id
    WHERE r.hop < getvariable('step_alignment_max_hops')
),
component AS (  -- each window's delta from its reference, by the shortest walk
    SELECT x.run, x.rank, x.window_id, arg_min(x.delta, (x.hop, x.delta)) AS delta, x.root
    FROM reach x JOIN reference f ON f.run = x.run AND f.rank = x.rank AND f.window_id = x.window_id AND f.root = x.root
    GROUP BY x.run, x.rank, x.window_id, x.root
),
shifted AS (SELECT *, delta - mode(delta ORDER BY delta) OVER (PARTITION BY run, root) AS shift FROM component)
SELECT s.run, s.rank, s.window_id, s.step, CAST(s.step + coalesce(x.shift, 0) AS INTEGER) AS aligned_step
FROM steps s LEFT JOIN shifted x USING (run, rank, window_id);

-- The steps table with each step's aligned number. Columns: those of steps, aligned_step.
-- scope: rank
CREATE OR REPLACE TEMP VIEW _aligned_steps AS
SELECT s.*, a.aligned_step FROM steps s JOIN step_alignment a USING (run, rank, window_id, step);
