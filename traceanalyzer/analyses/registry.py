"""The analyses, one record each: what ``traceanalyzer analyze`` computes and saves, and everything
that reads that list (``results.analyze``/``save``, the CLI's ``--only`` and ``schema``,
:meth:`Session.analyses`, ``schema.RESULTS``, docs/analyses.md).

An :class:`Analysis` names its result table, the public view of the SQL module (``sql/<m>.sql``)
that produces it, the row order, an optional row filter, its result columns (name, type, unit,
meaning, in order) and a one-line help; the parameters it reads are found in its module and the
modules those require (``getvariable('name')``, each a named entry of :data:`.params.SETTINGS`).
An analysis computed in Python names its producer instead of a view.

Adding an analysis is one SQL file plus one record::

    from traceanalyzer.analyses import registry as R
    R.register(R.Analysis("my_result", "my_view", "run, rank", "what it answers",
                          R.columns([("run", R.STR, "", "run name"), ("n", R.I64, "", "count")]),
                          sql_file="path/to/my_module.sql"))

``schema.RESULTS`` (name -> :class:`~traceanalyzer.schema.Table`) is kept as a view of this
registry for the code that reads result columns below the analyses (the store's ``result_*`` views).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .. import schema as S
from ..errors import TraceAnalyzerError
from ..schema import BOOL, F64, I32, I64, STR, Column, Table

__all__ = ["Analysis", "register", "unregister", "get", "analyses", "names", "columns", "docs_table",
           "describe", "BUILDING_BLOCKS", "public_views", "update_docs", "STR", "I32", "I64", "F64", "BOOL"]


def columns(cols: list[tuple]) -> tuple[Column, ...]:
    """Result columns from ``(name, arrow type, unit, meaning)`` tuples, in order."""
    return tuple(Column(n, t, d, u) for n, t, u, d in cols)


@dataclass(frozen=True)
class Analysis:
    """One analysis: its result table and how it is computed."""
    name: str                          #: result table (``result_<name>`` view, ``--only`` name)
    view: str | None                   #: public view producing its rows (None: computed in Python)
    order: str                         #: ORDER BY of its rows
    help: str                          #: one line: what it answers
    columns: tuple[Column, ...]        #: result columns, in order
    where: str = ""                    #: row filter (SQL over the view's columns and parameters)
    producer: Callable | None = None   #: f(con, run, cache) -> DataFrame, for Python analyses
    sql_file: str | Path | None = None  #: the SQL module, when it is not one of the package's

    @property
    def table(self) -> Table:
        return Table(self.name, self.help, self.columns, partition=())

    @property
    def sql(self) -> str:
        """The query of its result rows (SQL analyses)."""
        where = f" WHERE {self.where}" if self.where else ""
        return f"SELECT * FROM {self.view}{where} ORDER BY {self.order}"

    @property
    def module(self) -> str | None:
        """The SQL module defining its view."""
        from . import modules
        return modules.owner().get(self.view) if self.view else None

    @property
    def params(self) -> tuple[str, ...]:
        """The parameters it reads: ``getvariable`` names in its module and what that requires."""
        from . import modules
        if self.view is None:
            return ()
        texts = [modules.modules()[m].text for m in modules.modules_for([self.view])] + [self.where]
        return tuple(sorted({p for t in texts for p in re.findall(r"getvariable\('(\w+)'\)", t)}))


_REGISTRY: dict[str, Analysis] = {}


def register(analysis: Analysis) -> Analysis:
    """Add ``analysis`` (its SQL module first, when it brings one); its result table joins
    ``schema.RESULTS``. A name already taken is an error."""
    if analysis.name in _REGISTRY:
        raise TraceAnalyzerError(f"analysis {analysis.name!r} is registered already")
    if analysis.sql_file is not None:
        from . import modules
        modules.add(analysis.sql_file)
    _REGISTRY[analysis.name] = analysis
    S.RESULTS[analysis.name] = analysis.table
    return analysis


def unregister(name: str) -> None:
    """Remove analysis ``name`` (and the SQL module it brought)."""
    a = _REGISTRY.pop(name)
    S.RESULTS.pop(name, None)
    if a.sql_file is not None:
        from . import modules
        modules.remove(Path(a.sql_file).stem)


def get(name: str) -> Analysis:
    if name not in _REGISTRY:
        raise TraceAnalyzerError(f"unknown analysis: {name}; known: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def analyses() -> list[Analysis]:
    """Every analysis, in registration order (the order ``analyze`` runs and prints them)."""
    return list(_REGISTRY.values())


def names() -> list[str]:
    return list(_REGISTRY)


#: Views users query besides the result views (each a wrapper of :mod:`traceanalyzer.analyses` or
#: read by other packages): view -> what it holds. Every other view or macro an SQL module defines is
#: private: its name starts with '_' (a test checks it) and it may change without notice.
BUILDING_BLOCKS: dict[str, str] = {
    "step_alignment": "each trace window's ProfilerStep numbers and the aligned step (the same iteration on every rank)",
    "clock_alignment": "the offset added to each rank's timestamps (clock offsets applied)",
    "collective_ranks": "each rank's arrival, end and wait at each collective",
    "p2p_transfers": "every receive joined to the send that fed it, with who waited",
    "activity_intervals": "compute / comm / memory intervals per rank and step",
    "activity_segments": "labelled time segments (compute > comm > memory > idle) per rank and step",
    "straggler_steps": "per rank and step: the delay it imposed on its peers",
    "straggler_candidates": "every rank's cost and excess, thresholds not applied",
    "overlap_steps": "communication/computation overlap per rank and step",
    "exposed_intervals": "every exposed communication interval, not attributed",
    "imbalance_steps": "per step: the spread of compute over the ranks",
    "pipeline_stages": "the stage of each rank of each pipeline",
    "pipeline_idle": "idle stretches of each pipeline stage per step, classified (warmup, cooldown, stall, other)",
    "pipeline_stall_causes": "stall time charged to each rank per step",
    "host_cpu_steps": "per rank and step: the training thread's wait for a CPU core (collector samples)",
    "hta_window": "HTA's window per trace file (µs rounding, ProfilerStep names, last-step cut)",
    "hta_kernels": "the kernels HTA analyses, with its kernel type",
    "hta_temporal_breakdown": "HTA's get_temporal_breakdown",
    "hta_overlap": "HTA's get_comm_comp_overlap",
    "hta_kernel_type_breakdown": "HTA's kernel-type (Venn) table per trace file",
    "hta_kernel_type_all_ranks": "HTA's kernel-type table summed over the ranks of a run",
    "hta_kernel_stats": "HTA's per-kernel table",
}


def public_views() -> list[str]:
    """The views users may query: each analysis's view and the building blocks."""
    return list(dict.fromkeys([a.view for a in analyses() if a.view] + list(BUILDING_BLOCKS)))


