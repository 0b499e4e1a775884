"""Join the NCCL side (debug logs, Inspector, profiler plugin) to the profiler's collectives.

NCCL numbers ops per *communicator* (opCount, coll_sn, SeqNum); ``comms`` numbers them per
*process group* (``pg_name``, ``seq``). None of the NCCL files says which process group a
communicator serves, and a profiling window starts somewhere in the middle of the job, so the
position of the window in the communicator's sequence is unknown too. Both are found here, per
(run, rank), by matching sequences:

1. For each communicator of each source, its collectives in order (log: line order; Inspector:
   ``sn``; plugin: COLL begin time) as (op, elements or bytes, nranks). For each process group and
   profiling window of the same rank, its collectives in ``seq`` order, sized as NCCL counts them
   (AllGather: the send count, ReduceScatter: the receive count, others: the buffer). Only the ops
   NCCL runs as collectives are compared (all_reduce, all_gather, reduce_scatter, broadcast,
   reduce); all_to_all and p2p are Send/Recv in NCCL and are left out on both sides.
2. Every shift (offset) of one sequence against the other is scored: pairs with the same op, size
   and group size, divided by the shorter sequence's length. The best offset must reach
   ``min_score`` over at least ``min_ops`` pairs (or the whole shorter sequence).
3. Training repeats itself: a window of steps 4-6 fits a log of steps 0-6 equally at every step.
   When several offsets score within ``ambiguity_margin`` of the best, durations break the tie
   where the source has them (Inspector exec time, plugin COLL duration vs the kernel's): the
   runner-up offset's median |ln ratio| must be ``dur_tiebreak_ratio`` times the best's (errors
   under ``dur_error_floor`` count as that floor: timing noise).
   Otherwise the communicator stays unjoined (``ambiguous``), with the offsets in the reason.
4. Direct evidence: torch's ``ProcessGroupNCCL created ncclComm_ 0x...`` line in the log names the
   group (only that group is tried; ``contradicted`` if its ops do not fit). A log communicator whose
   commId hash equals an Inspector communicator's is the same communicator: if the log alone is
   ambiguous and the Inspector's is joined, the Inspector's ``sn`` anchors the log (log collective
   i = the record with sn i + b; b in {0, 1}, the one base whose ops agree, else nothing).
5. Two communicators of one source that both fit one group and window are both left ambiguous,
   unless only one was written by the trace's process (its pid): that one is kept.

The result is ``nccl_comm_map`` (schema.NCCL_COMM_MAP) and the ``comms_nccl`` view (schema.COMMS_NCCL),
built by :func:`register` when a store is opened. Verified only on fixtures written from NCCL's
documented formats (no GPU here).
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import pandas as pd
import pyarrow as pa

from .. import schema as S
from .params import default

#: ops NCCL runs as collectives; the profiler's barrier is an NCCL AllReduce of one element
NCCL_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")


@dataclass(frozen=True)
class JoinParams:
    """The join's thresholds: field ``x`` is setting ``nccl_join_x`` (:data:`.params.SETTINGS`,
    which documents each), defaults from there."""
    min_score: float = default("nccl_join_min_score")
    min_ops: int = default("nccl_join_min_ops")
    ambiguity_margin: float = default("nccl_join_ambiguity_margin")
    dur_tiebreak_ratio: float = default("nccl_join_dur_tiebreak_ratio")
    dur_error_floor: float = default("nccl_join_dur_error_floor")


# -- the two sides as sequences -------------------------------------------------------------------

_NCCL_SQL = {
    "nccl_log": """
        SELECT run, rank, pid || ':' || comm AS nccl_comm, comm_id AS comm_hash, pid, op, count AS nelems, bytes,
               nranks, NULL::BIGINT AS dur_ns, torch_pg_name,
               source_file, line_no, op_count, count, dtype, NULL::BIGINT AS sn, comm
        FROM nccl_log_ops WHERE NOT is_p2p AND op IN {ops} ORDER BY run, rank, nccl_comm, line_no""",
    "nccl_inspector": """
        SELECT run, rank, comm_id AS nccl_comm, comm_id AS comm_hash, pid, op, NULL::BIGINT AS nelems,
               msg_size_bytes AS bytes, comm_nranks AS nranks, exec_dur_ns AS dur_ns, NULL AS torch_pg_name,
               sn, exec_dur_ns, algo, proto, algobw_gbs, busbw_gbs
        FROM nccl_inspector_ops WHERE kind = 'coll' AND op IN {ops} ORDER BY run, rank, nccl_comm, sn, dump_ts_ns""",
    "nccl_profiler": """
        SELECT run, rank, comm_hash AS nccl_comm, comm_hash, pid, op, count AS nelems, NULL::BIGINT AS bytes,
               NULL::INTEGER AS nranks, dur_ns, NULL AS torch_pg_name,
               seq_num, dur_ns AS plugin_dur, algorithm, protocol, n_channels
        FROM nccl_profiler_events WHERE cat = 'COLL' AND op IN {ops} ORDER BY run, rank, nccl_comm, start_rel_ns""",
}

#: every Flight Recorder collective of each (run, rank, group) with the NCCL-side op it is, in
#: sequence order (profiling names are "nccl:all_reduce", "nccl:_allgather_base", ...)
_FR_SQL = """
    SELECT run, rank, pg_name, collective_seq_id AS seq,
           regexp_replace(lower(profiling_name), '^[a-z0-9]+:', '') AS fr_op
    FROM fr_entries WHERE NOT is_p2p AND collective_seq_id IS NOT NULL
      AND (run, rank) IN (SELECT DISTINCT run, rank FROM _nccl_ranks)
    QUALIFY row_number() OVER (PARTITION BY run, rank, pg_name, collective_seq_id ORDER BY record_id DESC) = 1
    ORDER BY run, rank, pg_name, seq"""

#: FR profiling names (after "backend:") of the ops NCCL runs as one collective each
_FR_NCCL_COLLECTIVE = ("all_reduce", "allreduce", "allreduce_coalesced", "all_gather", "allgather", "_allgather_base",
                       "all_gather_into_tensor", "allgather_into_tensor_coalesced", "reduce_scatter",
                       "_reduce_scatter_base", "reduce_scatter_tensor", "broadcast", "reduce", "barrier",
                       "all_reduce_barrier")

_PROFILER_SQL = """
    SELECT run, rank, window_id, pg_name, comm_id, seq, seq_source,
           CASE WHEN op = 'barrier' THEN 'all_reduce' ELSE op END AS op,
           CASE WHEN op = 'barrier' THEN 1 WHEN op = 'reduce_scatter' THEN out_nelems ELSE in_nelems END AS nelems,
           CASE WHEN op = 'barrier' THEN NULL WHEN op = 'reduce_scatter' THEN out_bytes ELSE in_bytes END AS bytes,
           group_size AS nranks, dur_ns
    FROM comms WHERE NOT is_p2p AND op IN {ops_barrier} AND (run, rank) IN (SELECT DISTINCT run, rank FROM _nccl_ranks)
    ORDER BY run, rank, window_id, pg_name NULLS LAST, seq, start_ts_ns"""


def _hash(value) -> str | None:
    """A communicator hash as lowercase hex, whether written 0x... (log, Inspector) or in decimal (plugin)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    try:
        return hex(int(str(value), 0))
    except ValueError:
        return str(value).lower()


