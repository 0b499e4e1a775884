-- exposed_comm as it was before issue 17 moved its candidates (session 19: each rank's exposed_top
-- largest, _exposed_top) and then their attribution (session 26: the range joins with the rank's
-- activity_intervals and the comms row, now in _exposed_top, made in the map) out of the reduce:
-- every exposed interval of the run ranked (exposed_intervals), the top exposed_top attributed
-- (analyses/sql/overlap.sql at 2b39893, that ranking in place of _exposed_top's). Only the view's
-- name differs. tests/test_exposed_top.py compares the two on random intervals.

CREATE OR REPLACE TEMP VIEW _ref_exposed_comm AS
WITH intervals AS (  -- every exposed interval of the run, ranked (exposed.sql)
    SELECT * FROM exposed_intervals WHERE rank_order <= getvariable('exposed_top')
),
covering AS (
    SELECT i.run, i.rank, i.window_id, i.step, i.lo_ns,
           -- the interval covering most; a tie: the earliest, then by name (one row for both columns)
           first(a.comm_id ORDER BY least(a.hi_ns, i.hi_ns) - greatest(a.lo_ns, i.lo_ns) DESC, a.lo_ns, a.name, a.comm_id) AS comm_id,
           first(a.name ORDER BY least(a.hi_ns, i.hi_ns) - greatest(a.lo_ns, i.lo_ns) DESC, a.lo_ns, a.name, a.comm_id) AS comm_name
    FROM intervals i JOIN activity_intervals a
      ON a.run = i.run AND a.rank = i.rank AND a.window_id = i.window_id AND a.category = 'comm'
     AND a.lo_ns < i.hi_ns AND a.hi_ns > i.lo_ns
    GROUP BY ALL
),
before AS (
    SELECT i.run, i.rank, i.window_id, i.lo_ns, arg_max(a.name, (a.hi_ns, a.name)) AS compute_before
    FROM intervals i JOIN activity_intervals a
      ON a.run = i.run AND a.rank = i.rank AND a.window_id = i.window_id AND a.category = 'compute'
     AND a.hi_ns <= i.lo_ns AND a.hi_ns > i.lo_ns - getvariable('exposed_context_max_ns')
    GROUP BY ALL
),
after AS (
    SELECT i.run, i.rank, i.window_id, i.lo_ns, arg_min(a.name, (a.lo_ns, a.name)) AS compute_after
    FROM intervals i JOIN activity_intervals a
      ON a.run = i.run AND a.rank = i.rank AND a.window_id = i.window_id AND a.category = 'compute'
     AND a.lo_ns >= i.hi_ns AND a.lo_ns < i.hi_ns + getvariable('exposed_context_max_ns')
    GROUP BY ALL
)
SELECT i.run, i.rank, i.window_id, i.step, i.lo_ns, i.hi_ns, i.exposed_ns,
       c.op, c.pg_name AS pg, c.seq, coalesce(c.in_bytes, c.out_bytes) AS bytes,
       coalesce(cv.comm_name, c.exec_name) AS comm_name, b.compute_before, f.compute_after,
       i.rank_order
FROM intervals i
LEFT JOIN covering cv USING (run, rank, window_id, lo_ns)  -- not step: it is null in traces without steps
LEFT JOIN comms c ON c.run = i.run AND c.rank = i.rank AND c.window_id = i.window_id AND c.comm_id = cv.comm_id
LEFT JOIN before b USING (run, rank, window_id, lo_ns)
LEFT JOIN after f USING (run, rank, window_id, lo_ns);
