-- The union of intervals, one rule for every module that merges them (pipeline busy time, exposed
-- communication, HTA's merge of kernel intervals): intervals that overlap or touch, directly or
-- through others, form one island; the union is each island's [min(lo_ns), max(hi_ns)).
--
-- _interval_islands(t): t (a table, view or CTE) has a column grp (the partition: any type, a
-- STRUCT of the keys for several), lo_ns and hi_ns, and any others; returns every row of t with
-- island (1, 2, ... per grp in order of start). Walking t by (lo_ns, hi_ns), a row opens a new
-- island when it starts after every earlier row of its grp ended (one starting exactly where an
-- earlier one ends joins it). Callers aggregate per (grp, island) what they need.
-- _union_intervals(t): the merged intervals: grp, island, lo_ns, hi_ns, n (rows in it).
--
-- requires: (nothing: macros over their argument)

CREATE OR REPLACE TEMP MACRO _interval_islands(t) AS TABLE
WITH ordered AS (
    SELECT *,
           max(hi_ns) OVER w AS _prev_hi, row_number() OVER (PARTITION BY grp ORDER BY lo_ns, hi_ns) AS _pos
    FROM query_table(t)
    WINDOW w AS (PARTITION BY grp ORDER BY lo_ns, hi_ns ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
)
SELECT * EXCLUDE (_prev_hi, _pos),
       sum(CASE WHEN _prev_hi IS NULL OR lo_ns > _prev_hi THEN 1 ELSE 0 END)
           OVER (PARTITION BY grp ORDER BY _pos ROWS UNBOUNDED PRECEDING) AS island
FROM ordered;

CREATE OR REPLACE TEMP MACRO _union_intervals(t) AS TABLE
SELECT grp, island, min(lo_ns) AS lo_ns, max(hi_ns) AS hi_ns, count(*) AS n
FROM _interval_islands(t) GROUP BY grp, island;
