"""Nsight Systems SQLite exports (``nsys export --type sqlite``) as a trace source.

``load(path)`` reads one export and returns one :class:`~traceanalyzer.ingest.kineto.build.RankTables`
per process that ran GPU work, with its ``comms`` table built; :mod:`traceanalyzer.ingest.batch` stages
and commits them like Kineto traces. See :mod:`.reader` (tables, time base) and :mod:`.build`
(mapping, rank and step rules).

Communication: PyTorch's NVTX ranges (``c10d::<op>`` > ``record_param_comms`` > ``nccl:<op>``)
around the NCCL kernel launch give each NCCL kernel its op, as for Kineto's legacy dialect
(:mod:`traceanalyzer.ingest.comms`); a kernel without them keeps the op its name gives. nsys records no
process group, so the group is inferred (``pg_source='nsys_op_order'``): one group per op
(``pg_name='nsys:<op>'``, e.g. ``nsys:all_to_all``), whose members are the file's processes that
ran it, and ``seq`` numbers a rank's collectives of that op in time order. The same collective
then has the same (pg, seq) on every rank of the file, and across files (one per rank) when each
file holds the same window of the job. Sizes are unknown (NVTX carries no tensor sizes unless
``record_shapes``): bytes stay null.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from ... import schema as S
from ...errors import TraceInputError
from ..kineto.build import RankTables
from .build import STEP_NAME_RE, assign_ranks, build_all
from .reader import is_nsys_export, looks_like_sqlite, read_export

__all__ = [
    "PG_SOURCE",
    "STEP_NAME_RE",
    "assign_ranks",
    "build_all",
    "is_nsys_export",
    "load",
    "looks_like_sqlite",
    "read_export",
]

#: comms.pg_source of the groups inferred here.
PG_SOURCE = "nsys_op_order"


#: A rank mapping beside an export ``X.sqlite``: ``X.ranks.json`` holding ``{"<pid>": rank, ...}``
#: for its GPU processes; it overrides every other rank rule (see :mod:`.build`).
RANK_MAP_SUFFIX = ".ranks.json"


def rank_map_beside(path) -> dict[int, int] | None:
    """The ``X.ranks.json`` mapping beside export ``X.*`` (None when absent)."""
    p = Path(path)
    m = p.with_name(p.name.split(".")[0] + RANK_MAP_SUFFIX) if "." in p.name else p.with_name(p.name + RANK_MAP_SUFFIX)
    if not m.is_file():
        return None
    try:
        doc = json.loads(m.read_text())
        return {int(pid): int(rank) for pid, rank in doc.items()}
    except (OSError, ValueError, TypeError, AttributeError):
        raise TraceInputError(m, 'unreadable rank mapping: expected JSON {"<pid>": rank, ...} for the '
                                 "export's GPU processes") from None


def load(path, rank_arg: int | None = None, rank_map: dict[int, int] | None = None) -> list[RankTables]:
    """Read an export into per-process tables (``tables['comms']`` included). ``rank_map``
    ({pid: rank}) defaults to the ``X.ranks.json`` beside the export."""
    from ..comms import build_comms
    if rank_map is None:
        rank_map = rank_map_beside(path)
    export = read_export(path)
    built = build_all(export, rank_arg, rank_map)
    del export
    for b in built:
        t = b.tables
        t["comms"] = build_comms(t["events"], t["process_groups"], t["threads"], None, b.rank)
    _infer_groups(built)
    return built


def _infer_groups(built: list[RankTables]) -> None:
    """Give communication without a recorded process group the group 'nsys:<op>' (members: the
    ranks of this file that ran that op) and number seq / p2p_seq per group in time order."""
    from ..comms import _number
    members: dict[str, set[int]] = defaultdict(set)
    rows_by_rank = {}
    for b in built:
        rows = b.tables["comms"].to_pylist()
        for r in rows:
            if r["pg_name"] is None:
                r["pg_name"] = f"nsys:{r['op'] or 'unknown'}"
                r.update(pg_source=PG_SOURCE, pg_inferred=True, seq=None, seq_source=None, p2p_seq=None)
            if r["pg_source"] == PG_SOURCE:
                members[r["pg_name"]].add(b.rank)
        rows_by_rank[b.rank] = rows
    for b in built:
        rows = rows_by_rank[b.rank]
        for r in rows:
            if r["pg_source"] == PG_SOURCE:
                ranks = sorted(members[r["pg_name"]])
                # one process in the file: the group's other members are in other files (unknown)
                r.update(pg_ranks=ranks if len(ranks) > 1 else None, group_size=len(ranks) if len(ranks) > 1 else None)
        _number(rows)
        b.tables["comms"] = pa.Table.from_pylist(rows, schema=S.COMMS.arrow_schema)


def summary(built: list[RankTables]) -> dict:
    """Counts per rank (for messages and tests): events by kind, comms, steps."""
    out = {}
    for b in built:
        ev = b.tables["events"]
        kinds = ev.group_by("kind").aggregate([("event_id", "count")]).to_pydict()
        out[b.rank] = {"kinds": dict(zip(kinds["kind"], kinds["event_id_count"])),
                       "comms": b.tables["comms"].num_rows, "steps": b.tables["steps"].num_rows,
                       "devices": sorted(d for d in pc.unique(ev["device"]).to_pylist() if d is not None)}
    return out
