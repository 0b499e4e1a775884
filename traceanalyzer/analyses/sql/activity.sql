-- What each rank was doing, as labelled time segments: the base of overlap, exposed
-- communication, temporal breakdown and imbalance.
--
-- Intervals per rank, step and category:
--   GPU ranks (the window has kernels): compute = compute kernels, comm = communication kernels
--     (NCCL, symmetric-memory), memory = memcpy/memset, all streams together;
--   CPU ranks (gloo, no kernels): compute = CPU operators (cpu_op) on the threads that issue work
--     (not the gloo runloop threads), comm = the execution of each communication op (comms).
--   On GPU ranks, a gloo op (CUDA tensors: gloo stages them through host memory, no kernel) is
--     comm for its CPU execution span too; an NCCL op without a kernel is not (its CPU span is the
--     enqueue, not the transfer; a one-rank communicator launches none).
-- A step's intervals are the events whose step is that step (GPU work: the step of the CPU call
-- that launched it); work outside every ProfilerStep (warm-up before the first one) forms its own
-- group with step NULL, so that nothing is left out. Steps are aligned (step_alignment.sql): the
-- same iteration has the same number on every rank.
--
-- The sweep: every interval contributes +1 at its start and -1 at its end for its category; a
-- running sum in time order gives, between consecutive timestamps, how many intervals of each
-- category are active (of the rows of one timestamp, the last one's sums count them all and only it
-- starts a segment longer than zero: equal timestamps need no merging). Each such segment gets one label by priority:
-- compute > comm > memory > idle. 'comm' segments are therefore exposed communication (no compute
-- ran at the same time), and merged intervals are never double-counted.
--
-- requires: step_alignment

-- Columns: run, rank, window_id, step, category (compute/comm/memory), lo_ns, hi_ns, name,
-- comm_id (comms row for comm intervals).
-- scope: rank
CREATE OR REPLACE TEMP VIEW activity_intervals AS
WITH gpu_windows AS (
    SELECT DISTINCT run, rank, window_id FROM events WHERE is_gpu AND kind IN ('compute_kernel', 'comm_kernel')
),
runloop AS (SELECT run, rank, window_id, tid FROM threads WHERE name LIKE '%gloo_runloop%'),
raw AS (
SELECT e.run, e.rank, e.window_id, e.step,
       CASE e.kind WHEN 'compute_kernel' THEN 'compute' WHEN 'comm_kernel' THEN 'comm' ELSE 'memory' END AS category,
       e.ts_ns AS lo_ns, e.ts_ns + e.dur_ns AS hi_ns, e.name, c.comm_id
FROM events e SEMI JOIN gpu_windows g USING (run, rank, window_id)
-- a communication kernel is the execution of its comms row (NCCL/RCCL: exec_event_id is the kernel)
LEFT JOIN comms c ON e.kind = 'comm_kernel' AND c.run = e.run AND c.rank = e.rank AND c.window_id = e.window_id
     AND c.exec_event_id = e.event_id AND c.on_gpu
WHERE e.is_gpu AND e.kind IN ('compute_kernel', 'comm_kernel', 'memcpy', 'memset') AND e.dur_ns > 0
UNION ALL
SELECT e.run, e.rank, e.window_id, e.step, 'compute', e.ts_ns, e.ts_ns + e.dur_ns, e.name, NULL
FROM events e ANTI JOIN gpu_windows g USING (run, rank, window_id)
ANTI JOIN runloop r ON r.run = e.run AND r.rank = e.rank AND r.window_id = e.window_id AND r.tid = e.tid
WHERE e.kind = 'cpu_op' AND e.dur_ns > 0
UNION ALL
SELECT c.run, c.rank, c.window_id, coalesce(e.step, c.step), 'comm', c.start_ts_ns, c.end_ts_ns, c.exec_name, c.comm_id
FROM comms c
LEFT JOIN events e ON e.run = c.run AND e.rank = c.rank AND e.window_id = c.window_id AND e.event_id = c.exec_event_id
LEFT JOIN gpu_windows g ON g.run = c.run AND g.rank = c.rank AND g.window_id = c.window_id
WHERE c.dur_ns > 0 AND NOT c.on_gpu AND (g.run IS NULL OR c.dialect = 'gloo') AND c.dialect IS DISTINCT FROM 'op_timeline'
UNION ALL  -- an op timeline's comm is its own event, of its step: no join (half of this view's time there)
SELECT run, rank, window_id, step, 'comm', start_ts_ns, end_ts_ns, exec_name, comm_id
FROM comms WHERE dur_ns > 0 AND NOT on_gpu AND dialect = 'op_timeline'
)
SELECT r.run, r.rank, r.window_id, coalesce(sa.aligned_step, r.step) AS step, r.category, r.lo_ns, r.hi_ns, r.name, r.comm_id
FROM raw r LEFT JOIN step_alignment sa USING (run, rank, window_id, step);

