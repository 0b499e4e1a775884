-- Per-rank clock offsets, estimated from collective completions.
--
-- Members of a blocking collective leave it together, so a rank whose ends are consistently
-- later (earlier) than its peers' has a clock ahead (behind). For each collective seen on more
-- than one rank we take each rank's end minus the median end of the collective; a rank's
-- estimated offset is minus the median of those differences.
--
-- When the offsets are applied (align_clocks, parameter of traceanalyzer.analyses):
--   'auto'   (default) whenever they are evident: the run spans several hosts, or some rank's
--            estimate is at least clock_offset_evident_ns (100 ms by default) -- ranks on one host
--            share one clock, so an offset that large there means a trace's clock (its
--            baseTimeNanoseconds) is off, e.g. a rank shifted by 10 s or an hour; below it the
--            estimate is how far apart members leave collectives (at most 4.6 ms in the shipped runs);
--   'always' / 'never'.
--
-- Columns: run, rank, estimated_offset_ns, n_collectives, applied (bool), offset_ns (applied
-- value: estimated_offset_ns or 0).
--
-- clock_alignment: one row per run: applied, why ('several hosts', 'evident offset',
-- 'align_clocks=always', or NULL when not applied), n_hosts, max_abs_offset_ns (the largest
-- estimate), median_step_ns, and absurd (an applied offset longer than the median step: the
-- clocks were off by more than a step, a damaged or hand-edited trace; info and the report say it).
CREATE OR REPLACE TEMP VIEW clock_offset_estimates AS
WITH ends AS (
    SELECT run, coalesce(pg_name, '?') AS pg, seq, rank, end_ts_ns,
           median(end_ts_ns) OVER (PARTITION BY run, coalesce(pg_name, '?'), seq) AS median_end,
           count(*) OVER (PARTITION BY run, coalesce(pg_name, '?'), seq) AS n
    FROM comms WHERE NOT is_p2p AND seq IS NOT NULL
)
SELECT run, rank,
       CAST(-median(end_ts_ns - median_end) AS BIGINT) AS estimated_offset_ns,
       count(*) AS n_collectives
FROM ends
WHERE n > 1
GROUP BY run, rank;

CREATE OR REPLACE TEMP VIEW clock_alignment AS
WITH hosts AS (SELECT run, count(DISTINCT host) AS n_hosts FROM ranks GROUP BY run),
est AS (SELECT run, max(abs(estimated_offset_ns)) AS max_abs_offset_ns FROM clock_offset_estimates GROUP BY run),
steps AS (SELECT run, median(dur_ns) AS median_step_ns FROM steps GROUP BY run),
decided AS (
    SELECT h.run, h.n_hosts, e.max_abs_offset_ns, s.median_step_ns,
           CASE getvariable('align_clocks')
                WHEN 'always' THEN 'align_clocks=always'
                WHEN 'never' THEN NULL
                ELSE CASE WHEN h.n_hosts > 1 THEN 'several hosts'
                          WHEN e.max_abs_offset_ns >= getvariable('clock_offset_evident_ns') THEN 'evident offset' END
           END AS why
    FROM hosts h LEFT JOIN est e USING (run) LEFT JOIN steps s USING (run))
SELECT run, why IS NOT NULL AS applied, why, n_hosts, max_abs_offset_ns, median_step_ns,
       coalesce(why IS NOT NULL AND max_abs_offset_ns > median_step_ns, false) AS absurd
FROM decided;

CREATE OR REPLACE TEMP VIEW clock_offsets AS
SELECT e.run, e.rank, e.estimated_offset_ns, e.n_collectives, a.applied,
       CASE WHEN a.applied THEN e.estimated_offset_ns ELSE 0 END AS offset_ns
FROM clock_offset_estimates e JOIN clock_alignment a USING (run);