def _same(a: dict, b: dict) -> bool:
    """One NCCL op and one profiler collective agree: op, then every size and group size both sides know."""
    if a["op"] != b["op"]:
        return False
    for k in ("nelems", "bytes", "nranks"):
        x, y = a.get(k), b.get(k)
        if x is not None and y is not None and not pd.isna(x) and not pd.isna(y) and int(x) != int(y):
            return False
    return not all(pd.isna(a.get(k)) or pd.isna(b.get(k)) for k in ("nelems", "bytes"))


@dataclass
class _Fit:
    offset: int | None  # profiler position = NCCL position + offset
    n_compared: int
    n_matched: int
    score: float
    tied: list[int]
    dur_error: float | None
    by_durations: bool
    by_anchor: bool = False  # the tie was broken by an offset known from elsewhere (the Flight Recorder)


def _align(nccl: list[dict], prof: list[dict], p: JoinParams, anchor: int | None = None) -> _Fit:
    """The best offset of ``prof`` against ``nccl``; repeating ops tie several offsets: durations
    break the tie where the source has them, else ``anchor`` (an offset known independently) if it
    is one of the tied offsets."""
    n, m = len(nccl), len(prof)
    by_op = defaultdict(list)
    for j, b in enumerate(prof):
        by_op[b["op"]].append(j)
    matched: dict[int, int] = defaultdict(int)
    for i, a in enumerate(nccl):
        for j in by_op.get(a["op"], ()):
            if _same(a, prof[j]):
                matched[j - i] += 1
    overlap = {d: min(n, m - d) - max(0, -d) for d in matched}
    need = min(p.min_ops, n, m)  # a sequence shorter than min_ops must match whole
    scores = {d: matched[d] / min(n, m) for d in matched if overlap[d] >= need}
    if not scores:
        return _Fit(None, 0, 0, 0.0, [], None, False)
    best = max(scores.values())
    tied = sorted((d for d, s in scores.items() if s >= best - p.ambiguity_margin), key=lambda d: (-scores[d], d))
    errors = {d: _dur_error(nccl, prof, d) for d in tied}
    chosen, by_dur, by_anchor = tied[0], False, False
    if len(tied) > 1:
        ranked = sorted(tied, key=lambda d: (math.inf if errors[d] is None else errors[d]))
        e1, e2 = errors[ranked[0]], errors[ranked[1]]
        if e1 is not None and e2 is not None and e2 >= p.dur_tiebreak_ratio * max(e1, p.dur_error_floor):
            chosen, by_dur = ranked[0], True
        elif anchor in tied:
            chosen, by_anchor = anchor, True
    return _Fit(chosen, overlap[chosen], matched[chosen], scores[chosen], tied, errors[chosen], by_dur, by_anchor)


