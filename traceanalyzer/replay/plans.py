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
  communication transfer scaled.

Why durations only: the graph keeps every recorded dependency, so any duration change propagates
through waits, collectives and p2p the way the recorded run would have. Pipeline schedule changes
and DP bucket changes need new nodes and edges: not in this first slice.
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
            "scale_comm": {"factor", "ops", "ranks"}}


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
        if "factor" in _ACTIONS[a["action"]]:
            f = a.get("factor")
            if not isinstance(f, (int, float)) or isinstance(f, bool) or not f >= 0:
                raise TraceAnalyzerError(f"{where}: action {i} ({a['action']}): \"factor\" must be a number >= 0")
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


def typical_durations(g: Graph, reference: np.ndarray | None = None) -> np.ndarray:
    """Per node, the typical duration: compute = mean over ranks of the same operation (lane
    ordinal within the rank, name, k-th occurrence on that lane); communication = median over the
    members of the same collective / p2p instance of their own time after the last arrival.

    Why host gaps are keyed by the node that follows them: a gap has no name of its own, and the
    cut points that split a thread's time into gaps differ between ranks (a wait detected on one
    rank, not on another), so "the k-th gap" of two ranks is often not the same moment of the step;
    "the gap before the k-th `aten::as_strided`" is.

    ``reference``: a per-rank boolean mask (indexed by rank) of the ranks whose durations define
    "typical" (default: every rank). Operations that no reference rank ran keep their own duration."""
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
    is_gap = g.kind == GAP
    name = np.where(is_gap & same_lane, nxt, name)
    df = pd.DataFrame({"lane": lane_key[g.lane], "label": name, "kind": g.kind, "dur": g.dur, "rank": g.rank})
    df["occ"] = df.groupby(["rank", "lane", "label", "kind"]).cumcount()
    is_ref = _reference_mask(g, reference)
    key = ["lane", "label", "kind", "occ"]
    ref_mean = df[is_ref].groupby(key)["dur"].mean().rename("typ")
    typ = df[key].merge(ref_mean, left_on=key, right_index=True, how="left")["typ"].to_numpy()
    typ = np.rint(np.where(np.isnan(typ), g.dur, typ)).astype(np.int64)
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
        med = members[members["ref"]].groupby("inst")["member"].median()
        # never longer than the member's own (gloo's members finish at different times by design)
        typ_member = np.fmin(med.reindex(d["inst"]).to_numpy(), member.to_numpy())
        out[pi] = np.rint(share * typ_member).astype(np.int64)
    return out


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
    for a in plan["actions"]:
        m = _rank_mask(g, a.get("ranks", "all")) & _name_mask(g, a.get("ops"))
        if a["action"] == "idealize":
            ranks = a.get("ranks", "all")
            n_ranks = int(g.rank.max()) + 1
            subset = ranks != "all" and 0 < len(set(ranks) & set(range(n_ranks))) < len(np.unique(g.rank[g.rank >= 0]))
            if a.get("reference", "others" if subset else "all") == "others" and subset:
                ref = np.ones(n_ranks, bool)
                ref[[r for r in ranks if 0 <= r < n_ranks]] = False
                typ = typical_durations(g, reference=ref)
            else:
                if typical is None:
                    typical = typical_durations(g)
                typ = typical
            sel = np.zeros(g.n, bool)
            if a.get("compute", True):
                sel |= compute
            if a.get("comm", True):
                sel |= comm
            m &= sel
            dur[m] = typ[m]
        elif a["action"] == "scale":
            m &= compute
            if a.get("categories"):
                cats = np.isin(np.asarray(g.categories, dtype=object), a["categories"])
                m &= cats[g.category] if len(cats) else False
            dur[m] = np.rint(dur[m] * float(a["factor"])).astype(np.int64)
        else:  # scale_comm
            m &= comm
            dur[m] = np.rint(dur[m] * float(a["factor"])).astype(np.int64)
    return dur
