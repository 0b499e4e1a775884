"""Hang / desync diagnosis from the Flight Recorder dumps of all ranks.

    import traceanalyzer.desync as desync
    d = desync.diagnose(["traces/fr_desync_gloo_3rank"])     # dump files or folders, or a store
    d.findings                                                 # DataFrame, one row per finding
    print(d.text())                                            # the one-screen answer

The question is the one ``torchfrtrace`` (torch/distributed/flight_recorder) answers: which
collective did not every member of its process group join, which ranks are missing, and where
(the Python stack) the ranks that did join are waiting. It works on raw gloo dumps too, whose
``pg_config`` names no group (``{"": ...}``, where ``torchfrtrace`` stops with a KeyError): group
members then come from the collector's rank manifests beside the dumps, from the traces'
process groups in a store, or, for the default group, from the world size.

Method, per process group: each rank's last collective sequence id (``collective_seq_id``, counted
per group, the same on every member for the same call). If they differ, the first id past the
lowest is the collective some members never entered: those are the missing ranks
(``missing_ranks``); the others wait in it. Before that point, the first id whose op or input
sizes differ between ranks is a ``mismatch`` (ranks called different collectives). If all members
reached the same id but NCCL never saw it complete everywhere, it is ``not_completed`` (every rank
joined; the hang is inside the collective). Unequal NCCL send/recv counts between two ranks are
``p2p_unmatched``. Members that left no dump at all are ``no_dump`` (they cannot be judged).
"""
from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ..errors import TraceAnalyzerError, TraceInputError
from ..ingest.batch import format_ranges
from ..store.runs import resolve_run, store_runs

#: Ops whose input sizes may differ between ranks for a correct call (uneven splits, roots).
SIZES_MAY_DIFFER = {"all_to_all", "gather", "scatter", "coalesced", "send", "recv", "send_recv", None}
#: Stack frames shown per finding in the text answer.
MAX_FRAMES = 12
_P2P_NAME = re.compile(r"^\w+:(send|recv) (\d+)(->|<-)(\d+)")


@dataclass
class RankDump:
    """One rank's FR dump, as the diagnosis needs it."""
    rank: int
    path: str
    entries: list[dict]  # normalised (see flight_recorder._entry): pg_name, collective_seq_id, frames, ...
    pg_config: list[dict]
    pg_config_usable: bool
    backend: str | None


@dataclass
class Diagnosis:
    """What :func:`diagnose` found."""
    ranks: list[int]
    backend: str | None
    groups: pd.DataFrame  # pg_name, pg_desc, members, membership_source, last_seq (rank -> seq)
    findings: pd.DataFrame  # kind, pg_name, pg_desc, seq, op, profiling_name, ... (see _FINDING_COLUMNS)
    sources: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.findings.empty

    def text(self) -> str:
        return format_text(self)


_FINDING_COLUMNS = ["kind", "pg_name", "pg_desc", "seq", "op", "profiling_name", "input_sizes", "input_dtypes",
                    "members", "joined_ranks", "missing_ranks", "no_dump_ranks", "state", "detail", "stack_rank",
                    "stack", "missing_last"]


def diagnose(paths_or_store, run: str | None = None) -> Diagnosis:
    """Diagnose the FR dumps in ``paths_or_store``: dump files or folders of them (recognised by
    content: ``rank{R}.fr.json``, ``nccl_trace_rank_{R}``, ``fr_rank_{R}``, ...), or a store (then ``run`` picks the run when it holds several)."""
    items = [paths_or_store] if isinstance(paths_or_store, (str, Path)) else list(paths_or_store)
    items = [Path(p) for p in items]
    if len(items) == 1 and (items[0] / "_store.json").is_file():
        dumps, hints, world = _from_store(items[0], run)
    else:
        dumps, hints, world = _from_files(items)
    return _diagnose(dumps, hints, world)


# -- inputs ------------------------------------------------------------------------------------

