"""Parse NCCL debug logs (``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL``) into ``nccl_log_ops``.

Each NCCL API call is logged by ``ncclEnqueueCheck`` as (NCCL's ``src/enqueue.cc``; since 2.28 or
so ``src/enqueue/enqueue.cc``)::

    INFO(NCCL_COLL, "%s: opCount %lx sendbuff %p recvbuff %p count %zu datatype %d op %d root %d
                     comm %p [nranks=%d] stream %p", opName, comm->opCount, ...)

older 2.x releases print ``count %zi`` (same fields), and RCCL appends ``task %d globalrank %d``.
``src/debug.cc`` prefixes every INFO line with ``[timestamp] `` (only when INFO is in
``NCCL_DEBUG_TIMESTAMP_LEVELS``; the format is user-set), then ``host:pid:tid [cudaDev] NCCL INFO ``.
The ``[cudaDev]`` is the CUDA device, not the rank. The rank of a log is therefore taken from its
file name (``rank3``), else from RCCL's ``globalrank``, else from the ``Init COMPLETE`` line of
the largest communicator in the log (``comm %p rank %d nranks %d cudaDev %d ... commId 0x%llx -
Init COMPLETE``: for the world communicator that rank is the global rank), else from ``--rank``.

When the file is the job's combined output (torch logging to the same stream), PyTorch's own line
``ProcessGroupNCCL created ncclComm_ 0x... on CUDA device: D`` (``TORCH_CPP_LOG_LEVEL=INFO``; torch's
``NCCLComm::repr()`` prints the ``ncclComm_t`` pointer, the same one NCCL prints as ``comm %p``) is
read too: its log prefix names the process group, ``[PG ID 0 PG GUID 0(default_pg) Rank 0] `` in
torch 2.3+, ``[PG 0 (default_pg) Rank 0] `` before. That is direct evidence of which process group
a communicator serves (``torch_pg_name``, used by :mod:`traceanalyzer.analyses.nccl_join`).

Lines that are not NCCL log lines, and NCCL op lines that do not parse, are skipped and counted
(``garbage_lines``, ``malformed_op_lines``); other NCCL lines (INIT, NET, ...) are ignored, and so
are lines starting with ``#`` (NCCL writes none; they annotate test fixtures).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from ... import schema as S
from ...errors import TraceInputError

#: ncclDataType_t codes (nccl.h): 0..9 since NCCL 2.10 (bfloat16), fp8 codes since 2.19.
DATATYPES = {0: ("int8", 1), 1: ("uint8", 1), 2: ("int32", 4), 3: ("uint32", 4), 4: ("int64", 8),
             5: ("uint64", 8), 6: ("float16", 2), 7: ("float32", 4), 8: ("float64", 8), 9: ("bfloat16", 2),
             10: ("float8e4m3", 1), 11: ("float8e5m2", 1)}
#: ncclRedOp_t codes; values >= 5 are user-created (ncclRedOpCreatePreMulSum) ops.
REDOPS = {0: "sum", 1: "prod", 2: "max", 3: "min", 4: "avg"}
P2P_NCCL_OPS = {"Send", "Recv"}

_PREFIX = re.compile(r"(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] NCCL (?P<level>INFO|WARN|TRACE|CALL) ?(?P<msg>.*)$")
_OP = re.compile(
    r"^(?P<op>[A-Za-z]+): opCount (?P<opcount>[0-9a-fA-F]+) sendbuff (?P<sendbuff>\S+) recvbuff (?P<recvbuff>\S+) "
    r"count (?P<count>-?\d+) datatype (?P<dt>-?\d+) op (?P<redop>-?\d+) root (?P<root>-?\d+) comm (?P<comm>\S+) "
    r"\[nranks=(?P<nranks>\d+)\] stream (?P<stream>\S+)(?: task (?P<task>-?\d+) globalrank (?P<grank>-?\d+))?\s*$")
_OPCOUNT_HINT = re.compile(r"^[A-Za-z]+: opCount ")
_INIT = re.compile(r"comm (?P<comm>0x[0-9a-fA-F]+|\(nil\)) rank (?P<rank>\d+) nranks (?P<nranks>\d+) cudaDev (?P<dev>\d+)"
                   r".*?commId (?P<commid>0x[0-9a-fA-F]+) - Init COMPLETE")
#: torch's "ProcessGroupNCCL created ncclComm_ %p" line, after its "[PG ID i PG GUID name(desc) Rank r] " prefix.
_TORCH_COMM = re.compile(r"\[PG (?:ID \d+ PG GUID )?(?P<pg>[^\s(\]]+) ?(?:\((?P<desc>[^)]*)\))? Rank (?P<grank>\d+)\] "
                         r"ProcessGroupNCCL created ncclComm_ (?P<comm>0x[0-9a-fA-F]+)")
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
#: Names that mark a file as an NCCL debug log in a folder (NCCL_DEBUG_FILE is user-chosen).
NAME_RE = re.compile(r"(\.nccl\.(log|txt)|^nccl[_-]?debug.*\.(log|txt))(\.gz)?$", re.IGNORECASE)


@dataclass
class NcclLog:
    path: str
    rank: int | None
    rank_source: str | None
    table: pa.Table
    counts: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)


def looks_like_nccl_log(head: str) -> bool:
    return " NCCL INFO " in head or " NCCL WARN " in head


def rank_from_name(path: str | Path) -> int | None:
    m = _RANK_IN_NAME.search(Path(path).name)
    return int(m.group(1)) if m else None


def read_nccl_log(path: str | Path, rank: int | None = None) -> NcclLog:
    """Parse one log. ``rank`` (the --rank argument) is used only when the log cannot tell."""
    path = Path(path)
    try:
        from ..kineto.gunzip import read_bounded  # streaming, bounded; refuses FIFOs
        raw = read_bounded(path, "NCCL log")
    except (OSError, EOFError) as exc:
        raise TraceInputError(path, f"cannot read NCCL log ({getattr(exc, 'strerror', None) or exc})") from None
    text = raw.decode("utf-8", errors="replace")
    rows, inits, torch_pgs = [], {}, {}
    garbage = malformed = other = 0
    grank: int | None = None
    seq: dict[tuple, int] = {}
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):  # NCCL never writes '#' lines: annotations, not counted
            continue
        m = _PREFIX.search(line)
        if m is None:
            tc = _TORCH_COMM.search(line)
            if tc:  # torch's own line: which process group the communicator serves
                torch_pgs[tc["comm"].lower()] = (tc["pg"], tc["desc"])
                continue
            garbage += 1
            continue
        msg = m["msg"]
        op = _OP.match(msg)
        if op is None:
            if _OPCOUNT_HINT.match(msg):
                malformed += 1
            else:
                init = _INIT.search(msg)
                if init:
                    inits[(int(m["pid"]), init["comm"])] = (int(init["rank"]), int(init["nranks"]), init["commid"])
                other += 1
            continue
        dt, redop = int(op["dt"]), int(op["redop"])
        name, eb = DATATYPES.get(dt, (None, None))
        count = int(op["count"])
        key = (int(m["pid"]), op["comm"])
        if op["grank"] is not None:
            grank = int(op["grank"])
        prefix = line[:m.start()].strip() or None
        rows.append({"source_file": str(path.resolve()), "line_no": line_no, "log_prefix": prefix, "host": m["host"],
                     "pid": int(m["pid"]), "tid": int(m["tid"]), "cuda_dev": int(m["dev"]), "nccl_op": op["op"],
                     "op": _normalize(op["op"]), "is_p2p": op["op"] in P2P_NCCL_OPS,
                     "op_count": int(op["opcount"], 16), "comm_seq": seq.get(key, 0), "count": count,
                     "datatype": dt, "dtype": name, "elem_bytes": eb, "bytes": count * eb if eb else None,
                     "redop": redop, "redop_name": REDOPS.get(redop, "premulsum" if redop >= 5 else None),
                     "root": int(op["root"]), "sendbuff": op["sendbuff"], "recvbuff": op["recvbuff"],
                     "comm": op["comm"], "nranks": int(op["nranks"]), "stream": op["stream"],
                     "comm_rank": None, "comm_id": None, "torch_pg_name": None, "torch_pg_desc": None, "_key": key})
        seq[key] = seq.get(key, 0) + 1
    if not rows and not other and not malformed:
        raise TraceInputError(path, "not an NCCL debug log (no 'host:pid:tid [dev] NCCL INFO' lines)")
    for r in rows:
        r["torch_pg_name"], r["torch_pg_desc"] = torch_pgs.get(r["comm"].lower(), (None, None))
        if r["_key"] in inits:
            r["comm_rank"], _, r["comm_id"] = inits[r.pop("_key")]
        else:
            r.pop("_key")
    log_rank, source = rank_from_name(path), "file_name"
    if log_rank is None and grank is not None:
        log_rank, source = grank, "log_globalrank"
    if log_rank is None and inits:
        log_rank = max(inits.values(), key=lambda v: v[1])[0]
        source = "log_init_line"
    if log_rank is None and rank is not None:
        log_rank, source = rank, "argument"
    if log_rank is None:
        raise TraceInputError(path, "cannot tell the rank of this NCCL log: name it with the rank (e.g. nccl_debug_rank3.txt), "
                                    "keep NCCL_DEBUG_SUBSYS=INIT,COLL (its 'Init COMPLETE' lines), or pass --rank")
    skipped = {k: v for k, v in (("nccl_log.garbage_lines", garbage), ("nccl_log.malformed_op_lines", malformed)) if v}
    return NcclLog(str(path.resolve()), log_rank, source, pa.Table.from_pylist(rows, schema=S.NCCL_LOG_OPS.arrow_schema),
                   {"nccl_log_ops": len(rows), "other_nccl_lines": other}, skipped)


def _normalize(nccl_op: str) -> str:
    from ..ops import normalize_op
    return normalize_op(nccl_op) or nccl_op.lower()
