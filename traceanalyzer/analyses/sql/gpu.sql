-- GPU-side views (HTA's catalogue, all ranks): CPU->GPU launch delay, queue length per stream,
-- idle-time breakdown per stream. CPU-only traces give empty results, not errors.
--
-- requires: (nothing: reads the canonical tables only)

-- Each GPU operation with the runtime call that launched it (same correlation id).
-- Columns: run, rank, window_id, stream, name, kind, ts_ns, dur_ns, launch_ts_ns, launch_dur_ns,
-- launch_name, launch_delay_ns (GPU start - end of the launch call, clipped at 0 as HTA does).
CREATE OR REPLACE TEMP VIEW gpu_launches AS
SELECT g.run, g.rank, g.window_id, g.stream, g.name, g.kind, g.ts_ns, g.dur_ns,
       r.ts_ns AS launch_ts_ns, r.dur_ns AS launch_dur_ns, r.name AS launch_name,
       greatest(g.ts_ns - (r.ts_ns + r.dur_ns), 0) AS launch_delay_ns
FROM events g
JOIN events r ON r.run = g.run AND r.rank = g.rank AND r.window_id = g.window_id
     AND r.correlation = g.correlation AND r.kind IN ('runtime', 'sync') AND NOT r.is_gpu
WHERE g.kind IN ('compute_kernel', 'comm_kernel', 'memcpy', 'memset');

-- Launch statistics per rank. Columns: run, rank, launches, mean/median/p95/max launch_delay_ns,
-- mean launch (CPU) duration, mean GPU duration, short_kernels (GPU time < launch time, launch
-- <= 50 us: launch-bound), launch_outliers (launch call > 50 us), delay_outliers (delay > 100 us).
CREATE OR REPLACE TEMP VIEW launch_stats AS
SELECT run, rank, count(*) AS launches,
       avg(launch_delay_ns) AS mean_launch_delay_ns, median(launch_delay_ns) AS median_launch_delay_ns,
       quantile_cont(launch_delay_ns, 0.95) AS p95_launch_delay_ns, max(launch_delay_ns) AS max_launch_delay_ns,
       avg(launch_dur_ns) AS mean_launch_dur_ns, avg(dur_ns) AS mean_gpu_dur_ns,
       count(*) FILTER (WHERE launch_dur_ns <= 50000 AND dur_ns < launch_dur_ns) AS short_kernels,
       count(*) FILTER (WHERE launch_dur_ns > 50000) AS launch_outliers,
       count(*) FILTER (WHERE launch_delay_ns > 100000) AS delay_outliers
FROM gpu_launches GROUP BY ALL;

-- Queue length per stream: +1 when a launch call starts, -1 when the GPU operation starts.
-- Columns: run, rank, stream, launches, max_queue, mean_queue (time-weighted over the stream's
-- activity; HTA reports an unweighted mean over samples instead).
CREATE OR REPLACE TEMP VIEW queue_length AS
WITH deltas AS (
    SELECT run, rank, window_id, stream, launch_ts_ns AS t, 1 AS d FROM gpu_launches
    UNION ALL
    SELECT run, rank, window_id, stream, ts_ns, -1 FROM gpu_launches
),
merged AS (SELECT run, rank, window_id, stream, t, sum(d) AS d FROM deltas GROUP BY ALL),
running AS (
    SELECT *, sum(d) OVER w AS queue, lead(t) OVER w - t AS held_ns
    FROM merged WINDOW w AS (PARTITION BY run, rank, window_id, stream ORDER BY t ROWS UNBOUNDED PRECEDING)
)
SELECT run, rank, stream, count(*) FILTER (WHERE d > 0) AS launches, max(queue) AS max_queue,
       sum(queue * held_ns) / nullif(sum(held_ns), 0) AS mean_queue
FROM running GROUP BY run, rank, stream;

-- Idle time between consecutive GPU operations of a stream, split as HTA does:
--   host_wait   the launch call started after the previous operation ended (the CPU was late);
--   kernel_wait otherwise, a gap shorter than idle_kernel_wait_ns (default 30 us);
--   other       the rest.
-- Columns: run, rank, stream, category, idle_ns, gaps, idle_pct (of the stream's span).
CREATE OR REPLACE TEMP VIEW idle_breakdown AS
WITH ordered AS (
    SELECT run, rank, window_id, stream, ts_ns, dur_ns, launch_ts_ns,
           lag(ts_ns + dur_ns) OVER w AS prev_end
    FROM gpu_launches WINDOW w AS (PARTITION BY run, rank, window_id, stream ORDER BY ts_ns)
),
gaps AS (
    SELECT run, rank, stream, ts_ns - prev_end AS gap_ns,
           CASE WHEN launch_ts_ns > prev_end THEN 'host_wait'
                WHEN ts_ns - prev_end < getvariable('idle_kernel_wait_ns') THEN 'kernel_wait'
                ELSE 'other' END AS category
    FROM ordered WHERE prev_end IS NOT NULL
),
span AS (SELECT run, rank, stream, max(ts_ns + dur_ns) - min(ts_ns) AS span_ns FROM gpu_launches GROUP BY ALL)
SELECT g.run, g.rank, g.stream, g.category, sum(greatest(g.gap_ns, 0)) AS idle_ns, count(*) AS gaps,
       100.0 * sum(greatest(g.gap_ns, 0)) / nullif(any_value(s.span_ns), 0) AS idle_pct
FROM gaps g JOIN span s USING (run, rank, stream) GROUP BY ALL;
