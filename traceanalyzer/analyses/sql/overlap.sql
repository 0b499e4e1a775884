-- Communication/computation overlap and the exposed communication it leaves, per rank and step.
--
-- Overlap % follows HTA's definition: |comm ∩ compute| / |comm| over merged intervals
-- (activity.sql's segments: a segment with comm and compute active is overlapped, one with comm
-- only is exposed). Exposed communication is listed interval by interval: consecutive exposed
-- segments are joined, each is attributed to the collective that covers most of it, and the
-- compute that ran just before and just after it is named -- what a user would move or overlap.
--
-- requires: activity, collectives, intervals, phases

-- Columns: run, rank, step, comm_ns, overlapped_ns, exposed_ns, compute_ns, overlap_pct,
-- exposed_pct_of_step (exposed / step span of the rank's activity).
-- scope: rank
CREATE OR REPLACE TEMP VIEW overlap_steps AS
SELECT run, rank, step, sum(comm_ns) AS comm_ns, coalesce(sum(overlapped_ns), 0) AS overlapped_ns,
       coalesce(sum(exposed_ns), 0) AS exposed_ns, coalesce(sum(compute_ns), 0) AS compute_ns,
       100.0 * coalesce(sum(overlapped_ns), 0) / nullif(sum(comm_ns), 0) AS overlap_pct,
       100.0 * coalesce(sum(exposed_ns), 0) / nullif(max(hi_ns) - min(lo_ns), 0) AS exposed_pct_of_step
FROM _activity_steps GROUP BY run, rank, step;

-- Per rank over its whole window(s) (what HTA reports per rank): one sweep over all steps, so that
-- communication of one step overlapped by compute of the next counts as overlapped.
-- Columns: run, rank, comm_ns, overlapped_ns, exposed_ns, overlap_pct. overlap_pct is NULL (unknown)
-- for ranks read from an op timeline (ranks.rank_source = 'op_timeline'): one timed span per op on
-- one thread and no kernels, so how communication overlapped GPU work is not recorded.
-- scope: rank
CREATE OR REPLACE TEMP VIEW overlap_ranks AS
SELECT run, rank, sum(comm_ns) AS comm_ns, sum(overlapped_ns) AS overlapped_ns, sum(comm_label_ns) AS exposed_ns,
       CASE WHEN bool_or(o.op_timeline) THEN NULL ELSE
       100.0 * sum(overlapped_ns) / nullif(sum(comm_ns), 0) END AS overlap_pct
FROM _activity_window_sums
LEFT JOIN (SELECT DISTINCT run, rank, true AS op_timeline FROM ranks WHERE rank_source = 'op_timeline') o USING (run, rank)
GROUP BY run, rank;

-- Exposed communication intervals of each rank: consecutive exposed segments joined (per rank: the
-- map computes them, the reduce only ranks them).
-- Columns: run, rank, window_id, step, lo_ns, hi_ns, exposed_ns.
-- scope: rank
CREATE OR REPLACE TEMP VIEW _exposed_islands AS
WITH comm AS (
    SELECT {'run': run, 'rank': rank, 'window_id': window_id, 'step': step} AS grp, * FROM activity_segments WHERE label = 'comm'
),
seg AS (SELECT * FROM _interval_islands(comm))  -- consecutive segments joined (intervals.sql)
SELECT run, rank, window_id, step, min(lo_ns) AS lo_ns, max(hi_ns) AS hi_ns, sum(dur_ns) AS exposed_ns
FROM seg GROUP BY run, rank, window_id, step, island;

-- The largest exposed intervals of a map task's ranks, exposed_top of them (largest first, in
-- exposed_intervals' order), attributed: the collective that covers most of each (its op, group,
-- sequence number, bytes, name), and the compute just before and after it. The run's largest
-- (exposed_comm) are among the union of every task's, since an interval of the run's top exposed_top
-- has fewer than exposed_top larger ones among the ranks of its own task. So the reduce ranks
-- exposed_top rows a task, never every exposed interval of the run (exposed_intervals, exposed.sql,
-- lists them all when asked), and attribution, a range join with the ranks' intervals, is done here
-- for those few (the reduce read every rank's intervals for it; in the map, for each rank's largest,
-- it cost 3x the view). Which rows a task keeps depends on its ranks; the union's top does not.
-- Columns: run, rank, window_id, step, lo_ns, hi_ns, exposed_ns, op, pg, seq, bytes, comm_name,
-- compute_before, compute_after.
-- scope: rank
CREATE OR REPLACE TEMP VIEW _exposed_top AS
WITH threshold AS (  -- the exposed_top-th largest size of each run: only intervals at least as large are sorted
    -- (a sort of every interval of the task cost 0.97 of the view's 1.1 CPU s, 158 op-timeline ranks)
    SELECT run, list_min(max(exposed_ns, greatest(getvariable('exposed_top'), 1))) AS exposed_ns FROM _exposed_islands GROUP BY run
),
top AS (
    SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY run ORDER BY exposed_ns DESC, rank, lo_ns, window_id, step) AS k
                   FROM _exposed_islands i SEMI JOIN threshold t ON t.run = i.run AND i.exposed_ns >= t.exposed_ns)
    WHERE k <= getvariable('exposed_top')
),
covering AS (
    SELECT i.run, i.k,
           -- the interval covering most; a tie: the earliest, then by name (one row for both columns)
           first(a.comm_id ORDER BY least(a.hi_ns, i.hi_ns) - greatest(a.lo_ns, i.lo_ns) DESC, a.lo_ns, a.name, a.comm_id) AS comm_id,
           first(a.name ORDER BY least(a.hi_ns, i.hi_ns) - greatest(a.lo_ns, i.lo_ns) DESC, a.lo_ns, a.name, a.comm_id) AS comm_name
    FROM top i JOIN activity_intervals a
      ON a.run = i.run AND a.rank = i.rank AND a.window_id = i.window_id AND a.category = 'comm'
     AND a.lo_ns < i.hi_ns AND a.hi_ns > i.lo_ns
    GROUP BY i.run, i.k
),
before AS (
    SELECT i.run, i.k, arg_max(a.name, (a.hi_ns, a.name)) AS compute_before
    FROM top i JOIN activity_intervals a
      ON a.run = i.run AND a.rank = i.rank AND a.window_id = i.window_id AND a.category = 'compute'
     AND a.hi_ns <= i.lo_ns AND a.hi_ns > i.lo_ns - getvariable('exposed_context_max_ns')
    GROUP BY i.run, i.k
),
after AS (
    SELECT i.run, i.k, arg_min(a.name, (a.lo_ns, a.name)) AS compute_after
    FROM top i JOIN activity_intervals a
      ON a.run = i.run AND a.rank = i.rank AND a.window_id = i.window_id AND a.category = 'compute'
     AND a.lo_ns >= i.hi_ns AND a.lo_ns < i.hi_ns + getvariable('exposed_context_max_ns')
    GROUP BY i.run, i.k
)
SELECT i.run, i.rank, i.window_id, i.step, i.lo_ns, i.hi_ns, i.exposed_ns,
       c.op, c.pg_name AS pg, c.seq, coalesce(c.in_bytes, c.out_bytes) AS bytes,
       coalesce(cv.comm_name, c.exec_name) AS comm_name, b.compute_before, f.compute_after
