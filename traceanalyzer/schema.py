"""The canonical schema: every table, column, type and unit of a traceanalyzer store.

This is the one place where column names are spelled. Ingest writes these tables, the DuckDB
views expose them, analyses read them. Conventions:

* time is int64 nanoseconds since the Unix epoch (``*_ts_ns``) or a duration (``*_dur_ns``),
  parsed exactly from the trace's decimal text (``baseTimeNanoseconds + ts x 1000``);
* sizes are ``*_bytes`` or ``*_nelems``; ``rank`` is always the *global* rank;
* ``run``, ``rank`` and ``window_id`` are Hive partition keys
  (``TABLE/run=R/rank=K/window_id=W/part-G.parquet``), so they are not stored inside the files;
* a trace file is identified by ``(run, rank, window_id)``: a rank may have several profiling
  windows of one long run; windows are numbered 0, 1, ... per rank in the order they are ingested.

Bump ``SCHEMA_VERSION`` whenever a column changes meaning or type; a store written with another
major version is refused with a clear message (see :mod:`traceanalyzer.store`).
"""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

SCHEMA_VERSION = "1.0"

#: Durations above this are not plausible for one traced operation (a clock glitch or a
#: never-closed range); such events are dropped and counted (``skipped.absurd_duration``).
MAX_EVENT_DUR_NS = 24 * 3600 * 1_000_000_000

#: Partition keys, in path order, with their DuckDB types.
PARTITION_KEYS = {"run": "VARCHAR", "rank": "INTEGER", "window_id": "INTEGER"}


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    doc: str
    unit: str = ""


@dataclass(frozen=True)
class Table:
    name: str
    doc: str
    columns: tuple[Column, ...]

    @property
    def arrow_schema(self) -> pa.Schema:
        return pa.schema([pa.field(c.name, c.type) for c in self.columns])

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]


def _c(name, type_, doc, unit=""):
    return Column(name, type_, doc, unit)


I64, I32, STR, BOOL, F64 = pa.int64(), pa.int32(), pa.string(), pa.bool_(), pa.float64()

RANKS = Table("ranks", "One row per ingested trace file: who recorded it and where it lies in time.", (
    _c("trace_file", STR, "absolute path of the ingested file"),
    _c("host", STR, "host name recorded by the profiler (empty when absent)"),
    _c("pid", I64, "process id of the CPU side"),
    _c("world_size", I32, "world size from distributedInfo (null when absent)"),
    _c("backend", STR, "default process group backend: nccl, gloo, ... (null when absent)"),
    _c("device", STR, "accelerator model from deviceProperties, or 'cpu' for CPU-only traces"),
    _c("rank_source", STR, "where the rank came from: distributedInfo, file_name or argument"),
    _c("base_time_ns", I64, "baseTimeNanoseconds of the trace (0 when ts are already epoch microseconds)", "ns"),
    _c("start_ts_ns", I64, "first event start", "ns"),
    _c("end_ts_ns", I64, "last event end", "ns"),
    _c("clock_offset_ns", I64, "offset to add to this rank's timestamps to align its clock with the run's reference; 0 until estimated", "ns"),
    _c("n_events", I64, "rows written to events"),
    _c("n_skipped", I64, "trace events not written anywhere (see skipped_json)"),
    _c("skipped_json", STR, "JSON object: reason -> count of dropped or repaired events"),
    _c("distributed_info_json", STR, "the raw distributedInfo object, as JSON"),
    _c("trace_meta_json", STR, "other top-level keys of the trace (schemaVersion, deviceProperties, ...) as JSON"),
))

PROCESS_GROUPS = Table("process_groups", "Process groups this rank knew, from distributedInfo.pg_config.", (
    _c("pg_name", STR, "process group name ('0' is the default group)"),
    _c("pg_desc", STR, "process group description (default_pg, undefined, user text)"),
    _c("backend_config", STR, "e.g. 'cuda:nccl' or 'cpu:gloo,cuda:gloo'"),
    _c("pg_size", I32, "number of member ranks"),
    _c("pg_ranks", pa.list_(I32), "global ranks of the members, in group-rank order"),
))