def views_table() -> str:
    """The Markdown list of the building blocks (docs/analyses.md holds it)."""
    from . import modules
    return "\n".join(f"- `{v}` ({modules.owner()[v]}.sql): {doc}" for v, doc in BUILDING_BLOCKS.items())


def docs_table() -> str:
    """The Markdown table of the analyses (docs/analyses.md holds it; a test keeps it equal)."""
    rows = ["| analysis (result table) | view (SQL module) | parameters | what it answers |", "|---|---|---|---|"]
    for a in analyses():
        src = f"`{a.view}` ({a.module}.sql)" if a.view else "computed in Python"
        params = ", ".join(f"`{p}`" for p in a.params) or "-"
        rows.append(f"| `{a.name}` | {src} | {params} | {a.help} |")
    return "\n".join(rows)


def update_docs(text: str) -> str:
    """``text`` (docs/analyses.md) with its generated blocks made again: the analyses table
    (between ``<!-- registry:begin -->`` and ``<!-- registry:end -->``), the building blocks
    (``views``) and the settings (``settings``)::

        python -c "from traceanalyzer.analyses import registry as R; import pathlib; \\
                   p = pathlib.Path('docs/analyses.md'); p.write_text(R.update_docs(p.read_text()))"
    """
    from .params import describe as settings
    for tag, block in (("registry", docs_table()), ("views", views_table()),
                       ("settings", settings().split("\n", 4)[4].rstrip())):
        text = re.sub(rf"(<!-- {tag}:begin -->\n).*?(<!-- {tag}:end -->)", lambda m: m.group(1) + block + "\n" + m.group(2),
                      text, flags=re.S)
    return text


