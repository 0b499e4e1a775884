"""Normalise the communication of one rank's trace into ``comms`` rows, whatever the dialect.

Dialects (see the ``comms`` table in :mod:`traceanalyzer.schema`):

* **nccl** (2024+): ``c10d::<op>`` > ``record_param_comms`` (args: Collective name, msg nelems,
  dtype, Process Group Name/Description/Ranks, Seq) > ``nccl:<op>`` annotation, which launches the
  ``ncclKernel_*`` / ``ncclDevKernel_*`` kernel (same args on the kernel in newer traces).
* **nccl_legacy** (2022-23): a bare ``record_param_comms`` and the ``nccl:<op>`` annotation with
  ``Input Dims``/``Input type``; no process group.
* **gloo**: ``c10d::<op>`` enqueues on the caller thread; a ``gloo:<op>`` span executes it on one of
  the process group's ``pt_gloo_runloop`` threads (collectives) or on the caller thread (p2p).
  Each group has its own runloop threads, created when the group is created; a group's queue is
  FIFO, so the k-th enqueue of a group runs as the k-th span on that group's threads.
* **symm_mem** / **kernel_only**: non-NCCL communication kernels and communication kernels
  whose CPU side is missing (sampled or cut traces).

The autograd ``Sequence number`` arg is never used: it numbers autograd nodes, not collectives.
"""
from __future__ import annotations

import bisect
import json
from collections import defaultdict, deque
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from .. import schema as S
from .kineto.build import parse_rank_list
from .ops import P2P_OPS, dtype_bytes, normalize_op

#: CPU ops that wait for communication rather than issue it.
_NOT_COMM = {"c10d::wait", "_c10d_functional::wait_tensor", "c10d_functional::wait_tensor",
             "record_param_comms"}
def _numel(dims: Any) -> int | None:
    """Elements in the tensors of an 'Input Dims' entry (a shape, or a list of shapes)."""
    if not isinstance(dims, list):
        return None
    if all(isinstance(d, int) for d in dims):
        n = 1
        for d in dims:
            n *= d
        return n if dims else None
    parts = [_numel(d) for d in dims]
    parts = [p for p in parts if p is not None]
    return sum(parts) if parts else None


def _first_tensor(args: dict) -> tuple[int | None, str | None]:
    """(numel, dtype) of the first tensor argument recorded by record_shapes."""
    dims = args.get("Input Dims") or []
    types = args.get("Input type") or []
    for i, d in enumerate(dims):
        n = _numel(d)
        if n is not None and d != []:
            t = types[i] if i < len(types) else None
            return n, (t if t not in ("TensorList", "", "Scalar", "ScalarList") else None)
    return None, None


#: c10d enqueue ops whose first two tensor arguments are (output, input): sizes come from there.
_OUT_IN_OPS = {"c10d::alltoall_base_", "c10d::_allgather_base_", "c10d::_reduce_scatter_base_", "c10d::allgather_",
               "c10d::reduce_scatter_", "c10d::allgather_into_tensor_coalesced_",
               "c10d::reduce_scatter_tensor_coalesced_", "c10d::alltoall_"}


def _enqueue_io(enqueue: dict | None) -> tuple:
    """(in_nelems, out_nelems, dtype, in_splits, out_splits) from the enqueue op's recorded shapes,
    for ops whose signature starts (output, input); splits (rows per peer, as the caller passed
    them) from ``Concrete Inputs`` of alltoall_base_. Nones when not recorded."""
    if not enqueue or enqueue["name"] not in _OUT_IN_OPS:
        return None, None, None, None, None
    args = enqueue.get("args") or {}
    dims = args.get("Input Dims") or []
    types = args.get("Input type") or []
    if len(dims) < 2:
        return None, None, None, None, None
    out_n, in_n = _numel(dims[0]), _numel(dims[1])
    dtype = next((t for t in types[:2] if t not in ("TensorList", "", "Scalar", "ScalarList", None)), None)
    in_splits = out_splits = None
    concrete = args.get("Concrete Inputs") or []
    if enqueue["name"] == "c10d::alltoall_base_" and len(concrete) > 4:
        out_splits, in_splits = _split(concrete[3]), _split(concrete[4])
    return in_n, out_n, dtype, in_splits, out_splits


