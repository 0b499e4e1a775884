-- Training phases per rank and step, as time segments of the step on the CPU.
--
-- How: inside each ProfilerStep range we find the first and the last autograd engine call
-- ('autograd::engine::evaluate_function: ...', on any CPU thread: GPU jobs run backward on an
-- autograd thread) and the first 'Optimizer.step#...' annotation, and cut the step there:
--   forward   [step start, first autograd call)     includes zero_grad and data loading
--   backward  [first autograd call, end of the last autograd call)
--   sync      [end of backward, optimizer start)    waiting for the last gradient collectives
--   optimizer [optimizer start, step end)
-- Data loading ('enumerate(DataLoader)#...') is also reported on its own. A step without autograd
-- calls (inference, pipeline stages) is all 'forward'. Forward, backward, optimizer and data
-- loading are the rank's own time; sync is waiting, so it never makes a rank a straggler.
--
-- step is the aligned step (step_alignment.sql): the same iteration has the same number on every
-- rank, whatever the profiler counted (step_alignment maps it to the rank's own ProfilerStep).
-- Columns: run, rank, step, step_start_ns, step_end_ns, step_ns, forward_ns, backward_ns, sync_ns,
-- optimizer_ns, data_loading_ns.
--
-- requires: step_alignment
-- scope: rank
CREATE OR REPLACE TEMP VIEW step_phases AS
WITH marks AS (
    SELECT s.run, s.rank, s.window_id, s.step, s.start_ts_ns, s.end_ts_ns,
           min(e.ts_ns) FILTER (WHERE e.name LIKE 'autograd::engine::evaluate_function:%') AS bwd_start,
           max(e.ts_ns + e.dur_ns) FILTER (WHERE e.name LIKE 'autograd::engine::evaluate_function:%') AS bwd_end,
           min(e.ts_ns) FILTER (WHERE e.name LIKE 'Optimizer.step#%') AS opt_start,
           coalesce(sum(e.dur_ns) FILTER (WHERE e.name LIKE 'enumerate(DataLoader)#%'), 0) AS data_ns
    FROM steps s
    LEFT JOIN events e ON e.run = s.run AND e.rank = s.rank AND e.window_id = s.window_id
         AND NOT e.is_gpu AND e.ts_ns >= s.start_ts_ns AND e.ts_ns < s.end_ts_ns
         AND (e.name LIKE 'autograd::engine::evaluate_function:%' OR e.name LIKE 'Optimizer.step#%'
              OR e.name LIKE 'enumerate(DataLoader)#%')
    GROUP BY ALL
),
cuts AS (
    SELECT run, rank, window_id, step, start_ts_ns, end_ts_ns, data_ns,
           coalesce(bwd_start, opt_start, end_ts_ns) AS b0,
           least(coalesce(bwd_end, bwd_start, opt_start, end_ts_ns), coalesce(opt_start, end_ts_ns)) AS b1,
           coalesce(opt_start, end_ts_ns) AS o0
    FROM marks
)
SELECT c.run, c.rank, coalesce(sa.aligned_step, c.step) AS step, start_ts_ns AS step_start_ns, end_ts_ns AS step_end_ns,
       end_ts_ns - start_ts_ns AS step_ns,
       b0 - start_ts_ns AS forward_ns, b1 - b0 AS backward_ns, o0 - b1 AS sync_ns,
       end_ts_ns - o0 AS optimizer_ns, data_ns AS data_loading_ns
FROM cuts c LEFT JOIN step_alignment sa USING (run, rank, window_id, step);