def _from_files(paths: list[Path]) -> tuple[list[RankDump], dict, int | None]:
    from ..ingest.flight_recorder import read_fr_dump
    from ..ingest.sidecars import classify, fr_rank
    for p in paths:
        if not p.exists():
            raise TraceInputError(p, "no such file or folder")
    _, side = classify(paths)
    files = [s.path for s in side if s.kind == "flight_recorder"]
    if not files:
        raise TraceAnalyzerError("no Flight Recorder dumps (JSON or pickle, recognised by content) in "
                                 + ", ".join(map(str, paths)))
    dumps: dict[int, RankDump] = {}
    for f in files:
        rank, _ = fr_rank(f)
        if rank is None:
            raise TraceInputError(f, "cannot tell the rank of this Flight Recorder dump: no rank{R}.manifest.json "
                                     "lists it and its name has no number (name it like fr_rank_{R})")
        if rank in dumps:
            raise TraceInputError(f, f"second Flight Recorder dump for rank {rank} (first: {dumps[rank].path}); "
                                     "diagnose one run at a time")
        d = read_fr_dump(f)
        dumps[rank] = RankDump(rank, d.path, d.entries, d.pg_config, d.pg_config_usable, d.backend)
    hints, world = _manifest_hints({Path(d.path).parent for d in dumps.values()})
    return sorted(dumps.values(), key=lambda d: d.rank), hints, world


def _manifest_hints(folders) -> tuple[dict, int | None]:
    """Group members and world size from the collector's manifests beside the dumps."""
    hints: dict[str, dict] = {}
    world = None
    for folder in folders:
        for m in sorted(folder.glob("*manifest.json")):
            try:
                doc = json.loads(m.read_text())
            except (OSError, ValueError):
                continue  # a manifest we cannot read only costs us a hint
            if not isinstance(doc, dict):
                continue
            if isinstance(doc.get("world_size"), int):
                world = max(world or 0, doc["world_size"])
            for pg in doc.get("process_groups") or []:
                if isinstance(pg, dict) and isinstance(pg.get("ranks"), list) and pg.get("name") is not None:
                    hints.setdefault(str(pg["name"]), {"desc": pg.get("desc"), "ranks": pg["ranks"],
                                                       "source": "rank_manifest"})
    return hints, world


def _from_store(store: Path, run: str | None) -> tuple[list[RankDump], dict, int | None]:
    from . import connect
    con = connect(store)
    if not store_runs(con, "fr_dumps"):
        raise TraceAnalyzerError(f"{store}: no Flight Recorder dumps in this store (ingest the rank{{R}}.fr.json files)")
    run = resolve_run(con, run, where=store, table="fr_dumps", what="runs with Flight Recorder dumps")
    heads = con.execute("SELECT rank, source_file, pg_config_json, pg_config_usable, backend FROM fr_dumps WHERE run = ?",
                        [run]).fetchall()
    cur = con.execute("SELECT * EXCLUDE (run) FROM fr_entries WHERE run = ? ORDER BY rank, record_id", [run])
    cols = [c[0] for c in cur.description]
    by_rank: dict[int, list[dict]] = defaultdict(list)
    for values in cur.fetchall():  # plain Python values: NULL stays None, ints stay ints
        e = dict(zip(cols, values))
        e.update(frames=json.loads(e["frames_json"]) if e["frames_json"] else None,
                 input_sizes=json.loads(e["input_sizes"]) if e["input_sizes"] else None,
                 input_dtypes=json.loads(e["input_dtypes"]) if e["input_dtypes"] else None)
        by_rank[e["rank"]].append(e)
    dumps = [RankDump(int(rank), path, by_rank[rank], json.loads(cfg) if cfg else [], bool(usable), backend)
             for rank, path, cfg, usable, backend in heads]
    hints: dict[str, dict] = {}
    for name, desc, ranks in con.execute("""SELECT pg_name, any_value(pg_desc), any_value(pg_ranks) FROM process_groups
                                            WHERE run = ? GROUP BY pg_name""", [run]).fetchall():
        if ranks:
            hints[str(name)] = {"desc": desc, "ranks": list(ranks), "source": "trace_pg_config"}
    world = con.execute("SELECT max(world_size) FROM ranks WHERE run = ?", [run]).fetchone()[0]
    return sorted(dumps, key=lambda d: d.rank), hints, world


# -- the diagnosis ---------------------------------------------------------------------------

