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
-- clock_alignment: one row per run with estimates: applied, why ('several hosts', 'evident offset',
-- 'align_clocks=always', or NULL when not applied), n_hosts, max_abs_offset_ns (the largest
-- estimate), median_step_ns, and absurd (an applied offset longer than the median step: the
-- clocks were off by more than a step, a damaged or hand-edited trace; info and the report say it).
-- One view does the work (_clock_decisions) and the two public ones read it: every analysis
-- view that adds offsets binds this chain once (a chain of views that each re-read the estimates
-- made binding the analyses five times slower).
--
-- requires: (nothing: reads the canonical tables only)
-- scope: align
CREATE OR REPLACE TEMP VIEW _clock_decisions AS
WITH calls AS MATERIALIZED (
    SELECT run, coalesce(pg_name, '?') AS pg, seq, rank, end_ts_ns FROM comms WHERE NOT is_p2p AND seq IS NOT NULL),
per_collective AS (  -- a GROUP BY joined back, not a median window (8,192 op-timeline ranks: 14.7 -> 8.7 s wall)
    SELECT run, pg, seq, median(end_ts_ns) AS median_end, count(*) AS n FROM calls GROUP BY ALL),
ends AS (SELECT c.*, p.median_end, p.n FROM calls c JOIN per_collective p USING (run, pg, seq)),
_estimates AS (
    SELECT run, rank, CAST(-median(end_ts_ns - median_end) AS BIGINT) AS estimated_offset_ns,
           count(*) AS n_collectives
    FROM ends WHERE n > 1 GROUP BY run, rank),
_hosts AS (SELECT run, count(DISTINCT host) AS n_hosts FROM ranks GROUP BY run),
_per_run AS (
    SELECT e.*, h.n_hosts, max(abs(e.estimated_offset_ns)) OVER (PARTITION BY e.run) AS max_abs_offset_ns
    FROM _estimates e JOIN _hosts h USING (run)),
_decided AS (
    SELECT *, CASE getvariable('align_clocks')
                   WHEN 'always' THEN 'align_clocks=always'
                   WHEN 'never' THEN NULL
                   ELSE CASE WHEN n_hosts > 1 THEN 'several hosts'
                             WHEN max_abs_offset_ns >= getvariable('clock_offset_evident_ns') THEN 'evident offset' END
              END AS why
    FROM _per_run)
SELECT run, rank, estimated_offset_ns, n_collectives, why IS NOT NULL AS applied, why, n_hosts, max_abs_offset_ns
FROM _decided;

-- scope: align
CREATE OR REPLACE TEMP VIEW clock_offsets AS
SELECT run, rank, estimated_offset_ns, n_collectives, applied,
       CASE WHEN applied THEN estimated_offset_ns ELSE 0 END AS offset_ns
FROM _clock_decisions;

-- runs without a collective seen on two ranks have no row (nothing to apply); the steps are read
-- here only (not in the chain every analysis binds)
-- scope: align
CREATE OR REPLACE TEMP VIEW clock_alignment AS
WITH d AS (SELECT DISTINCT run, applied, why, n_hosts, max_abs_offset_ns FROM _clock_decisions),
s AS (SELECT run, median(dur_ns) AS median_step_ns FROM steps GROUP BY run)
SELECT d.*, s.median_step_ns, coalesce(d.applied AND d.max_abs_offset_ns > s.median_step_ns, false) AS absurd
FROM d LEFT JOIN s USING (run);
