-- Every exposed communication interval of a run, ranked (a building block users query: the
-- exposed_intervals wrapper). Kept apart from overlap.sql so that an analyze does not rank every
-- exposed interval of the run (a sort of the whole run's intervals in the reduce) only to keep the
-- exposed_top largest: exposed_comm ranks each map task's largest (overlap.sql's _exposed_top).
--
-- requires: overlap

-- Exposed communication intervals, all of them.
-- Columns: run, rank, window_id, step, lo_ns, hi_ns, exposed_ns, rank_order (per run, largest first; a
-- tie: the lowest rank, the earliest, then by window and step: a total order, the same as exposed_comm's).
CREATE OR REPLACE TEMP VIEW exposed_intervals AS
SELECT run, rank, window_id, step, lo_ns, hi_ns, exposed_ns,
       row_number() OVER (PARTITION BY run ORDER BY exposed_ns DESC, rank, lo_ns, window_id, step) AS rank_order
FROM _exposed_islands;
