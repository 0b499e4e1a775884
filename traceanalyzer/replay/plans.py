"""What-if plans: change node durations, replay, compare with the identity replay.

A plan is a list of actions applied in order to the graph's durations:

* ``{"action": "idealize", "ranks": [2] | "all", "ops": "glob" (optional), "comm": true,
  "reference": "others" | "all"}``:
  the chosen ranks' compute (CPU ops, host gaps, GPU ops) takes the mean over ranks of the same
  operation (same lane, name and occurrence), and their communication takes the median over the
  instance's members of their time after the last arrival (the OSDI'25 straggler study's
  T_ideal: mean for compute, median for communication transfer). Typical is taken over the ranks
  left as they are ("others", the default when only some ranks are idealised: "what if rank 2
  behaved like the rest") or over every rank ("all", OSDI'25's T_ideal; with few ranks the
  straggler's own time then stays in the mean);
* ``{"action": "scale", "factor": 0.5, "ops": "glob", "categories": [...], "ranks": [...]}``:
  matching compute ops scaled;
* ``{"action": "scale_comm", "factor": 0.5, "ops": ["all_reduce"], "ranks": [...]}``:
  communication transfer scaled; or ``"bandwidth": 2.0`` and/or ``"latency": 0.5`` instead of a
  factor: each transfer rescaled by the run's alpha-beta fit (``alphabeta.fit``: time =
  alpha x hops + beta x bytes x wire factor, per collective type), bandwidth multiplying the
  beta term's speed and latency the alpha term's time.

These act on durations: the graph keeps every recorded dependency, so a change propagates through
waits, collectives and p2p the way the recorded run would have. Two structural actions regenerate
the step instead (they need actions that never ran), each alone in its plan:

* ``{"action": "pipeline", "schedule": "gpipe" | "1f1b" | "interleaved1f1b", "microbatches": 8}``
  (``replay.pipeline``: the schedule rebuilt from per-micro-batch stage costs);
* ``{"action": "ddp", "bucket_mb": 4, "overlap": true, "dp": 8}`` (``replay.ddp``: buckets and the
  comm lane rebuilt from the gradient-ready profile and the alpha-beta fit).
"""
from __future__ import annotations

import fnmatch
import json
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import TraceAnalyzerError
from .graph import GAP, KERNEL, OP, POST, Graph

_ACTIONS = {"idealize": {"ranks", "ops", "comm", "compute", "reference"},
            "scale": {"factor", "ops", "categories", "ranks"},
            "scale_comm": {"factor", "ops", "ranks", "bandwidth", "latency"},
            "pipeline": {"schedule", "microbatches", "stages_per_rank"},
            "ddp": {"bucket_mb", "overlap", "dp", "first_bucket_mb"}}
#: actions that regenerate the step (each must be the plan's only action)
STRUCTURAL = ("pipeline", "ddp")