def describe() -> str:
    """Markdown: each analysis's result table and columns (``traceanalyzer schema``)."""
    lines = [f"# analysis results {S.RESULTS_VERSION}", "",
             "What `traceanalyzer analyze` saves (`result_<analysis>` views).", ""]
    for a in analyses():
        lines += [f"## {a.name}", "", a.help + (f" View `{a.view}`." if a.view else " Computed in Python."), "",
                  "| column | type | unit | meaning |", "|---|---|---|---|"]
        lines += [f"| {c.name} | {c.type} | {c.unit} | {c.doc} |" for c in a.columns]
        lines.append("")
    return "\n".join(lines)


def _sql(name, view, order, help, cols, where="") -> Analysis:
    return register(Analysis(name, view, order, help, columns(cols), where=where))


def _py(name, producer, help, cols) -> Analysis:
    return register(Analysis(name, None, "", help, columns(cols), producer=producer))


def _critical_path(con, run, cache):
    from .critical_path import critical_path
    if "critical_path" not in cache:
        cache["critical_path"] = critical_path(con, run=run)
    return cache["critical_path"]


def _critical_path_summary(con, run, cache):
    from .critical_path import critical_path_summary
    return critical_path_summary(con, run=run, path=_critical_path(con, run, cache))


# -- the analyses -----------------------------------------------------------------------------
# Bump schema.RESULTS_VERSION when a result column changes.

_RUN_RANK = [("run", STR, "", "run name"), ("rank", I32, "", "global rank")]
_NS = "ns"

_sql("clock_offsets", "clock_offsets", "run, rank", "Per-rank clock offset estimated from collective completions, and whether it is applied.", _RUN_RANK + [
    ("estimated_offset_ns", I64, _NS, "minus the median of (this rank's end - the collective's median end)"),
    ("n_collectives", I64, "", "collectives used"),
    ("applied", BOOL, "", "applied to timestamps (several hosts, or align_clocks=always)"),
    ("offset_ns", I64, _NS, "offset added to this rank's timestamps")])
_sql("collectives", "collective_instances", "run, pg, seq", "One row per logical collective joined across the ranks of its group.", [
    ("run", STR, "", "run name"), ("pg", STR, "", "process group name ('?' when unknown)"),
    ("seq", I64, "", "sequence index within the group"), ("op", STR, "", "normalised op"),
    ("step", I32, "", "most common ProfilerStep of its ranks"), ("n_ranks", I64, "", "ranks seen"),
    ("group_size", I32, "", "members of the group"), ("complete", BOOL, "", "every member seen"),
    ("bytes", I64, "bytes", "bytes as nccl-tests counts them (all_gather output, reduce_scatter input)"),
    ("first_arrival_ns", I64, _NS, "earliest arrival"), ("last_arrival_ns", I64, _NS, "latest arrival"),
    ("arrival_skew_ns", I64, _NS, "latest - earliest arrival"), ("last_arriver", I32, "", "rank that arrived last"),
    ("transfer_ns", I64, _NS, "earliest end - latest arrival (>= 0)"),
    ("total_wait_ns", I64, _NS, "sum over ranks of (latest arrival - own arrival)"),
    ("algbw_gbps", F64, "GB/s", "bytes / transfer time"), ("busbw_gbps", F64, "GB/s", "algbw x NCCL bus factor")])
_sql("stragglers", "straggler_findings", "run, rank_order", "Ranks that cost their peers time and were slower on their own, ranked by cost.", _RUN_RANK + [
    ("delay_ns_per_step", F64, _NS, "median over steps of the wait it imposed per peer"),
    ("delay_pct", F64, "%", "delay as % of the median step time"),
    ("imposed_wait_ns_per_step", F64, _NS, "median over steps of the waits it imposed, summed over peers"),
    ("steps", I64, "", "steps in the window"), ("steps_flagged", I64, "", "steps above the thresholds"),
    ("pattern", STR, "", "persistent or sporadic"), ("phase", STR, "", "phase where it was slower than its peers"),
    ("phase_excess_ns_per_step", F64, _NS, "median excess over its peers in that phase"),
    ("annotation", STR, "", "innermost user annotation (record_function range) of that phase holding the most excess"),
    ("annotation_excess_ns_per_step", F64, _NS, "median excess over its peers in that annotation (exclusive time)"),
    ("phase_excess_pct", F64, "%", "phase_excess_ns_per_step as % of the median step time"),
    ("host_wait_excess_pct", F64, "%", "its threads' extra wait for a CPU core per step beyond its peers', as % of the "
                                       "median step time (unknown without the collector's CPU samples)"),
    ("rank_order", I64, "", "1 = costliest")])