def _members(name: str, desc: str | None, dumps: list[RankDump], hints: dict, world: int | None) -> tuple[list[int], str]:
    for d in dumps:
        if d.pg_config_usable:
            for cfg in d.pg_config:
                if cfg["pg_name"] == name and cfg["ranks"]:
                    return sorted(cfg["ranks"]), "fr_pg_config"
    if name in hints:
        return sorted(hints[name]["ranks"]), hints[name]["source"]
    if desc == "default_pg":
        n = world or (max(d.rank for d in dumps) + 1)
        return list(range(max(n, max(d.rank for d in dumps) + 1))), "default_pg_world"
    seen = sorted({d.rank for d in dumps if any(e["pg_name"] == name for e in d.entries)})
    return seen, "seen_in_dumps"


def _diagnose(dumps: list[RankDump], hints: dict, world: int | None) -> Diagnosis:
    by_rank = {d.rank: d for d in dumps}
    names: dict[str, str | None] = {}
    for d in dumps:
        for e in d.entries:
            names.setdefault(e["pg_name"], e["pg_desc"])
    backends = {d.backend for d in dumps if d.backend}
    backend = "/".join(sorted(backends)) if backends else None
    groups, findings = [], []
    for name in sorted(names, key=lambda n: (0, int(n)) if n.isdigit() else (1, n)):
        desc = names[name]
        members, source = _members(name, desc, dumps, hints, world)
        dumped = [r for r in members if r in by_rank]
        colls = {r: _collectives(by_rank[r], name) for r in dumped}
        last = {r: max(colls[r], default=0) for r in dumped}
        groups.append({"pg_name": name, "pg_desc": desc, "members": members, "membership_source": source,
                       "no_dump_ranks": [r for r in members if r not in by_rank], "last_seq": last})
        base = {"pg_name": name, "pg_desc": desc, "members": members,
                "no_dump_ranks": [r for r in members if r not in by_rank]}
        findings += _mismatches(base, colls, last)
        findings += _missing(base, colls, last, by_rank)
        findings += _no_dump(base, last, source)
        findings += _not_completed(base, colls, last)
        findings += _p2p(base, by_rank, dumped, members)
    cols = _FINDING_COLUMNS
    return Diagnosis(sorted(by_rank), backend, pd.DataFrame(groups),
                     pd.DataFrame(findings, columns=cols, dtype=object),  # object: a missing seq stays None
                     [d.path for d in dumps])


def _collectives(dump: RankDump, pg_name: str) -> dict[int, dict]:
    """seq -> entry of the group's collectives on one rank (the last op of a coalesced group)."""
    out: dict[int, dict] = {}
    for e in dump.entries:
        if e["pg_name"] == pg_name and not e["is_p2p"] and e["collective_seq_id"] and e["collective_seq_id"] > 0:
            prev = out.get(e["collective_seq_id"])
            if prev is None or (e["op_id"] or 0) >= (prev["op_id"] or 0):
                out[e["collective_seq_id"]] = e
    return out


def _signature(e: dict) -> tuple:
    op = _op(e)
    sizes = None if op in SIZES_MAY_DIFFER else json.dumps(e.get("input_sizes"))
    return (e["profiling_name"], sizes, json.dumps(e.get("input_dtypes")))


def _op(e: dict) -> str | None:
    from ..ingest.ops import normalize_op
    return normalize_op(e["profiling_name"].split(" ")[0]) if e.get("profiling_name") else None


def _mismatches(base: dict, colls: dict, last: dict) -> list[dict]:
    """The first seq that every dumped member has but not as the same call."""
    if len(colls) < 2:
        return []
    common = set.intersection(*(set(c) for c in colls.values()))
    for seq in sorted(common):
        sigs = {r: _signature(colls[r][seq]) for r in colls}
        if len(set(sigs.values())) > 1:
            variants = defaultdict(list)
            for r, s in sigs.items():
                variants[s].append(r)
            detail = "; ".join(f"ranks {format_ranges(rs)}: {s[0]} {s[1] or ''} {s[2]}".replace("  ", " ")
                               for s, rs in sorted(variants.items(), key=lambda kv: kv[1]))
            first = colls[min(colls)][seq]
            return [_finding("mismatch", base, seq, first, joined=sorted(colls), missing=[],
                             detail=f"ranks called different collectives at seq {seq}: {detail}",
                             stack_rank=min(colls))]
    return []