def load_plan(path_or_obj) -> dict:
    """Read and validate a plan (a path to JSON, a JSON string or a dict); errors are one line."""
    if isinstance(path_or_obj, dict):
        plan, where = path_or_obj, "plan"
    else:
        where = str(path_or_obj)
        try:
            text = Path(path_or_obj).read_text()
        except OSError as exc:
            raise TraceAnalyzerError(f"{where}: cannot read the plan ({exc.strerror})") from None
        try:
            plan = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceAnalyzerError(f"{where}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if isinstance(plan, list):
        plan = {"actions": plan}
    if not isinstance(plan, dict) or not isinstance(plan.get("actions"), list) or not plan["actions"]:
        raise TraceAnalyzerError(f"{where}: a plan is an object with a non-empty \"actions\" list")
    for i, a in enumerate(plan["actions"]):
        if not isinstance(a, dict) or a.get("action") not in _ACTIONS:
            raise TraceAnalyzerError(f"{where}: action {i}: \"action\" must be one of {', '.join(_ACTIONS)}")
        extra = set(a) - _ACTIONS[a["action"]] - {"action"}
        if extra:
            raise TraceAnalyzerError(f"{where}: action {i} ({a['action']}): unknown key(s) {', '.join(sorted(extra))}; "
                                     f"known: {', '.join(sorted(_ACTIONS[a['action']]))}")
        if a["action"] == "scale" or (a["action"] == "scale_comm" and not {"bandwidth", "latency"} & set(a)):
            f = a.get("factor")
            if not isinstance(f, (int, float)) or isinstance(f, bool) or not f >= 0:
                raise TraceAnalyzerError(f"{where}: action {i} ({a['action']}): \"factor\" must be a number >= 0")
        for k in ("bandwidth", "latency", "bucket_mb", "first_bucket_mb"):
            if k in a and (not isinstance(a[k], (int, float)) or isinstance(a[k], bool) or not a[k] > 0):
                raise TraceAnalyzerError(f"{where}: action {i} ({a['action']}): \"{k}\" must be a number > 0")
        for k in ("microbatches", "dp", "stages_per_rank"):
            if k in a and (not isinstance(a[k], int) or isinstance(a[k], bool) or a[k] < 1):
                raise TraceAnalyzerError(f"{where}: action {i} ({a['action']}): \"{k}\" must be an integer >= 1")
        if "overlap" in a and not isinstance(a["overlap"], bool):
            raise TraceAnalyzerError(f"{where}: action {i} ({a['action']}): \"overlap\" must be true or false")
        if a["action"] in STRUCTURAL and len(plan["actions"]) > 1:
            raise TraceAnalyzerError(f"{where}: action {i} ({a['action']}) regenerates the step and must be the "
                                     f"plan's only action")
        if a.get("reference", "all") not in ("all", "others"):
            raise TraceAnalyzerError(f"{where}: action {i} ({a['action']}): \"reference\" must be \"others\" or \"all\"")
        r = a.get("ranks", "all")
        if r != "all" and not (isinstance(r, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in r)):
            raise TraceAnalyzerError(f"{where}: action {i} ({a['action']}): \"ranks\" must be \"all\" or a list of integers")
    plan.setdefault("name", Path(where).stem if where != "plan" else "plan")
    return plan


def _rank_mask(g: Graph, ranks) -> np.ndarray:
    if ranks in (None, "all"):
        return g.rank >= 0
    return np.isin(g.rank, np.asarray(ranks, dtype=np.int64))


def _name_mask(g: Graph, pattern) -> np.ndarray:
    if pattern is None:
        return np.ones(g.n, bool)
    pats = [pattern] if isinstance(pattern, str) else list(pattern)
    ok = np.array([any(fnmatch.fnmatchcase(lbl, p) for p in pats) for lbl in g.labels], dtype=bool)
    return ok[g.label] if len(ok) else np.zeros(g.n, bool)


def typical_durations(g: Graph, reference: np.ndarray | None = None, roles: bool = True) -> np.ndarray:
    """Per node, the typical duration: compute = mean over ranks of the same operation (lane
    ordinal within the rank, name, k-th occurrence on that lane); communication = median over the
    members of the same collective / p2p instance of their own time after the last arrival.

    Why host gaps are keyed by the node that follows them: a gap has no name of its own, and the
    cut points that split a thread's time into gaps differ between ranks (a wait detected on one
    rank, not on another), so "the k-th gap" of two ranks is often not the same moment of the step;
    "the gap before the k-th `aten::as_strided`" is.

    ``reference``: a per-rank boolean mask (indexed by rank) of the ranks whose durations define
    "typical" (default: every rank).

    An operation no reference rank ran under the same key falls back to coarser keys (see
    :func:`_operation_keys`): the same name with its numbers blanked ("Forward 3" and "Forward 5"
    are the same kind of work: a pipeline stage's micro-batch annotations are numbered per rank) at
    the same occurrence, then the median of that name on that lane type over every occurrence. Only
    work no reference rank did at all keeps its own duration (the last stage's loss, say: its role).

    ``roles`` (a pipeline): a rank's operations are compared only with the reference ranks that
    hold the same stages (its replicas in the other data-parallel groups, :func:`_rank_roles`):
    another stage runs other layers, so its k-th ``aten::linear`` is not this one's. A stage no
    reference rank holds keeps the part of each operation its nested events cover (nothing else did
    that work: the last stage's head and loss) and takes, for the rest of it (``g.dur - g.child``: an
    unannotated sleep inside a "Forward" range, Python between ops), the typical of that own time
    over every reference rank, never longer; its host gaps -- a sleep, a wait for a core, not its
    role -- are compared with every reference rank too."""
    is_ref = _reference_mask(g, reference)
    keys = _operation_keys(g)
    typ = _typical_by_keys(g, is_ref, keys)
    role = _rank_roles(g) if roles else None
    if role is not None:
        node_role = np.where(g.rank >= 0, role[np.clip(g.rank, 0, len(role) - 1)], -1)
        by_role = _typical_by_keys(g, is_ref, keys, node_role, int(role.max()) + 1)
        comp = np.isin(g.kind, [OP, KERNEL])
        # a gap is compared within its role only where a reference rank other than its own holds
        # that role (a stage with no replica: with every other reference rank)
        ref_rank = np.asarray(reference, bool) if reference is not None else np.ones(len(role), bool)
        peers = np.where(g.rank >= 0, _role_peers(role, ref_rank)[np.clip(g.rank, 0, len(role) - 1)], False)
        # an op of a stage no other reference rank holds: what nested events cover stays (its role: the
        # last stage's head and loss), its own time outside them (a sleep inside a "Forward" range)
        # takes the typical own time of that op over every reference rank, never longer
        alone = comp & ~peers & (g.kind == OP)
        typ = np.where(comp | (peers & ~np.isnan(by_role)), by_role, typ)   # compute: its role's or its own (NaN)
        if alone.any():
            own = g.dur - g.child
            # (by the names with their numbers blanked: a stage's ranges carry its stage and micro-batch
            # numbers -- "PP:1F3" -- so the exact name matches only the rank itself)
            self_typ = _typical_by_keys(g, is_ref, keys, values=own, first_level=1)
            typ = np.where(alone, g.child + np.fmin(own, np.where(np.isnan(self_typ), own, self_typ)), typ)
    typ = np.rint(np.where(np.isnan(typ), g.dur, typ)).astype(np.int64)
    is_gap = g.kind == GAP
    out = np.where(np.isin(g.kind, [OP, KERNEL]), typ, g.dur)
    # a host gap may hide a wait the graph could not see (a thread descheduled while its own gloo
    # runloop thread reduces, a wait with no traced call): idealising never lengthens a gap
    out = np.where(is_gap, np.minimum(typ, g.dur), out)
    # communication: the median over the members of the same instance of their own part after the
    # last arrival (a single member's long tail is removed; the instance keeps its own transfer time,
    # so step-to-step variation of the network stays in T_ideal as it does for compute)
    post = g.kind == POST
    pi = np.flatnonzero(post)
    if len(pi):
        d = pd.DataFrame({"inst": g.inst[pi], "rank": g.rank[pi], "dur": g.dur[pi]})
        member = d.groupby(["inst", "rank"], sort=False)["dur"].transform("sum")   # a member's POST may be split
        share = np.where(member > 0, d["dur"] / member.where(member > 0, 1), 0.0)
        members = d.assign(member=member, ref=is_ref[pi]).drop_duplicates(["inst", "rank"])
        med = members[members["ref"]].groupby("inst")["member"].median().reindex(d["inst"]).to_numpy()
        # an instance no reference rank took part in (a p2p whose peer's side was not recorded, a
        # gloo send span that stays open while its thread goes on to other work -- e.g. the next
        # micro-batch's sleep): its typical time is the instance's transfer (min end - max arrival),
        # not the member's own time, or idealising the rank would keep what it alone did
        transfer = g.instances.set_index("inst")["transfer_ns"].reindex(d["inst"]).to_numpy(np.float64)
        med = np.where(np.isnan(med), transfer, med)
        # never longer than the member's own (gloo's members finish at different times by design)
        typ_member = np.fmin(med, member.to_numpy())
        out[pi] = np.rint(share * typ_member).astype(np.int64)
    return out


def _typical_by_keys(g: Graph, is_ref: np.ndarray, keys, group: np.ndarray | None = None,
                     n_groups: int = 1, values: np.ndarray | None = None, first_level: int = 0) -> np.ndarray:
    """Per node, the typical ``values`` (default: durations) over the reference nodes of its key
    (finest key first; NaN where no reference node has any of its keys); ``group`` (per node, >= 0)
    splits every key further (a node is then compared only within its group; a node of group -1
    gets NaN); ``first_level``: the finest key used (1: names with their numbers blanked)."""
    vals = (g.dur if values is None else values).astype(np.float64)
    typ = np.full(g.n, np.nan)
    ok = np.ones(g.n, bool) if group is None else group >= 0
    ref = is_ref & ok
    for level, (key, n_keys) in enumerate(keys[first_level:], start=first_level):
        todo = np.isnan(typ) & ok
        if not todo.any():
            break
        if group is not None:
            key, n_keys = key * n_groups + np.maximum(group, 0), n_keys * n_groups
        if level < 2:   # mean over the reference ranks of each operation (int64 ns sums are exact in float64)
            cnt = np.bincount(key[ref], minlength=n_keys)
            tot = np.bincount(key[ref], weights=vals[ref], minlength=n_keys)
            with np.errstate(invalid="ignore", divide="ignore"):
                per_key = tot / cnt
        else:           # any occurrence: the median (robust to the few long ones)
            per_key = pd.Series(vals[ref]).groupby(key[ref]).median() \
                .reindex(range(n_keys)).to_numpy()
        typ[todo] = per_key[key[todo]]
    return typ


def _rank_roles(g: Graph) -> np.ndarray | None:
    """Per rank (indexed by rank), a code of its role in a pipeline: the set of stages it holds
    (ranks with the same code are replicas of each other: the same layers); -1 for a rank that
    holds none. None when the run is not a pipeline (every rank does the same work)."""
    st = g.stages
    if st is None or st.empty or st["stage"].nunique() < 2:
        return None
    sets = st.groupby("rank")["stage"].apply(lambda s: tuple(sorted(s.astype(int))))
    codes = pd.factorize(sets)[0]
    out = np.full(max(int(g.rank.max()), int(sets.index.max())) + 1, -1, np.int64)
    out[sets.index.to_numpy(int)] = codes
    return out


def _role_peers(role: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Per rank (indexed as ``role``): does a reference rank other than itself hold its role (a
    replica to compare it with)? ``ref``: per-rank reference mask (ranks beyond it are none)."""
    n = min(len(role), len(ref))
    is_ref = np.zeros(len(role), bool)
    is_ref[:n] = np.asarray(ref, bool)[:n]
    held = role >= 0
    count = np.bincount(role[held & is_ref], minlength=int(role.max()) + 1 if held.any() else 0)
    return held & (np.where(held, count[np.maximum(role, 0)], 0) - is_ref > 0)


def _operation_keys(g: Graph) -> list[tuple[np.ndarray, int]]:
    """Per node, codes for "the same operation" across ranks, finest first, each with its number
    of codes: (1) lane ordinal within the rank and lane type, name (a host gap takes the name of
    the node after it), node kind, and k-th occurrence of that on the lane; (2) the same with the
    numbers in the name blanked; (3) lane, blanked name and kind, any occurrence. They depend on
    the graph alone, so they are computed once per graph (``g.cache``): a what-if at 128 ranks
    then costs its replay, not ~1 s of grouping 4 M nodes."""
    if "operation_keys" in g.cache:
        return g.cache["operation_keys"]
    lanes = g.lanes.sort_values(["rank", "type", "tid"])
    lanes["ordinal"] = lanes.groupby(["rank", "type"]).cumcount()
    lane_key = np.full(int(g.lane.max()) + 2, -1)
    lane_key[lanes["lane"].to_numpy()] = pd.factorize(lanes["type"] + ":" + lanes["ordinal"].astype(str))[0]
    name = g.label.astype(np.int64)
    nxt = np.empty_like(name)
    nxt[:-1] = name[1:]
    nxt[-1] = -1
    same_lane = np.zeros(g.n, bool)
    same_lane[:-1] = (g.lane[1:] == g.lane[:-1]) & (g.lane[:-1] >= 0)
    name = np.where((g.kind == GAP) & same_lane, nxt, name)
    blank = pd.factorize(pd.Series(list(g.labels) + [""], dtype=object).str.replace(r"\d+", "#", regex=True))[0]
    df = pd.DataFrame({"lane": lane_key[g.lane], "label": name, "blank": blank[name], "kind": g.kind, "rank": g.rank})
    out = []
    for label in ("label", "blank"):
        df["occ"] = df.groupby(["rank", "lane", label, "kind"]).cumcount()
        out.append(df.groupby(["lane", label, "kind", "occ"], sort=False).ngroup().to_numpy(np.int64))
    out.append(df.groupby(["lane", "blank", "kind"], sort=False).ngroup().to_numpy(np.int64))
    g.cache["operation_keys"] = [(k, int(k.max()) + 1 if len(k) else 0) for k in out]
    return g.cache["operation_keys"]


def _reference_mask(g: Graph, reference) -> np.ndarray:
    """Per node: does its rank belong to the reference ranks (all ranks when None)?"""
    if reference is None:
        return g.rank >= 0
    ref = np.asarray(reference, dtype=bool)
    return (g.rank >= 0) & ref[np.clip(g.rank, 0, len(ref) - 1)]


def apply_plan(g: Graph, plan: dict, typical: np.ndarray | None = None) -> np.ndarray:
    """The durations after the plan's actions. ``typical``: precomputed all-rank typical
    durations (used by ``idealize`` actions whose reference is "all")."""
    dur = g.dur.copy()
    compute = np.isin(g.kind, [OP, GAP, KERNEL])
    comm = g.kind == POST
    for i, a in enumerate(plan["actions"]):
        m = _rank_mask(g, a.get("ranks", "all")) & _name_mask(g, a.get("ops"))
        _check_matches(g, i, a, m)
        if a["action"] == "idealize":
            ranks = a.get("ranks", "all")
            n_ranks = int(g.rank.max()) + 1
            subset = ranks != "all" and 0 < len(set(ranks) & set(range(n_ranks))) < len(np.unique(g.rank[g.rank >= 0]))
            if a.get("reference", "others" if subset else "all") == "others" and subset:
                ref = np.ones(n_ranks, bool)
                ref[[r for r in ranks if 0 <= r < n_ranks]] = False
                # a pipeline stage is compared with the ranks holding the same stage (its data-parallel
                # peers in the other replicas; typical_durations' roles): the other stages do other work
                typ = typical_durations(g, reference=ref)
                # ranks whose reference does the same work (not a pipeline; a stage's data-parallel
                # peers) take the reference's durations as they are
                role = _rank_roles(g)
                if role is None:
                    same_role = np.ones(g.n, bool)
                else:
                    peers = _role_peers(role, ref)
                    same_role = _rank_mask(g, [r for r in ranks if 0 <= r < len(peers) and peers[r]])
            else:
                if typical is None:
                    typical = typical_durations(g)
                typ = typical
                same_role = np.zeros(g.n, bool)     # a subset against every rank: never slower than it was
            sel = np.zeros(g.n, bool)
            if a.get("compute", True):
                sel |= compute
            if a.get("comm", True):
                sel |= comm
            m &= sel
            # "what if these ranks behaved like the others": never slower than they were (an op the
            # others ran longer -- a piece of a stage's work cut differently, another stage's role --
            # is not something idealising a slow rank would add); every rank: OSDI'25's mean
            if subset:
                exact = same_role & np.isin(g.kind, [OP, KERNEL])
                dur[m] = np.where(exact[m], typ[m], np.minimum(typ[m], dur[m]))
            else:
                dur[m] = typ[m]
        elif a["action"] == "scale":
            m &= compute
            if a.get("categories"):
                cats = np.isin(np.asarray(g.categories, dtype=object), a["categories"])
                m &= cats[g.category] if len(cats) else False
            dur[m] = np.rint(dur[m] * float(a["factor"])).astype(np.int64)
        elif a["action"] == "scale_comm":
            m &= comm
            if {"bandwidth", "latency"} & set(a):
                dur[m] = np.rint(dur[m] * _alpha_beta_factor(g, a, m)).astype(np.int64)
            else:
                dur[m] = np.rint(dur[m] * float(a["factor"])).astype(np.int64)
        else:
            raise TraceAnalyzerError(f"plan: action '{a['action']}' regenerates the step: use replay.run_plan")
    return dur


def _check_matches(g: Graph, i: int, a: dict, m: np.ndarray) -> None:
    """An action that matches nothing would be a silent no-op: refuse it, saying which part."""
    where = f"plan: action {i} ({a['action']})"
    ranks = a.get("ranks", "all")
    if ranks != "all":
        present = set(np.unique(g.rank[g.rank >= 0]).tolist())
        missing = sorted(set(ranks) - present)
        if missing:
            raise TraceAnalyzerError(f"{where}: rank(s) {', '.join(map(str, missing))} not in run '{g.run}' "
                                     f"(ranks {', '.join(map(str, sorted(present)))})")
    if a.get("ops") is not None:
        pats = [a["ops"]] if isinstance(a["ops"], str) else list(a["ops"])
        for p in pats:
            if not any(fnmatch.fnmatchcase(lbl, p) for lbl in g.labels):
                raise TraceAnalyzerError(f"{where}: \"ops\" pattern {p!r} matches no operation of run '{g.run}'")
    if a.get("categories"):
        unknown = sorted(set(a["categories"]) - set(g.categories))
        if unknown:
            raise TraceAnalyzerError(f"{where}: categories {', '.join(map(repr, unknown))} not in run '{g.run}' "
                                     f"(known: {', '.join(map(str, g.categories))})")
    if not m.any():
        raise TraceAnalyzerError(f"{where}: matches nothing in run '{g.run}' (no operation of those ranks and names)")


def _alpha_beta_factor(g: Graph, a: dict, m: np.ndarray) -> np.ndarray:
    """Per selected node: (alpha-term / latency + beta-term / bandwidth) / (alpha-term + beta-term)
    of its instance under the run's alpha-beta fit (1 where the fit has nothing for the op)."""
    from .alphabeta import fit, hops, wire
    if g.source is None:
        raise TraceAnalyzerError("scale_comm by bandwidth/latency needs the graph's store (build_graph)")
    ab = g.alphabeta if g.alphabeta is not None else fit(g.source, g.run)
    g.alphabeta = ab
    inst = g.instances.set_index("inst")
    idx = np.flatnonzero(m)
    rows = inst.reindex(g.inst[idx])
    out = np.ones(len(idx))
    lat, bw = float(a.get("latency", 1.0)), float(a.get("bandwidth", 1.0))
    for (op, is_p2p, n), sub in rows.groupby(["op", "is_p2p", "n_ranks"], dropna=False).indices.items():
        key = "send" if is_p2p else op   # alphabeta fits p2p under "send"
        try:
            alpha, beta = ab.params(key)
        except Exception:  # noqa: BLE001 - no fit for this op: leave its transfers as they are
            continue
        n = int(n) if n == n else 2
        at = alpha * hops(key, n)
        bt = beta * rows["bytes"].to_numpy(float)[sub] * wire(key, n)
        tot = at + bt
        out[sub] = np.where(tot > 0, (at / lat + bt / bw) / np.where(tot > 0, tot, 1), 1.0)
    return out
