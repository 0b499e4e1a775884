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
major version is refused with a clear message (see :mod:`traceanalyzer.store.files`).
"""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

SCHEMA_VERSION = "1.3"

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
    #: Hive partition keys of its files: per trace file (run, rank, window_id), or per process
    #: (run, rank) for what a rank writes once, whatever its profiling windows (FR dumps, NCCL logs).
    partition: tuple[str, ...] = ("run", "rank", "window_id")

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
    _c("rank_source", STR, "where the rank came from: distributedInfo, file_name, argument, or for Nsight Systems exports rank_map (X.ranks.json) or nsys_process_order (position of the process by lowest CUDA device id)"),
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
    _c("cat", STR, "Kineto category: cpu_op, user_annotation, gpu_user_annotation, kernel, gpu_memcpy, gpu_memset, cuda_runtime, cuda_driver, cuda_sync, python_function, ...; from Nsight Systems exports also nvtx (a non-default NVTX domain) and nsys (the synthetic window step)"),
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
    _c("nested", BOOL, "true for a CPU event that lies wholly inside the span of events that started before it on its thread (ProfilerStep and the profiler's own spans not counted): not top-level work. `WHERE NOT nested` keeps each thread's top-level ops plus events that outlive their parent; null in stores written before schema 1.3"),
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
    _c("pg_source", STR, "where pg_name came from: op_args, kernel_args, flight_recorder, runloop_thread (inferred), default_pg (inferred), p2p_match (gloo p2p: the group under which sender and receiver agree, see p2p_groups.py), nsys_op_order (Nsight Systems export: inferred group nsys:<op>, see traceanalyzer/ingest/nsys), collective_match (gloo collectives: the one group whose members all ran the same unresolved collectives, see coll_groups.py; inferred), none"),
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
    _c("in_split_sizes", STR, "all_to_all input split sizes as recorded (JSON list text; the caller's units: rows per peer for c10d::alltoall_base_)"),
    _c("out_split_sizes", STR, "all_to_all output split sizes as recorded (JSON list text, same units)"),
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

# -- The NCCL side: per-process dumps and logs, partitioned by (run, rank) only -----------------
# A process writes each of these once, whatever its profiling windows, so they are not tied to
# a trace file. Files: TABLE/run=R/rank=K/part-G-N.parquet. Their rows are joined to the profiler's
# collectives by (run, rank, process group, sequence number); see the comms_fr view, and for the NCCL
# logs and plugins (numbered per communicator) nccl_comm_map and comms_nccl (traceanalyzer/nccl_join.py).

_PER_RANK = ("run", "rank")

FR_DUMPS = Table("fr_dumps", "One row per ingested Flight Recorder dump (one per rank): what the dump says about itself.", (
    _c("source_file", STR, "absolute path of the dump"),
    _c("source_format", STR, "json (_dump_fr_trace_json, or the collector's JSON with frames) or pickle (_dump_fr_trace, read without running code)"),
    _c("fr_version", STR, "the dump's format version (torch 2.13 writes '2.10')"),
    _c("backend", STR, "nccl or gloo, from the entries' profiling names (null when the dump has no entries)"),
    _c("comm_lib_version", STR, "NCCL version for NCCL dumps; empty for gloo"),
    _c("n_entries", I64, "entries written to fr_entries"),
    _c("n_skipped", I64, "malformed entries skipped (not a dict, or no process group / sequence id)"),
    _c("pg_config_json", STR, "JSON list of {pg_name, pg_desc, ranks} from the dump's pg_config (ranks null when unreadable)"),
    _c("pg_config_usable", BOOL, "false when pg_config cannot name the groups: gloo dumps hold one entry keyed '' (name and desc empty)"),
    _c("pg_status_json", STR, "JSON object pg_id -> last_enqueued/started/completed_collective (ints)"),
    _c("nccl_comm_state_json", STR, "NCCL dumps: JSON object comm hash -> NCCL's own key/value state; null when absent"),
), _PER_RANK)

FR_ENTRIES = Table("fr_entries", "One row per Flight Recorder entry (a collective or p2p op this rank issued, newest 2000 by default).", (
    _c("record_id", I64, "position in the rank's FR ring (monotonic)"),
    _c("pg_id", I64, "process group uid within this process (keys pg_status)"),
    _c("pg_name", STR, "process group name (joins comms.pg_name)"),
    _c("pg_desc", STR, "process group description"),
    _c("collective_seq_id", I64, "1-based count of collectives on the group (joins comms.seq where seq_source is flight_recorder or nccl_seq); p2p entries repeat the last collective's"),
    _c("p2p_seq_id", I64, "1-based count of p2p ops on the group (0 for collectives)"),
    _c("op_id", I64, "counts every op of the group, including each op inside a coalesced group"),
    _c("is_p2p", BOOL, "point-to-point op"),
    _c("profiling_name", STR, "e.g. gloo:all_reduce, nccl:all_reduce, nccl:send 0->1 (group ranks)"),
    _c("op", STR, "normalised op (as comms.op)"),
    _c("input_sizes", STR, "JSON list of input tensor shapes"),
    _c("input_dtypes", STR, "JSON list of input dtypes (Float, BFloat16, ...)"),
    _c("output_sizes", STR, "JSON list of output tensor shapes"),
    _c("output_dtypes", STR, "JSON list of output dtypes"),
    _c("in_nelems", I64, "elements over all input tensors"),
    _c("out_nelems", I64, "elements over all output tensors"),
    _c("state", STR, "scheduled, started or completed (gloo entries stay 'scheduled': gloo records no start/end events)"),
    _c("time_created_ns", I64, "when the op was enqueued (epoch, the issuing CPU thread)", "ns"),
    _c("time_discovered_started_ns", I64, "when c10d saw the op start (NCCL; null for gloo or not started)", "ns"),
    _c("time_discovered_completed_ns", I64, "when c10d saw the op complete (NCCL; null for gloo or not completed)", "ns"),
    _c("duration_ns", I64, "GPU time between the op's CUDA events (NCCL with TORCH_NCCL_ENABLE_TIMING=1), else null", "ns"),
    _c("timeout_ns", I64, "the group's timeout", "ns"),
    _c("retired", BOOL, "the work object was retired (finished or timed out)"),
    _c("thread_id", STR, "issuing thread id (as text)"),
    _c("thread_name", STR, "issuing thread name"),
    _c("frames_json", STR, "JSON list of {name, filename, line}: the Python stack of the call, innermost first; null when the dump has no frames (_dump_fr_trace_json in torch 2.13)"),
), _PER_RANK)

NCCL_LOG_OPS = Table("nccl_log_ops", "One row per NCCL API call logged with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL ('AllReduce: opCount ...').", (
    _c("source_file", STR, "absolute path of the log"),
    _c("line_no", I64, "1-based line in the log"),
    _c("log_prefix", STR, "text before the host:pid:tid prefix (the NCCL_DEBUG_TIMESTAMP_FORMAT timestamp, when on), else null"),
    _c("host", STR, "host name from the line prefix"),
    _c("pid", I64, "process id from the line prefix"),
    _c("tid", I64, "thread id from the line prefix"),
    _c("cuda_dev", I32, "the [N] of the prefix: the CUDA device, not the rank"),
    _c("nccl_op", STR, "NCCL's op name: AllReduce, AllGather, ReduceScatter, Broadcast, Reduce, Send, Recv, AlltoAll, ..."),
    _c("op", STR, "normalised op (as comms.op)"),
    _c("is_p2p", BOOL, "Send or Recv"),
    _c("op_count", I64, "comm->opCount (logged in hex); its increments differ between NCCL versions"),
    _c("comm_seq", I64, "0-based position of this call among the calls of its communicator in this log"),
    _c("count", I64, "elements (per rank)"),
    _c("datatype", I32, "ncclDataType_t code"),
    _c("dtype", STR, "datatype name (int8, uint8, int32, uint32, int64, uint64, float16, float32, float64, bfloat16, float8e4m3, float8e5m2)"),
    _c("elem_bytes", I32, "bytes per element (null for an unknown code)"),
    _c("bytes", I64, "count x elem_bytes"),
    _c("redop", I32, "ncclRedOp_t code (0 sum, 1 prod, 2 max, 3 min, 4 avg; larger: user PreMulSum)"),
    _c("redop_name", STR, "sum, prod, max, min, avg or premulsum"),
    _c("root", I32, "root (Broadcast/Reduce) or peer (Send/Recv), as a rank of the communicator"),
    _c("sendbuff", STR, "send buffer pointer (text)"),
    _c("recvbuff", STR, "receive buffer pointer (text)"),
    _c("comm", STR, "communicator pointer (text): identifies the communicator within the process"),
    _c("nranks", I32, "ranks of the communicator"),
    _c("stream", STR, "CUDA stream pointer (text)"),
    _c("comm_rank", I32, "this process's rank in the communicator, from its 'Init COMPLETE' line (null when the INIT lines are absent)"),
    _c("comm_id", STR, "commId hash of the communicator from its 'Init COMPLETE' line (same on every rank of the communicator)"),
    _c("torch_pg_name", STR, "process group name from torch's 'ProcessGroupNCCL created ncclComm_ <comm>' line in the same file (PG GUID), else null"),
    _c("torch_pg_desc", STR, "process group description from that line (default_pg, ...), else null"),
), _PER_RANK)

NCCL_INSPECTOR_OPS = Table("nccl_inspector_ops", "One row per completed collective (coll_perf) or p2p (p2p_perf) record of the NCCL Inspector profiler plugin's JSON output.", (
    _c("source_file", STR, "absolute path of the Inspector log (<hostname>-pid<pid>.log, JSON lines)"),
    _c("kind", STR, "coll or p2p"),
    _c("nccl_op", STR, "NCCL's op name (AllReduce, Send, ...)"),
    _c("op", STR, "normalised op (as comms.op)"),
    _c("sn", I64, "coll_sn / p2p_sn: the Inspector's sequence number of the op in its communicator"),
    _c("peer", I32, "p2p peer (communicator rank), null for collectives"),
    _c("msg_size_bytes", I64, "message size", "bytes"),
    _c("exec_dur_ns", I64, "execution time (coll_exec_time_us x 1000)", "ns"),
    _c("timing_source", STR, "kernel_gpu, kernel_cpu or collective_cpu (v4.1+), else null"),
    _c("algo", STR, "algorithm (RING, TREE, ...), collectives only"),
    _c("proto", STR, "protocol (LL, LL128, SIMPLE), collectives only"),
    _c("algobw_gbs", F64, "algorithm bandwidth", "GB/s"),
    _c("busbw_gbs", F64, "bus bandwidth", "GB/s"),
    _c("comm_id", STR, "communicator hash (header.id)"),
    _c("comm_name", STR, "communicator name (header.comm_name, newer Inspectors), else null"),
    _c("comm_rank", I32, "rank in the communicator (header.rank)"),
    _c("comm_nranks", I32, "ranks of the communicator (header.n_ranks)"),
    _c("comm_nnodes", I32, "nodes of the communicator (header.nnodes)"),
    _c("hostname", STR, "metadata.hostname"),
    _c("pid", I64, "metadata.pid"),
    _c("dump_ts_ns", I64, "when the record was dumped (metadata.dump_timestamp_us x 1000)", "ns"),
    _c("format_version", STR, "metadata.inspector_output_format_version (v4.0 ... v4.3)"),
), _PER_RANK)

NCCL_PROFILER_EVENTS = Table("nccl_profiler_events", "One row per begin/end pair of the NCCL example profiler plugin's Chrome-trace dump (NCCL_PROFILE_DUMP_FILE-<host>-<tid>.txt).", (
    _c("source_file", STR, "absolute path of the dump"),
    _c("name", STR, "event name: Group API, AllReduce, Send, KernelCh, ScheduleSend, RecvWait, ..."),
    _c("cat", STR, "GROUP_API, COLL_API, P2P_API, KERNEL_LAUNCH, GROUP, COLL, P2P, PROXY, NET, GPU, NET_IB, NET_SOCK"),
    _c("event_id", I64, "the async event id (per category)"),
    _c("pid", I64, "process id"),
    _c("start_rel_ns", I64, "begin, relative to the plugin's own time origin (not epoch)", "ns"),
    _c("dur_ns", I64, "end - begin (null when the end is missing)", "ns"),
    _c("op", STR, "normalised op for COLL/P2P/COLL_API/P2P_API events, else null"),
    _c("seq_num", I64, "COLL: SeqNum (per communicator and collective type)"),
    _c("comm_hash", STR, "COLL/P2P: CommHash (text: an unsigned 64-bit value)"),
    _c("comm_rank", I32, "COLL/P2P: Rank in the communicator"),
    _c("peer", I32, "P2P/PROXY: Peer"),
    _c("count", I64, "COLL/P2P/API: element count"),
    _c("datatype", STR, "NCCL datatype name (ncclFloat32, ...)"),
    _c("algorithm", STR, "COLL: algorithm"),
    _c("protocol", STR, "COLL: protocol"),
    _c("n_channels", I32, "COLL/P2P: channels used"),
    _c("channel", I32, "KernelCh/PROXY: channel id"),
    _c("args_json", STR, "the begin event's args, as JSON"),
), _PER_RANK)

NCCL_SIDE_TABLES = (FR_DUMPS, FR_ENTRIES, NCCL_LOG_OPS, NCCL_INSPECTOR_OPS, NCCL_PROFILER_EVENTS)

# The collector's CPU scheduling samples (traceanalyzer/collect/cpu_sched.py, rank{R}.cpu_sched.json):
# one row per step boundary; no rows for a rank recorded without them (unknown, never 0).
CPU_SCHED = Table("cpu_sched", "One row per step boundary the collector sampled: this rank's CPU run and run-queue wait "
                  "(Linux schedstat, cumulative since each thread started). Sample `step` k is taken at the k-th "
                  "Collector.step() call (0: at entry), so samples k and k+1 bound ProfilerStep#k.", (
    _c("step", I32, "step boundary k: the k-th Collector.step() call (0 = entry); ProfilerStep#k runs from it to k+1"),
    _c("ts_ns", I64, "when it was taken (time.time_ns(): the trace's epoch clock)", "ns"),
    _c("proc_run_ns", I64, "time the process's threads ran on a CPU, summed over threads (an exited thread keeps its last value)", "ns"),
    _c("proc_wait_ns", I64, "time the process's threads were runnable but waited for a CPU, summed over threads", "ns"),
    _c("main_run_ns", I64, "the training (calling) thread's own run time", "ns"),
    _c("main_wait_ns", I64, "the training thread's own wait for a CPU", "ns"),
    _c("n_threads", I32, "threads seen so far"),
    _c("cores", I32, "CPUs this process may run on (os.sched_getaffinity); null when unknown"),
    _c("cpu_count", I32, "CPUs of the host (os.cpu_count()); null when unknown"),
    _c("host", STR, "host name"),
    _c("pid", I64, "process id"),
    _c("source_file", STR, "absolute path of the samples file (rank{R}.cpu_sched.json)"),
), _PER_RANK)

#: Every table of a store, in the order ``info`` lists them.
TABLES: dict[str, Table] = {t.name: t for t in (RANKS, PROCESS_GROUPS, THREADS, EVENTS, FLOWS, STEPS, COMMS,
                                                *NCCL_SIDE_TABLES, CPU_SCHED)}

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


#: Derived view: the profiler's collectives with their Flight Recorder entry (see store.py).
COMMS_FR = Table("comms_fr", "Derived view: every column of comms, for the collectives whose seq is the FR's numbering "
                 "(seq_source flight_recorder or nccl_seq), joined to fr_entries on (run, rank, pg_name, seq = "
                 "collective_seq_id); FR columns are null where the rank's dump has no such entry (not ingested, or "
                 "fallen out of the ring). When several FR entries share the key (ops of one coalesced group), the last "
                 "op_id is taken. p2p ops are not joined (FR numbers them per group, comms per channel).", (
    _c("fr_matched", BOOL, "an FR entry was found"),
    _c("fr_n_entries", I64, "FR entries with this key (more than 1 for coalesced ops)"),
    _c("fr_record_id", I64, "fr_entries.record_id"),
    _c("fr_profiling_name", STR, "fr_entries.profiling_name"),
    _c("fr_state", STR, "fr_entries.state"),
    _c("fr_time_created_ns", I64, "fr_entries.time_created_ns", "ns"),
    _c("fr_started_ns", I64, "fr_entries.time_discovered_started_ns", "ns"),
    _c("fr_completed_ns", I64, "fr_entries.time_discovered_completed_ns", "ns"),
    _c("fr_duration_ns", I64, "fr_entries.duration_ns", "ns"),
    _c("fr_input_sizes", STR, "fr_entries.input_sizes"),
    _c("fr_frames_json", STR, "fr_entries.frames_json: the Python stack of the call"),
))


#: Derived table (computed when the store is opened; see traceanalyzer/nccl_join.py): which process
#: group each NCCL communicator serves, per (run, rank, source, communicator, profiling window).
NCCL_COMM_MAP = Table("nccl_comm_map", "Derived table: each NCCL communicator seen in a rank's NCCL log, Inspector or "
                      "profiler-plugin output, matched to the process group whose collectives (in comms) it carried, "
                      "with the alignment of its op sequence, a match score and the evidence; or left unjoined with the "
                      "reason. One row per (run, rank, source, nccl_comm, window_id).", (
    _c("run", STR, "run name"),
    _c("rank", I32, "global rank"),
    _c("source", STR, "nccl_log, nccl_inspector or nccl_profiler"),
    _c("nccl_comm", STR, "the communicator as the source names it: comm pointer (log), header.id hash (Inspector), CommHash (plugin)"),
    _c("comm_hash", STR, "the communicator's hash as lowercase hex (log: commId of its Init COMPLETE line; Inspector: header.id; plugin: CommHash), null when unknown: equal hashes are one communicator"),
    _c("nccl_nranks", I32, "ranks of the communicator (null for the plugin)"),
    _c("n_nccl_ops", I64, "collectives of this communicator in the source (the sequence that was aligned)"),
    _c("window_id", I32, "profiling window of the rank (null when the rank has no profiler collectives)"),
    _c("pg_name", STR, "the process group chosen (or, for an unjoined row, the best candidate), null when none"),
    _c("n_pg_ops", I64, "collectives of that group in comms (this rank and window)"),
    _c("status", STR, "joined, ambiguous (several alignments or groups fit equally), below_threshold, contradicted (torch's log names a group the ops do not fit) or no_profiler_collectives"),
    _c("pos_offset", I64, "joined: the group's k-th collective (0-based, in seq order) is the communicator's (k - pos_offset)-th in the source"),
    _c("n_compared", I64, "op pairs the chosen alignment compares (overlap of the two sequences)"),
    _c("n_matched", I64, "pairs with the same op, element count / bytes and group size"),
    _c("score", F64, "n_matched / the shorter sequence's length; must reach min_score (default 0.9)"),
    _c("n_tied", I64, "alignments (offsets) of that group scoring within ambiguity_margin of the best"),
    _c("dur_error", F64, "median |ln(NCCL-side duration / kernel duration)| over matched pairs of the chosen alignment (Inspector, plugin), else null"),
    _c("evidence", STR, "what decided it, ';'-separated: ops_sizes (sequence alignment), durations (tie broken by op durations), torch_log (torch's 'created ncclComm_' line), comm_hash:<source> (alignment taken from the same communicator in another source), pid (the NCCL side's pid equals the trace's)"),
    _c("reason", STR, "one line: why it is joined, or why not"),
), partition=())

#: Derived view: comms with the matched NCCL-side rows (see nccl_join.py / store.py).
COMMS_NCCL = Table("comms_nccl", "Derived view: every column of comms, every row, plus the NCCL log line, Inspector record "
                   "and profiler-plugin COLL event of the same collective where nccl_comm_map joined its communicator "
                   "(matched pairs only: an op the alignment compared but found different is left null). p2p ops are not "
                   "joined.", (
    _c("nccl_log_matched", BOOL, "a NCCL log line was joined"),
    _c("nccl_log_comm", STR, "nccl_log_ops.comm (communicator pointer)"),
    _c("nccl_log_op_count", I64, "nccl_log_ops.op_count (NCCL's opCount)"),
    _c("nccl_log_count", I64, "nccl_log_ops.count (elements)"),
    _c("nccl_log_dtype", STR, "nccl_log_ops.dtype"),
    _c("nccl_log_nranks", I32, "nccl_log_ops.nranks"),
    _c("nccl_log_line_no", I64, "nccl_log_ops.line_no"),
    _c("nccl_log_file", STR, "nccl_log_ops.source_file"),
    _c("inspector_matched", BOOL, "an Inspector coll_perf record was joined"),
    _c("inspector_sn", I64, "nccl_inspector_ops.sn (coll_sn)"),
    _c("inspector_exec_dur_ns", I64, "nccl_inspector_ops.exec_dur_ns", "ns"),
    _c("inspector_algo", STR, "nccl_inspector_ops.algo"),
    _c("inspector_proto", STR, "nccl_inspector_ops.proto"),
    _c("inspector_algobw_gbs", F64, "nccl_inspector_ops.algobw_gbs", "GB/s"),
    _c("inspector_busbw_gbs", F64, "nccl_inspector_ops.busbw_gbs", "GB/s"),
    _c("plugin_matched", BOOL, "a profiler-plugin COLL event was joined"),
    _c("plugin_seq_num", I64, "nccl_profiler_events.seq_num"),
    _c("plugin_dur_ns", I64, "nccl_profiler_events.dur_ns (COLL begin to end)", "ns"),
    _c("plugin_algorithm", STR, "nccl_profiler_events.algorithm"),
    _c("plugin_protocol", STR, "nccl_profiler_events.protocol"),
    _c("plugin_n_channels", I32, "nccl_profiler_events.n_channels"),
))


def empty_table(table: Table) -> pa.Table:
    return table.arrow_schema.empty_table()


def describe() -> str:
    """Markdown description of every table and column (used by ``traceanalyzer schema``)."""
    lines = [f"# traceanalyzer store schema {SCHEMA_VERSION}", "",
             "Every per-rank table also has the Hive partition columns `run` (VARCHAR), `rank` (INTEGER, the global "
             "rank) and `window_id` (INTEGER, the profiling window of that rank; `window` is an SQL keyword).", ""]
    derived = (RUNS, COMMS_FR, NCCL_COMM_MAP, COMMS_NCCL)
    for t in list(TABLES.values()) + list(derived):
        lines += [f"## {t.name}", "", t.doc, ""]
        if t.partition != ("run", "rank", "window_id") and t not in derived:
            lines += [f"Partitioned by {', '.join(f'`{k}`' for k in t.partition)} only (one per process, not per trace file).", ""]
        lines += ["| column | type | unit | meaning |", "|---|---|---|---|"]
        lines += [f"| {c.name} | {c.type} | {c.unit} | {c.doc} |" for c in t.columns]
        lines.append("")
    return "\n".join(lines)


# -- Analysis results -------------------------------------------------------------------------
# What `traceanalyzer analyze` saves in the store (STORE/_results/<name>/<run>.<generation>.parquet)
# and prints with --json. Their columns are declared with the analyses, one record each, in
# traceanalyzer/analyses/registry.py; RESULTS (name -> Table) is that registry's view, filled when
# traceanalyzer.analyses is imported (the schema sits below the analyses and imports nothing of
# them). Bump RESULTS_VERSION when a result column changes.

RESULTS_VERSION = "1.7"   # 1.2: launch_stats clock-offset columns; 1.3: pipeline_slow_stages structural columns;
#                          1.4: serialized_comm, pipeline stalls on collectives and sends;
#                          1.5: imbalance above_thresholds, same_work (is_finding applies the same-work rule);
#                          1.6: stragglers phase_excess_pct, host_wait_excess_pct;
#                          1.7: host_cpu host_wait / host_proc_wait (and peers'); stragglers' host_wait_excess_pct from them

RESULTS: dict[str, Table] = {}
