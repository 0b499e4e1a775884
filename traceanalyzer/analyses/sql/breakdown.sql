-- Where the time went, per rank and step: compute / communication / memory / idle over merged
-- intervals (activity.sql: a segment counts once, for its highest-priority activity), and the
-- kernels (or CPU operators) that took the most time.
--
-- requires: activity

-- Columns: run, rank, step, span_ns (first to last activity of the step), compute_ns,
-- comm_ns (exposed: communication with no compute at the same time), memory_ns, idle_ns, and the
-- same as % of span_ns.
-- scope: rank
CREATE OR REPLACE TEMP VIEW temporal_breakdown AS
SELECT run, rank, step, max(hi_ns) - min(lo_ns) AS span_ns,
       coalesce(sum(dur_ns) FILTER (WHERE label = 'compute'), 0) AS compute_ns,
       coalesce(sum(dur_ns) FILTER (WHERE label = 'comm'), 0) AS comm_ns,
       coalesce(sum(dur_ns) FILTER (WHERE label = 'memory'), 0) AS memory_ns,
       coalesce(sum(dur_ns) FILTER (WHERE label = 'idle'), 0) AS idle_ns,
       100.0 * coalesce(sum(dur_ns) FILTER (WHERE label = 'compute'), 0) / nullif(max(hi_ns) - min(lo_ns), 0) AS compute_pct,
       100.0 * coalesce(sum(dur_ns) FILTER (WHERE label = 'comm'), 0) / nullif(max(hi_ns) - min(lo_ns), 0) AS comm_pct,
       100.0 * coalesce(sum(dur_ns) FILTER (WHERE label = 'memory'), 0) / nullif(max(hi_ns) - min(lo_ns), 0) AS memory_pct,
       100.0 * coalesce(sum(dur_ns) FILTER (WHERE label = 'idle'), 0) / nullif(max(hi_ns) - min(lo_ns), 0) AS idle_pct
FROM activity_segments GROUP BY ALL;

-- Per rank over its whole window(s), all steps swept together (idle is then time with nothing at
-- all running on the rank, whichever step the work belongs to).
-- Columns: run, rank, span_ns, compute_ns, comm_ns, memory_ns, idle_ns, and the same as % of span_ns.
-- scope: rank
CREATE OR REPLACE TEMP VIEW temporal_ranks AS
SELECT run, rank, sum(span_ns) AS span_ns, sum(compute_ns) AS compute_ns, sum(comm_ns) AS comm_ns,
       sum(memory_ns) AS memory_ns, sum(idle_ns) AS idle_ns,
       100.0 * sum(compute_ns) / nullif(sum(span_ns), 0) AS compute_pct,
       100.0 * sum(comm_ns) / nullif(sum(span_ns), 0) AS comm_pct,
       100.0 * sum(memory_ns) / nullif(sum(span_ns), 0) AS memory_pct,
       100.0 * sum(idle_ns) / nullif(sum(span_ns), 0) AS idle_pct
FROM (SELECT run, rank, window_id, hi_ns - lo_ns AS span_ns, compute_label_ns AS compute_ns,
             comm_label_ns AS comm_ns, memory_label_ns AS memory_ns, idle_label_ns AS idle_ns
      FROM _activity_window_sums)
GROUP BY run, rank;

-- Per kernel (GPU ranks) or CPU operator (CPU ranks) name: count and time, per rank.
-- Columns: run, rank, category, name, count, total_ns, mean_ns, max_ns, pct_of_category,
-- rank_in_category (1 = most time).
-- scope: rank
CREATE OR REPLACE TEMP VIEW kernel_breakdown AS
SELECT run, rank, category, name, count(*) AS count, sum(hi_ns - lo_ns) AS total_ns,
       avg(hi_ns - lo_ns) AS mean_ns, max(hi_ns - lo_ns) AS max_ns,
       100.0 * sum(hi_ns - lo_ns) / sum(sum(hi_ns - lo_ns)) OVER (PARTITION BY run, rank, category) AS pct_of_category,
       row_number() OVER (PARTITION BY run, rank, category ORDER BY sum(hi_ns - lo_ns) DESC, name) AS rank_in_category
FROM activity_intervals GROUP BY run, rank, category, name;