THREADS = Table("threads", "CPU threads and GPU streams of a trace, with their meaningful name.", (
    _c("pid", I64, "process id (CPU) or device id (GPU)"),
    _c("tid", I64, "thread id (CPU) or stream id (GPU)"),
    _c("is_gpu", BOOL, "true for a GPU stream"),
    _c("name", STR, "thread or stream name; of several thread_name records the most specific is kept (e.g. pt_gloo_runloop over python3)"),
    _c("n_events", I64, "events on this thread/stream"),
))

EVENTS = Table("events", "Every complete ('X') and instant ('i') trace event.", (
    _c("event_id", I64, "position of the event among the trace file's complete and instant events (gaps where events were dropped); unique within (run, rank, window_id); referenced by comms"),
    _c("ph", STR, "trace phase: X (complete) or i (instant)"),
    _c("cat", STR, "Kineto category: cpu_op, user_annotation, gpu_user_annotation, kernel, gpu_memcpy, gpu_memset, cuda_runtime, cuda_driver, cuda_sync, python_function, ..."),
    _c("kind", STR, "normalised class: cpu_op, comm_op, annotation, python, runtime, sync, compute_kernel, comm_kernel, memcpy, memset, gpu_annotation, step, instant, other"),
    _c("name", STR, "event name (invalid UTF-8 replaced, counted in ranks.skipped_json)"),
    _c("ts_ns", I64, "start, epoch nanoseconds", "ns"),
    _c("dur_ns", I64, "duration (0 for instant events)", "ns"),
    _c("pid", I64, "process id (CPU) or device id (GPU); non-numeric pids are hashed into negative ids"),
    _c("tid", I64, "thread id (CPU) or stream id (GPU); non-numeric tids are hashed into negative ids"),
    _c("is_gpu", BOOL, "true for events that run on a device"),
    _c("device", I32, "device index (GPU events), else null"),
    _c("stream", I64, "GPU stream (GPU events), else null"),
    _c("correlation", I64, "CUDA/HIP correlation id linking a runtime launch to its kernel"),
    _c("external_id", I64, "Kineto 'External id' linking GPU work to the CPU op that issued it"),
    _c("step", I32, "ProfilerStep number this event belongs to (CPU: the enclosing step; GPU: the step of the launching CPU call), null outside steps"),
    _c("args_json", STR, "the event's args as JSON text, kept whole"),
))

FLOWS = Table("flows", "Flow endpoints (ac2g launch->kernel, fwdbwd forward->backward, async_cpu_to_gpu).", (
    _c("flow_id", I64, "flow id; an 's' and an 'f' endpoint with the same (cat, flow_id) form one arrow"),
    _c("cat", STR, "ac2g, fwdbwd, async_cpu_to_gpu, ..."),
    _c("ph", STR, "s (start), t (step) or f (finish)"),
    _c("ts_ns", I64, "endpoint time", "ns"),
    _c("pid", I64, "process or device id"),
    _c("tid", I64, "thread or stream id"),
))

STEPS = Table("steps", "ProfilerStep#N ranges per rank (from the CPU-side annotation).", (
    _c("step", I32, "the N of ProfilerStep#N"),
    _c("start_ts_ns", I64, "step start", "ns"),
    _c("end_ts_ns", I64, "step end", "ns"),
    _c("dur_ns", I64, "end - start", "ns"),
))

