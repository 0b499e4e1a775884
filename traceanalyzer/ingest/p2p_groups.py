"""Which process group a gloo send/recv used, resolved across the ranks of one ingest.

A gloo p2p op records its peer as a rank *of its process group* (``Concrete Inputs``) but not
the group: the Flight Recorder does not record gloo p2p and the op has no group argument. Each
file is therefore parsed as if the op used the default group (``pg_source = 'default_pg'``),
which is right for one pipeline over the whole world and wrong for a pipeline on a subgroup
(PP x DP: replica 1's stage 0 on global rank 2 sends to group rank 1, global rank 3, not 1).

Once every rank of the ingest is parsed we pick, for each channel (rank, op, group peer), the
group under which the two sides agree: the group G (from the rank's ``pg_config``) maps the peer
to global rank B = G.ranks[peer], and B has the opposite op whose own group peer maps back to this
rank under G, as many times as this rank has ops on the channel. The default group is kept when
it agrees, or when no group does (a peer not in this ingest); when several non-default groups
agree the channel is ambiguous and also kept as parsed. Resolved rows get ``pg_source =
'p2p_match'`` and their src/dst/peer ranks and ``p2p_seq`` recomputed.
"""
from __future__ import annotations

from collections import Counter, defaultdict

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import schema as S


def resolve(summaries) -> int:
    """Rewrite the staged comms of ``summaries`` (TraceSummary, one per parsed file) in place;
    returns the number of p2p rows moved to another group."""
    tables, groups, default, descs = {}, {}, {}, {}
    for s in summaries:
        if s.rank_source == "op_timeline":  # its groups come from the ranks' coordinates
            continue
        f = pq.ParquetFile(s.staged["comms"])  # one file: no dataset discovery
        flags = f.read(columns=["is_p2p", "pg_source"])
        if not pc.any(pc.and_(flags["is_p2p"], pc.equal(flags["pg_source"], "default_pg"))).as_py():
            continue  # nothing to resolve: the rows are not read as Python objects
        comms = f.read().to_pylist()
        pgs = pq.ParquetFile(s.staged["process_groups"]).read().to_pylist()
        tables[id(s)] = (s, comms)
        groups[s.rank] = {str(g["pg_name"]): list(g["pg_ranks"] or []) for g in pgs if g.get("pg_ranks")}
        descs.update({str(g["pg_name"]): g.get("pg_desc") for g in pgs})
        default[s.rank] = groups[s.rank].get("0")
    if len({s.rank for s, _ in tables.values()}) < 2:
        return 0

    def group_peer(rank, row):  # the peer as the rank recorded it: its index in the default group
        ranks = default.get(rank)
        return ranks.index(row["peer_rank"]) if ranks and row["peer_rank"] in ranks else row["peer_rank"]

    # channel counts: (rank, op, group peer, tag) -> ops
    counts = Counter()
    for s, comms in tables.values():
        for r in comms:
            if r["is_p2p"] and r["pg_source"] == "default_pg" and r["op"] in ("send", "recv"):
                counts[(s.rank, r["op"], group_peer(s.rank, r), r["tag"])] += 1
    other = {"send": "recv", "recv": "send"}

    def agree(rank, op, peer, tag, name, ranks):
        if rank not in ranks or peer is None or not 0 <= peer < len(ranks) or ranks[peer] == rank:
            return False
        b = ranks[peer]
        if groups.get(b, {}).get(name) != ranks:
            return False
        return counts.get((b, other[op], ranks.index(rank), tag)) == counts[(rank, op, peer, tag)]

    choice = {}
    for (rank, op, peer, tag) in counts:
        ok = [name for name, ranks in groups[rank].items() if agree(rank, op, peer, tag, name, ranks)]
        if "0" not in ok and len(ok) == 1:
            choice[(rank, op, peer, tag)] = ok[0]

    moved = 0
    for s, comms in tables.values():
        changed = False
        for r in comms:
            key = (s.rank, r["op"], group_peer(s.rank, r), r["tag"]) if r["is_p2p"] else None
            name = choice.get(key) if r["is_p2p"] and r["pg_source"] == "default_pg" else None
            if name is None:
                continue
            ranks = groups[s.rank][name]
            peer = ranks[key[2]]
            r.update(pg_name=name, pg_ranks=ranks, group_size=len(ranks), pg_source="p2p_match", peer_rank=peer,
                     pg_desc=descs.get(name))
            r.update(src_rank=s.rank, dst_rank=peer) if r["op"] == "send" else r.update(src_rank=peer, dst_rank=s.rank)
            moved += 1
            changed = True
        if changed:
            _renumber(comms)
            pq.write_table(pa.Table.from_pylist(comms, schema=S.TABLES["comms"].arrow_schema), s.staged["comms"])
    return moved


def _renumber(comms: list[dict]) -> None:
    """p2p_seq: index among the rank's ops of the same (pg_name, src_rank, dst_rank, tag), in comm_id order."""
    seen: dict = defaultdict(int)
    for r in sorted(comms, key=lambda r: r["comm_id"]):
        if r["is_p2p"]:
            key = (r["pg_name"], r["src_rank"], r["dst_rank"], r["tag"])
            r["p2p_seq"] = seen[key]
            seen[key] += 1
