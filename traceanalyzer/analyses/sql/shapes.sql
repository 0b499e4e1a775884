-- The input shapes each rank's CPU operators recorded (Kineto record_shapes: `Input Dims`), per
-- aligned step: what work.sql compares between peers. Rank-local: the map of summaries.py computes
-- and saves it, so the cross-rank comparison never reads events.
--
-- requires: step_alignment

-- Each rank's CPU operators with recorded input shapes, per aligned step: how many ran with each
-- (name, `Input Dims`). Rank-local (the map of summaries.py saves it; the comparison reads it).
-- Columns: run, rank, step, name, input_dims (the JSON text of the shapes), n.
-- scope: rank
CREATE OR REPLACE TEMP VIEW _op_shapes AS
WITH gpu_windows AS (  -- compute there is kernels (activity.sql), which carry no shapes: nothing to read
    SELECT DISTINCT run, rank, window_id FROM events WHERE is_gpu AND kind IN ('compute_kernel', 'comm_kernel')
),
shaped AS (  -- (a CASE, not a filter: the JSON is read only outside GPU windows, and only where its
    -- text names the key: an op timeline's args never do, and parsing them was most of this view)
    SELECT e.run, e.rank, e.window_id, e.step, e.name,
           CASE WHEN g.rank IS NULL AND contains(e.args_json, 'Input Dims')
                THEN json_extract_string(e.args_json, '$."Input Dims"') END AS input_dims
    FROM events e LEFT JOIN gpu_windows g USING (run, rank, window_id)
    WHERE e.ph = 'X' AND e.kind = 'cpu_op' AND e.step IS NOT NULL
)
SELECT s.run, s.rank, coalesce(a.aligned_step, s.step) AS step, s.name, s.input_dims, count(*) AS n
FROM shaped s LEFT JOIN step_alignment a USING (run, rank, window_id, step)
WHERE s.input_dims IS NOT NULL
GROUP BY ALL;