COMMS = Table("comms", "One row per communication operation on a rank, normalised across the NCCL, legacy NCCL, gloo and non-NCCL dialects.", (
    _c("comm_id", I64, "row number within (run, rank, window_id)"),
    _c("dialect", STR, "nccl (record_param_comms with args, 2024+), nccl_legacy (bare record_param_comms + nccl:<op> annotation), gloo (c10d::* enqueue + gloo:* span), kernel_only (a communication kernel without CPU side), symm_mem / other (non-NCCL communication kernels)"),
    _c("op", STR, "normalised op: all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, reduce, gather, scatter, barrier, send, recv, send_recv, coalesced, ..."),
    _c("is_p2p", BOOL, "point-to-point (send/recv) rather than a collective"),
    _c("pg_name", STR, "process group name (null when unknown)"),
    _c("pg_desc", STR, "process group description"),
    _c("pg_ranks", pa.list_(I32), "global ranks of the group"),
    _c("group_size", I32, "members of the group"),
    _c("pg_source", STR, "where pg_name came from: op_args, kernel_args, flight_recorder, runloop_thread (inferred), default_pg (inferred), none"),
    _c("pg_inferred", BOOL, "true when the process group was inferred rather than recorded"),
    _c("seq", I64, "collective sequence index per (run, rank, pg_name): joins the same collective across the ranks of its group (see seq_source for its origin and base). Null for p2p"),
    _c("seq_source", STR, "nccl_seq (the trace's Seq arg), flight_recorder (collective_seq_id, 1-based, from the rank's FR dump), order (0-based position among this rank's collectives of the group in this window)"),
    _c("nccl_seq", I64, "the Seq arg of record_param_comms where present"),
    _c("p2p_seq", I64, "for p2p: index among ops of the same (pg_name, src_rank, dst_rank, tag), 0-based"),
    _c("src_rank", I32, "p2p: global rank that sends"),
    _c("dst_rank", I32, "p2p: global rank that receives"),
    _c("peer_rank", I32, "p2p: the other global rank"),
    _c("tag", I64, "p2p tag"),
    _c("dtype", STR, "element type (Float, BFloat16, ...)"),
    _c("elem_bytes", I32, "bytes per element (null when dtype unknown)"),
    _c("in_nelems", I64, "input elements on this rank"),
    _c("out_nelems", I64, "output elements on this rank"),
    _c("in_bytes", I64, "input bytes on this rank (in_nelems x elem_bytes)"),
    _c("out_bytes", I64, "output bytes on this rank"),
    _c("in_split_sizes", STR, "all_to_all input split sizes as recorded (JSON list text)"),
    _c("out_split_sizes", STR, "all_to_all output split sizes as recorded (JSON list text)"),
    _c("enqueue_event_id", I64, "events.event_id of the CPU op that issued the communication (c10d::*, record_param_comms, symm_mem::*)"),
    _c("enqueue_ts_ns", I64, "CPU issue time", "ns"),
    _c("enqueue_dur_ns", I64, "CPU issue duration", "ns"),
    _c("enqueue_tid", I64, "CPU thread that issued it"),
    _c("exec_event_id", I64, "events.event_id of the execution: the communication kernel (GPU), the gloo:* span (gloo), else the CPU annotation"),
    _c("exec_name", STR, "name of the execution event (kernel name, gloo:all_reduce, ...)"),
    _c("start_ts_ns", I64, "execution start (arrival): kernel start, gloo span start, or the CPU annotation start", "ns"),
    _c("end_ts_ns", I64, "execution end", "ns"),
    _c("dur_ns", I64, "end - start", "ns"),
    _c("exec_tid", I64, "thread (gloo) or stream (GPU) of the execution"),
    _c("on_gpu", BOOL, "execution timed on a GPU stream"),
    _c("step", I32, "ProfilerStep of the enqueue"),
))

#: Every table of a store, in the order ``info`` lists them.
TABLES: dict[str, Table] = {t.name: t for t in (RANKS, PROCESS_GROUPS, THREADS, EVENTS, FLOWS, STEPS, COMMS)}

#: Store-level (not per-rank) table: one row per run.
RUNS = Table("runs", "One row per run in the store (derived view).", (
    _c("run", STR, "run name"),
    _c("n_ranks", I64, "distinct ranks"),
    _c("n_windows", I64, "trace files"),
    _c("world_size", I32, "largest world size recorded"),
    _c("backend", STR, "backend of the default group"),
    _c("start_ts_ns", I64, "first event of any rank", "ns"),
    _c("end_ts_ns", I64, "last event end of any rank", "ns"),
))


def empty_table(table: Table) -> pa.Table:
    return table.arrow_schema.empty_table()


def describe() -> str:
    """Markdown description of every table and column (used by ``traceanalyzer schema``)."""
    lines = [f"# traceanalyzer store schema {SCHEMA_VERSION}", "",
             "Every per-rank table also has the Hive partition columns `run` (VARCHAR), `rank` (INTEGER, the global "
             "rank) and `window_id` (INTEGER, the profiling window of that rank; `window` is an SQL keyword).", ""]
    for t in list(TABLES.values()) + [RUNS]:
        lines += [f"## {t.name}", "", t.doc, "", "| column | type | unit | meaning |", "|---|---|---|---|"]
        lines += [f"| {c.name} | {c.type} | {c.unit} | {c.doc} |" for c in t.columns]
        lines.append("")
    return "\n".join(lines)