def _int(value) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _args(row: dict) -> dict:
    text = row.get("args_json")
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class _Nesting:
    """Containment of CPU comm events on each thread (parent chain by span)."""

    def __init__(self, rows: list[dict]):
        self.parent: dict[int, int | None] = {}
        by_tid: dict[int, list[dict]] = defaultdict(list)
        for r in rows:
            by_tid[r["tid"]].append(r)
        for evs in by_tid.values():
            evs.sort(key=lambda r: (r["ts_ns"], -r["dur_ns"]))
            stack: list[dict] = []
            for r in evs:
                while stack and stack[-1]["ts_ns"] + stack[-1]["dur_ns"] <= r["ts_ns"]:
                    stack.pop()
                # gloo:send may outlive its parent: only a span that ends inside counts as nested
                parent = stack[-1] if stack and r["ts_ns"] + r["dur_ns"] <= stack[-1]["ts_ns"] + stack[-1]["dur_ns"] else None
                self.parent[r["event_id"]] = parent["event_id"] if parent else None
                stack.append(r)

    def ancestors(self, event_id: int) -> list[int]:
        out = []
        p = self.parent.get(event_id)
        while p is not None:
            out.append(p)
            p = self.parent.get(p)
        return out


def build_comms(events: pa.Table, process_groups: pa.Table, threads: pa.Table, info: dict | None,
                rank: int, fr_entries: list | None = None) -> pa.Table:
    """The comms rows of one trace; ``fr_entries`` (Flight Recorder) give gloo collectives their
    process group and sequence id."""
    info = info if isinstance(info, dict) else {}
    cols = ["event_id", "kind", "name", "ts_ns", "dur_ns", "tid", "stream", "correlation", "external_id",
            "step", "args_json", "is_gpu"]
    cpu = events.filter(pc.and_(pc.equal(events["kind"], "comm_op"), pc.invert(events["is_gpu"]))).select(cols).to_pylist()
    kernels = events.filter(pc.equal(events["kind"], "comm_kernel")).select(cols).to_pylist()
    if not cpu and not kernels:
        return S.COMMS.arrow_schema.empty_table()
    launches = events.filter(pc.and_(pc.equal(events["kind"], "runtime"), pc.is_valid(events["correlation"])))
    launches = launches.select(["tid", "ts_ns", "correlation"]).to_pydict()
    ctx = _Context(cpu, kernels, launches, process_groups, threads, info, rank)
    rows = ctx.nccl_rows() + ctx.gloo_and_other_rows() + ctx.orphan_kernel_rows()
    if fr_entries:
        from .flight_recorder import join_fr
        join_fr(rows, fr_entries)
        for r in rows:
            if r["pg_source"] == "flight_recorder":
                ctx.fill_pg(r)
            if r.get("fr_dtype") and r["elem_bytes"] is None and r["in_nelems"] is not None:
                ctx._set_sizes(r, r["in_nelems"], r["out_nelems"], r["fr_dtype"])  # dtype from the FR entry
    _number(rows)
    for r in rows:
        r.pop("fr_seq", None)
        r.pop("fr_dtype", None)
    table = pa.Table.from_pylist(rows, schema=S.COMMS.arrow_schema)
    return table