def _dur_error(nccl, prof, d) -> float | None:
    errs = sorted(abs(math.log(a["dur_ns"] / prof[i + d]["dur_ns"])) for i, a in enumerate(nccl)
                  if 0 <= i + d < len(prof) and _same(a, prof[i + d])
                  and not pd.isna(a.get("dur_ns")) and a["dur_ns"] > 0 and not pd.isna(prof[i + d]["dur_ns"]) and prof[i + d]["dur_ns"] > 0)
    return errs[len(errs) // 2] if errs else None


# -- the mapping --------------------------------------------------------------------------------

def compute(con, params: JoinParams = JoinParams()) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    """(nccl_comm_map rows, {source: matched pairs}) for every (run, rank) with NCCL-side rows."""
    ops = "(" + ", ".join(f"'{o}'" for o in NCCL_COLLECTIVES) + ")"
    log_cols = {r[0] for r in con.execute("DESCRIBE nccl_log_ops").fetchall()}
    sqls = dict(_NCCL_SQL)
    if "torch_pg_name" not in log_cols:  # a store written before schema 1.2
        sqls["nccl_log"] = sqls["nccl_log"].replace(", torch_pg_name,", ", NULL::VARCHAR AS torch_pg_name,")
    nccl = {src: con.execute(sql.format(ops=ops)).df() for src, sql in sqls.items()}
    ranks = pd.concat([d[["run", "rank"]] for d in nccl.values()]).drop_duplicates()
    con.register("_nccl_ranks", ranks)
    prof = con.execute(_PROFILER_SQL.format(ops_barrier=ops[:-1] + ", 'barrier')")).df()
    fr = con.execute(_FR_SQL).df()
    con.unregister("_nccl_ranks")
    fr_pos = _fr_positions(fr)
    pids = {(r, k): set(v) for r, k, v in con.execute("SELECT run, rank, list(DISTINCT pid) FROM ranks GROUP BY ALL").fetchall()}
    groups = {key: g.to_dict("records") for key, g in prof.groupby(["run", "rank"], sort=False)}
    rows, seqs = [], {}
    for src, df in nccl.items():
        for (run, rank, comm), g in df.groupby(["run", "rank", "nccl_comm"], sort=True):
            ops_ = g.to_dict("records")
            seqs[(src, run, rank, comm)] = ops_
            rows += _map_comm(src, run, int(rank), comm, ops_, groups.get((run, rank), []), pids.get((run, rank), set()),
                              params, fr_pos if src == "nccl_log" else {})
    rows = _conflicts(rows)
    rows = _transfer(rows, seqs, groups, params)
    links = _links(rows, seqs, groups)
    return pd.DataFrame(rows, columns=[c.name for c in S.NCCL_COMM_MAP.columns]), links


def _fr_positions(fr: pd.DataFrame) -> dict:
    """(run, rank, pg) -> {seq: position among the group's NCCL collectives since the group began},
    only where the Flight Recorder holds the group's whole history (sequence ids 1, 2, ... without
    a gap: the ring has not wrapped). A debug log starts at the communicator's creation, so its
    i-th collective line is the group's collective at position i."""
    out = {}
    for (run, rank, pg), g in fr.groupby(["run", "rank", "pg_name"], sort=False):
        seqs = g["seq"].to_numpy()
        if len(seqs) == 0 or seqs[0] != 1 or (seqs[1:] - seqs[:-1] != 1).any():
            continue
        is_coll = g["fr_op"].isin(_FR_NCCL_COLLECTIVE).to_numpy()
        pos = is_coll.cumsum() - 1
        out[(run, int(rank), str(pg))] = {int(q): int(i) for q, i, c in zip(seqs, pos, is_coll) if c}
    return out


def _fr_offset(rows_: list[dict], fr_pos: dict, run, rank, pg) -> int | None:
    """The one alignment the Flight Recorder implies for these profiler rows (position j = NCCL
    position + offset), when their sequence ids are the group's own (FR- or NCCL-numbered)."""
    pos = fr_pos.get((run, rank, str(pg)))
    if not pos:
        return None
    offs = {j - pos[int(r["seq"])] for j, r in enumerate(rows_)
            if r.get("seq_source") in ("flight_recorder", "nccl_seq") and not pd.isna(r["seq"]) and int(r["seq"]) in pos}
    return offs.pop() if len(offs) == 1 else None


def _map_comm(src, run, rank, comm, ops_, prof_rows, pids, p: JoinParams, fr_pos: dict | None = None) -> list[dict]:
    first = ops_[0]
    base = {"run": run, "rank": rank, "source": src, "nccl_comm": comm.split(":", 1)[-1] if src == "nccl_log" else comm,
            "comm_hash": _hash(first["comm_hash"]), "nccl_nranks": None if pd.isna(first["nranks"]) else int(first["nranks"]),
            "n_nccl_ops": len(ops_), "_key": comm}
    pid_ok = "pid" if pids and not pd.isna(first["pid"]) and int(first["pid"]) in pids else None
    torch_pg = first.get("torch_pg_name") if not pd.isna(first.get("torch_pg_name")) else None
    if not prof_rows:
        return [{**base, "status": "no_profiler_collectives",
                 "reason": f"rank {rank} of run '{run}' has no profiler collectives to join (no trace ingested, or none in its windows)"}]
    out = []
    by_window = defaultdict(lambda: defaultdict(list))
    for r in prof_rows:
        by_window[r["window_id"]][r["pg_name"]].append(r)
    for window, pgs in sorted(by_window.items()):
        cands = {pg: rows_ for pg, rows_ in pgs.items() if torch_pg is None or pg == torch_pg}
        row = {**base, "window_id": int(window)}
        if not cands:
            out.append({**row, "status": "no_profiler_collectives", "pg_name": torch_pg, "evidence": "torch_log",
                        "reason": f"torch's log names process group {torch_pg} for communicator {base['nccl_comm']}, "
                                  f"which has no collectives in window {window}"})
            continue
        fits = {pg: _align(ops_, rows_, p, _fr_offset(rows_, fr_pos or {}, run, rank, pg)) for pg, rows_ in cands.items()}
        ranked = sorted(fits, key=lambda pg: -fits[pg].score)
        pg = ranked[0]
        f = fits[pg]
        if f.offset is None:  # no group fits at all: name none
            out.append({**row, "status": "contradicted" if torch_pg else "below_threshold", "pg_name": torch_pg,
                        "n_tied": 0, "evidence": "torch_log" if torch_pg else None,
                        "reason": f"no offset against {'process group ' + str(torch_pg) if torch_pg else 'any process group'} "
                                  f"of window {window} makes {min(p.min_ops, len(ops_))} or more of its {len(ops_)} ops agree"})
            continue
        evidence = ["ops_sizes"] + (["durations"] if f.by_durations else []) + (["flight_recorder"] if f.by_anchor else []) + (["torch_log"] if torch_pg else []) + ([pid_ok] if pid_ok else [])
        row.update(pg_name=pg, n_pg_ops=len(cands[pg]), pos_offset=f.offset, n_compared=f.n_compared, n_matched=f.n_matched,
                   score=round(f.score, 4), n_tied=len(f.tied), dur_error=f.dur_error, evidence=";".join(evidence))
        what = f"{f.n_matched} of {min(len(ops_), len(cands[pg]))} ops agree (op, size, group size) at offset {f.offset}"
        others = [q for q in ranked[1:] if fits[q].score >= p.min_score and fits[q].score >= f.score - p.ambiguity_margin]
        if f.score < p.min_score:
            status = "contradicted" if torch_pg else "below_threshold"
            why = (f"torch's log names process group {torch_pg}, but only " if torch_pg else f"best: process group {pg}, ") + \
                  f"{what}: score {f.score:.2f} < min_score {p.min_score}"
        elif others:
            status, why = "ambiguous", f"process groups {', '.join(map(str, [pg] + others))} fit equally well ({what})"
        elif len(f.tied) > 1 and not f.by_durations and not f.by_anchor:
            status = "ambiguous"
            why = (f"{len(f.tied)} alignments fit process group {pg} equally (offsets {', '.join(map(str, sorted(f.tied)[:6]))}"
                   f"{', ...' if len(f.tied) > 6 else ''}): the ops repeat; " +
                   ("durations do not tell them apart" if f.dur_error is not None else "the source has no durations to tell them apart"))
        else:
            status = "joined"
            why = what + (f"; {len(f.tied)} repeating alignments told apart by durations (median error {f.dur_error:.3f})"
                          if f.by_durations else "") + \
                (f"; {len(f.tied)} repeating alignments told apart by the Flight Recorder's sequence ids "
                 "(the log starts when the communicator is created)" if f.by_anchor else "")
        out.append({**row, "status": status, "reason": why})
    return out


def _conflicts(rows: list[dict]) -> list[dict]:
    """Two communicators of one source joined to the same (run, rank, window, group): neither is kept,
    unless it is the only one whose pid is the trace's."""
    claims = defaultdict(list)
    for r in rows:
        if r["status"] == "joined":
            claims[(r["source"], r["run"], r["rank"], r["window_id"], r["pg_name"])].append(r)
    for (_, _, _, _, pg), rs in claims.items():
        if len(rs) > 1:
            names = ", ".join(r["nccl_comm"] for r in rs)
            same_pid = [r for r in rs if "pid" in r["evidence"].split(";")]
            for r in rs:
                if len(same_pid) == 1 and r is same_pid[0]:  # the only one written by the trace's process
                    r["reason"] += f"; of communicators {names}, which all fit, the only one with the trace's pid"
                else:
                    r.update(status="ambiguous", reason=f"communicators {names} all fit process group {pg}" +
                             (f"; {same_pid[0]['nccl_comm']} has the trace's pid" if len(same_pid) == 1 else ""))
    return rows


def _transfer(rows, seqs, groups, p: JoinParams) -> list[dict]:
    """An ambiguous log communicator takes its alignment from the Inspector record of the same commId."""
    joined = {(r["run"], r["rank"], r.get("window_id"), r["comm_hash"]): r for r in rows
              if r["source"] == "nccl_inspector" and r["status"] == "joined" and r["comm_hash"]}
    for r in rows:
        other = joined.get((r["run"], r["rank"], r.get("window_id"), r["comm_hash"]))
        if r["source"] != "nccl_log" or r["status"] != "ambiguous" or other is None or other["pg_name"] != r["pg_name"]:
            continue
        log_ops = seqs[("nccl_log", r["run"], r["rank"], r["_key"])]
        insp = seqs[("nccl_inspector", r["run"], r["rank"], other["_key"])]
        sn_pos = {int(o["sn"]): k for k, o in enumerate(insp)}
        fits = {}
        for b in (0, 1):  # does coll_sn start at 0 or 1? the one base whose ops agree
            pairs = [(a, insp[sn_pos[i + b]]) for i, a in enumerate(log_ops) if i + b in sn_pos]
            if len(pairs) >= p.min_ops and sum(_same(a, c) for a, c in pairs) / len(pairs) >= p.min_score:
                fits[b] = pairs
        if len(fits) != 1:
            continue
        b = next(iter(fits))
        i0 = next(i for i in range(len(log_ops)) if i + b in sn_pos)  # log i -> Inspector position -> profiler position
        offset = sn_pos[i0 + b] - i0 + int(other["pos_offset"])
        prof = [x for x in groups[(r["run"], r["rank"])] if x["window_id"] == r["window_id"] and x["pg_name"] == r["pg_name"]]
        n_cmp = sum(1 for i in range(len(log_ops)) if 0 <= i + offset < len(prof))
        n_ok = sum(1 for i, a in enumerate(log_ops) if 0 <= i + offset < len(prof) and _same(a, prof[i + offset]))
        score = n_ok / min(len(log_ops), len(prof))
        if score < p.min_score:
            continue
        r.update(status="joined", pos_offset=offset, n_compared=n_cmp, n_matched=n_ok, score=round(score, 4),
                 evidence=r["evidence"] + ";comm_hash:nccl_inspector",
                 reason=f"{n_ok} of {min(len(log_ops), len(prof))} ops agree at offset {offset}, taken from the Inspector "
                        f"records of the same communicator (commId {r['comm_hash']}; log collective i = coll_sn i+{b}); "
                        f"the log alone fit {r['n_tied']} repeating alignments")
    return rows


def _links(rows: list[dict], seqs, groups) -> dict[str, pd.DataFrame]:
    """Matched (profiler collective, NCCL op) pairs of every joined communicator, per source."""
    out = {src: [] for src in _NCCL_SQL}
    for r in (r for r in rows if r["status"] == "joined"):
        ops_ = seqs[(r["source"], r["run"], r["rank"], r["_key"])]
        prof = [x for x in groups[(r["run"], r["rank"])] if x["window_id"] == r["window_id"] and x["pg_name"] == r["pg_name"]]
        for i, a in enumerate(ops_):
            j = i + int(r["pos_offset"])
            if 0 <= j < len(prof) and _same(a, prof[j]):
                out[r["source"]].append({"run": r["run"], "rank": r["rank"], "window_id": r["window_id"],
                                         "comm_id": prof[j]["comm_id"], **a})
    return {src: pd.DataFrame(v) for src, v in out.items()}


# -- the store's table and view ---------------------------------------------------------------------

_LINK_COLS = {  # comms_nccl column <- column of the source's sequence rows
    "nccl_log": {"nccl_log_comm": "comm", "nccl_log_op_count": "op_count", "nccl_log_count": "count",
                 "nccl_log_dtype": "dtype", "nccl_log_nranks": "nranks", "nccl_log_line_no": "line_no",
                 "nccl_log_file": "source_file"},
    "nccl_inspector": {"inspector_sn": "sn", "inspector_exec_dur_ns": "exec_dur_ns", "inspector_algo": "algo",
                       "inspector_proto": "proto", "inspector_algobw_gbs": "algobw_gbs", "inspector_busbw_gbs": "busbw_gbs"},
    "nccl_profiler": {"plugin_seq_num": "seq_num", "plugin_dur_ns": "plugin_dur", "plugin_algorithm": "algorithm",
                      "plugin_protocol": "protocol", "plugin_n_channels": "n_channels"},
}
_MATCHED = {"nccl_log": "nccl_log_matched", "nccl_inspector": "inspector_matched", "nccl_profiler": "plugin_matched"}
_KEYS = pa.schema([("run", pa.string()), ("rank", pa.int32()), ("window_id", pa.int32()), ("comm_id", pa.int64())])


def _arrow(df: pd.DataFrame, schema: pa.Schema) -> pa.Table:
    if df.empty:
        return schema.empty_table()
    df = df[[f.name for f in schema]].astype(object).where(df[[f.name for f in schema]].notna(), None)
    return pa.Table.from_pandas(df, schema=schema, preserve_index=False)


def register(con, params: JoinParams = JoinParams()) -> None:
    """Create the ``nccl_comm_map`` table and the ``comms_nccl`` view on an open store connection."""
    has_nccl = con.execute("SELECT (SELECT count(*) FROM nccl_log_ops) + (SELECT count(*) FROM nccl_inspector_ops) "
                           "+ (SELECT count(*) FROM nccl_profiler_events)").fetchall()[0][0] > 0
    mapping, links = compute(con, params) if has_nccl else (pd.DataFrame(columns=[c.name for c in S.NCCL_COMM_MAP.columns]), {})
    cols = {c.name: c for c in S.COMMS_NCCL.columns}
    _create(con, "nccl_comm_map", _arrow(mapping, S.NCCL_COMM_MAP.arrow_schema))
    select, joins = ["c.*"], []
    for src, fields in _LINK_COLS.items():
        schema = pa.schema(list(_KEYS) + [pa.field(name, cols[name].type) for name in fields])
        df = links.get(src, pd.DataFrame())
        if not df.empty:
            df = df.rename(columns={v: k for k, v in fields.items()})
        alias = f"_{src}"
        _create(con, f"_nccl_links_{src}", _arrow(df, schema))
        select.append(f"{alias}.comm_id IS NOT NULL AS {_MATCHED[src]}")
        select += [f"{alias}.{name}" for name in fields]
        joins.append(f"LEFT JOIN _nccl_links_{src} {alias} ON {alias}.run = c.run AND {alias}.rank = c.rank "
                     f"AND {alias}.window_id = c.window_id AND {alias}.comm_id = c.comm_id")
    con.execute(f"CREATE OR REPLACE TEMP VIEW comms_nccl AS SELECT {', '.join(select)} FROM comms c {' '.join(joins)}")


def _create(con, name: str, table: pa.Table) -> None:
    con.register(f"_arrow_{name}", table)
    con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS SELECT * FROM _arrow_{name}")
    con.unregister(f"_arrow_{name}")


def comm_map(store, **params) -> pd.DataFrame:
    """``nccl_comm_map`` of ``store`` computed with other thresholds (``JoinParams`` fields)."""
    from ..store import open_store
    con = open_store(store)
    mapping, _ = compute(con, JoinParams(**params))
    return mapping