_sql("phases", "step_phases", "run, step, rank", "Forward / backward / sync / optimizer time per rank and step.", _RUN_RANK + [
    ("step", I32, "", "ProfilerStep"), ("step_start_ns", I64, _NS, "step start"), ("step_end_ns", I64, _NS, "step end"),
    ("step_ns", I64, _NS, "step duration"), ("forward_ns", I64, _NS, "forward"), ("backward_ns", I64, _NS, "backward"),
    ("sync_ns", I64, _NS, "wait for the last gradient collectives"), ("optimizer_ns", I64, _NS, "optimizer"),
    ("data_loading_ns", I64, _NS, "DataLoader time")])
_sql("overlap", "overlap_ranks", "run, rank", "Communication/computation overlap per rank (HTA's definition).", _RUN_RANK + [
    ("comm_ns", I64, _NS, "merged communication time"), ("overlapped_ns", I64, _NS, "communication while compute ran"),
    ("exposed_ns", I64, _NS, "communication with no compute"), ("overlap_pct", F64, "%", "overlapped / comm")])
_sql("serialized_comm", "serialized_comm_steps", "run, step, rank", "Data-parallel collectives issued only after the backward pass, per rank and step.", _RUN_RANK + [
    ("step", I32, "", "aligned step"), ("backward_ns", I64, _NS, "the rank's backward phase"),
    ("n_serial", I64, "", "all_reduce / reduce_scatter / all_gather enqueued between backward end and optimizer"),
    ("serial_transfer_ns", I64, _NS, "their transfer time after the last member arrived, summed"),
    ("last_transfer_ns", I64, _NS, "the last one's (no overlap hides it)"),
    ("overlappable_ns", I64, _NS, "serial - last: what issuing them during backward could save")])
_sql("exposed_comm", "exposed_comm", "run, rank_order", "Exposed communication intervals, largest first.", _RUN_RANK + [
    ("window_id", I32, "", "profiling window"), ("step", I32, "", "ProfilerStep"),
    ("lo_ns", I64, _NS, "interval start"), ("hi_ns", I64, _NS, "interval end"), ("exposed_ns", I64, _NS, "length"),
    ("op", STR, "", "collective covering most of it"), ("pg", STR, "", "its process group"), ("seq", I64, "", "its seq"),
    ("bytes", I64, "bytes", "its size"), ("comm_name", STR, "", "kernel or span name"),
    ("compute_before", STR, "", "compute that ended last before it"), ("compute_after", STR, "", "compute that started first after it"),
    ("rank_order", I64, "", "1 = longest")])
_sql("temporal_breakdown", "temporal_breakdown", "run, rank, step", "Compute / exposed communication / memory / idle per rank and step over merged intervals.", _RUN_RANK + [
    ("step", I32, "", "ProfilerStep"), ("span_ns", I64, _NS, "first to last activity"),
    ("compute_ns", I64, _NS, "compute"), ("comm_ns", I64, _NS, "communication with no compute"),
    ("memory_ns", I64, _NS, "memcpy/memset with nothing else"), ("idle_ns", I64, _NS, "nothing running"),
    ("compute_pct", F64, "%", "of span"), ("comm_pct", F64, "%", "of span"), ("memory_pct", F64, "%", "of span"),
    ("idle_pct", F64, "%", "of span")])
