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
-- recorded this ProfilerStep), idle_core_ns (core time its process left unused: step_ns x cores -
-- proc_run_ns; its cores were idle or ran other processes), host_wait_ns / host_proc_wait_ns (the
-- waits its host can have caused: a thread waits behind its own process's threads as well as behind
-- other processes, and only the latter is its host. The training thread's wait beyond what its other
-- threads ran (proc_run_ns - run_ns), the process's wait, each at most idle_core_ns: a late rank whose
-- gloo threads run its collectives at once while its training thread computes keeps its own threads
-- waiting, which is no slow host. NULL without the rank's core count: unbounded, as measured).
CREATE OR REPLACE TEMP VIEW host_cpu_steps AS
WITH s AS (
    SELECT run, rank, step, host, cores, cpu_count, ts_ns, main_wait_ns, main_run_ns, proc_wait_ns, proc_run_ns,
           lead(step) OVER w AS next_step, lead(ts_ns) OVER w AS next_ts_ns,
           lead(main_wait_ns) OVER w AS next_main_wait_ns, lead(main_run_ns) OVER w AS next_main_run_ns,
           lead(proc_wait_ns) OVER w AS next_proc_wait_ns, lead(proc_run_ns) OVER w AS next_proc_run_ns
    FROM cpu_sched
    WINDOW w AS (PARTITION BY run, rank ORDER BY step)
),
traced AS (SELECT DISTINCT run, rank, step FROM steps),
d AS (
    SELECT s.run, s.rank, s.step, s.host, s.cores, s.cpu_count, s.next_ts_ns - s.ts_ns AS step_ns,
           s.next_main_wait_ns - s.main_wait_ns AS wait_ns, s.next_main_run_ns - s.main_run_ns AS run_ns,
           s.next_proc_wait_ns - s.proc_wait_ns AS proc_wait_ns, s.next_proc_run_ns - s.proc_run_ns AS proc_run_ns,
           t.step IS NOT NULL AS in_trace
    FROM s LEFT JOIN traced t ON t.run = s.run AND t.rank = s.rank AND t.step = s.step
    WHERE s.next_step = s.step + 1
),
i AS (SELECT *, CASE WHEN step_ns * cores >= proc_run_ns THEN step_ns * cores - proc_run_ns
                     WHEN step_ns * cores < proc_run_ns THEN 0 END AS idle_core_ns FROM d)
SELECT run, rank, step, host, cores, cpu_count, step_ns, wait_ns, run_ns,
       100.0 * wait_ns / nullif(step_ns, 0) AS wait_pct, proc_wait_ns, proc_run_ns, in_trace, idle_core_ns,
       CASE WHEN idle_core_ns IS NULL THEN wait_ns   -- (NULL stays NULL: least/greatest skip NULLs)
            WHEN wait_ns - (proc_run_ns - run_ns) IS NOT NULL
            THEN least(greatest(wait_ns - (proc_run_ns - run_ns), 0), idle_core_ns) END AS host_wait_ns,
       CASE WHEN idle_core_ns IS NULL THEN proc_wait_ns WHEN proc_wait_ns IS NOT NULL
            THEN least(proc_wait_ns, idle_core_ns) END AS host_proc_wait_ns
FROM i;

-- Per rank: the median over its steps (those its trace recorded, when it recorded any: the steps the
-- other analyses measure; else every sampled step), its peers' median and whether it was contended.
-- Columns: run, rank, host, cores, cpu_count, ranks_on_host (ranks of the run with samples on that
-- host), steps, step_ns_per_step, wait_ns_per_step, wait_pct, proc_wait_ns_per_step,
-- peers_wait_ns_per_step (median over the run's other ranks of their wait_ns_per_step; NULL: no
-- peer), contended (wait_pct >= host_cpu_wait_min_pct), run_ns_per_step (the training thread's CPU
-- time: what its work cost on its core), peers_run_ns_per_step (their median), peers_proc_wait_ns_per_step
-- (the median of the others' proc_wait_ns_per_step: a rank whose gloo or OpenMP threads waited for a
-- core runs its collectives and kernels late with its training thread idle), host_wait_ns_per_step /
-- host_proc_wait_ns_per_step and peers_host_wait_ns_per_step / peers_host_proc_wait_ns_per_step (the
-- same for the waits its host can have caused, host_cpu_steps: what the findings compare). A rank that runs the
-- same work as its peers with more CPU time was slowed by its host (a slower or shared core, cache);
-- one whose extra step time is neither run nor wait was off the CPU (a sleep, I/O, a lock).
CREATE OR REPLACE TEMP VIEW host_cpu_ranks AS
WITH chosen AS (
    SELECT *, bool_or(in_trace) OVER (PARTITION BY run, rank) AS rank_traced FROM host_cpu_steps
),
per_rank AS (
    SELECT run, rank, any_value(host) AS host, max(cores) AS cores, max(cpu_count) AS cpu_count, count(*) AS steps,
           median(step_ns) AS step_ns_per_step, median(wait_ns) AS wait_ns_per_step, median(wait_pct) AS wait_pct,
           median(proc_wait_ns) AS proc_wait_ns_per_step, median(run_ns) AS run_ns_per_step,
           median(host_wait_ns) AS host_wait_ns_per_step, median(host_proc_wait_ns) AS host_proc_wait_ns_per_step
    FROM chosen WHERE in_trace OR NOT rank_traced
    GROUP BY run, rank
)
SELECT p.run, p.rank, p.host, p.cores, p.cpu_count, count(*) OVER (PARTITION BY p.run, p.host) AS ranks_on_host,
       p.steps, p.step_ns_per_step, p.wait_ns_per_step, p.wait_pct, p.proc_wait_ns_per_step,
       (SELECT median(o.wait_ns_per_step) FROM per_rank o WHERE o.run = p.run AND o.rank <> p.rank) AS peers_wait_ns_per_step,
       p.wait_pct >= getvariable('host_cpu_wait_min_pct') AS contended, p.run_ns_per_step,
       (SELECT median(o.run_ns_per_step) FROM per_rank o WHERE o.run = p.run AND o.rank <> p.rank) AS peers_run_ns_per_step,
       (SELECT median(o.proc_wait_ns_per_step) FROM per_rank o WHERE o.run = p.run AND o.rank <> p.rank) AS peers_proc_wait_ns_per_step,
       p.host_wait_ns_per_step, p.host_proc_wait_ns_per_step,
       (SELECT median(o.host_wait_ns_per_step) FROM per_rank o WHERE o.run = p.run AND o.rank <> p.rank) AS peers_host_wait_ns_per_step,
       (SELECT median(o.host_proc_wait_ns_per_step) FROM per_rank o WHERE o.run = p.run AND o.rank <> p.rank) AS peers_host_proc_wait_ns_per_step
FROM per_rank p;
