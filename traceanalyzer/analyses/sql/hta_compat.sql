-- HTA compatibility: HTA 0.5.0's per-rank GPU numbers (temporal breakdown, communication/
-- computation overlap, kernel-type Venn breakdown, per-kernel table), reproduced from the
-- canonical events so that ours can be checked against HTA's (tests/test_hta_parity.py), and so
-- that anyone who knows HTA's numbers can get them from a store. Our own analyses (activity.sql,
-- overlap.sql, breakdown.sql) differ by design; tests/reference/DEVIATIONS.md says how and why.
-- Every rule below is HTA's, read from its source: tests/reference/HTA_DEFINITIONS.md (section
-- numbers in brackets).
--
-- The algorithm, per trace file (run, rank, window_id; HTA sees one file per rank):
--   1. the rows HTA loads [1]: complete events with a category (HTA drops rows without dur or cat,
--      and cat 'Trace'). If any timestamp of the file has a fractional microsecond, every row is
--      rounded inward to whole µs, as HTA does with its float64 column: ts = ceil(ts), end =
--      floor(ts + dur), in the file's own time base (our ts_ns - ranks.base_time_ns), with
--      float64 arithmetic (an epoch-µs float64 holds only 1/4 µs, and HTA rounds that value).
--   2. HTA's "GPU" events G [1]: rows whose `stream` arg is an int other than -1, whatever their
--      category. That is kernels, memcpys and memsets, but not gpu_user_annotation (Kineto gives it
--      no stream arg; our events.stream falls back to its tid), and it is also a CPU op that has a
--      stream arg (Inductor's triton_* cpu_op with "stream": 0 in the vLLM trace). So the stream
--      comes from args_json, not from events.stream.
--   3. the window [1]: when the run (HTA's trace set) has >= 2 distinct names containing
--      'ProfilerStep', each file keeps the launch-side rows (all rows but GPU kernels: stream >= 0
--      and correlation >= 0) that start before its cut -- the start of its last ProfilerStep row,
--      CPU or GPU side -- and the GPU kernels whose correlation is that of a kept launch-side row
--      (an inner join: launch time, not run time, decides; a kernel whose correlation appears on
--      several kept rows is counted that many times, as HTA's merge does). Otherwise nothing is cut.
--   4. the kernel type [2], by name only: ^nccl.*Kernel COMMUNICATION; ^Memcpy, ^Memset, ^dma
--      MEMORY; names containing Memcpy or Sync OTHER; everything else COMPUTATION (so non-NCCL
--      communication kernels such as multimem_all_reduce_kernel are COMPUTATION).
--   5. merged intervals per kernel type, all streams together, as HTA's merge_kernel_intervals:
--      sorted by start, an interval opens a new group when it starts after the largest end so far;
--      a group is [min start, max end].
--   6. a sweep over the merged intervals with one bit per type (1 COMPUTATION, 2 COMMUNICATION,
--      4 MEMORY, 8 OTHER): between consecutive bounds the running sum says which types are active.
--      Everything is read off these segments: |∪G| (any bit), compute time (bit 1), overlap [4]
--      (bits 1 and 2) over communication time (bit 2), and HTA's Venn regions [5] (bits 1, 2, 4).
--      Only kernel_time (first start to last end of G) comes from the events themselves.
-- Times come out in µs like HTA's (its columns say "(us)"); percentages are 0-100, given both
-- unrounded (*_pct) and rounded as HTA rounds them (*_pctg, percentage). Not reproduced: events
-- that HTA loads but we drop or repair at ingest (negative or absurd durations, complete events
-- without dur: counted in ranks.skipped_json); HTA's handling of rows whose rounded duration is
-- negative (none in the reference traces); a `stream` arg that is a bool (int(True) = 1 for HTA);
-- an Event Sync / Context Sync row with a stream arg but no correlation (HTA's join would pair it
-- with every launch-side row without one). Ranks are ours (distributedInfo), not HTA's (the first
-- '"rank": N' in the file text); they agree on every reference trace.
--
-- requires: intervals

-- Per trace file: how HTA loads it.
-- Columns: run, rank, window_id, base_time_ns, rounds_to_us (some ts of the file, event or flow, has a
-- fractional µs: HTA's ts column is then float64 and it rounds every row; false for every file after
-- SET VARIABLE hta_disable_ns_rounding = true, HTA's HTA_DISABLE_NS_ROUNDING=1), n_step_names (distinct
-- names containing 'ProfilerStep' in the run, HTA's trace set), window_applied (n_step_names >= 2).
CREATE OR REPLACE TEMP VIEW _hta_files AS
WITH fractional AS (
    SELECT run, rank, window_id, bool_or(frac) AS frac
    FROM (SELECT e.run, e.rank, e.window_id, (e.ts_ns - r.base_time_ns) % 1000 <> 0 AS frac
          FROM events e JOIN ranks r USING (run, rank, window_id)
          UNION ALL
          SELECT f.run, f.rank, f.window_id, (f.ts_ns - r.base_time_ns) % 1000 <> 0
          FROM flows f JOIN ranks r USING (run, rank, window_id))
    GROUP BY ALL
),
step_names AS (
    SELECT run, count(DISTINCT name) AS n_step_names
    FROM events WHERE ph = 'X' AND cat IS NOT NULL AND cat <> 'Trace' AND name LIKE '%ProfilerStep%'
    GROUP BY run
)
SELECT r.run, r.rank, r.window_id, r.base_time_ns,
       coalesce(f.frac, false) AND NOT coalesce(getvariable('hta_disable_ns_rounding'), false) AS rounds_to_us,
       coalesce(s.n_step_names, 0) AS n_step_names, coalesce(s.n_step_names, 0) >= 2 AS window_applied
FROM ranks r LEFT JOIN fractional f USING (run, rank, window_id) LEFT JOIN step_names s USING (run);

-- The rows of HTA's loaded frame that can matter, on HTA's clock, with HTA's stream and correlation:
-- rows with a `stream` arg (G), with a correlation (the launch side of the window's join), and the
-- ProfilerStep rows (the cut). The other rows never enter G, the cut or the join.
-- Columns: run, rank, window_id, event_id, cat, name, lo_ns, hi_ns (start and end after HTA's
-- rounding, as epoch ns), hta_stream (the int value of the `stream` arg, -1 when absent or not an
-- int), hta_correlation (correlation arg, -1 when absent), is_gpu_kernel (HTA's GPUKernelFilter:
-- stream >= 0 and correlation >= 0, or Event Sync / Context Sync).
CREATE OR REPLACE TEMP VIEW _hta_rows AS
WITH loaded AS (
    SELECT e.run, e.rank, e.window_id, e.event_id, e.cat, e.name, e.ts_ns, e.dur_ns, e.correlation,
           CASE WHEN e.args_json LIKE '%"stream"%' THEN json_extract_string(e.args_json, '$.stream') END AS stream_text,
           CASE WHEN e.args_json LIKE '%"stream"%' THEN json_type(e.args_json, '$.stream') END AS stream_type,
           f.base_time_ns, f.rounds_to_us, e.ts_ns - f.base_time_ns AS rel_ns
    FROM events e JOIN _hta_files f USING (run, rank, window_id)
    WHERE e.ph = 'X' AND e.cat IS NOT NULL AND e.cat <> 'Trace'
      AND (e.args_json LIKE '%"stream"%' OR e.correlation IS NOT NULL OR e.name LIKE '%ProfilerStep%'
           OR e.name IN ('Event Sync', 'Context Sync'))
),
as_float AS (
    -- the float64 HTA holds: ts parsed from its decimal text, dur likewise (exact below 2^53 ns)
    SELECT *,
           CASE WHEN rounds_to_us AND rel_ns >= 0
                THEN CAST((rel_ns // 1000)::VARCHAR || '.' || lpad((rel_ns % 1000)::VARCHAR, 3, '0') AS DOUBLE)
                ELSE rel_ns::DOUBLE / 1000.0 END AS ts_us_float,
           dur_ns::DOUBLE / 1000.0 AS dur_us_float
    FROM loaded
),
on_hta_clock AS (
    SELECT run, rank, window_id, event_id, cat, name, coalesce(correlation, -1) AS hta_correlation,
           CASE WHEN rounds_to_us THEN base_time_ns + 1000 * CAST(ceil(ts_us_float) AS BIGINT) ELSE ts_ns END AS lo_ns,
           CASE WHEN rounds_to_us THEN base_time_ns + 1000 * CAST(floor(ts_us_float + dur_us_float) AS BIGINT)
                ELSE ts_ns + dur_ns END AS hi_ns,
           coalesce(CASE WHEN stream_type = 'DOUBLE' THEN CAST(trunc(CAST(stream_text AS DOUBLE)) AS BIGINT)
                         WHEN regexp_full_match(stream_text, '\s*[+-]?[0-9]{1,18}\s*') THEN CAST(trim(stream_text) AS BIGINT)
                    END, -1) AS hta_stream
    FROM as_float
)
SELECT run, rank, window_id, event_id, cat, name, lo_ns, hi_ns, hta_stream, hta_correlation,
       (hta_stream >= 0 AND hta_correlation >= 0) OR name IN ('Event Sync', 'Context Sync') AS is_gpu_kernel
FROM on_hta_clock;

-- The window HTA analyses, per trace file (compare with hta_reference.json's hta_window).
-- Columns: run, rank, window_id, rounds_to_us, n_step_names, window_applied, cut_ts_ns (start of the
-- file's last ProfilerStep row, CPU or GPU side, after rounding; null when no cut is made),
-- cut_ts_us (the same in the trace's own time base and unit, like HTA's).
CREATE OR REPLACE TEMP VIEW hta_window AS
WITH last_step AS (
    SELECT run, rank, window_id, max(lo_ns) FILTER (WHERE name LIKE '%ProfilerStep%' AND NOT is_gpu_kernel) AS start_ns
    FROM _hta_rows GROUP BY ALL
)
SELECT f.run, f.rank, f.window_id, f.rounds_to_us, f.n_step_names, f.window_applied,
       CASE WHEN f.window_applied THEN l.start_ns END AS cut_ts_ns,
       CASE WHEN f.window_applied THEN (l.start_ns - f.base_time_ns) / 1000.0 END AS cut_ts_us
FROM _hta_files f LEFT JOIN last_step l USING (run, rank, window_id);

-- G inside HTA's window, with HTA's kernel type: the events every number below is made of.
-- Columns: run, rank, window_id, event_id, cat, name, kernel_type, hta_stream, lo_ns, hi_ns, dur_us.
CREATE OR REPLACE TEMP VIEW hta_kernels AS
WITH loaded_rows AS MATERIALIZED (SELECT * FROM _hta_rows),
cuts AS MATERIALIZED (SELECT run, rank, window_id, window_applied, cut_ts_ns FROM hta_window),
launch_side_kept AS (
    SELECT r.run, r.rank, r.window_id, r.hta_correlation
    FROM loaded_rows r JOIN cuts c USING (run, rank, window_id)
    WHERE c.window_applied AND NOT r.is_gpu_kernel AND r.lo_ns < c.cut_ts_ns AND r.hta_correlation >= 0
),
in_window AS (
    SELECT r.* FROM loaded_rows r JOIN cuts c USING (run, rank, window_id)
    WHERE r.hta_stream <> -1 AND (NOT c.window_applied OR (NOT r.is_gpu_kernel AND r.lo_ns < c.cut_ts_ns))
    UNION ALL
    SELECT r.* FROM loaded_rows r JOIN cuts c USING (run, rank, window_id)
    JOIN launch_side_kept l ON l.run = r.run AND l.rank = r.rank AND l.window_id = r.window_id
                           AND l.hta_correlation = r.hta_correlation
    WHERE r.hta_stream <> -1 AND c.window_applied AND r.is_gpu_kernel
)
SELECT run, rank, window_id, event_id, cat, name,
       CASE WHEN regexp_matches(name, '^nccl.*Kernel') THEN 'COMMUNICATION'
            WHEN regexp_matches(name, '^(Memcpy|Memset|dma)') THEN 'MEMORY'
            WHEN regexp_matches(name, '^(.*Memcpy|.*Sync)') THEN 'OTHER'
            ELSE 'COMPUTATION' END AS kernel_type,
       hta_stream, lo_ns, hi_ns, (hi_ns - lo_ns) / 1000.0 AS dur_us
FROM in_window;

-- Merged intervals per kernel type, HTA's merge_kernel_intervals (step 5): intervals.sql's rule is
-- HTA's (a kernel starting after every earlier one ended opens a merged interval).
-- Columns: run, rank, window_id, kernel_type (COMPUTATION, COMMUNICATION, MEMORY, OTHER), lo_ns, hi_ns.
CREATE OR REPLACE TEMP VIEW _hta_merged AS
WITH k AS (
    SELECT {'run': run, 'rank': rank, 'window_id': window_id, 'kernel_type': kernel_type} AS grp, lo_ns, hi_ns
    FROM hta_kernels
)
SELECT grp.run AS run, grp.rank AS rank, grp.window_id AS window_id, grp.kernel_type AS kernel_type, lo_ns, hi_ns
FROM _union_intervals(k);

-- Time segments between consecutive merged-interval bounds, labelled with the types running
-- (step 6; OTHER takes part so that the segments also give the union of G).
-- Columns: run, rank, window_id, lo_ns, hi_ns, running (bits: 1 COMPUTATION, 2 COMMUNICATION,
-- 4 MEMORY, 8 OTHER), kernel_type (HTA's Venn label: COMPUTATION, COMMUNICATION, MEMORY among the
-- running ones, in that order, joined by ' overlapping '; '' when only OTHER runs).
CREATE OR REPLACE TEMP VIEW _hta_segments AS
WITH bounds AS (
    SELECT run, rank, window_id, lo_ns, hi_ns,
           CASE kernel_type WHEN 'COMPUTATION' THEN 1 WHEN 'COMMUNICATION' THEN 2 WHEN 'MEMORY' THEN 4 ELSE 8 END AS bit
    FROM _hta_merged
),
deltas AS (
    SELECT run, rank, window_id, t, sum(d) AS d
    FROM (SELECT run, rank, window_id, lo_ns AS t, bit AS d FROM bounds
          UNION ALL
          SELECT run, rank, window_id, hi_ns, -bit FROM bounds)
    GROUP BY ALL
),
running AS (
    SELECT run, rank, window_id, t AS lo_ns, lead(t) OVER w AS hi_ns, sum(d) OVER w AS running
    FROM deltas
    WINDOW w AS (PARTITION BY run, rank, window_id ORDER BY t ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
)
SELECT run, rank, window_id, lo_ns, hi_ns, running,
       concat_ws(' overlapping ', CASE WHEN running & 1 <> 0 THEN 'COMPUTATION' END,
                 CASE WHEN running & 2 <> 0 THEN 'COMMUNICATION' END,
                 CASE WHEN running & 4 <> 0 THEN 'MEMORY' END) AS kernel_type
FROM running WHERE hi_ns IS NOT NULL AND running > 0;

-- HTA's get_temporal_breakdown [3], per trace file.
-- Columns: run, rank, window_id, kernel_time_us (first start to last end of G), idle_time_us
-- (kernel_time - |∪G|), compute_time_us (|∪COMPUTATION|), non_compute_time_us (the rest: communication,
-- memory and OTHER not under compute), idle_pct, compute_pct, non_compute_pct (of kernel_time,
-- unrounded), idle_time_pctg, compute_time_pctg, non_compute_time_pctg (rounded to 2 decimals, HTA's).
CREATE OR REPLACE TEMP VIEW hta_temporal_breakdown AS
WITH span AS (
    SELECT run, rank, window_id, max(hi_ns) - min(lo_ns) AS kernel_ns FROM hta_kernels GROUP BY ALL
),
busy AS (
    SELECT run, rank, window_id, sum(hi_ns - lo_ns) AS busy_ns,
           coalesce(sum(hi_ns - lo_ns) FILTER (WHERE running & 1 <> 0), 0) AS compute_ns
    FROM _hta_segments GROUP BY ALL
),
times AS (
    SELECT run, rank, window_id, s.kernel_ns / 1000.0 AS kernel_time_us,
           (s.kernel_ns - coalesce(b.busy_ns, 0)) / 1000.0 AS idle_time_us,
           coalesce(b.compute_ns, 0) / 1000.0 AS compute_time_us,
           (coalesce(b.busy_ns, 0) - coalesce(b.compute_ns, 0)) / 1000.0 AS non_compute_time_us
    FROM span s LEFT JOIN busy b USING (run, rank, window_id)
)
SELECT *,
       100.0 * idle_time_us / nullif(kernel_time_us, 0) AS idle_pct,
       100.0 * compute_time_us / nullif(kernel_time_us, 0) AS compute_pct,
       100.0 * non_compute_time_us / nullif(kernel_time_us, 0) AS non_compute_pct,
       round(100.0 * idle_time_us / nullif(kernel_time_us, 0), 2) AS idle_time_pctg,
       round(100.0 * compute_time_us / nullif(kernel_time_us, 0), 2) AS compute_time_pctg,
       round(100.0 * non_compute_time_us / nullif(kernel_time_us, 0), 2) AS non_compute_time_pctg
FROM times;

-- HTA's get_comm_comp_overlap [4], per trace file: the share of the merged communication time
-- during which some computation kernel runs, on any stream, over the whole window.
-- Columns: run, rank, window_id, comm_time_us (|∪COMMUNICATION|), overlap_time_us
-- (|∪COMMUNICATION ∩ ∪COMPUTATION|), overlap_pct (unrounded; null, HTA's NaN, without communication
-- time), comp_comm_overlap_pctg (rounded to 2 decimals, HTA's).
CREATE OR REPLACE TEMP VIEW hta_overlap AS
WITH times AS (
    SELECT run, rank, window_id,
           coalesce(sum(hi_ns - lo_ns) FILTER (WHERE running & 2 <> 0), 0) AS comm_ns,
           coalesce(sum(hi_ns - lo_ns) FILTER (WHERE running & 3 = 3), 0) AS overlap_ns
    FROM _hta_segments GROUP BY ALL
)
SELECT run, rank, window_id, comm_ns / 1000.0 AS comm_time_us, overlap_ns / 1000.0 AS overlap_time_us,
       100.0 * overlap_ns / nullif(comm_ns, 0) AS overlap_pct,
       round(100.0 * overlap_ns / nullif(comm_ns, 0), 2) AS comp_comm_overlap_pctg
FROM times;

-- HTA's kernel-type table [5] for one trace file (what hta_reference.json's per-rank
-- kernel_type_breakdown holds). HTA truncates each segment to whole µs (no effect on whole-µs data).
-- Columns: run, rank, window_id, kernel_type (a Venn region: 'COMPUTATION', 'COMPUTATION overlapping
-- COMMUNICATION', ...), sum_us, pct (of the sum over the regions, unrounded), percentage (rounded
-- to 1 decimal, HTA's).
CREATE OR REPLACE TEMP VIEW hta_kernel_type_breakdown AS
WITH regions AS (
    SELECT run, rank, window_id, kernel_type, sum((hi_ns - lo_ns) // 1000) AS sum_us
    FROM _hta_segments WHERE running & 7 <> 0 GROUP BY ALL
)
SELECT run, rank, window_id, kernel_type, sum_us,
       100.0 * sum_us / nullif(sum(sum_us) OVER (PARTITION BY run, rank, window_id), 0) AS pct,
       round(100.0 * sum_us / nullif(sum(sum_us) OVER (PARTITION BY run, rank, window_id), 0), 1) AS percentage
FROM regions;

-- HTA's public kernel-type table: the regions summed over all the ranks of the run (trace set).
-- Columns: run, kernel_type, sum_us, pct, percentage (as hta_kernel_type_breakdown).
CREATE OR REPLACE TEMP VIEW hta_kernel_type_all_ranks AS
WITH regions AS (SELECT run, kernel_type, sum(sum_us) AS sum_us FROM hta_kernel_type_breakdown GROUP BY ALL)
SELECT run, kernel_type, sum_us,
       100.0 * sum_us / nullif(sum(sum_us) OVER (PARTITION BY run), 0) AS pct,
       round(100.0 * sum_us / nullif(sum(sum_us) OVER (PARTITION BY run), 0), 1) AS percentage
FROM regions;

-- HTA's per-kernel table [5] without its "others" grouping (num_kernels=1e9, duration_ratio=1):
-- per trace file, kernel type and name, all streams pooled. HTA reports no count; we add it.
-- Columns: run, rank, window_id, kernel_type (COMPUTATION, COMMUNICATION, MEMORY: HTA's table has
-- no OTHER), name, count, sum_us, max_us, min_us, mean_us, std_us (sample std, 0 for one kernel),
-- pct_of_type (share of the type's summed durations), rank_in_type (1 = largest sum).
CREATE OR REPLACE TEMP VIEW hta_kernel_stats AS
SELECT run, rank, window_id, kernel_type, name, count(*) AS count, sum(dur_us) AS sum_us,
       max(dur_us) AS max_us, min(dur_us) AS min_us, avg(dur_us) AS mean_us,
       coalesce(stddev_samp(dur_us), 0) AS std_us,
       100.0 * sum(dur_us) / nullif(sum(sum(dur_us)) OVER (PARTITION BY run, rank, window_id, kernel_type), 0) AS pct_of_type,
       row_number() OVER (PARTITION BY run, rank, window_id, kernel_type ORDER BY sum(dur_us) DESC, name) AS rank_in_type
FROM hta_kernels WHERE kernel_type <> 'OTHER'
GROUP BY run, rank, window_id, kernel_type, name;
