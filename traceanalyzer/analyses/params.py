"""The one settings object: every threshold of the analyses, the NCCL join and the report, each a
named, documented parameter with a default (:data:`SETTINGS`), and the checks of a value before it
reaches SQL: a NaN threshold compares false with everything and silently hides every finding, a
negative or infinite one is meaningless, and an enumerated parameter has a fixed set of values.

Where each one is used (``scope``):

* ``sql``: a DuckDB variable of the SQL modules (``getvariable('name')``), set by
  :func:`traceanalyzer.analyses.prepare`; ``traceanalyzer analyze --set NAME=VALUE`` changes it and
  the saved results record it. :data:`traceanalyzer.analyses.PARAMETERS` is this scope.
* ``nccl_join``: matching NCCL communicators to process groups (:class:`.nccl_join.JoinParams`).
* ``diff``: comparing two runs (:mod:`.diff`).
* ``report``: which findings the report keeps and replays (:mod:`traceanalyzer.report`).

``traceanalyzer schema`` and docs/analyses.md list them (:func:`describe`). Units are in the names.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import TraceAnalyzerError


@dataclass(frozen=True)
class Setting:
    """One named parameter: its default (its type is the parameter's), what it means, where used."""
    name: str
    default: Any
    help: str
    scope: str = "sql"
    choices: tuple[str, ...] = ()


def _s(name, default, help, scope="sql", choices=()):
    return Setting(name, default, help, scope, choices)


#: Every threshold, by name.
SETTINGS: dict[str, Setting] = {s.name: s for s in (
    # -- the SQL analyses (DuckDB variables) --
    _s("align_clocks", "auto", "apply estimated clock offsets: 'auto' (when evident: several hosts, or an offset >= "
                               "clock_offset_evident_ns), 'always', 'never'", choices=("auto", "always", "never")),
    # on one host the estimate is how far apart ranks leave collectives: at most 4.6 ms over the shipped
    # runs (a desync run); a shifted trace's clock is off by seconds or hours
    _s("clock_offset_evident_ns", 100_000_000, "align_clocks=auto applies the offsets on one host when one is at least this"),
    # 10 %: the OSDI'25 what-if study calls a job straggling when its slowdown S >= 1.1
    _s("straggler_min_delay_pct", 10.0, "a straggler costs its peers at least this % of the median step time per step"),
    _s("straggler_min_delay_ns", 1_000_000, "... and at least this many ns per step"),
    _s("straggler_min_excess_pct", 10.0, "... and was slower on its own: median excess in one phase, or extra wait of its threads for a CPU core (host_cpu), >= this % of the step time"),
    _s("straggler_persistent_pct", 50.0, "flagged in at least this % of steps: 'persistent', else 'sporadic'"),
    _s("imbalance_min_ratio", 1.1, "a rank is imbalanced when its compute is at least this times the mean of the ranks"),
    _s("imbalance_min_excess_pct", 5.0, "... and its excess over the mean is at least this % of the median step time"),
    # 1.25: the usual MoE capacity factor; a trained router's balancing loss keeps experts within it, so
    # a skew below it is the spread of a healthy router (1.11x on a clean 4-rank recording), not a fault
    _s("routing_min_ratio", 1.25, "MoE routing skew: a rank that sends or receives at least this times the mean all_to_all bytes"),
    # the bulk of a step's compute: a training step's few matmuls, convolutions and their backward
    _s("same_work_top_ops", 8, "a rank above the imbalance thresholds is no imbalance when it ran the run's this many largest compute ops (by time per step) on the same input shapes, as often, as its peers (a slower host, not more work; work.sql)"),
    _s("seqlen_min_corr", 0.9, "forward/backward correlation across steps that signals sequence-length imbalance"),
    _s("seqlen_min_steps", 3, "... over at least this many steps"),
    _s("clock_offset_min_launch_delay_ns", 1_000_000, "a CPU/GPU clock offset is suspected when even a rank's quickest GPU op started this long after its launch call returned"),
    _s("clock_offset_max_spread_ratio", 1.0, "... and its median launch delay is within (1 + this) x that quickest one (uniform, unlike a backlogged GPU)"),
    _s("clock_offset_min_early_pct", 50.0, "... or this % of its GPU ops started before their launch call began (GPU clock behind)"),
    _s("clock_offset_min_launches", 10, "... over at least this many launches"),
    _s("launch_short_max_ns", 50_000, "a GPU op shorter than its launch call is launch-bound ('short_kernels') when the call took at most this"),
    _s("launch_outlier_min_ns", 50_000, "a launch call taking longer than this is an outlier ('launch_outliers')"),
    _s("launch_delay_outlier_min_ns", 100_000, "a launch delay (less a detected clock offset) longer than this is an outlier ('delay_outliers')"),
    _s("idle_kernel_wait_ns", 30_000, "a gap between kernels of a stream shorter than this is 'kernel wait' (HTA: 30 us)"),
    _s("p2p_wait_max_tail_ns", 1_000_000, "a pipeline gap under an open send is a wait on it (a stall) up to the send's completion only when the stage's next call follows it within this many ns (else only the send call is; the rest is the stage's own time)"),
    _s("finding_min_steps_pct", 75.0, "a slow stage is a finding only when its own time exceeds its peers' in at least this % of the steps (one noisy step of a healthy run is not a fault)"),
    _s("slow_stage_min_excess_pct", 10.0, "a pipeline stage is slow when its own time exceeds the other stages' median by this % of the step"),
    _s("exposed_top", 20, "exposed-communication intervals attributed (collective, compute before/after) per run"),
    _s("exposed_context_max_ns", 1_000_000_000, "the compute before/after an exposed interval is looked for within this many ns of it"),
    _s("step_alignment_max_hops", 32, "steps of two trace windows are aligned through at most this many shared synchronisation points in a chain"),
    _s("kernels_top", 10, "kernels/operators kept per rank and category by analyze"),
    # same order as imbalance_min_excess_pct: a wait this large moves a rank's timings by as much
    _s("host_cpu_wait_min_pct", 5.0, "a rank is contended when its training thread waited for a CPU core at least this % of its step (median; host_cpu.sql); the report then says so once (a caveat)"),
    # -- matching NCCL communicators to process groups (nccl_join.JoinParams) --
    _s("nccl_join_min_score", 0.9, "fraction of the shorter op sequence that must match at the chosen offset", "nccl_join"),
    _s("nccl_join_min_ops", 3, "fewest compared pairs for an offset to count (or the whole shorter sequence, when shorter)", "nccl_join"),
    _s("nccl_join_ambiguity_margin", 0.05, "offsets (or groups) scoring within this of the best are equally good", "nccl_join"),
    _s("nccl_join_dur_tiebreak_ratio", 2.0, "a duration tie-break needs the runner-up's duration error to be this many times the best's", "nccl_join"),
    _s("nccl_join_dur_error_floor", 0.01, "duration errors below this (|ln ratio|, ~1 %) are timing noise: the runner-up must beat ratio x max(best, floor)", "nccl_join"),
    # -- comparing two runs (diff.py) --
    _s("diff_min_impact_ns", 50_000, "a change between two runs smaller than this (ns per step) is noise on a shared machine and is not listed", "diff"),
    # -- the report --
    # same order as the analyses' 5-10 % thresholds for imbalance and stragglers
    # 100 %: its host's extra cost alone accounts for all of the phase it was slower in
    _s("straggler_host_min_pct", 60.0, "a straggler that ran the same work as its peers (work.sql) and whose extra CPU time plus extra wait for a core per step that its host can have caused (host_cpu.sql: a lower bound) is at least this % of its slower phase's excess is reported as a slow host, not as a straggler of the job; so is a slow stage whose extra wait for a core alone is this % of its excess", "report"),
    _s("exposed_comm_min_pct", 5.0, "an exposed-communication finding needs at least this much recoverable time, in % of the median step", "report"),
    _s("exposed_evidence_top", 3, "exposed intervals listed as evidence of an exposed-communication finding", "report"),
    # one what-if costs two replays of the whole graph plus the plan: ~0.6 s for 13 M events on 2 cores
    _s("replay_max_findings", 3, "rank findings are replayed (largest estimate first) until this many are confirmed (at most 3x as many what-ifs); the others keep their estimate", "report"),
    # a 128-rank DLRM job flags 16 ranks that each cost 0.07 % of a step
    _s("replay_min_pct", 1.0, "findings whose estimate is below this % of the median step are not replayed", "report"),
    # building the graph costs ~0.5 us per stored event on 2 cores: graph + 3 what-ifs of a 20 M-event
    # run stay inside the report's 30 s budget
    _s("replay_max_events", 20_000_000, "runs with more stored events than this are not replayed by the report (--replay-max-events)", "report"),
)}

#: enumerated parameters: name -> the values they take
CHOICES: dict[str, tuple[str, ...]] = {s.name: s.choices for s in SETTINGS.values() if s.choices}


def scope(name: str) -> dict[str, Setting]:
    """The settings of one scope ('sql', 'nccl_join', 'report'), in order."""
    return {k: s for k, s in SETTINGS.items() if s.scope == name}


def default(name: str) -> Any:
    return SETTINGS[name].default


def describe() -> str:
    """Markdown: every setting with its default, scope and meaning (``traceanalyzer schema``)."""
    lines = ["# analysis settings", "",
             "`sql`: `traceanalyzer analyze --set NAME=VALUE`; `nccl_join`: `JoinParams`; `diff`: `traceanalyzer diff`; "
             "`report`: the report.", "",
             "| name | default | scope | meaning |", "|---|---|---|---|"]
    lines += [f"| {s.name} | {s.default!r} | {s.scope} | {s.help} |" for s in SETTINGS.values()]
    return "\n".join(lines) + "\n"


def check_parameter(name: str, value: Any, default: Any) -> Any:
    """``value`` as the type of ``default``, or a one-line :class:`TraceAnalyzerError`."""
    if name in CHOICES:
        if value not in CHOICES[name]:
            raise TraceAnalyzerError(f"analysis parameter {name}={value!r}: takes one of {', '.join(CHOICES[name])}")
        return value
    if isinstance(default, bool) or not isinstance(default, (int, float)):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TraceAnalyzerError(f"analysis parameter {name}={value!r}: takes a number")
    if not math.isfinite(value):
        raise TraceAnalyzerError(f"analysis parameter {name}={value!r}: takes a finite number, not NaN or infinity")
    if value < 0:
        raise TraceAnalyzerError(f"analysis parameter {name}={value!r}: takes a number >= 0")
    if isinstance(default, int) and value != int(value):
        raise TraceAnalyzerError(f"analysis parameter {name}={value!r}: takes a whole number")
    return type(default)(value)