class _Context:
    def __init__(self, cpu, kernels, launches, process_groups, threads, info, rank):
        self.cpu = sorted(cpu, key=lambda r: (r["ts_ns"], -r["dur_ns"]))
        for r in self.cpu:
            r["args"] = _args(r)
        self.by_id = {r["event_id"]: r for r in self.cpu}
        self.nest = _Nesting(self.cpu)
        self.kernels = kernels
        for k in kernels:
            k["args"] = _args(k)
        self.kernel_by_corr = {k["correlation"]: k for k in kernels if k["correlation"] is not None}
        self.kernel_by_ext: dict[int, list[dict]] = defaultdict(list)
        for k in kernels:
            if k["external_id"] is not None:
                self.kernel_by_ext[k["external_id"]].append(k)
        self.launch_by_tid: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for tid, ts, corr in zip(launches["tid"], launches["ts_ns"], launches["correlation"]):
            if corr in self.kernel_by_corr:
                self.launch_by_tid[tid].append((ts, corr))
        for v in self.launch_by_tid.values():
            v.sort()
        self.claimed_kernels: set[int] = set()
        self.consumed: set[int] = set()
        self.pgs = {r["pg_name"]: r for r in process_groups.to_pylist()}
        self.threads = threads.to_pylist()
        self.info = info
        self.rank = rank

    # -- helpers ---------------------------------------------------------------------------
    def _kernel_for(self, anchors: list[dict]) -> dict | None:
        """The communication kernel launched inside the outermost anchor's span, else one
        carrying an anchor's external id."""
        outer = anchors[-1]
        lo, hi = outer["ts_ns"], outer["ts_ns"] + outer["dur_ns"]
        launches = self.launch_by_tid.get(outer["tid"], [])
        for i in range(bisect.bisect_left(launches, (lo, -1)), len(launches)):
            ts, corr = launches[i]
            if ts > hi:
                break
            k = self.kernel_by_corr[corr]
            if k["event_id"] not in self.claimed_kernels:
                return k
        for a in anchors:
            for k in self.kernel_by_ext.get(a["external_id"], ()):
                if k["event_id"] not in self.claimed_kernels:
                    return k
        return None

    def _pg(self, name) -> dict:
        return self.pgs.get(str(name), {}) if name is not None else {}

    def _base_row(self, dialect: str, op: str | None, enqueue: dict | None, execu: dict | None) -> dict:
        execu = execu or enqueue
        row = {k: None for k in S.COMMS.column_names }
        row.update(dialect=dialect, op=op, is_p2p=op in P2P_OPS, pg_source="none", pg_inferred=False)
        if enqueue is not None:
            row.update(enqueue_event_id=enqueue["event_id"], enqueue_ts_ns=enqueue["ts_ns"],
                       enqueue_dur_ns=enqueue["dur_ns"], enqueue_tid=enqueue["tid"], step=enqueue["step"])
        row.update(exec_event_id=execu["event_id"], exec_name=execu["name"], start_ts_ns=execu["ts_ns"],
                   end_ts_ns=execu["ts_ns"] + execu["dur_ns"], dur_ns=execu["dur_ns"],
                   on_gpu=bool(execu["is_gpu"]), exec_tid=execu["stream"] if execu["is_gpu"] else execu["tid"])
        if row["step"] is None:
            row["step"] = execu["step"]
        return row

    def fill_pg(self, row: dict) -> None:
        """Members and size of the row's group from pg_config (after a Flight Recorder join)."""
        pg = self._pg(row["pg_name"])
        row["pg_ranks"] = pg.get("pg_ranks") or row["pg_ranks"]
        row["group_size"] = pg.get("pg_size") or row["group_size"]

    def _set_pg(self, row: dict, name, source: str, inferred: bool, args: dict | None = None) -> None:
        args = args or {}
        pg = self._pg(name)
        ranks = parse_rank_list(args.get("Process Group Ranks")) or pg.get("pg_ranks")
        row.update(pg_name=str(name) if name is not None else None, pg_source=source, pg_inferred=inferred,
                   pg_desc=args.get("Process Group Description") or pg.get("pg_desc"),
                   pg_ranks=ranks or None,
                   group_size=_int(args.get("Group size")) or pg.get("pg_size") or (len(ranks) if ranks else None))

    def _set_sizes(self, row: dict, in_n, out_n, dtype) -> None:
        eb = dtype_bytes(dtype)
        op, gs = row["op"], row["group_size"]
        if out_n is None and in_n is not None:
            if op in ("all_reduce", "broadcast", "all_to_all", "send", "recv", "send_recv", "reduce"):
                out_n = in_n
            elif op in ("all_gather", "gather") and gs:
                out_n = in_n * gs
            elif op == "reduce_scatter" and gs:
                out_n = in_n // gs
        row.update(dtype=dtype, elem_bytes=eb, in_nelems=in_n, out_nelems=out_n,
                   in_bytes=in_n * eb if (in_n is not None and eb) else None,
                   out_bytes=out_n * eb if (out_n is not None and eb) else None)

    # -- NCCL --------------------------------------------------------------------------------
    def nccl_rows(self) -> list[dict]:
        rows = []
        annotations = [r for r in self.cpu if r["name"].startswith("nccl:")]
        rpcs = [r for r in self.cpu if r["name"] == "record_param_comms"]
        for a in annotations:
            chain = [a] + [self.by_id[p] for p in self.nest.ancestors(a["event_id"])]
            self.consumed.update(r["event_id"] for r in chain)
            rows.append(self._nccl_row(a, chain))
        for r in rpcs:  # record_param_comms with args but no backend annotation (newer torch)
            if r["event_id"] in self.consumed or not r["args"].get("Collective name"):
                continue
            if normalize_op(r["args"]["Collective name"]) in ("wait", "barrier_wait"):
                continue
            chain = [r] + [self.by_id[p] for p in self.nest.ancestors(r["event_id"])]
            self.consumed.update(x["event_id"] for x in chain)
            rows.append(self._nccl_row(r, chain))
        return rows

    def _nccl_row(self, anchor: dict, chain: list[dict]) -> dict:
        rpc = next((c for c in chain if c["name"] == "record_param_comms"), None)
        enqueue = next((c for c in reversed(chain) if c["name"] != "record_param_comms" and not c["name"].startswith("nccl:")), None)
        enqueue = enqueue or rpc or anchor
        kernel = self._kernel_for(chain)
        if kernel is not None:
            self.claimed_kernels.add(kernel["event_id"])
        args = dict((kernel or {}).get("args") or {})
        args.update({k: v for k, v in (rpc or {}).get("args", {}).items() if v not in (None, "")})
        coll = args.get("Collective name")
        op = normalize_op(coll) or normalize_op(anchor["name"]) or normalize_op(enqueue["name"])
        dialect = "nccl" if coll else "nccl_legacy"
        row = self._base_row(dialect, op, enqueue, kernel or anchor)
        pg_name = args.get("Process Group Name", args.get("Process Group ID"))
        if pg_name is not None:
            self._set_pg(row, pg_name, "op_args" if rpc and "Process Group Name" in rpc["args"] else "kernel_args", False, args)
        else:
            row["group_size"] = _int(args.get("Group size"))
        seq = _int(args.get("Seq", args.get("seq")))
        if seq is not None:
            row.update(nccl_seq=seq)
        in_n, out_n = _int(args.get("In msg nelems")), _int(args.get("Out msg nelems"))
        dtype = args.get("dtype")
        io_in, io_out, io_dtype, io_in_splits, io_out_splits = _enqueue_io(enqueue)
        if in_n is None:
            in_n, dtype2 = _first_tensor(anchor["args"])
            in_n = io_in if io_in is not None else in_n
            out_n = io_out if out_n is None else out_n
            dtype = dtype or dtype2 or io_dtype
        row.update(in_split_sizes=_split(args.get("In split size")) or io_in_splits,
                   out_split_sizes=_split(args.get("Out split size")) or io_out_splits)
        self._set_sizes(row, in_n, out_n, dtype)
        if row["is_p2p"]:
            self._set_peer(row, enqueue)
        return row

    # -- gloo and others -----------------------------------------------------------------------
    def _runloop_pg(self) -> dict[int, str]:
        """Runloop thread -> process group, inferred from creation order: each gloo group
        creates its runloop threads when it is created, so sorted thread ids fall into
        consecutive blocks, one per group in pg_config order."""
        tids = sorted(({t["tid"] for t in self.threads if "gloo_runloop" in (t["name"] or "")}
                       | self._runloop_tids) - {None})     # an event without a tid names no thread
        groups = [name for name, pg in sorted(self.pgs.items(), key=lambda kv: _pg_order(kv[0]))
                  if "gloo" in (pg.get("backend_config") or self.info.get("backend") or "")
                  and self.rank in (pg.get("pg_ranks") or [self.rank])]
        if not tids or not groups or len(tids) < len(groups):
            return {}
        if len(tids) % len(groups) == 0:
            per = len(tids) // len(groups)
            return {tid: groups[i // per] for i, tid in enumerate(tids)}
        return dict(zip(tids, _split_at_gaps(tids, groups)))

    def gloo_and_other_rows(self) -> list[dict]:
        rows = []
        spans = [r for r in self.cpu if r["name"].startswith("gloo:")]
        span_ids = {s["event_id"] for s in spans}
        caller_tids = {r["tid"] for r in self.cpu if not r["name"].startswith("gloo:")}
        anchors = [r for r in self.cpu if r["event_id"] not in self.consumed and r["event_id"] not in span_ids
                   and r["name"] not in _NOT_COMM
                   and not any(p not in span_ids and self.by_id[p]["name"] not in _NOT_COMM
                               for p in self.nest.ancestors(r["event_id"]))]
        self._runloop_tids = {s["tid"] for s in spans if s["tid"] not in caller_tids}
        runloop_pg = self._runloop_pg()
        queues: dict[Any, deque] = defaultdict(deque)
        claimed: set[int] = set()
        for s in spans:
            if s["tid"] not in caller_tids and normalize_op(s["name"]) not in P2P_OPS:
                queues[runloop_pg.get(s["tid"])].append(s)
        for a in anchors:
            op = normalize_op(a["name"])
            if a["name"].startswith("symm_mem::"):
                kernel = self._kernel_for([a])
                if kernel is not None:
                    self.claimed_kernels.add(kernel["event_id"])
                row = self._base_row("symm_mem", op, a, kernel)
                n, dtype = _first_tensor(a["args"])
                self._set_sizes(row, n, None, dtype)
                rows.append(row)
                continue
            if op in P2P_OPS:
                span = next((s for s in spans if s["tid"] == a["tid"] and s["event_id"] not in claimed
                             and normalize_op(s["name"]) in P2P_OPS
                             and a["ts_ns"] <= s["ts_ns"] <= a["ts_ns"] + a["dur_ns"]), None)
                pg_name, source = "0" if "0" in self.pgs else None, "default_pg"
            else:
                span = _pop_fifo(queues, a)
                pg_name, source = (runloop_pg.get(span["tid"]), "runloop_thread") if span else (None, "none")
            if span is not None:
                claimed.add(span["event_id"])
            row = self._base_row("gloo" if span is not None or self.info.get("backend") == "gloo" else "other", op, a, span)
            if pg_name is not None:
                self._set_pg(row, pg_name, source, True)
            n, dtype = _first_tensor(span["args"]) if span else (None, None)
            if n is None:
                n, dtype = _first_tensor(a["args"])
            in_n, out_n, io_dtype, in_splits, out_splits = _enqueue_io(a)
            row.update(in_split_sizes=in_splits, out_split_sizes=out_splits)
            self._set_sizes(row, in_n if in_n is not None else n, out_n, dtype or io_dtype)
            if row["is_p2p"]:
                self._set_peer(row, a)
            rows.append(row)
        for s in spans:  # execution whose enqueue lies outside the trace window
            if s["event_id"] not in claimed:
                row = self._base_row("gloo", normalize_op(s["name"]), None, s)
                if runloop_pg.get(s["tid"]) is not None:
                    self._set_pg(row, runloop_pg[s["tid"]], "runloop_thread", True)
                n, dtype = _first_tensor(s["args"])
                self._set_sizes(row, n, None, dtype)
                rows.append(row)
        return rows

    def _set_peer(self, row: dict, enqueue: dict) -> None:
        """p2p peer and tag from the enqueue op's Concrete Inputs (group ranks -> global ranks)."""
        concrete = enqueue.get("args", {}).get("Concrete Inputs") or []
        peer = _int(concrete[2]) if len(concrete) > 3 else None
        tag = _int(concrete[3]) if len(concrete) > 3 else (_int(concrete[2]) if len(concrete) == 3 else None)
        ranks = row["pg_ranks"]
        if peer is not None and ranks and 0 <= peer < len(ranks):
            peer = ranks[peer]
        row.update(peer_rank=peer, tag=tag)
        if row["op"] == "send":
            row.update(src_rank=self.rank, dst_rank=peer)
        elif row["op"] == "recv":
            row.update(src_rank=peer, dst_rank=self.rank)

    def orphan_kernel_rows(self) -> list[dict]:
        rows = []
        for k in self.kernels:
            if k["event_id"] in self.claimed_kernels:
                continue
            op = normalize_op(k["name"])
            row = self._base_row("kernel_only" if "nccl" in k["name"].lower() else "symm_mem", op, None, k)
            args = k["args"]
            pg_name = args.get("Process Group Name")
            if pg_name is not None:
                self._set_pg(row, pg_name, "kernel_args", False, args)
            self._set_sizes(row, _int(args.get("In msg nelems")), _int(args.get("Out msg nelems")), args.get("dtype"))
            rows.append(row)
        return rows


#: How far into a group's queue a gloo enqueue may look for its execution span: the group's runloop
#: threads can record the starts of consecutive works slightly out of order.
_FIFO_LOOKAHEAD = 4


#: gloo runs these enqueued ops as a span of another collective (op -> the span's op).
_GLOO_EXEC_AS = {"reduce_scatter": "all_reduce"}


def _pop_fifo(queues: dict[Any, deque], enqueue: dict) -> dict | None:
    """The execution span of a gloo collective: one of the first spans of a group's queue,
    preferring one of the enqueued op (a barrier's dummy 1-element tensor must not pick the
    1-element size broadcast of a following ``broadcast_object_list``), then one with the
    enqueued tensor's size, then the earliest. Spans that started before this enqueue belong to
    enqueues outside the window and are dropped."""
    want = _enqueue_io(enqueue)[0]  # the input tensor: what the gloo span records
    if want is None:
        want = _first_tensor(enqueue["args"])[0]
    op = normalize_op(enqueue["name"])
    ops = {op, _GLOO_EXEC_AS.get(op)}
    best, best_key = None, None
    for key, q in queues.items():
        while q and q[0]["ts_ns"] < enqueue["ts_ns"]:
            q.popleft()
        for pos in range(min(_FIFO_LOOKAHEAD, len(q))):
            span = q[pos]
            same_op = normalize_op(span["name"]) in ops
            match = want is not None and _first_tensor(span["args"])[0] == want
            rank_key = (not same_op, not match, span["ts_ns"], pos)
            if best is None or rank_key < best_key:
                best, best_key = (key, pos), rank_key
    if best is None:
        return None
    key, pos = best
    span = queues[key][pos]
    del queues[key][pos]
    return span


def _split_at_gaps(tids: list[int], groups: list[str]) -> list[str]:
    """The group of each sorted runloop thread id when the groups' blocks are uneven (a thread
    that ran nothing in the window is missing): a group's threads are created together, so the
    blocks are cut at the len(groups) - 1 widest gaps between consecutive ids."""
    gaps = sorted(range(1, len(tids)), key=lambda i: (-(tids[i] - tids[i - 1]), i))[:len(groups) - 1]
    out, g = [], 0
    cuts = set(gaps)
    for i in range(len(tids)):
        if i in cuts:
            g += 1
        out.append(groups[g])
    return out


def _pg_order(name: str):
    return (0, int(name)) if str(name).isdigit() else (1, str(name))


def _split(value) -> str | None:
    if value in (None, "", "[]"):
        return None
    return value if isinstance(value, str) else json.dumps(value)


def _number(rows: list[dict]) -> None:
    """comm_id in start order; seq per process group over collectives; p2p_seq per channel."""
    rows.sort(key=lambda r: (r["enqueue_ts_ns"] if r["enqueue_ts_ns"] is not None else r["start_ts_ns"], r["start_ts_ns"]))
    seq: dict[Any, int] = defaultdict(int)
    p2p: dict[Any, int] = defaultdict(int)
    for i, r in enumerate(rows):
        r["comm_id"] = i
        if r["is_p2p"]:
            key = (r["pg_name"], r["src_rank"], r["dst_rank"], r["tag"])
            r["p2p_seq"] = p2p[key]
            p2p[key] += 1
        else:
            r["seq"] = seq[r["pg_name"]]
            r["seq_source"] = "order"
            seq[r["pg_name"]] += 1
            if r["nccl_seq"] is not None:
                r["seq"], r["seq_source"] = r["nccl_seq"], "nccl_seq"
            elif r.get("fr_seq") is not None:
                r["seq"], r["seq_source"] = r["fr_seq"], "flight_recorder"