_sql("temporal_ranks", "temporal_ranks", "run, rank", "Compute / exposed communication / memory / idle per rank over its whole window (all steps swept together, as HTA).", _RUN_RANK + [
    ("span_ns", I64, _NS, "first to last activity"), ("compute_ns", I64, _NS, "compute"),
    ("comm_ns", I64, _NS, "communication with no compute"), ("memory_ns", I64, _NS, "memcpy/memset with nothing else"),
    ("idle_ns", I64, _NS, "nothing running"), ("compute_pct", F64, "%", "of span"), ("comm_pct", F64, "%", "of span"),
    ("memory_pct", F64, "%", "of span"), ("idle_pct", F64, "%", "of span")])
_sql("kernel_breakdown", "kernel_breakdown", "run, rank, category, rank_in_category", "Top kernels (GPU) or CPU operators per rank and category.", _RUN_RANK + [
    ("category", STR, "", "compute, comm or memory"), ("name", STR, "", "kernel or operator name"),
    ("count", I64, "", "occurrences"), ("total_ns", I64, _NS, "total time"), ("mean_ns", F64, _NS, "mean"),
    ("max_ns", I64, _NS, "longest"), ("pct_of_category", F64, "%", "share of its category's time"),
    ("rank_in_category", I64, "", "1 = most time")], where="rank_in_category <= getvariable('kernels_top')")
_sql("imbalance", "imbalance_ranks", "run, rank_order", "Per rank: compute relative to the mean of the ranks (median over steps); the same ops on the same shapes as its peers is no finding.", _RUN_RANK + [
    ("compute_ns_per_step", F64, _NS, "median compute per step"), ("ratio_to_mean", F64, "", "compute / mean of ranks"),
    ("excess_ns_per_step", F64, _NS, "compute - mean of ranks"), ("excess_pct", F64, "%", "excess as % of the median step time"),
    ("steps", I64, "", "steps"), ("steps_max", I64, "", "steps in which it did the most work"),
    ("above_thresholds", BOOL, "", "compute >= imbalance_min_ratio x its peers' mean, excess >= imbalance_min_excess_pct of the step"),
    ("same_work", BOOL, "", "ran the same compute ops on the same input shapes as its peers (work.sql); NULL: unknown (no shapes recorded, no peer)"),
    ("is_finding", BOOL, "", "above the thresholds and not the same work (a slower host is no imbalance)"), ("rank_order", I64, "", "1 = most excess work")])
_sql("imbalance_ops", "imbalance_ops", "run, rank_order", "Imbalance per op type: which kernels/operators the ranks spend unevenly (largest excess first).", [
    ("run", STR, "", "run name"), ("category", STR, "", "compute, comm or memory"), ("name", STR, "", "kernel or operator"),
    ("n_ranks", I64, "", "ranks in the run"), ("mean_ns_per_step", F64, _NS, "mean over ranks (median over steps)"),
    ("max_ns_per_step", F64, _NS, "the rank with the most"), ("max_rank", I32, "", "that rank, most often"),
    ("max_over_mean", F64, "", "max / mean"), ("excess_ns_per_step", F64, _NS, "max - mean"),
    ("rank_order", I64, "", "1 = largest excess")], where="rank_order <= getvariable('kernels_top')")
_sql("all_to_all_balance", "all_to_all_balance", "run, rank_order", "MoE routing: all_to_all bytes per rank.", _RUN_RANK + [
    ("n_all_to_all", I64, "", "all_to_all ops"), ("sent_bytes", I64, "bytes", "bytes sent"),
    ("recv_bytes", I64, "bytes", "bytes received"), ("sent_over_mean", F64, "", "sent / mean of ranks"),
    ("recv_over_mean", F64, "", "received / mean of ranks"),
    ("is_finding", BOOL, "", "sent or received >= routing_min_ratio x the mean"),
    ("rank_order", I64, "", "1 = most bytes over the mean")])
_sql("seqlen_signal", "seqlen_signal", "run, rank", "Sequence-length imbalance signal: forward/backward correlation across steps.", _RUN_RANK + [
    ("steps", I64, "", "steps"), ("fwd_bwd_corr", F64, "", "Pearson correlation"), ("signal", BOOL, "", "above seqlen_min_corr")])
