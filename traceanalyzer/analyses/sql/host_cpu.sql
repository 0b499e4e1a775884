-- Host CPU contention: how long each rank's training thread waited for a CPU core, per step.
--
-- A rank whose thread was runnable but waited on a run queue (other ranks on the same cores,
-- data-loader workers, other jobs) looks exactly like a slow rank in its trace. The collector
-- samples Linux's schedstat at every step boundary (cpu_sched, traceanalyzer/collect/cpu_sched.py):
-- samples k and k + 1 bound ProfilerStep#k, so the difference of two consecutive samples is step
-- k's CPU wait and run time. The headline is the training (main) thread's wait: the time the step
-- itself lost; the process's, summed over its threads (gloo, OMP, data loaders), may exceed the
-- step's wall time. A rank recorded without samples has no rows here: its wait is unknown, never 0.
--
-- Parameters (DuckDB variables set by traceanalyzer.analyses):
--   host_cpu_wait_min_pct  a rank is contended when its training thread waited for a core at least
--                          this % of its step (median over steps) (default 5)
--
-- requires: (nothing: reads the canonical tables only)

-- Per rank and step: the CPU wait and run time between the step's two samples.
-- Columns: run, rank, step (ProfilerStep#step), host, cores (usable by the rank), cpu_count (of the
-- host), step_ns (wall time between the samples), wait_ns / run_ns (training thread), wait_pct (of
-- step_ns), proc_wait_ns / proc_run_ns (every thread of the process), in_trace (the rank's trace
-- recorded this ProfilerStep).
CREATE OR REPLACE TEMP VIEW host_cpu_steps AS
WITH s AS (
    SELECT run, rank, step, host, cores, cpu_count, ts_ns, main_wait_ns, main_run_ns, proc_wait_ns, proc_run_ns,
           lead(step) OVER w AS next_step, lead(ts_ns) OVER w AS next_ts_ns,
           lead(main_wait_ns) OVER w AS next_main_wait_ns, lead(main_run_ns) OVER w AS next_main_run_ns,
           lead(proc_wait_ns) OVER w AS next_proc_wait_ns, lead(proc_run_ns) OVER w AS next_proc_run_ns
    FROM cpu_sched
    WINDOW w AS (PARTITION BY run, rank ORDER BY step)
),
traced AS (SELECT DISTINCT run, rank, step FROM steps)
SELECT s.run, s.rank, s.step, s.host, s.cores, s.cpu_count, s.next_ts_ns - s.ts_ns AS step_ns,
       s.next_main_wait_ns - s.main_wait_ns AS wait_ns, s.next_main_run_ns - s.main_run_ns AS run_ns,
       100.0 * (s.next_main_wait_ns - s.main_wait_ns) / nullif(s.next_ts_ns - s.ts_ns, 0) AS wait_pct,
       s.next_proc_wait_ns - s.proc_wait_ns AS proc_wait_ns, s.next_proc_run_ns - s.proc_run_ns AS proc_run_ns,
       t.step IS NOT NULL AS in_trace
FROM s LEFT JOIN traced t ON t.run = s.run AND t.rank = s.rank AND t.step = s.step
WHERE s.next_step = s.step + 1;

-- Per rank: the median over its steps (those its trace recorded, when it recorded any: the steps the
-- other analyses measure; else every sampled step), its peers' median and whether it was contended.
-- Columns: run, rank, host, cores, cpu_count, ranks_on_host (ranks of the run with samples on that
-- host), steps, step_ns_per_step, wait_ns_per_step, wait_pct, proc_wait_ns_per_step,
-- peers_wait_ns_per_step (median over the run's other ranks of their wait_ns_per_step; NULL: no
-- peer), contended (wait_pct >= host_cpu_wait_min_pct), run_ns_per_step (the training thread's CPU
-- time: what its work cost on its core), peers_run_ns_per_step (their median), peers_proc_wait_ns_per_step
-- (the median of the others' proc_wait_ns_per_step: a rank whose gloo or OpenMP threads waited for a
-- core runs its collectives and kernels late with its training thread idle). A rank that runs the
-- same work as its peers with more CPU time was slowed by its host (a slower or shared core, cache);
-- one whose extra step time is neither run nor wait was off the CPU (a sleep, I/O, a lock).
CREATE OR REPLACE TEMP VIEW host_cpu_ranks AS
WITH chosen AS (
    SELECT *, bool_or(in_trace) OVER (PARTITION BY run, rank) AS rank_traced FROM host_cpu_steps
),
per_rank AS (
    SELECT run, rank, any_value(host) AS host, max(cores) AS cores, max(cpu_count) AS cpu_count, count(*) AS steps,
           median(step_ns) AS step_ns_per_step, median(wait_ns) AS wait_ns_per_step, median(wait_pct) AS wait_pct,
           median(proc_wait_ns) AS proc_wait_ns_per_step, median(run_ns) AS run_ns_per_step
    FROM chosen WHERE in_trace OR NOT rank_traced
    GROUP BY run, rank
)
SELECT p.run, p.rank, p.host, p.cores, p.cpu_count, count(*) OVER (PARTITION BY p.run, p.host) AS ranks_on_host,
       p.steps, p.step_ns_per_step, p.wait_ns_per_step, p.wait_pct, p.proc_wait_ns_per_step,
       (SELECT median(o.wait_ns_per_step) FROM per_rank o WHERE o.run = p.run AND o.rank <> p.rank) AS peers_wait_ns_per_step,
       p.wait_pct >= getvariable('host_cpu_wait_min_pct') AS contended, p.run_ns_per_step,
       (SELECT median(o.run_ns_per_step) FROM per_rank o WHERE o.run = p.run AND o.rank <> p.rank) AS peers_run_ns_per_step,
       (SELECT median(o.proc_wait_ns_per_step) FROM per_rank o WHERE o.run = p.run AND o.rank <> p.rank) AS peers_proc_wait_ns_per_step
FROM per_rank p;