def _missing(base: dict, colls: dict, last: dict, by_rank: dict) -> list[dict]:
    if len(last) < 1 or len(set(last.values())) < 2:
        return []
    seq = min(last.values()) + 1
    joined = sorted(r for r, s in last.items() if s >= seq)
    missing = sorted(r for r, s in last.items() if s < seq)
    holder = next((r for r in joined if seq in colls[r]), joined[0])
    entry = colls[holder].get(seq) or {}
    missing_last = {r: _describe_last(by_rank[r]) for r in missing}
    detail = (f"ranks {format_ranges(missing)} never called collective #{seq} of group {base['pg_name']}; "
              f"ranks {format_ranges(joined)} wait in it")
    return [_finding("missing_ranks", base, seq, entry, joined, missing, detail, holder, missing_last)]


def _no_dump(base: dict, last: dict, source: str) -> list[dict]:
    """Members that left no dump (died, or hung before dumping): the others cannot be judged
    against them; say so rather than report a clean group."""
    if not base["no_dump_ranks"] or source == "seen_in_dumps":
        return []
    reached = f"collective #{max(last.values())}" if last else "no collective"
    detail = (f"no Flight Recorder dump from ranks {format_ranges(base['no_dump_ranks'])} (died, or hung before dumping?); "
              f"the ranks with dumps reached {reached} of group {base['pg_name']}")
    return [_finding("no_dump", base, max(last.values()) if last else None, {}, sorted(last), base["no_dump_ranks"],
                     detail)]


def _not_completed(base: dict, colls: dict, last: dict) -> list[dict]:
    """All members reached the same seq, but the collective did not complete everywhere (NCCL)."""
    if not last or len(set(last.values())) != 1 or not next(iter(last.values())):
        return []
    seq = next(iter(last.values()))
    entries = {r: colls[r].get(seq) for r in colls}
    if any(e is None or _is_gloo(e) for e in entries.values()):
        return []  # fallen out of a ring, or gloo, which records no start/end: completion is unknowable
    states = {r: (e.get("state") or "?") for r, e in entries.items()}
    if all(s == "completed" for s in states.values()):
        return []
    by_state = defaultdict(list)
    for r, s in states.items():
        by_state[s].append(r)
    detail = (f"every member joined collective #{seq}, but it did not complete: "
              + ", ".join(f"{s} on ranks {format_ranges(rs)}" for s, rs in sorted(by_state.items())))
    holder = min(r for r, s in states.items() if s != "completed")
    return [_finding("not_completed", base, seq, entries[holder], sorted(entries), [], detail, holder)]


def _is_gloo(e: dict) -> bool:
    return (e.get("profiling_name") or "").startswith("gloo:")


def _p2p(base: dict, by_rank: dict, dumped: list[int], members: list[int]) -> list[dict]:
    """NCCL p2p: sends from a to b must equal receives on b from a (group ranks in the names)."""
    sends, recvs = Counter(), Counter()
    example = {}
    for r in dumped:
        for e in by_rank[r].entries:
            if e["pg_name"] != base["pg_name"] or not e["is_p2p"]:
                continue
            m = _P2P_NAME.match(e["profiling_name"] or "")
            if not m:
                continue
            a, b = int(m.group(2)), int(m.group(4))
            pair = (a, b) if m.group(1) == "send" else (b, a)  # "recv b<-a": b receives from a
            (sends if m.group(1) == "send" else recvs)[pair] += 1
            example.setdefault(pair, (r, e))
    out = []

    def glob(g):
        return members[g] if 0 <= g < len(members) else g
    for pair in sorted(set(sends) | set(recvs)):
        if sends[pair] != recvs[pair]:
            src, dst = glob(pair[0]), glob(pair[1])
            if src not in by_rank or dst not in by_rank:
                continue  # the other side has no dump: cannot tell
            r, e = example[pair]
            detail = (f"rank {src} posted {sends[pair]} send(s) to rank {dst}, which posted {recvs[pair]} "
                      f"receive(s) from it")
            out.append(_finding("p2p_unmatched", base, None, e, sorted({src, dst}), [], detail, r))
    return out