_sql("launch_stats", "launch_stats", "run, rank", "CPU->GPU launch statistics per rank.", _RUN_RANK + [
    ("launches", I64, "", "GPU operations joined to their launch call"),
    ("mean_launch_delay_ns", F64, _NS, "mean of GPU start - end of the launch call (clipped at 0)"),
    ("median_launch_delay_ns", F64, _NS, "median launch delay"), ("p95_launch_delay_ns", F64, _NS, "95th percentile"),
    ("max_launch_delay_ns", I64, _NS, "largest"), ("mean_launch_dur_ns", F64, _NS, "mean launch call duration"),
    ("mean_gpu_dur_ns", F64, _NS, "mean GPU duration"),
    ("short_kernels", I64, "", "GPU time shorter than the launch call (launch <= 50 us): launch-bound"),
    ("launch_outliers", I64, "", "launch calls > 50 us"),
    ("delay_outliers", I64, "", "launch delays > 100 us (after removing a detected clock offset)"),
    ("min_launch_delay_ns", I64, _NS, "quickest GPU start - end of its launch call, not clipped (about 0 or below unless the clocks are offset)"),
    ("clock_offset_ns", I64, _NS, "CPU/GPU clock offset detected from the launches (GPU - CPU); NULL when none"),
    ("clock_offset_reason", STR, "", "why a clock offset is suspected (NULL when none)"),
    ("corrected_median_launch_delay_ns", F64, _NS, "median launch delay less the detected offset")])
_sql("queue_length", "queue_length", "run, rank, stream", "Launched-but-not-started GPU operations per stream.", _RUN_RANK + [
    ("stream", I64, "", "GPU stream"), ("launches", I64, "", "launches"), ("max_queue", F64, "", "largest queue"),
    ("mean_queue", F64, "", "time-weighted mean queue length")])
_sql("idle_breakdown", "idle_breakdown", "run, rank, stream, category", "Idle gaps between GPU operations per stream: host wait / kernel wait / other.", _RUN_RANK + [
    ("stream", I64, "", "GPU stream"), ("category", STR, "", "host_wait, kernel_wait or other"),
    ("idle_ns", F64, _NS, "idle time"), ("gaps", I64, "", "gaps"), ("idle_pct", F64, "%", "of the stream's span")])
_sql("pipeline_shape", "pipeline_shape", "run, pipeline_id", "Detected pipeline: stages, stages per rank, micro-batches, schedule.", [
    ("run", STR, "", "run name"), ("pipeline_id", I32, "", "the pipeline (connected component of the p2p graph): its smallest global rank"),
    ("n_stages", I64, "", "pipeline ranks (p)"), ("stages_per_rank", I64, "", "v"),
    ("microbatches", F64, "", "m"), ("schedule", STR, "", "gpipe, 1f1b or interleaved1f1b"),
    ("theoretical_bubble_pct", F64, "%", "(p-1)/(v*m+p-1)")])
_sql("pipeline_bubbles", "pipeline_bubbles", "run, pipeline_id, step, stage", "Idle time of each pipeline stage per step, split by cause.", _RUN_RANK + [
    ("pipeline_id", I32, "", "the rank's pipeline (smallest global rank)"), ("stage", I64, "", "position in the pipeline"), ("step", I32, "", "ProfilerStep"), ("step_ns", I64, _NS, "step"),
    ("busy_ns", I64, _NS, "compute"), ("idle_ns", I64, _NS, "step - compute"),
    ("warmup_ns", I64, _NS, "before its first compute"), ("cooldown_ns", I64, _NS, "after its last compute"),
    ("stall_ns", I64, _NS, "waiting on a p2p peer in between"), ("other_idle_ns", I64, _NS, "own host-side delays"),
    ("bubble_pct", F64, "%", "idle / step"), ("theoretical_bubble_pct", F64, "%", "for the detected schedule"),
    ("schedule", STR, "", "detected schedule"), ("microbatches", F64, "", "detected m")])
