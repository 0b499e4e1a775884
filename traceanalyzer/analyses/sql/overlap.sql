-- Communication/computation overlap and the exposed communication it leaves, per rank and step.
--
-- Overlap % follows HTA's definition: |comm ∩ compute| / |comm| over merged intervals
-- (activity.sql's segments: a segment with comm and compute active is overlapped, one with comm
-- only is exposed). Exposed communication is listed interval by interval: consecutive exposed
-- segments are joined, each is attributed to the collective that covers most of it, and the
-- compute that ran just before and just after it is named -- what a user would move or overlap.
--
-- requires: activity, intervals

-- Columns: run, rank, step, comm_ns, overlapped_ns, exposed_ns, compute_ns, overlap_pct,
-- exposed_pct_of_step (exposed / step span of the rank's activity).
CREATE OR REPLACE TEMP VIEW overlap_steps AS
SELECT run, rank, step,
       sum(dur_ns) FILTER (WHERE n_comm > 0) AS comm_ns,
       coalesce(sum(dur_ns) FILTER (WHERE n_comm > 0 AND n_compute > 0), 0) AS overlapped_ns,
       coalesce(sum(dur_ns) FILTER (WHERE label = 'comm'), 0) AS exposed_ns,
       coalesce(sum(dur_ns) FILTER (WHERE n_compute > 0), 0) AS compute_ns,
       100.0 * coalesce(sum(dur_ns) FILTER (WHERE n_comm > 0 AND n_compute > 0), 0)
             / nullif(sum(dur_ns) FILTER (WHERE n_comm > 0), 0) AS overlap_pct,
       100.0 * coalesce(sum(dur_ns) FILTER (WHERE label = 'comm'), 0) / nullif(max(hi_ns) - min(lo_ns), 0) AS exposed_pct_of_step
FROM activity_segments GROUP BY ALL;

-- Per rank over its whole window(s) (what HTA reports per rank): one sweep over all steps, so that
-- communication of one step overlapped by compute of the next counts as overlapped.
-- Columns: run, rank, comm_ns, overlapped_ns, exposed_ns, overlap_pct. overlap_pct is NULL (unknown)
-- for ranks read from an op timeline (ranks.rank_source = 'op_timeline'): one timed span per op on
-- one thread and no kernels, so how communication overlapped GPU work is not recorded.
CREATE OR REPLACE TEMP VIEW overlap_ranks AS
SELECT run, rank,
       coalesce(sum(dur_ns) FILTER (WHERE n_comm > 0), 0) AS comm_ns,
       coalesce(sum(dur_ns) FILTER (WHERE n_comm > 0 AND n_compute > 0), 0) AS overlapped_ns,
       coalesce(sum(dur_ns) FILTER (WHERE label = 'comm'), 0) AS exposed_ns,
       CASE WHEN bool_or(o.op_timeline) THEN NULL ELSE
       100.0 * coalesce(sum(dur_ns) FILTER (WHERE n_comm > 0 AND n_compute > 0), 0)
             / nullif(sum(dur_ns) FILTER (WHERE n_comm > 0), 0) END AS overlap_pct
FROM _activity_window_segments
LEFT JOIN (SELECT DISTINCT run, rank, true AS op_timeline FROM ranks WHERE rank_source = 'op_timeline') o USING (run, rank)
GROUP BY run, rank;

-- Exposed communication intervals, all of them: consecutive exposed segments joined.
-- Columns: run, rank, window_id, step, lo_ns, hi_ns, exposed_ns, rank_order (per run, largest first).
CREATE OR REPLACE TEMP VIEW exposed_intervals AS
WITH comm AS (
    SELECT {'run': run, 'rank': rank, 'window_id': window_id, 'step': step} AS grp, * FROM activity_segments WHERE label = 'comm'
),
seg AS (SELECT * FROM _interval_islands(comm))  -- consecutive segments joined (intervals.sql)
SELECT run, rank, window_id, step, min(lo_ns) AS lo_ns, max(hi_ns) AS hi_ns, sum(dur_ns) AS exposed_ns,
       row_number() OVER (PARTITION BY run ORDER BY sum(dur_ns) DESC, rank, min(lo_ns)) AS rank_order
FROM seg GROUP BY run, rank, window_id, step, island;

-- The largest exposed intervals (exposed_top per run, default 20), attributed: the collective that
-- covers most of each, and the compute just before and after it. Attribution is a range join, so
-- it is done for the intervals a user will read, not for all of them.
-- Columns: run, rank, window_id, step, lo_ns, hi_ns, exposed_ns, op, pg, seq, bytes, comm_name,
-- compute_before, compute_after, rank_order.
CREATE OR REPLACE TEMP VIEW exposed_comm AS
WITH intervals AS (
    SELECT * FROM exposed_intervals WHERE rank_order <= getvariable('exposed_top')
),
covering AS (
    SELECT i.run, i.rank, i.window_id, i.step, i.lo_ns,
           arg_max(a.comm_id, least(a.hi_ns, i.hi_ns) - greatest(a.lo_ns, i.lo_ns)) AS comm_id,
           arg_max(a.name, least(a.hi_ns, i.hi_ns) - greatest(a.lo_ns, i.lo_ns)) AS comm_name
    FROM intervals i JOIN activity_intervals a
      ON a.run = i.run AND a.rank = i.rank AND a.window_id = i.window_id AND a.category = 'comm'
     AND a.lo_ns < i.hi_ns AND a.hi_ns > i.lo_ns
    GROUP BY ALL
),
before AS (
    SELECT i.run, i.rank, i.window_id, i.lo_ns, arg_max(a.name, a.hi_ns) AS compute_before
    FROM intervals i JOIN activity_intervals a
      ON a.run = i.run AND a.rank = i.rank AND a.window_id = i.window_id AND a.category = 'compute'
     AND a.hi_ns <= i.lo_ns AND a.hi_ns > i.lo_ns - getvariable('exposed_context_max_ns')
    GROUP BY ALL
),
after AS (
    SELECT i.run, i.rank, i.window_id, i.lo_ns, arg_min(a.name, a.lo_ns) AS compute_after
    FROM intervals i JOIN activity_intervals a
      ON a.run = i.run AND a.rank = i.rank AND a.window_id = i.window_id AND a.category = 'compute'
     AND a.lo_ns >= i.hi_ns AND a.lo_ns < i.hi_ns + getvariable('exposed_context_max_ns')
    GROUP BY ALL
)
SELECT i.run, i.rank, i.window_id, i.step, i.lo_ns, i.hi_ns, i.exposed_ns,
       c.op, c.pg_name AS pg, c.seq, coalesce(c.in_bytes, c.out_bytes) AS bytes,
       coalesce(cv.comm_name, c.exec_name) AS comm_name, b.compute_before, f.compute_after,
       i.rank_order
FROM intervals i
LEFT JOIN covering cv USING (run, rank, window_id, lo_ns)  -- not step: it is null in traces without steps
LEFT JOIN comms c ON c.run = i.run AND c.rank = i.rank AND c.window_id = i.window_id AND c.comm_id = cv.comm_id
LEFT JOIN before b USING (run, rank, window_id, lo_ns)
LEFT JOIN after f USING (run, rank, window_id, lo_ns);
