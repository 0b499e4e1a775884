-- Per-rank clock offsets, estimated from collective completions.
--
-- Members of a blocking collective leave it together, so a rank whose ends are consistently
-- later (earlier) than its peers' has a clock ahead (behind). For each collective seen on more
-- than one rank we take each rank's end minus the median end of the collective; a rank's
-- estimated offset is minus the median of those differences. Ranks on one host share one clock:
-- the estimate is reported but applied only when the run spans several hosts, or when
-- align_clocks = 'always' (parameter of traceanalyzer.analyses; 'never' disables it).
--
-- Columns: run, rank, estimated_offset_ns, n_collectives, applied (bool), offset_ns (applied
-- value: estimated_offset_ns or 0).
--
-- clock_alignment (run, applied) says whether a run's offsets are applied at all, from the ranks
-- table alone: the replay graph builder asks it first and skips the estimate (a median per
-- collective) where nothing would be applied.
--
-- requires: (nothing: reads the canonical tables only)
CREATE OR REPLACE TEMP VIEW clock_alignment AS
SELECT run,
       CASE getvariable('align_clocks') WHEN 'always' THEN true WHEN 'never' THEN false
            ELSE count(DISTINCT host) > 1 END AS applied
FROM ranks GROUP BY run;

CREATE OR REPLACE TEMP VIEW clock_offset_estimates AS
WITH ends AS (
    SELECT run, coalesce(pg_name, '?') AS pg, seq, rank, end_ts_ns,
           median(end_ts_ns) OVER (PARTITION BY run, coalesce(pg_name, '?'), seq) AS median_end,
           count(*) OVER (PARTITION BY run, coalesce(pg_name, '?'), seq) AS n
    FROM comms WHERE NOT is_p2p AND seq IS NOT NULL
)
SELECT e.run, e.rank,
       CAST(-median(e.end_ts_ns - e.median_end) AS BIGINT) AS estimated_offset_ns,
       count(*) AS n_collectives,
       any_value(a.applied) AS applied
FROM ends e JOIN clock_alignment a USING (run)
WHERE e.n > 1
GROUP BY e.run, e.rank;

CREATE OR REPLACE TEMP VIEW clock_offsets AS
SELECT run, rank, estimated_offset_ns, n_collectives, applied,
       CASE WHEN applied THEN estimated_offset_ns ELSE 0 END AS offset_ns
FROM clock_offset_estimates;
