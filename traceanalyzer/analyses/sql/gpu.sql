-- GPU-side views (HTA's catalogue, all ranks): CPU->GPU launch delay, queue length per stream,
-- idle-time breakdown per stream. CPU-only traces give empty results, not errors.
--
-- requires: (nothing: reads the canonical tables only)

-- Each GPU operation with the runtime call that launched it (same correlation id).
-- Columns: run, rank, window_id, stream, name, kind, ts_ns, dur_ns, launch_ts_ns, launch_dur_ns,
-- launch_name, launch_delay_ns (GPU start - end of the launch call, clipped at 0 as HTA does),
-- raw_launch_delay_ns (not clipped: negative when the GPU op starts before the call returns).
-- scope: rank
CREATE OR REPLACE TEMP VIEW _gpu_launches AS
SELECT g.run, g.rank, g.window_id, g.stream, g.name, g.kind, g.ts_ns, g.dur_ns,
       r.ts_ns AS launch_ts_ns, r.dur_ns AS launch_dur_ns, r.name AS launch_name,
       greatest(g.ts_ns - (r.ts_ns + r.dur_ns), 0) AS launch_delay_ns,
       g.ts_ns - (r.ts_ns + r.dur_ns) AS raw_launch_delay_ns
FROM events g
JOIN events r ON r.run = g.run AND r.rank = g.rank AND r.window_id = g.window_id
     AND r.correlation = g.correlation AND r.kind IN ('runtime', 'sync') AND NOT r.is_gpu
WHERE g.is_gpu AND g.kind IN ('compute_kernel', 'comm_kernel', 'memcpy', 'memset');

-- CPU/GPU clock offset per rank, from the launches alone. The GPU starts a launched op within
-- microseconds whenever its queue is empty, so over a rank's launches the quickest start is ~0 (or
-- negative: the op may start before the launch call returns). When even the quickest one started
-- clock_offset_min_launch_delay_ns or more after its call, and the delays are uniform (median within
-- (1 + clock_offset_max_spread_ratio) x that minimum; a backlogged GPU's delays grow and vary
-- instead), the GPU timestamps are offset from the CPU's (seen on ROCm traces: 21-38 ms on every
-- launch): the offset is estimated as that minimum. The other way round, a GPU op cannot start
-- before its launch call began: when clock_offset_min_early_pct % of the launches do, the GPU clock
-- is behind (offset = the most negative start - call start). Needs clock_offset_min_launches.
-- Columns: run, rank, launches, min_launch_delay_ns (raw, may be < 0), median_raw_launch_delay_ns,
-- early_launches, clock_offset_ns (NULL: none detected), clock_offset_reason.
-- scope: rank
CREATE OR REPLACE TEMP VIEW _gpu_clock_offset AS
WITH s AS (
    SELECT run, rank, count(*) AS launches, min(raw_launch_delay_ns) AS min_launch_delay_ns,
           median(raw_launch_delay_ns) AS median_raw_launch_delay_ns,
           count(*) FILTER (WHERE ts_ns < launch_ts_ns) AS early_launches,
           min(ts_ns - launch_ts_ns) AS min_start_after_call_ns
    FROM _gpu_launches GROUP BY ALL
), d AS (
    SELECT *,
           launches >= getvariable('clock_offset_min_launches')
           AND min_launch_delay_ns >= getvariable('clock_offset_min_launch_delay_ns')
           AND median_raw_launch_delay_ns <= (1 + getvariable('clock_offset_max_spread_ratio')) * min_launch_delay_ns AS late,
           launches >= getvariable('clock_offset_min_launches')
           AND 100.0 * early_launches / launches >= getvariable('clock_offset_min_early_pct') AS early
    FROM s
)
SELECT run, rank, launches, min_launch_delay_ns, median_raw_launch_delay_ns, early_launches,
       CASE WHEN late THEN min_launch_delay_ns WHEN early THEN min_start_after_call_ns END AS clock_offset_ns,
       CASE WHEN late THEN format('every one of {:d} GPU ops started {:.1f} ms or more after its launch call returned '
                                  '(median {:.1f} ms): a CPU/GPU clock offset of about {:.1f} ms, not launch latency',
                                  launches, min_launch_delay_ns / 1e6, median_raw_launch_delay_ns / 1e6, min_launch_delay_ns / 1e6)
            WHEN early THEN format('{:d} of {:d} GPU ops started before their launch call began (by up to {:.1f} ms): '
                                   'the GPU clock is behind the CPU''s', early_launches, launches, -min_start_after_call_ns / 1e6)
       END AS clock_offset_reason
