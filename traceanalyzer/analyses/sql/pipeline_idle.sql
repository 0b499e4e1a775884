-- Pipeline idle time, one row per idle stretch (bubbles.sql says what the kinds mean): made from the
-- per-rank parts (pipeline_gaps.sql) only when asked (the report's pipeline timeline, export): the
-- analyses read their sums per step (_pipeline_idle_steps), not one row per gap of every rank.
--
-- requires: pipeline_gaps, pipelines

-- Idle stretches of each stage in each step, classified: a gap's stall is the union of the parts
-- during which a send, a receive or a collective was pending, charged to the peer of its longest
-- island (ties: the lowest rank); the rest of the gap is the stage's own (other).
-- Columns: run, rank, stage, step, kind (warmup/cooldown/stall/other), caused_by_rank (stalls),
-- lo_ns, hi_ns, dur_ns.
CREATE OR REPLACE TEMP VIEW pipeline_idle AS
WITH gaps AS (
    SELECT g.*, st.stage FROM _pipeline_gaps g JOIN pipeline_stages st USING (run, rank)
),
per_gap AS (
    SELECT run, rank, step, lo_ns, hi_ns, src_rank, stall_ns FROM _pipeline_touched
    UNION ALL
    SELECT p.run, p.rank, p.step, p.lo_ns, p.hi_ns, arg_max(p.src_rank, (p.c_hi - p.c_lo, -p.src_rank)),
           least(sum(p.c_hi - p.c_lo), p.hi_ns - p.lo_ns)  -- _pipeline_p2p_stalls (not saved: read by rank views only)
    FROM _pipeline_p2p_islands p ANTI JOIN _pipeline_touched t USING (run, rank, step, lo_ns, hi_ns)
    GROUP BY p.run, p.rank, p.step, p.lo_ns, p.hi_ns
)
SELECT g.run, g.rank, g.stage, g.step, g.kind, CAST(NULL AS INTEGER) AS caused_by_rank, g.lo_ns, g.hi_ns,
       g.hi_ns - g.lo_ns AS dur_ns
FROM gaps g WHERE g.kind <> 'gap' AND g.hi_ns > g.lo_ns
UNION ALL
SELECT g.run, g.rank, g.stage, g.step, 'stall', p.src_rank, g.lo_ns, g.lo_ns + p.stall_ns, p.stall_ns
FROM gaps g JOIN per_gap p USING (run, rank, step, lo_ns, hi_ns) WHERE g.kind = 'gap' AND p.stall_ns > 0
UNION ALL
SELECT g.run, g.rank, g.stage, g.step, 'other', NULL, g.lo_ns + coalesce(p.stall_ns, 0), g.hi_ns,
       g.hi_ns - g.lo_ns - coalesce(p.stall_ns, 0)
FROM gaps g LEFT JOIN per_gap p USING (run, rank, step, lo_ns, hi_ns)
WHERE g.kind = 'gap' AND g.hi_ns - g.lo_ns - coalesce(p.stall_ns, 0) > 0;