_sql("pipeline_slow_stages", "pipeline_slow_stages", "run, rank_order", "Pipeline stages whose own time exceeds the others' (slow stage first).", _RUN_RANK + [
    ("pipeline_id", I32, "", "the rank's pipeline (smallest global rank)"), ("stage", I64, "", "position"), ("own_ns_per_step", F64, _NS, "compute + own delays, median over steps"),
    ("others_own_ns_per_step", F64, _NS, "median of the other stages of its pipeline"),
    ("excess_ns_per_step", F64, _NS, "own host-side delays beyond the other stages' + compute beyond its DP peers'"),
    ("excess_pct", F64, "%", "of the median step"),
    ("structural_ns_per_step", F64, _NS, "compute beyond the other stages' of its pipeline (its role: loss/head, partition)"),
    ("structural_pct", F64, "%", "of the median step"), ("stall_caused_ns_per_step", F64, _NS, "stalls charged to it"),
    ("steps", I64, "", "steps compared"), ("steps_in_excess", I64, "", "steps in which its own time exceeded its peers'"),
    ("is_finding", BOOL, "", "excess above slow_stage_min_excess_pct, in at least finding_min_steps_pct of the steps"),
    ("is_structural", BOOL, "", "not a finding, structural above slow_stage_min_excess_pct (replay decides)"),
    ("rank_order", I64, "", "1 = largest excess")])
_sql("host_cpu", "host_cpu_ranks", "run, rank", "Per rank: how long its training thread waited for a CPU core per step (the collector's schedstat samples; no rows when not sampled).", _RUN_RANK + [
    ("host", STR, "", "host name"), ("cores", I32, "", "CPUs the rank may run on (affinity)"), ("cpu_count", I32, "", "CPUs of the host"),
    ("ranks_on_host", I64, "", "ranks of the run sampled on that host"), ("steps", I64, "", "steps measured (the traced ones, when the trace has any)"),
    ("step_ns_per_step", F64, _NS, "median wall time between the step's samples"),
    ("wait_ns_per_step", F64, _NS, "median run-queue wait of the training thread"), ("wait_pct", F64, "%", "median wait as % of the step"),
    ("proc_wait_ns_per_step", F64, _NS, "median wait summed over every thread of the process (may exceed the step)"),
    ("peers_wait_ns_per_step", F64, _NS, "median over the run's other ranks of their wait_ns_per_step (NULL: no peer)"),
    ("contended", BOOL, "", "wait_pct >= host_cpu_wait_min_pct"),
    ("run_ns_per_step", F64, _NS, "median CPU time of the training thread (what its work cost on its core)"),
    ("peers_run_ns_per_step", F64, _NS, "median over the run's other ranks of their run_ns_per_step (NULL: no peer)"),
    ("peers_proc_wait_ns_per_step", F64, _NS, "median over the run's other ranks of their proc_wait_ns_per_step (NULL: no peer)"),
    ("host_wait_ns_per_step", F64, _NS, "median wait of the training thread its host can have caused: beyond its other threads' CPU time, at most its cores' unused time"),
    ("host_proc_wait_ns_per_step", F64, _NS, "median wait of the process, at most its cores' unused time"),
    ("peers_host_wait_ns_per_step", F64, _NS, "median over the run's other ranks of their host_wait_ns_per_step (NULL: no peer)"),
    ("peers_host_proc_wait_ns_per_step", F64, _NS, "median over the run's other ranks of their host_proc_wait_ns_per_step (NULL: no peer)")])
_py("critical_path", _critical_path, "Cross-rank critical path of each step, one row per hop (latest first).", [
    ("run", STR, "", "run name"), ("step", I32, "", "ProfilerStep"), ("hop", I64, "", "0 = the hop that ends the step"),
    ("rank", I32, "", "rank whose own time this is"), ("lo_ns", I64, _NS, "hop start (aligned clock: + clock_offsets.offset_ns)"), ("hi_ns", I64, _NS, "hop end"),
    ("dur_ns", I64, _NS, "hop length"), ("via_op", STR, "", "how the path entered this rank: the collective's op, or 'recv' (a receive that waited for this rank's send)"),
    ("via_pg", STR, "", "its process group"),
    ("via_seq", I64, "", "its seq (collective) or p2p_seq (receive)")])
_py("critical_path_summary", _critical_path_summary, "Time on each step's critical path per rank and activity.", [
    ("run", STR, "", "run name"), ("step", I32, "", "ProfilerStep"), ("rank", I32, "", "rank"),
    ("label", STR, "", "compute, comm, memory or idle"), ("path_ns", F64, _NS, "time on the path"),
    ("path_pct", F64, "%", "share of the path")])
