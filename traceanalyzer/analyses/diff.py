"""Compare two runs (A = baseline, B = the other): what changed, ranked by its impact on the step.

    d = diff_runs("store", run_a="ddp_gloo_4rank", run_b="ddp_gloo_4rank_slow2")   # or two stores
    d.changes.head()                                                # ranked causes
    print(d.text())

Everything is per step (per rank and step, or the median over steps), so runs of different length
compare. Changes are of two sorts, kept apart because they must not be ranked together:

* **causes**, ranked by impact (ns per step, B - A): each rank's *own time* (compute, memory
  traffic and idle time of the rank itself: the step minus the communication it sat in, so a rank
  that waits longer for a slower peer does not look slower), every operator/kernel (time and
  count per rank and step; annotations included, so ``DistributedDataParallel.forward`` shows a
  sleep inside it), every collective by (op, process group, bytes) with its *transfer* time (waits
  for late peers excluded) and p2p ops by (op, peer, bytes); an op or collective present on one
  side only is *added* or *removed*;
* **effects**: step time per rank and the temporal breakdown (compute / exposed communication /
  memory / idle) -- they show how much the causes cost, and waiting shows up there.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..errors import TraceAnalyzerError
from ..store.runs import resolve_run
from .params import default

#: Kinds of events compared as operators: the work a rank does itself (communication executions
#: are compared as collectives, where waiting can be told apart from transfer).
OP_KINDS = ("cpu_op", "annotation", "compute_kernel", "memcpy", "memset", "gpu_annotation")

#: A change smaller than this (ns per step) is noise on a shared machine and is not listed
#: (setting diff_min_impact_ns).
MIN_IMPACT_NS = default("diff_min_impact_ns")

_CHANGE_COLS = ["kind", "what", "rank", "a", "b", "delta_ns", "delta_pct_of_step", "detail"]


@dataclass
class RunProfile:
    """What is compared, for one run (all values per step; ns)."""
    store: str
    run: str
    step_ns: float                      # median over steps of the median over ranks
    rank_steps: pd.DataFrame            # rank, step_ns, own_ns, comm_ns (medians over steps)
    breakdown: pd.Series                # compute_ns, comm_ns, memory_ns, idle_ns (median step, mean over ranks)
    ops: pd.DataFrame                   # rank, kind, name, count, total_ns (per step)
    collectives: pd.DataFrame           # op, pg, bytes, count (per step), transfer_ns (median)
    p2p: pd.DataFrame                   # op, peer, bytes, count (per step), dur_ns (median)


@dataclass
class Diff:
    a: RunProfile
    b: RunProfile
    changes: pd.DataFrame               # causes, ranked by |delta_ns| (columns: _CHANGE_COLS)
    effects: pd.DataFrame               # step time and breakdown (same columns)
    params: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        def recs(df):
            return json.loads(df.to_json(orient="records"))
        return {"a": {"store": self.a.store, "run": self.a.run, "step_ms": self.a.step_ns / 1e6},
                "b": {"store": self.b.store, "run": self.b.run, "step_ms": self.b.step_ns / 1e6},
                "step_delta_ms": (self.b.step_ns - self.a.step_ns) / 1e6,
                "changes": recs(self.changes), "effects": recs(self.effects)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def text(self, top: int = 15) -> str:
        a, b = self.a, self.b
        d = b.step_ns - a.step_ns
        lines = [f"A: run '{a.run}' ({a.store})", f"B: run '{b.run}' ({b.store})",
                 f"step time: {_ms(a.step_ns)} -> {_ms(b.step_ns)} ({_signed_ms(d)}, {_pct(100 * d / a.step_ns)}) "
                 f"(median over steps of the median over ranks)", "",
                 f"what changed, ranked by impact on the step (top {top}); how much: B - A in ms per step, and in % of "
                 f"A's median step ({_ms(a.step_ns)}):"]
        for i, c in enumerate(self.changes.head(top).itertuples(), start=1):
            lines.append(f"{i:3d}. {c.what}: {c.detail}; {_signed_ms(c.delta_ns)} per step ({_pct(c.delta_pct_of_step)})")
        if self.changes.empty:
            lines.append("     nothing above the noise floor")
        lines += ["", "effects (where the step time went):"]
        for c in self.effects.itertuples():
            lines.append(f"     {c.what}: {_ms(c.a)} -> {_ms(c.b)} ({_signed_ms(c.delta_ns)})")
        return "\n".join(lines)


def _ms(ns) -> str:
    return "unknown" if ns is None or pd.isna(ns) else f"{ns / 1e6:.2f} ms"


def _signed_ms(ns) -> str:
    return "unknown" if ns is None or pd.isna(ns) else f"{ns / 1e6:+.2f} ms"


def _pct(v) -> str:
    return "% unknown" if v is None or pd.isna(v) or np.isinf(v) else f"{v:+.1f}%"


# -- one run -------------------------------------------------------------------------------------

def profile(con, store: str, run: str) -> RunProfile:
    """Read what :func:`diff_runs` compares for ``run`` (the analyses' SQL views must be loaded)."""
    q = {"run": run}
    rs = con.execute("""
        WITH tb AS (SELECT rank, step, compute_ns + memory_ns + idle_ns AS own_ns, comm_ns
                    FROM temporal_breakdown WHERE run = $run AND step IS NOT NULL)
        SELECT s.rank, median(s.dur_ns) AS step_ns, median(tb.own_ns) AS own_ns, median(tb.comm_ns) AS comm_ns
        FROM steps s LEFT JOIN tb USING (rank, step) WHERE s.run = $run GROUP BY s.rank ORDER BY s.rank""", q).df()
    if rs.empty:
        raise TraceAnalyzerError(f"{store}: run '{run}' has no ProfilerStep ranges; nothing to compare per step")
    step_ns = float(con.execute("SELECT median(m) FROM (SELECT step, median(dur_ns) AS m FROM steps WHERE run = $run "
                                "GROUP BY step)", q).fetchone()[0])
    n = float(con.execute("SELECT count(*) FROM steps WHERE run = $run", q).fetchone()[0])  # rank-steps
    bd = con.execute("""SELECT median(c) AS compute_ns, median(x) AS comm_ns, median(m) AS memory_ns, median(i) AS idle_ns
                        FROM (SELECT step, avg(compute_ns) AS c, avg(comm_ns) AS x, avg(memory_ns) AS m, avg(idle_ns) AS i
                              FROM temporal_breakdown WHERE run = $run AND step IS NOT NULL GROUP BY step)""", q).df().iloc[0]
    steps_per_rank = con.execute("SELECT rank, count(*) AS n FROM steps WHERE run = $run GROUP BY rank", q).df()
    ops = con.execute(f"""SELECT rank, kind, name, count(*) AS count, sum(dur_ns) AS total_ns FROM events
                          WHERE run = $run AND step IS NOT NULL AND kind IN {OP_KINDS} GROUP BY ALL""", q).df()
    ops = ops.merge(steps_per_rank, on="rank")
    ops["count"], ops["total_ns"] = ops["count"] / ops["n"], ops["total_ns"] / ops["n"]
    coll = con.execute("""SELECT op, pg, coalesce(bytes, -1) AS bytes, count(*) AS n, median(transfer_ns) AS transfer_ns
                          FROM collective_instances WHERE run = $run AND step IS NOT NULL GROUP BY ALL""", q).df()
    n_steps = float(con.execute("SELECT count(DISTINCT step) FROM steps WHERE run = $run", q).fetchone()[0])
    coll["count"] = coll["n"] / max(n_steps, 1.0)
    p2p = con.execute("""SELECT op, peer_rank AS peer, coalesce(in_bytes, out_bytes, -1) AS bytes, count(*) AS n,
                                median(dur_ns) AS dur_ns
                         FROM comms WHERE run = $run AND is_p2p AND step IS NOT NULL GROUP BY ALL""", q).df()
    p2p["count"] = p2p["n"] / max(n, 1.0)
    return RunProfile(store, run, step_ns, rs, bd, ops.drop(columns="n"), coll.drop(columns="n"), p2p.drop(columns="n"))


# -- comparing -----------------------------------------------------------------------------------

def _row(kind, what, rank, a, b, delta, step_ns, detail) -> dict:
    return dict(kind=kind, what=what, rank=rank, a=a, b=b, delta_ns=float(delta),
                delta_pct_of_step=100.0 * float(delta) / step_ns if step_ns else np.nan, detail=detail)


def _rank_changes(a: RunProfile, b: RunProfile) -> list[dict]:
    m = a.rank_steps.merge(b.rank_steps, on="rank", suffixes=("_a", "_b"))
    return [_row("rank_own_time", f"rank {int(r.rank)} own time", int(r.rank), r.own_ns_a, r.own_ns_b,
                 r.own_ns_b - r.own_ns_a, a.step_ns,
                 f"compute, memory and idle time of the rank itself {_ms(r.own_ns_a)} -> {_ms(r.own_ns_b)} per step")
            for r in m.itertuples() if pd.notna(r.own_ns_a) and pd.notna(r.own_ns_b)]


def _op_changes(a: RunProfile, b: RunProfile) -> list[dict]:
    """Per op: the change of its time per step, mean over the ranks of both runs, and the rank
    where it changed most."""
    m = a.ops.merge(b.ops, on=["rank", "kind", "name"], how="outer", suffixes=("_a", "_b")).fillna(
        {"count_a": 0.0, "count_b": 0.0, "total_ns_a": 0.0, "total_ns_b": 0.0})
    m["d"] = m["total_ns_b"] - m["total_ns_a"]
    n_ranks = max(len(set(a.rank_steps["rank"]) | set(b.rank_steps["rank"])), 1)
    out = []
    for (kind, name), g in m.groupby(["kind", "name"], sort=False):
        delta = g["d"].sum() / n_ranks
        ta, tb = g["total_ns_a"].sum() / n_ranks, g["total_ns_b"].sum() / n_ranks
        ca, cb = g["count_a"].sum() / n_ranks, g["count_b"].sum() / n_ranks
        top = g.loc[g["d"].abs().idxmax()]
        status = "added" if ca == 0 else "removed" if cb == 0 else "changed"
        out.append(_row(f"op_{status}", f"{kind} {name}", int(top["rank"]), ta, tb, delta, a.step_ns,
                        f"{_ms(ta)} -> {_ms(tb)} per rank and step, {ca:.1f} -> {cb:.1f} calls; most on rank "
                        f"{int(top['rank'])} ({_signed_ms(top['d'])})"))
    return out


def _collective_changes(a: RunProfile, b: RunProfile) -> list[dict]:
    out = []
    keys = ["op", "pg", "bytes"]
    m = a.collectives.merge(b.collectives, on=keys, how="outer", suffixes=("_a", "_b"))
    for r in m.itertuples():
        ca, cb = (0.0 if pd.isna(r.count_a) else r.count_a), (0.0 if pd.isna(r.count_b) else r.count_b)
        ta = 0.0 if pd.isna(r.transfer_ns_a) else r.transfer_ns_a
        tb = 0.0 if pd.isna(r.transfer_ns_b) else r.transfer_ns_b
        status = "added" if ca == 0 else "removed" if cb == 0 else "changed"
        size = "?" if r.bytes < 0 else f"{int(r.bytes)} B"
        out.append(_row(f"collective_{status}", f"{r.op} pg {r.pg} {size}", None, ca * ta, cb * tb,
                        cb * tb - ca * ta, a.step_ns,
                        f"{ca:.1f} -> {cb:.1f} per step, transfer {_ms(ta)} -> {_ms(tb)} (waits excluded)"))
    keys = ["op", "peer", "bytes"]
    m = a.p2p.merge(b.p2p, on=keys, how="outer", suffixes=("_a", "_b"))
    for r in m.itertuples():
        ca, cb = (0.0 if pd.isna(r.count_a) else r.count_a), (0.0 if pd.isna(r.count_b) else r.count_b)
        if ca and cb and abs(cb - ca) < 1e-9:
            continue  # same p2p traffic: its duration is mostly waiting for the peer (see the effects)
        dur = r.dur_ns_b if cb else r.dur_ns_a
        status = "added" if ca == 0 else "removed" if cb == 0 else "changed"
        out.append(_row(f"p2p_{status}", f"{r.op} peer {r.peer} {int(r.bytes)} B", None, ca, cb, (cb - ca) * dur,
                        a.step_ns, f"{ca:.1f} -> {cb:.1f} per rank and step"))
    return out


def _effects(a: RunProfile, b: RunProfile) -> pd.DataFrame:
    rows = [_row("step", "step time (median)", None, a.step_ns, b.step_ns, b.step_ns - a.step_ns, a.step_ns, "")]
    names = {"compute_ns": "compute", "comm_ns": "exposed communication (incl. waiting for peers)",
             "memory_ns": "memory", "idle_ns": "idle"}
    for k, label in names.items():
        va, vb = float(a.breakdown.get(k, np.nan)), float(b.breakdown.get(k, np.nan))
        rows.append(_row("breakdown", f"{label} per step (mean over ranks)", None, va, vb, vb - va, a.step_ns, ""))
    m = a.rank_steps.merge(b.rank_steps, on="rank", suffixes=("_a", "_b"))
    for r in m.itertuples():
        rows.append(_row("rank_step", f"rank {int(r.rank)} step time", int(r.rank), r.step_ns_a, r.step_ns_b,
                         r.step_ns_b - r.step_ns_a, a.step_ns, ""))
        if pd.notna(r.comm_ns_a) and pd.notna(r.comm_ns_b):
            rows.append(_row("rank_comm", f"rank {int(r.rank)} exposed communication", int(r.rank), r.comm_ns_a,
                             r.comm_ns_b, r.comm_ns_b - r.comm_ns_a, a.step_ns, ""))
    return pd.DataFrame(rows, columns=_CHANGE_COLS)


def compare(a: RunProfile, b: RunProfile, min_impact_ns: float = MIN_IMPACT_NS) -> Diff:
    rows = _rank_changes(a, b) + _op_changes(a, b) + _collective_changes(a, b)
    ch = pd.DataFrame(rows, columns=_CHANGE_COLS)
    ch = ch[ch["delta_ns"].abs() >= min_impact_ns]
    ch = ch.reindex(ch["delta_ns"].abs().sort_values(ascending=False, kind="stable").index).reset_index(drop=True)
    return Diff(a, b, ch, _effects(a, b), {"min_impact_ns": min_impact_ns})


def diff_runs(store_a: str | os.PathLike, store_b: str | os.PathLike | None = None, run_a: str | None = None,
              run_b: str | None = None, min_impact_ns: float = MIN_IMPACT_NS) -> Diff:
    """Compare run ``run_a`` of ``store_a`` with ``run_b`` of ``store_b`` (default: the same store)."""
    from . import connect, prepare
    same = store_b is None or os.path.abspath(str(store_b)) == os.path.abspath(str(store_a))  # str: a URL too
    con_a = connect(store_a)
    con_b = con_a if same else connect(store_b)
    try:
        ra = resolve_run(con_a, run_a, where=store_a, flag="--run-a")
        rb = resolve_run(con_b, run_b, where=store_b or store_a, flag="--run-b")
        if same and ra == rb:
            raise TraceAnalyzerError(f"diff: A and B are the same run '{ra}'; give --run-a and --run-b")
        for con in {id(con_a): con_a, id(con_b): con_b}.values():
            prepare(con, views=["temporal_breakdown", "collective_instances"])
        pa, pb = profile(con_a, str(store_a), ra), profile(con_b, str(store_b or store_a), rb)
    finally:
        con_a.close()
        if not same:
            con_b.close()
    return compare(pa, pb, min_impact_ns)
