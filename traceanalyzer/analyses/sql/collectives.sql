-- Cross-rank collectives: one logical collective = the seq-th collective of a process group,
-- seen on every member rank (see ../shared/METRICS.md, "Collectives").
--
-- How: comms rows are keyed by (run, pg, seq); for each key we take every rank's arrival (the
-- start of its execution: kernel start, gloo span start, or the CPU annotation), the latest
-- arrival, and the earliest end. Groups without a recorded name (legacy NCCL traces) share the
-- key '?', which is right when a job has one data-parallel group and otherwise the best we can do.
-- Clock offsets (see clock_offsets.sql) are added to every timestamp first; step is the aligned
-- step (step_alignment.sql), the same number for the same iteration on every rank.
--
-- requires: clock_offsets, step_alignment

-- Each rank's collective calls, clock-aligned: its part of collective_ranks (and of
-- serialized_comm_steps), made in the map (summaries.py) so that the cross-rank views read these rows,
-- not every rank's comms. Columns: run, pg, seq, rank, step, op, group_size (as recorded; NULL when
-- unknown), bytes (NCCL-tests convention), arrival_ns, end_ns, dur_ns, enqueue_ts_ns (rank clock).
-- scope: rank
CREATE OR REPLACE TEMP VIEW _collective_calls AS
SELECT c.run, coalesce(c.pg_name, '?') AS pg, c.seq, c.rank, coalesce(sa.aligned_step, c.step) AS step, c.op, c.group_size,
       -- bytes as nccl-tests counts them: the all_gather output, the reduce_scatter input
       CASE WHEN c.op = 'all_gather' THEN coalesce(c.out_bytes, c.in_bytes * c.group_size)
            ELSE c.in_bytes END AS bytes,
       c.start_ts_ns + coalesce(o.offset_ns, 0) AS arrival_ns,
       c.end_ts_ns + coalesce(o.offset_ns, 0) AS end_ns,
       c.dur_ns, c.enqueue_ts_ns
FROM comms c LEFT JOIN clock_offsets o ON o.run = c.run AND o.rank = c.rank
LEFT JOIN step_alignment sa ON sa.run = c.run AND sa.rank = c.rank AND sa.window_id = c.window_id AND sa.step = c.step
WHERE NOT c.is_p2p AND c.seq IS NOT NULL;

-- Per rank and collective: arrival, end and the wait for the last peer, clock-aligned.
-- Columns: run, pg, seq, rank, step, op, group_size (as recorded, else the largest of its group),
-- bytes (NCCL-tests convention), arrival_ns,
-- end_ns, dur_ns, gap_ns (arrival - this rank's end of the group's previous collective in the
-- window: the time the rank spent on its own between the two), last_arrival_ns, first_end_ns,
-- wait_ns (last_arrival - arrival), n_ranks.
CREATE OR REPLACE TEMP VIEW collective_ranks AS
WITH aligned AS (
    SELECT run, pg, seq, rank, step, op,
           coalesce(group_size, max(group_size) OVER (PARTITION BY run, pg)) AS group_size,
           bytes, arrival_ns, end_ns, dur_ns
    FROM _collective_calls
)
SELECT *,
       arrival_ns - lag(end_ns) OVER (PARTITION BY run, pg, rank ORDER BY seq) AS gap_ns,
       max(arrival_ns) OVER w AS last_arrival_ns,
       min(end_ns) OVER w AS first_end_ns,
       max(arrival_ns) OVER w - arrival_ns AS wait_ns,
       count(*) OVER w AS n_ranks
FROM aligned
WINDOW w AS (PARTITION BY run, pg, seq);

-- One row per logical collective.
-- Columns: run, pg, seq, op, step (the most common step of its ranks), n_ranks, group_size,
-- complete (every member seen), bytes, first/last_arrival_ns, arrival_skew_ns, last_arriver
-- (rank; ties -> lowest rank), transfer_ns (earliest end - latest arrival, >= 0: the part no
-- rank could avoid), total_wait_ns (sum of all ranks' waits), algbw_gbps, busbw_gbps
-- (bytes / transfer time, x NCCL's bus factor: all_reduce 2(n-1)/n; all_gather, reduce_scatter,
-- all_to_all (n-1)/n; others 1).
CREATE OR REPLACE TEMP VIEW collective_instances AS
SELECT run, pg, seq,
       mode(op ORDER BY op) AS op, mode(step ORDER BY step) AS step,
       count(*) AS n_ranks, max(group_size) AS group_size,
       count(*) >= coalesce(max(group_size), count(*)) AS complete,
       max(bytes) AS bytes,
       min(arrival_ns) AS first_arrival_ns, max(arrival_ns) AS last_arrival_ns,
       max(arrival_ns) - min(arrival_ns) AS arrival_skew_ns,
       min(rank) FILTER (WHERE arrival_ns = last_arrival_ns) AS last_arriver,
       greatest(min(end_ns) - max(arrival_ns), 0) AS transfer_ns,
       sum(wait_ns) AS total_wait_ns,
       max(bytes) / nullif(greatest(min(end_ns) - max(arrival_ns), 0), 0) AS algbw_gbps,
       max(bytes) / nullif(greatest(min(end_ns) - max(arrival_ns), 0), 0) *
           CASE WHEN count(*) <= 1 THEN 1.0
                WHEN mode(op ORDER BY op) = 'all_reduce' THEN 2.0 * (count(*) - 1) / count(*)
                WHEN mode(op ORDER BY op) IN ('all_gather', 'reduce_scatter', 'all_to_all') THEN (count(*) - 1.0) / count(*)
                ELSE 1.0 END AS busbw_gbps
FROM collective_ranks
GROUP BY run, pg, seq;