FROM top i
LEFT JOIN covering cv USING (run, k)
LEFT JOIN comms c ON c.run = i.run AND c.rank = i.rank AND c.window_id = i.window_id AND c.comm_id = cv.comm_id
LEFT JOIN before b USING (run, k)
LEFT JOIN after f USING (run, k);

-- The largest exposed intervals (exposed_top per run, default 20), attributed (_exposed_top): what a
-- user would move or overlap. rank_order is exposed_intervals' (every larger one is a candidate too).
-- Columns: run, rank, window_id, step, lo_ns, hi_ns, exposed_ns, op, pg, seq, bytes, comm_name,
-- compute_before, compute_after, rank_order.
CREATE OR REPLACE TEMP VIEW exposed_comm AS
SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY run ORDER BY exposed_ns DESC, rank, lo_ns, window_id, step) AS rank_order
               FROM _exposed_top)
WHERE rank_order <= getvariable('exposed_top');

-- Gradient communication issued only after the backward pass: per rank and step, the data-parallel
-- collectives (all_reduce, reduce_scatter, all_gather) enqueued after the rank's backward ended and
-- before its optimizer started (step_phases' sync phase). Bucketed data parallelism (DDP, FSDP)
-- issues them from inside backward, as each bucket's gradients are ready, so that all but the last
-- run under the rest of the backward; issued afterwards, they run one after another with nothing
-- to hide under. What overlapping them could save per step: their transfer time (after the last
-- member arrived: waiting for a late peer is the straggler's, not overlap's) less the last one's
-- (which no overlap can hide). Not capped by this run's backward time: issued from inside backward,
-- the collectives also run faster (measured on gloo: DDP's own bucketed all_reduce vs the same
-- buckets reduced after backward, 2 ranks: 7.3 ms saved per step with 2.6 ms of backward); the
-- backward time is given beside it (a backward shorter than the transfer cannot hide all of it).
-- Columns: run, rank, step, backward_ns, n_serial, serial_transfer_ns, last_transfer_ns,
-- overlappable_ns (= serial_transfer_ns - last_transfer_ns).
CREATE OR REPLACE TEMP VIEW serialized_comm_steps AS
WITH ph AS (
    SELECT run, rank, step, backward_ns, step_start_ns + forward_ns + backward_ns AS bwd_end_ns,
           step_end_ns - optimizer_ns AS opt_start_ns
    FROM step_phases WHERE backward_ns > 0
),
arrivals AS (  -- the ranks' collective calls (collectives.sql): times aligned, the enqueue on the rank's clock (as step_phases)
    SELECT run, rank, enqueue_ts_ns, end_ns, max(arrival_ns) OVER (PARTITION BY run, pg, seq) AS last_arrival_ns
    FROM _collective_calls
    WHERE enqueue_ts_ns IS NOT NULL AND op IN ('all_reduce', 'reduce_scatter', 'all_gather')
),
serial AS (
    SELECT p.run, p.rank, p.step, p.backward_ns, a.enqueue_ts_ns, greatest(a.end_ns - a.last_arrival_ns, 0) AS transfer_ns
    FROM arrivals a JOIN ph p ON p.run = a.run AND p.rank = a.rank
     AND a.enqueue_ts_ns >= p.bwd_end_ns AND a.enqueue_ts_ns < p.opt_start_ns
)
SELECT run, rank, step, any_value(backward_ns)::BIGINT AS backward_ns, count(*) AS n_serial,
       sum(transfer_ns)::BIGINT AS serial_transfer_ns, arg_max(transfer_ns, (enqueue_ts_ns, transfer_ns))::BIGINT AS last_transfer_ns,
       (sum(transfer_ns) - arg_max(transfer_ns, (enqueue_ts_ns, transfer_ns)))::BIGINT AS overlappable_ns
FROM serial GROUP BY run, rank, step;