FROM d;

-- Launch statistics per rank. Columns: run, rank, launches, mean/median/p95/max launch_delay_ns
-- (as recorded), mean launch (CPU) duration, mean GPU duration, short_kernels (GPU time < launch
-- time, launch <= launch_short_max_ns, 50 us: launch-bound), launch_outliers (launch call >
-- launch_outlier_min_ns, 50 us), delay_outliers (delay > launch_delay_outlier_min_ns, 100 us, after
-- removing a detected clock offset), min_launch_delay_ns (raw), clock_offset_ns
-- and clock_offset_reason (_gpu_clock_offset; NULL when none), corrected_median_launch_delay_ns
-- (median delay less the offset, clipped at 0).
-- scope: rank
CREATE OR REPLACE TEMP VIEW launch_stats AS
SELECT g.run, g.rank, count(*) AS launches,
       avg(launch_delay_ns) AS mean_launch_delay_ns, median(launch_delay_ns) AS median_launch_delay_ns,
       quantile_cont(launch_delay_ns, 0.95) AS p95_launch_delay_ns, max(launch_delay_ns) AS max_launch_delay_ns,
       avg(launch_dur_ns) AS mean_launch_dur_ns, avg(dur_ns) AS mean_gpu_dur_ns,
       count(*) FILTER (WHERE launch_dur_ns <= getvariable('launch_short_max_ns') AND dur_ns < launch_dur_ns) AS short_kernels,
       count(*) FILTER (WHERE launch_dur_ns > getvariable('launch_outlier_min_ns')) AS launch_outliers,
       count(*) FILTER (WHERE raw_launch_delay_ns - coalesce(o.clock_offset_ns, 0) > getvariable('launch_delay_outlier_min_ns')) AS delay_outliers,
       any_value(o.min_launch_delay_ns) AS min_launch_delay_ns, any_value(o.clock_offset_ns) AS clock_offset_ns,
       any_value(o.clock_offset_reason) AS clock_offset_reason,
       median(greatest(raw_launch_delay_ns - coalesce(o.clock_offset_ns, 0), 0)) AS corrected_median_launch_delay_ns
FROM _gpu_launches g LEFT JOIN _gpu_clock_offset o USING (run, rank) GROUP BY g.run, g.rank;

-- Queue length per stream: +1 when a launch call starts, -1 when the GPU operation starts.
-- Columns: run, rank, stream, launches, max_queue, mean_queue (time-weighted over the stream's
-- activity; HTA reports an unweighted mean over samples instead).
-- scope: rank
CREATE OR REPLACE TEMP VIEW queue_length AS
WITH deltas AS (
    SELECT run, rank, window_id, stream, launch_ts_ns AS t, 1 AS d FROM _gpu_launches
    UNION ALL
    SELECT run, rank, window_id, stream, ts_ns, -1 FROM _gpu_launches
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
-- scope: rank
CREATE OR REPLACE TEMP VIEW idle_breakdown AS
WITH ordered AS (
    SELECT run, rank, window_id, stream, ts_ns, dur_ns, launch_ts_ns,
           lag(ts_ns + dur_ns) OVER w AS prev_end
    FROM _gpu_launches WINDOW w AS (PARTITION BY run, rank, window_id, stream ORDER BY ts_ns)
),
gaps AS (
    SELECT run, rank, stream, ts_ns - prev_end AS gap_ns,
           CASE WHEN launch_ts_ns > prev_end THEN 'host_wait'
                WHEN ts_ns - prev_end < getvariable('idle_kernel_wait_ns') THEN 'kernel_wait'
                ELSE 'other' END AS category
    FROM ordered WHERE prev_end IS NOT NULL
),
span AS (SELECT run, rank, stream, max(ts_ns + dur_ns) - min(ts_ns) AS span_ns FROM _gpu_launches GROUP BY ALL)
SELECT g.run, g.rank, g.stream, g.category, sum(greatest(g.gap_ns, 0)) AS idle_ns, count(*) AS gaps,
       100.0 * sum(greatest(g.gap_ns, 0)) / nullif(any_value(s.span_ns), 0) AS idle_pct
FROM gaps g JOIN span s USING (run, rank, stream) GROUP BY ALL;