-- The sweep, as a table macro over tbl (activity_intervals' columns, or a subset of its rows):
-- per_step = true keeps each step's intervals apart (per-step views), false sweeps the whole window
-- of a rank at once (GPU work of step N that runs while step N+1's kernels run is then merged with
-- them, as on the device).
-- Columns: run, rank, window_id, step (NULL when per_step is false), lo_ns, hi_ns, dur_ns, label
-- (compute/comm/memory/idle), n_compute, n_comm, n_memory (intervals of each category active).
-- One running sum over all partitions in one order (run, rank, window_id, step, t), no PARTITION BY:
-- every interval adds +1 and -1 inside its own partition, so the deltas of each partition sum to
-- zero and a running sum across partitions is the partition's own (DuckDB's partitioned running sum
-- cost 6-7 CPU s against ~3 for a whole-window sweep of 0.95 M intervals, 3.1 against 2.9 per step);
-- the next timestamp is taken only from the same partition.
CREATE OR REPLACE TEMP MACRO _activity_sweep(tbl, per_step) AS TABLE
WITH deltas AS (
    SELECT run, rank, window_id, CASE WHEN per_step THEN step END AS step, lo_ns AS t,
           (category = 'compute')::INT AS d_compute, (category = 'comm')::INT AS d_comm, (category = 'memory')::INT AS d_memory
    FROM query_table(tbl)
    UNION ALL
    SELECT run, rank, window_id, CASE WHEN per_step THEN step END, hi_ns,
           -(category = 'compute')::INT, -(category = 'comm')::INT, -(category = 'memory')::INT
    FROM query_table(tbl)
),
running AS (
    SELECT run, rank, window_id, step, t AS lo_ns,
           CASE WHEN lead(run) OVER w = run AND lead(rank) OVER w = rank AND lead(window_id) OVER w = window_id
                     AND lead(step) OVER w IS NOT DISTINCT FROM step THEN lead(t) OVER w END AS hi_ns,
           CAST(sum(d_compute) OVER w AS BIGINT) AS n_compute, CAST(sum(d_comm) OVER w AS BIGINT) AS n_comm,
           CAST(sum(d_memory) OVER w AS BIGINT) AS n_memory   -- counts: BIGINT, not the sums' HUGEINT (float in pandas)
    FROM deltas   -- not merged per timestamp first: a GROUP BY over every delta cost more than the
                  -- zero-length segments it saves (1.55-2.12 against 1.35-1.58 CPU s, 0.95 M intervals)
    WINDOW w AS (ORDER BY run, rank, window_id, step, t ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
)
SELECT run, rank, window_id, step, lo_ns, hi_ns, hi_ns - lo_ns AS dur_ns,
       CASE WHEN n_compute > 0 THEN 'compute' WHEN n_comm > 0 THEN 'comm' WHEN n_memory > 0 THEN 'memory'
            ELSE 'idle' END AS label,
       n_compute, n_comm, n_memory
FROM running WHERE hi_ns IS NOT NULL AND hi_ns > lo_ns;

-- Per step (see _activity_sweep).
-- scope: rank
CREATE OR REPLACE TEMP VIEW activity_segments AS SELECT * FROM _activity_sweep('activity_intervals', true);

-- Segments (an _activity_sweep's rows) added up per (run, rank, window_id, step): the columns of
-- _activity_steps below.
CREATE OR REPLACE TEMP MACRO _segment_sums(tbl) AS TABLE
SELECT run, rank, window_id, step, min(lo_ns) AS lo_ns, max(hi_ns) AS hi_ns,
       sum(dur_ns) FILTER (WHERE n_comm > 0) AS comm_ns,
       sum(dur_ns) FILTER (WHERE n_comm > 0 AND n_compute > 0) AS overlapped_ns,
       sum(dur_ns) FILTER (WHERE label = 'compute') AS compute_ns,
       sum(dur_ns) FILTER (WHERE label = 'comm') AS exposed_ns,
       sum(dur_ns) FILTER (WHERE label = 'memory') AS memory_ns,
       sum(dur_ns) FILTER (WHERE label = 'idle') AS idle_ns
FROM query_table(tbl) GROUP BY run, rank, window_id, step;

-- Per rank, window and step: its segments added up (one row per (run, rank, window_id, step) of
-- activity_segments, step NULL too): what the per-step views read (overlap.sql's overlap_steps,
-- _activity_window_sums below; imbalance.sql and work.sql in the reduce, which so read a few rows per
-- rank and step, not every segment of the run).
-- Columns: run, rank, window_id, step, lo_ns, hi_ns (the first and last segment's ends), and the time
-- with communication active comm_ns, with communication and compute overlapped_ns, and labelled
-- compute_ns (compute active), exposed_ns (comm: exposed communication), memory_ns, idle_ns; each NULL
-- when there is none (a segment is never empty: a sum of none is the only way to 0).
-- scope: rank
CREATE OR REPLACE TEMP VIEW _activity_steps AS SELECT * FROM _segment_sums('activity_segments');

-- Per rank, step and operation: its time (the intervals of each name added up, steps only), made in
-- the map so that the reduce's views of operations (imbalance.sql's imbalance_ops, work.sql's
-- _work_ops) combine these rows, not every rank's intervals.
-- Columns: run, step, category, name, rank, ns.
-- scope: rank
CREATE OR REPLACE TEMP VIEW _activity_ops AS
SELECT run, step, category, name, rank, sum(hi_ns - lo_ns) AS ns
FROM activity_intervals WHERE step IS NOT NULL GROUP BY ALL;

-- Per rank and window, all steps together: what _activity_sweep(activity_intervals, false) gives,
-- added up (what overlap_ranks and temporal_ranks read: the window's segments themselves, as many as
-- activity_segments, are never stored), without sweeping every interval twice: the steps of a window
-- fall into islands of overlapping time spans (a step's span: its first to its last timestamp; spans
-- that only touch are apart); islands are disjoint, so the window's sweep is, island by island, the
-- sweep of that island's intervals alone (the deltas of every earlier step sum to zero), with idle
-- segments between the islands. A one-step island's sweep is that step's activity_segments, whose
-- sums _activity_steps holds; only islands of several overlapping steps (GPU work of step N under step
-- N+1's, an op timeline's steps that overlap by a nanosecond) are swept again
-- (_activity_several_segments, in numpy like activity_segments) and added up the same way (_segment_sums).

-- Each step of a window with its island. Columns: run, rank, window_id, step, island (1, 2, ... in time
-- order), n_steps (of its island), t0, t1 (the island's span).
-- scope: rank
CREATE OR REPLACE TEMP VIEW _activity_islands AS
WITH spans AS (
    SELECT run, rank, window_id, step, least(min(lo_ns), min(hi_ns)) AS t0, greatest(max(lo_ns), max(hi_ns)) AS t1
    FROM activity_intervals GROUP BY ALL
),
ordered AS (
    SELECT *, max(t1) OVER (PARTITION BY run, rank, window_id ORDER BY t0, t1, step NULLS FIRST
                            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_t1
    FROM spans
),
islanded AS (
    SELECT *, CAST(sum(CASE WHEN prev_t1 IS NULL OR t0 >= prev_t1 THEN 1 ELSE 0 END)
                  OVER (PARTITION BY run, rank, window_id ORDER BY t0, t1, step NULLS FIRST ROWS UNBOUNDED PRECEDING)
                   AS INTEGER) AS island
    FROM ordered
)
SELECT run, rank, window_id, step, island, count(*) OVER i AS n_steps, min(t0) OVER i AS t0, max(t1) OVER i AS t1
FROM islanded WINDOW i AS (PARTITION BY run, rank, window_id, island);

-- The intervals of islands of several steps, the island in place of the step. Columns: those of
-- activity_intervals that _activity_sweep reads.
-- scope: rank
CREATE OR REPLACE TEMP VIEW _activity_several AS
SELECT a.run, a.rank, a.window_id, s.island AS step, a.category, a.lo_ns, a.hi_ns
FROM activity_intervals a JOIN _activity_islands s
  ON s.run = a.run AND s.rank = a.rank AND s.window_id = a.window_id AND s.step IS NOT DISTINCT FROM a.step
WHERE s.n_steps > 1;

-- Their sweep, island by island (step: the island). Columns: those of activity_segments.
-- scope: rank
CREATE OR REPLACE TEMP VIEW _activity_several_segments AS SELECT * FROM _activity_sweep('_activity_several', true);

-- Columns: run, rank, window_id, lo_ns, hi_ns (the first and last segment's ends), comm_ns (time with
-- communication active), overlapped_ns (communication and compute active), and the time labelled
-- compute_label_ns, comm_label_ns (exposed communication), memory_label_ns, idle_label_ns.
-- scope: rank
CREATE OR REPLACE TEMP VIEW _activity_window_sums AS
WITH islands AS (SELECT DISTINCT run, rank, window_id, island, t0, t1 FROM _activity_islands),
parts AS (  -- per window: its one-step islands' sums, its swept islands' sums, the idle between islands
    SELECT a.run, a.rank, a.window_id, a.lo_ns, a.hi_ns, a.comm_ns, a.overlapped_ns, a.compute_ns, a.exposed_ns,
           a.memory_ns, a.idle_ns
    FROM _activity_steps a SEMI JOIN _activity_islands s
      ON s.run = a.run AND s.rank = a.rank AND s.window_id = a.window_id AND s.step IS NOT DISTINCT FROM a.step
     AND s.n_steps = 1
    UNION ALL
    SELECT * EXCLUDE (step) FROM _segment_sums('_activity_several_segments')
    UNION ALL  -- between islands: nothing active
    SELECT run, rank, window_id, prev_t1, t0, NULL, NULL, NULL, NULL, NULL, t0 - prev_t1
    FROM (SELECT *, lag(t1) OVER (PARTITION BY run, rank, window_id ORDER BY island) AS prev_t1 FROM islands)
    WHERE t0 > prev_t1
)
SELECT run, rank, window_id, min(lo_ns) AS lo_ns, max(hi_ns) AS hi_ns,
       coalesce(sum(comm_ns), 0) AS comm_ns, coalesce(sum(overlapped_ns), 0) AS overlapped_ns,
       coalesce(sum(compute_ns), 0) AS compute_label_ns, coalesce(sum(exposed_ns), 0) AS comm_label_ns,
       coalesce(sum(memory_ns), 0) AS memory_label_ns, coalesce(sum(idle_ns), 0) AS idle_label_ns
FROM parts GROUP BY run, rank, window_id;
