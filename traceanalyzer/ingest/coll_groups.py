"""Which process group a gloo collective used when one trace alone cannot tell, resolved across
the ranks of one ingest.

Without a Flight Recorder dump a gloo collective gets its group from the runloop thread that ran
it (comms.py: each group's threads are created together, in pg_config order). That fails when the
rank belongs to more groups than show runloop threads in the window: on a PP x DP job, rank 0 is
in the default group, its pipeline's group and its DP group, but only the DP group's two threads
ran anything, so its all_reduces are left with no group (NULL).

Once every rank of the ingest is parsed we try, for each rank's collectives of unknown group
(taken together, in order), each group G of the rank's pg_config: G agrees when every other member
of G is in this ingest and has collectives of unknown group with the same sequence of (op, bytes).
When exactly one group agrees, the rows take it (``pg_source = 'collective_match'``, inferred); the
sequence numbers stay (they count these rows in order, as they would in G when the rank has no
other row in G). Ambiguous or unmatched rows stay unknown.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import schema as S


def _unknown(comms: list[dict]) -> list[dict]:
    return sorted((r for r in comms if not r["is_p2p"] and r["pg_name"] is None and r["dialect"] == "gloo"),
                  key=lambda r: r["comm_id"])


def _any_unknown(t: pa.Table) -> bool:
    """Whether the comms columns ``t`` hold a row :func:`_unknown` would pick (read as Python only then)."""
    return bool(pc.any(pc.and_(pc.and_(pc.invert(t["is_p2p"]), pc.is_null(t["pg_name"])),
                               pc.equal(t["dialect"], "gloo"))).as_py())


def resolve(summaries) -> int:
    """Rewrite the staged comms of ``summaries`` (TraceSummary, one per parsed file) in place;
    returns the number of collective rows given a group."""
    tables, groups, descs = {}, {}, {}
    for s in summaries:
        f = None if s.rank_source == "op_timeline" else pq.ParquetFile(s.staged["comms"])  # one file: no dataset discovery
        if f is None or not _any_unknown(f.read(columns=["is_p2p", "pg_name", "dialect"])):
            tables.setdefault(s.rank, []).append((s, []))  # no row to resolve (an op timeline's groups are known)
            continue
        comms = f.read().to_pylist()
        pgs = pq.ParquetFile(s.staged["process_groups"]).read().to_pylist()
        groups.setdefault(s.rank, {}).update({str(g["pg_name"]): list(g["pg_ranks"] or []) for g in pgs if g.get("pg_ranks")})
        descs.update({str(g["pg_name"]): g.get("pg_desc") for g in pgs})
        tables.setdefault(s.rank, []).append((s, comms))
    if any(len(v) > 1 for v in tables.values()):
        return 0  # several windows of a rank: sequences of different windows are not comparable
    signature = {rank: tuple((r["op"], r["in_bytes"]) for r in _unknown(v[0][1])) for rank, v in tables.items()}
    choice = {}
    for rank, sig in signature.items():
        if not sig:
            continue
        ok = [name for name, ranks in groups.get(rank, {}).items()
              if rank in ranks and len(ranks) > 1
              and all(b == rank or (b in signature and signature[b] == sig and groups.get(b, {}).get(name) == ranks)
                      for b in ranks)]
        if len(ok) == 1:
            choice[rank] = ok[0]
    moved = 0
    for rank, name in choice.items():
        s, comms = tables[rank][0]
        if any(r["pg_name"] == name for r in comms if not r["is_p2p"]):
            continue  # the rank already has rows in that group: their numbering would have to merge
        ranks = groups[rank][name]
        rows = _unknown(comms)
        for r in rows:
            r.update(pg_name=name, pg_ranks=ranks, group_size=len(ranks), pg_source="collective_match",
                     pg_inferred=True, pg_desc=descs.get(name))
        moved += len(rows)
        if s.unknown:  # the ingest summary's counts (batch.unknown_comms)
            s.unknown["group"] = max(0, s.unknown.get("group", 0) - len(rows))
            if not s.unknown.get("size") and not s.unknown["group"]:
                s.unknown = {}
        pq.write_table(pa.Table.from_pylist(comms, schema=S.TABLES["comms"].arrow_schema), s.staged["comms"])
    return moved