def _finding(kind, base, seq, entry, joined, missing, detail, stack_rank=None, missing_last=None) -> dict:
    return {**base, "kind": kind, "seq": seq, "op": _op(entry) if entry else None,
            "profiling_name": entry.get("profiling_name"), "input_sizes": entry.get("input_sizes"),
            "input_dtypes": entry.get("input_dtypes"), "joined_ranks": joined, "missing_ranks": missing,
            "state": entry.get("state"), "detail": detail, "stack_rank": stack_rank,
            "stack": _stack(entry.get("frames")), "missing_last": missing_last or {}}


def _stack(frames) -> list[str]:
    if not frames:
        return []
    return [f"{f.get('name')} at {f.get('filename')}:{f.get('line')}" for f in frames
            if isinstance(f, dict) and not str(f.get("filename", "")).startswith("<frozen")]


def _describe_last(dump: RankDump) -> str:
    if not dump.entries:
        return "no FR entries"
    e = max(dump.entries, key=lambda x: (x["record_id"] if x["record_id"] is not None else -1))
    where = next((s for s in _stack(e.get("frames")) if "/torch/" not in s), None)
    text = f"last FR entry: {e['profiling_name']} (group {e['pg_name']}, #{e['collective_seq_id']}"
    text += f", p2p #{e['p2p_seq_id']})" if e["is_p2p"] else ")"
    return text + (f" from {where}" if where else "")


# -- the one-screen answer -----------------------------------------------------------------------

def format_text(d: Diagnosis) -> str:
    lines = [f"Flight Recorder dumps of {len(d.ranks)} rank(s) ({format_ranges(d.ranks)}), backend {d.backend or '?'}"]
    for g in d.groups.to_dict("records"):
        seqs = ", ".join(f"{r}:{s}" for r, s in sorted(g["last_seq"].items()))
        line = (f"  group {g['pg_name']} ({g['pg_desc']}): members {format_ranges(g['members'])} "
                f"[{g['membership_source']}]; last collective # per rank {seqs}")
        if g["no_dump_ranks"]:
            line += f"; no dump from ranks {format_ranges(g['no_dump_ranks'])}"
        lines.append(line)
    if d.findings.empty:
        lines.append("No desync: every member of every group reached the same collective, with the same ops"
                     + (" and NCCL saw it complete." if d.backend and "nccl" in d.backend else "."))
        return "\n".join(lines)
    titles = {"missing_ranks": "HANG: not all ranks joined", "mismatch": "MISMATCH", "not_completed":
              "HANG: all joined, not completed", "p2p_unmatched": "P2P UNMATCHED", "no_dump": "NO DUMP"}
    for f in d.findings.to_dict("records"):
        if f["kind"] == "no_dump":
            lines.append(f"{titles['no_dump']}: group {f['pg_name']} ({f['pg_desc']}): {f['detail']}")
            continue
        seq = f"collective #{f['seq']}" if f["seq"] is not None else "p2p"
        lines.append(f"{titles[f['kind']]}: group {f['pg_name']} ({f['pg_desc']}), {seq}: {f['profiling_name']} "
                     f"sizes {json.dumps(f['input_sizes'])} {json.dumps(f['input_dtypes'])}")
        if f["kind"] == "missing_ranks":
            lines.append(f"  missing ranks: {format_ranges(f['missing_ranks'])}   joined: {format_ranges(f['joined_ranks'])}")
            for r, text in sorted(f["missing_last"].items()):
                lines.append(f"  rank {r} {text}")
        else:
            lines.append(f"  {f['detail']}")
        if f["stack"]:
            lines.append(f"  stack of the call on rank {f['stack_rank']} (innermost first):")
            lines += [f"    {s}" for s in f["stack"][:MAX_FRAMES]]
            if len(f["stack"]) > MAX_FRAMES:
                lines.append(f"    ... {len(f['stack']) - MAX_FRAMES} more frames")
        elif f["kind"] != "p2p_unmatched":
            lines.append("  (no stack: this dump has no frames; the collector's rank{R}.fr.json and pickle dumps have them)")
    return "\n".join(lines)
