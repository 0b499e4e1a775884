-- Stragglers: who made the others wait, where, how much, and how often.
--
-- Cost, not count: for every collective, its last arriver imposes on each other member the wait
-- (last arrival - that member's arrival). Per rank and step we add up the waits it imposed and
-- divide by its number of peers: the time the average peer lost waiting for it, which is what the
-- step lost (see ../shared/METRICS.md, "Stragglers").
-- Blame goes to the rank that was slow, not to the one that merely arrived last: a rank that left
-- the group's previous collective late (ring completion order, a late start) arrives late without
-- being slower. So a peer's wait is charged only up to the last arriver's own excess: its gap since
-- its previous collective of the group minus the median gap of its peers (collectives.sql); the
-- first collective of a group in the window, with no previous one, is charged in full. 'Where' is the phase of the step in which the rank
-- was slower than its peers: the phase with the largest excess over the median of the other ranks
-- of the same step (phases.sql); and within that phase, the innermost named range (a user's
-- record_function, annotations.sql) holding the largest part of that excess.
--
-- Parameters (DuckDB variables set by traceanalyzer.analyses.stragglers):
--   straggler_min_delay_pct  a rank is a finding when it costs at least this % of the median step
--                            time per step (median over the steps of the window) (default 10: the OSDI'25
--                            what-if study calls a job straggling at a slowdown of 1.1)
--   straggler_min_delay_ns   ... and at least this many ns per step (default 1e6 = 1 ms)
--   straggler_min_excess_pct ... and was slower on its own: its median excess over its peers in
--                            one phase is at least this % of the median step time, or its threads
--                            waited that much longer for a CPU core per step than its peers' did,
--                            behind other processes (host_cpu.sql: a rank on a shared core runs its collectives late on its
--                            gloo threads, time no phase of its own shows; a rank that only waited
--                            for a peer slept, it did not wait for a core) (default 10)
--   straggler_persistent_pct flagged in at least this % of steps -> 'persistent', else 'sporadic'
--                            (default 50)
--
-- requires: activity, annotations, clock_offsets, collectives, host_cpu, intervals, phases

-- Per rank and step: the delay it imposed on its peers.
-- Columns: run, rank, step, n_collectives (where it arrived last), imposed_wait_ns (sum over
-- peers of the wall time each waited for it, concurrent waits counted once), delay_ns (imposed
-- wait / number of its peers: what the average peer lost), step_ns (median step time of the run's
-- ranks in that step), delay_pct.
CREATE OR REPLACE TEMP VIEW straggler_steps AS
WITH excess AS (
    -- the last arriver's own excess time since the group's previous collective
    SELECT l.run, l.pg, l.seq, l.gap_ns - median(p.gap_ns) AS excess_ns
    FROM collective_instances i
    JOIN collective_ranks l ON l.run = i.run AND l.pg = i.pg AND l.seq = i.seq AND l.rank = i.last_arriver
    JOIN collective_ranks p ON p.run = i.run AND p.pg = i.pg AND p.seq = i.seq AND p.rank <> i.last_arriver
    GROUP BY l.run, l.pg, l.seq, l.gap_ns
),
waits AS (
    -- every peer's wait charged to the last arriver, as an interval on the peer's (aligned) clock
    SELECT r.run, i.step, i.last_arriver AS rank, r.rank AS peer,
           r.last_arrival_ns - least(r.wait_ns, greatest(coalesce(x.excess_ns, r.wait_ns), 0)) AS lo,
           r.last_arrival_ns AS hi
    FROM collective_ranks r JOIN collective_instances i USING (run, pg, seq)
    LEFT JOIN excess x USING (run, pg, seq)
    WHERE i.n_ranks > 1 AND i.step IS NOT NULL AND r.rank <> i.last_arriver AND r.wait_ns > 0
),
islands AS (
    -- concurrent collectives (DDP buckets, several groups) wait at the same time: merge each
    -- peer's waits for one straggler (intervals.sql) so that the same wall time is counted once
    SELECT {'run': run, 'step': step, 'rank': rank, 'peer': peer} AS grp, lo AS lo_ns, hi AS hi_ns FROM waits
),
per_peer AS (
    SELECT grp.run AS run, grp.step AS step, grp.rank AS rank, grp.peer AS peer, sum(hi_ns - lo_ns) AS wait_ns
    FROM _union_intervals(islands) GROUP BY ALL
),
member_sets AS (  -- the distinct sets of ranks that met in a collective (pairs per set, not per instance:
                  -- a group of all N ranks is N^2 pairs once, not once per collective)
    SELECT run, members, row_number() OVER () AS set_id
    FROM (SELECT DISTINCT run, list(rank ORDER BY rank) AS members FROM collective_ranks GROUP BY run, pg, seq)
),
set_members AS (SELECT run, set_id, unnest(members) AS rank FROM member_sets),
peers AS (
    SELECT a.run, a.rank, count(DISTINCT b.rank) AS n_peers
    FROM set_members a JOIN set_members b ON b.run = a.run AND b.set_id = a.set_id AND b.rank <> a.rank
    GROUP BY ALL
),
imposed AS (
    SELECT p.run, p.rank, p.step, sum(p.wait_ns) AS imposed_wait_ns,
           sum(p.wait_ns) / greatest(any_value(g.n_peers), 1) AS delay_ns
    FROM per_peer p JOIN peers g USING (run, rank)
    GROUP BY ALL
),
arrived_last AS (
    SELECT run, last_arriver AS rank, step, count(*) AS n_collectives
    FROM collective_instances WHERE n_ranks > 1 AND step IS NOT NULL GROUP BY ALL
),
step_time AS (SELECT run, step, median(step_ns) AS step_ns FROM step_phases GROUP BY ALL),
all_rank_steps AS (SELECT DISTINCT run, rank, step FROM step_phases)
SELECT a.run, a.rank, a.step, coalesce(l.n_collectives, 0) AS n_collectives,
       coalesce(i.imposed_wait_ns, 0) AS imposed_wait_ns, coalesce(i.delay_ns, 0) AS delay_ns,
       t.step_ns, 100.0 * coalesce(i.delay_ns, 0) / nullif(t.step_ns, 0) AS delay_pct
FROM all_rank_steps a JOIN step_time t USING (run, step)
LEFT JOIN imposed i USING (run, rank, step)
LEFT JOIN arrived_last l USING (run, rank, step);

-- Per rank, step and phase: the spans the rank sat in a collective waiting for its last member,
-- from its own call to the last member's arrival, on the rank's own clock (the offset taken back
-- out), cut at the phases of its steps (a table of its own: bind materialises it, so that the
-- planner of _collective_blocked knows how few rows it has). Columns: run, rank, step, phase, lo, hi.
CREATE OR REPLACE TEMP VIEW _collective_waits AS
WITH w AS (
    SELECT {'run': r.run, 'rank': r.rank} AS grp, r.arrival_ns - coalesce(o.offset_ns, 0) AS lo_ns,
           r.arrival_ns - coalesce(o.offset_ns, 0) + r.wait_ns AS hi_ns
    FROM collective_ranks r LEFT JOIN clock_offsets o ON o.run = r.run AND o.rank = r.rank
    WHERE r.wait_ns > 0
),
u AS (SELECT grp.run AS run, grp.rank AS rank, lo_ns, hi_ns FROM _union_intervals(w)),
ph AS (
    SELECT run, rank, step, 'forward' AS phase, step_start_ns AS lo, step_start_ns + forward_ns AS hi FROM step_phases
    UNION ALL
    SELECT run, rank, step, 'backward', step_start_ns + forward_ns, step_start_ns + forward_ns + backward_ns FROM step_phases
    UNION ALL
    SELECT run, rank, step, 'optimizer', step_end_ns - optimizer_ns, step_end_ns FROM step_phases
)
SELECT p.run, p.rank, p.step, p.phase, greatest(u.lo_ns, p.lo) AS lo, least(u.hi_ns, p.hi) AS hi
FROM u JOIN ph p ON p.run = u.run AND p.rank = u.rank AND u.lo_ns < p.hi AND u.hi_ns > p.lo;

-- Per rank, step and phase: the time the rank sat blocked in a collective waiting for its last
-- member -- its _collective_waits with none of its compute running (FSDP's all_gather in forward
-- blocks the rank; DDP's all_reduce runs beside backward and blocks nothing). Columns: run, rank,
-- step, phase, wait_ns.
-- The compute inside a wait is the sum, over the rank's compute segments (of every step: a step's
-- GPU work may run under the next one's), of their overlap with it. Found through time buckets, not
-- a join of every wait with every compute segment of its rank (quadratic per rank: 3.1 of the
-- view's 3.4 CPU s at 128 ranks): buckets of width b = the mean wait; a segment no longer than b is
-- in the bucket of its start, a longer one (rare) is cut into pieces at multiples of b; a wait
-- looks in the buckets from that of (its start - b) to that of its end, where every piece that
-- overlaps it starts. Each piece is found once, so the sums are those of the direct join whatever b
-- is (b only sets the cost). Buckets: floor(t / b), exact in integers. The segments stream past
-- a hash table of the waits' buckets (one scan of the saved segments, nothing of them held).
CREATE OR REPLACE TEMP VIEW _collective_blocked AS
WITH width AS MATERIALIZED (SELECT greatest(coalesce(avg(hi - lo), 1), 1)::BIGINT AS b FROM _collective_waits),
pieces AS (  -- compute, in pieces no longer than b, each with the bucket of its start
    SELECT run, rank, CASE WHEN hi_ns - lo_ns <= b THEN lo_ns ELSE greatest(lo_ns, bucket * b) END AS lo_ns,
           CASE WHEN hi_ns - lo_ns <= b THEN hi_ns ELSE least(hi_ns, (bucket + 1) * b) END AS hi_ns, bucket
    FROM (SELECT a.run, a.rank, a.lo_ns, a.hi_ns, w.b,
                 unnest(CASE WHEN a.hi_ns - a.lo_ns <= w.b THEN [(a.lo_ns - (a.lo_ns % w.b + w.b) % w.b) // w.b]
                             ELSE range((a.lo_ns - (a.lo_ns % w.b + w.b) % w.b) // w.b,
                                        (a.hi_ns - 1 - ((a.hi_ns - 1) % w.b + w.b) % w.b) // w.b + 1) END) AS bucket
          FROM activity_segments a, width w WHERE a.n_compute > 0)
),
looked AS (  -- each wait once per bucket where a piece overlapping it can start
    SELECT c.run, c.rank, c.step, c.phase, c.lo, c.hi,
           unnest(range((c.lo - w.b - ((c.lo - w.b) % w.b + w.b) % w.b) // w.b,
                        (c.hi - 1 - ((c.hi - 1) % w.b + w.b) % w.b) // w.b + 1)) AS bucket
    FROM _collective_waits c, width w
),
busy AS (  -- compute inside each wait
    SELECT c.run, c.rank, c.step, c.phase, c.lo, sum(least(a.hi_ns, c.hi) - greatest(a.lo_ns, c.lo)) AS busy_ns
    FROM looked c JOIN pieces a ON a.run = c.run AND a.rank = c.rank AND a.bucket = c.bucket
    WHERE a.lo_ns < c.hi AND a.hi_ns > c.lo
    GROUP BY ALL
)
SELECT c.run, c.rank, c.step, c.phase, sum(c.hi - c.lo - coalesce(b.busy_ns, 0)) AS wait_ns
FROM _collective_waits c LEFT JOIN busy b USING (run, rank, step, phase, lo)
GROUP BY ALL;

-- Per rank and step: its own time per phase (phases.sql; not the sync wait, nor the time it sat
-- blocked in a collective waiting for a late peer, _collective_blocked) in excess of the median of
-- the other ranks. Columns: run, rank, step, phase, ns, others_ns, excess_ns.
CREATE OR REPLACE TEMP VIEW _phase_excess AS
WITH own AS (
    -- the rank's own time per phase (sync, the wait for the last collectives, is left out)
    SELECT run, rank, step, forward_ns AS forward, backward_ns AS backward, optimizer_ns AS optimizer,
           data_loading_ns AS data_loading
    FROM step_phases
),
long AS (
    SELECT l.run, l.rank, l.step, l.phase, l.ns - coalesce(b.wait_ns, 0) AS ns
    FROM (UNPIVOT own ON forward, backward, optimizer, data_loading INTO NAME phase VALUE ns) l
    LEFT JOIN _collective_blocked b USING (run, rank, step, phase)
),
counted AS (
    SELECT *, count(*) OVER (PARTITION BY run, step, phase) AS n_group,
           count(*) OVER (PARTITION BY run, rank, step, phase) AS n_own,
           rank() OVER (PARTITION BY run, step, phase ORDER BY ns NULLS LAST) - 1 AS below  -- known values < ns
    FROM long
),
known AS (  -- of the group's L known values in order (v), the five a median of the others can need:
    -- m = L - 1 others (the rank's own value known): v at (L-2)//2 + 1, + 2 and (L-1)//2 + 1, + 2;
    -- m = L (its own value unknown): v at (L-1)//2 + 1 and L//2 + 1. Scalars, not the list: every rank
    -- joined to its group's list of thousands of values ran out of memory under the reduce's cap.
    SELECT run, step, phase, len(v) AS n_v, v[(len(v) - 2) // 2 + 1] AS a1, v[(len(v) - 2) // 2 + 2] AS a2,
           v[(len(v) - 1) // 2 + 1] AS b1, v[(len(v) - 1) // 2 + 2] AS b2, v[len(v) // 2 + 1] AS c1
    FROM (SELECT run, step, phase, list(ns ORDER BY ns) FILTER (WHERE ns IS NOT NULL) AS v FROM long GROUP BY ALL)
),
loo AS (  -- a rank with one row: the median of the others from the sorted values without its own
    -- (linear: a self-join of every rank with every other is quadratic in the ranks)
    SELECT c.run, c.rank, c.step, c.phase, c.ns, c.below, k.a1, k.a2, k.b1, k.b2, k.c1,
           coalesce(k.n_v, 0) - CASE WHEN c.ns IS NULL THEN 0 ELSE 1 END AS m
    FROM counted c LEFT JOIN known k USING (run, step, phase)
    WHERE c.n_own = 1 AND c.n_group > 1
),
pos AS (  -- v[(m - 1) // 2 + 1 or + 2] and v[m // 2 + 1 or + 2], from the five above
    SELECT *, (m - 1) // 2 AS k1,  -- the median is at (m - 1) / 2 of the m others: between k1 and m // 2
           CASE WHEN ns IS NULL THEN b1 WHEN (m - 1) // 2 < below THEN a1 ELSE a2 END AS lo,
           CASE WHEN ns IS NULL THEN c1 WHEN m // 2 < below THEN b1 ELSE b2 END AS hi
    FROM loo
),
others AS (
    SELECT run, rank, step, phase, ns,
           CASE WHEN m > 0 THEN lo::DOUBLE * (1 - ((m - 1) / 2 - k1)) + hi::DOUBLE * ((m - 1) / 2 - k1) END AS others_ns
    FROM pos
    UNION ALL  -- a rank with several rows of one step and phase (rare): compared with every other rank's
    SELECT a.run, a.rank, a.step, a.phase, a.ns, median(b.ns) AS others_ns
    FROM (SELECT * FROM counted WHERE n_own > 1) a
    JOIN long b ON a.run = b.run AND a.step = b.step AND a.phase = b.phase AND a.rank <> b.rank
    GROUP BY ALL
)
SELECT run, rank, step, phase, ns, others_ns, ns - others_ns AS excess_ns FROM others;

-- The findings: one row per rank that cost its peers time *and* was slower on its own, ranked by
-- cost. Medians over the steps of the window keep one-off events (the profiler exporting the trace
-- during the last step of a window, a descheduled thread) from making a finding.
-- Columns: run, rank, delay_ns_per_step (median over steps), delay_pct (of the median step time),
-- imposed_wait_ns_per_step, steps, steps_flagged, pattern (persistent/sporadic), phase (where it
-- was slower than its peers), phase_excess_ns_per_step (median excess in that phase), annotation
-- (the innermost user annotation starting in that phase with the largest median excess over its
-- peers; null when no range of the phase is longer on this rank), annotation_excess_ns_per_step,
-- rank_order (1 = costliest).
CREATE OR REPLACE TEMP VIEW straggler_candidates AS
WITH per_rank AS (
    SELECT run, rank, median(delay_ns) AS delay_ns_per_step, median(imposed_wait_ns) AS imposed_wait_ns_per_step,
           100.0 * median(delay_ns) / nullif(median(step_ns), 0) AS delay_pct, median(step_ns) AS step_ns,
           count(*) AS steps,
           count(*) FILTER (WHERE delay_pct >= getvariable('straggler_min_delay_pct')
                                  AND delay_ns >= getvariable('straggler_min_delay_ns')) AS steps_flagged
    FROM straggler_steps GROUP BY ALL
),
where_slow AS (
    SELECT run, rank, arg_max(phase, (excess, phase)) FILTER (WHERE excess IS NOT NULL) AS phase, max(excess) AS phase_excess_ns_per_step
    FROM (SELECT run, rank, phase, median(excess_ns) AS excess FROM _phase_excess GROUP BY ALL)
    GROUP BY ALL
),
where_named AS (  -- per rank and phase: the range with the largest median excess (> 0)
    SELECT run, rank, phase, arg_max(name, (excess, name)) AS annotation, max(excess) AS annotation_excess_ns_per_step
    FROM (SELECT run, rank, phase, name, median(excess_ns) AS excess FROM _user_annotation_excess GROUP BY ALL)
    WHERE excess > 0
    GROUP BY ALL
),
host AS (  -- its threads' extra wait for a core per step that its host can have caused (not their
           -- wait behind each other), the larger of its training thread's and its whole process's
           -- (greatest skips a NULL one; host_cpu_ranks has no rows without the collector's
           -- samples: unknown, not 0)
    SELECT run, rank, greatest(host_wait_ns_per_step - peers_host_wait_ns_per_step,
                               host_proc_wait_ns_per_step - peers_host_proc_wait_ns_per_step) AS wait_excess_ns
    FROM host_cpu_ranks
)
SELECT p.run, p.rank, p.delay_ns_per_step, p.delay_pct, p.imposed_wait_ns_per_step, p.steps, p.steps_flagged,
       CASE WHEN 100.0 * p.steps_flagged / p.steps >= getvariable('straggler_persistent_pct') THEN 'persistent'
            ELSE 'sporadic' END AS pattern,
       w.phase, w.phase_excess_ns_per_step, n.annotation, n.annotation_excess_ns_per_step,
       100.0 * w.phase_excess_ns_per_step / nullif(p.step_ns, 0) AS phase_excess_pct,
       100.0 * h.wait_excess_ns / nullif(p.step_ns, 0) AS host_wait_excess_pct
FROM per_rank p LEFT JOIN where_slow w USING (run, rank)
LEFT JOIN where_named n ON n.run = p.run AND n.rank = p.rank AND n.phase = w.phase
LEFT JOIN host h ON h.run = p.run AND h.rank = p.rank;

CREATE OR REPLACE TEMP VIEW straggler_findings AS
SELECT *,
       row_number() OVER (PARTITION BY run ORDER BY delay_ns_per_step DESC, rank) AS rank_order
FROM straggler_candidates
WHERE delay_pct >= getvariable('straggler_min_delay_pct')
  AND delay_ns_per_step >= getvariable('straggler_min_delay_ns')
  AND greatest(coalesce(phase_excess_pct, 0), coalesce(host_wait_excess_pct, 0))
      >= getvariable('straggler_min_excess_pct');
