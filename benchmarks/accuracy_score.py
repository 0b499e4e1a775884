"""Scoring of the accuracy benchmark (``benchmarks/accuracy.py``), shared with tests/test_accuracy.py.

Input per run: a *doc* -- the run's report (``report.report_dict(...)["runs"][0]``), its measured and
identity-replayed job step (``measured_step_ns``, ``identity_step_ns``: per rank the mean step, the
slowest rank, as ``replay.simulate.job_step_ns``), the manifest's ``ground_truth`` and, for a fault
run, ``whatif`` (the replay of "idealise the culprit's ranks": ``identity_step_ns``, ``predicted_step_ns``).

Scores (targets from issue 14):

* detection: the injected culprit (rank / stage / worker; for a run without overlap the exposed
  communication) is the **first** finding, and its recoverable time is within ``MAGNITUDE_TOL`` of
  the injected delay's effect on the step, T_fault - T_clean (the clean twin measured the same way);
* false findings: findings on clean runs (target 0; every recording of a clean run is reported),
  and ranks that only waited for the culprit named as culprits (straggler / imbalance / slow stage
  findings on other ranks; target 0). A *structural* finding (issue 14 part 3: "stage S holds the
  loss", labelled as such, never a slow stage) on a clean pipeline is not a false finding when the
  stage it names is heavier by construction -- the last stage (the workload's head and loss, see
  ``workloads/models.stage_module``) or a stage with more layers than the others
  (``layers_per_stage``); any other structural finding is counted as false;
* a fault whose measured effect T_fault - T_clean is within the clean twin's own run-to-run range
  (``spread x T_clean``) had *no measurable effect* on that recording: nothing can say what a
  finding should have claimed, so detection and magnitude are not scored there (listed, and counted
  apart); the what-if and S still are;
* what-if: the "idealise the culprit" predicted step against the clean twin's measured step, within
  max(``WHATIF_MIN_TOL``, 2 x the clean twin's run-to-run spread); S = T/T_ideal (identity replay over
  the prediction) within ``SLOWDOWN_TOL`` of the measured slowdown T_fault / T_clean;
* structural plans (schedule, micro-batches, buckets): predicted step against the real re-run (the median
  of the predictions from every recording of the run against the median of the re-run's recordings).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

MAGNITUDE_TOL = 0.30    # detection: |recoverable - (T_fault - T_clean)| / (T_fault - T_clean)
WHATIF_MIN_TOL = 0.10   # what-if: at least this relative error allowed ...
SPREAD_FACTOR = 2.0     # ... or this many times the clean twin's run-to-run spread
SLOWDOWN_TOL = 0.10     # S within this fraction of the measured slowdown
RANK_KINDS = ("straggler", "imbalance", "slow_stage")
HOST_KINDS = ("slow_host",)     # the machine, not the job: counted apart on clean runs, as a victim on fault runs


@dataclass
class Truth:
    kind: str                     # slow_rank, slow_stage, slow_worker, imbalance, routing_skew, seqlen_imbalance, no_overlap, slow_host
    ranks: list = field(default_factory=list)   # the ranks to idealise (global)
    stage: int | None = None
    injected_ms: float | None = None
    analysis: str = ""            # the analysis expected to find it (table row)


def plain(v):
    """JSON-safe copy (numpy scalars to Python, NaN to None)."""
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, np.ndarray)):
        return [plain(x) for x in v]
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return None if math.isnan(v) or math.isinf(v) else float(v)
    return v


def truth(gt: dict) -> Truth | None:
    """The injected culprit of a run from its manifest's ground truth (None: a clean run). Reads
    ``faults`` (written by the workloads since issue 14) and, for older manifests, the flat keys."""
    wl = gt.get("workload", "")
    faults = list(gt.get("faults") or [])
    if not faults and "faults" not in gt:      # older manifests: the flat keys
        if gt.get("slow_stages"):
            faults.append({"kind": "slow_stage", "stage": gt.get("slow_stage"), "rank": gt["slow_stages"][0],
                           "injected_ms": gt.get("slow_ms", 0) * gt.get("microbatches", 1)})
        elif gt.get("slow_rank") is not None:
            faults.append({"kind": "slow_rank", "rank": gt["slow_rank"], "injected_ms": gt.get("slow_ms")})
        if gt.get("imbalance_rank") is not None:
            faults.append({"kind": "imbalance", "rank": gt["imbalance_rank"]})
        if gt.get("skew_rank") is not None:
            faults.append({"kind": "routing_skew", "rank": gt["skew_rank"]})
    if not faults:
        return Truth("no_overlap", analysis="exposed comm") if gt.get("overlap") is False else None
    f = faults[0]
    ranks = [int(r) for r in f.get("ranks", [f["rank"]])] if f.get("rank") is not None else []
    if wl == "pipeline":
        analysis = "pp x dp (slow worker)" if f["kind"] == "slow_worker" else "pipeline (slow stage/rank)"
    else:
        analysis = {"slow_rank": "straggler", "imbalance": "imbalance", "seqlen_imbalance": "imbalance",
                    "routing_skew": "moe routing", "slow_host": "slow host"}.get(f["kind"], f["kind"])
    if gt.get("slow_spin"):     # the delay busy-waits (the rank's own code; its core kept busy), not asleep
        analysis += " (busy-waiting)"
    return Truth(f["kind"], ranks, f.get("stage"), f.get("injected_ms"), analysis)


def names_culprit(f: dict, t: Truth) -> bool:
    if t.kind == "no_overlap":
        return f["kind"] == "exposed_comm"
    kinds = HOST_KINDS if t.kind == "slow_host" else RANK_KINDS    # a sleep is no slow host, nor the reverse
    return f["kind"] in kinds and f.get("rank") is not None and int(f["rank"]) in t.ranks


def victims_named(findings: list, t: Truth | None) -> list:
    """Rank findings (straggler, imbalance, slow stage, slow host) that name a rank other than the culprit's."""
    culprits = set(t.ranks) if t else set()
    return [int(f["rank"]) for f in findings
            if f["kind"] in RANK_KINDS + HOST_KINDS and f.get("rank") is not None and int(f["rank"]) not in culprits]


def _rel(a, b):
    return abs(a - b) / abs(b) if a is not None and b not in (None, 0) else None


def spread(docs: list) -> float | None:
    """Run-to-run spread of the measured job step of repeats of one clean run: (max - min) / median."""
    xs = [d["measured_step_ns"] for d in docs if d.get("measured_step_ns")]
    return (max(xs) - min(xs)) / float(np.median(xs)) if len(xs) >= 2 else None


def measurable(effect, t_clean, sp) -> bool:
    """Did the fault measurably slow the step: its effect beyond the clean twin's own range?"""
    if effect is None or effect <= 0:
        return False
    return sp is None or effect > sp * t_clean


def score_fault(doc: dict, clean: list, t: Truth) -> dict:
    """One fault run against its clean twin (``clean``: the twin's docs, repeats included)."""
    findings = doc["report"]["findings"]
    t_fault = doc["measured_step_ns"]
    t_clean = float(np.median([d["measured_step_ns"] for d in clean])) if clean else None
    effect = t_fault - t_clean if t_clean is not None else None
    sp = spread(clean)
    first = findings[0] if findings else None
    detected = first is not None and names_culprit(first, t)
    mine = [f for f in findings if names_culprit(f, t)]
    magnitude = mine[0]["recoverable_ns_per_step"] if mine else 0.0
    mag_err = _rel(magnitude, effect) if effect and effect > 0 else None
    tol = max(WHATIF_MIN_TOL, SPREAD_FACTOR * sp) if sp is not None else WHATIF_MIN_TOL
    w = doc.get("whatif") or {}
    pred, ident = w.get("predicted_step_ns"), w.get("identity_step_ns")
    whatif_err = _rel(pred, t_clean)
    s_pred = ident / pred if pred and ident else None
    s_meas = t_fault / t_clean if t_clean else None
    s_err = _rel(s_pred, s_meas)
    return {"run": doc["run"], "analysis": t.analysis, "kind": t.kind, "culprit_ranks": t.ranks,
            "injected_ms": t.injected_ms, "t_fault_ms": t_fault / 1e6, "t_clean_ms": t_clean / 1e6 if t_clean else None,
            "effect_ms": effect / 1e6 if effect is not None else None,
            "first": f"{first['kind']} r{first.get('rank')}" if first else "-", "detected": detected,
            "measurable": measurable(effect, t_clean, sp),
            "magnitude_ms": magnitude / 1e6, "magnitude_err": mag_err,
            "magnitude_ok": bool(detected and mag_err is not None and mag_err <= MAGNITUDE_TOL),
            "victims": victims_named(findings, t), "n_findings": len(findings),
            "predicted_ms": pred / 1e6 if pred else None, "whatif_err": whatif_err, "whatif_tol": tol,
            "whatif_ok": bool(whatif_err is not None and whatif_err <= tol),
            "s_pred": s_pred, "s_meas": s_meas, "s_err": s_err, "s_ok": bool(s_err is not None and s_err <= SLOWDOWN_TOL)}


def structural_as_built(f: dict, gt: dict) -> bool:
    """A structural finding whose stage is heavier by construction (see the module's docstring)."""
    if f["kind"] != "structural" or gt.get("workload") != "pipeline" or f.get("stage") is None:
        return False
    n, layers, stage = gt.get("n_stages"), gt.get("layers_per_stage") or [], int(f["stage"])
    if n is not None and stage == int(n) - 1:
        return True
    return stage < len(layers) and layers[stage] > float(np.median(layers))


def score_clean(doc: dict) -> dict:
    fs = doc["report"]["findings"]
    gt = doc.get("ground_truth", {})
    built = [f for f in fs if structural_as_built(f, gt)]
    host = [f for f in fs if f["kind"] in HOST_KINDS]
    false = [f for f in fs if f not in built and f not in host]
    return {"run": doc["run"], "n_findings": len(false), "n_structural": len(built), "n_host": len(host),
            "findings": [f"{f['kind']} r{f.get('rank')} {f['recoverable_ns_per_step'] / 1e6:.1f}ms"
                         + (" (as built)" if f in built else " (host)" if f in host else "") for f in fs],
            "step_ms": doc["measured_step_ns"] / 1e6}


def score_corpus(docs: dict, twins: dict, not_clean=(), structural=()) -> dict:
    """Every score of a corpus. ``docs``: run name -> doc (repeats of run X are named ``X_ri``; each
    repeat of a fault run is scored on its own);
    ``twins``: case name -> its clean twin (None for clean cases)."""
    def repeats(name):
        return [d for n, d in docs.items() if re.fullmatch(re.escape(name) + r"(_r\d+)?", n)]
    faults, clean, spreads = [], [], {}
    for name, twin in twins.items():
        if name not in docs:
            continue
        if twin is None:
            spreads[name] = spread(repeats(name))
            if name not in not_clean:
                clean += [score_clean(d) for d in repeats(name) if "report" in d]
            continue
        for d in repeats(name):   # every recording of the fault, each against the twin's repeats
            t = truth(d.get("ground_truth", {}))
            if t is not None and "report" in d:
                faults.append(score_fault(d, repeats(twin), t))
    plans = []
    for p in structural:
        if "error" in p:
            plans.append({**p, "err": None})
        else:
            plans.append({**p, "err": _rel(p["predicted_step_ns"], p["measured_step_ns"])})
    return {"faults": faults, "clean": clean, "spreads": spreads, "structural": plans, "summary": summary(faults, clean)}


def summary(faults: list, clean: list) -> dict:
    """Per analysis and overall: fractions met; ``score``: the mean of the overall fractions (1 = every target met)."""
    out = {}
    groups = sorted({f["analysis"] for f in faults}) + ["overall"]
    for g in groups:
        fs = [f for f in faults if g == "overall" or f["analysis"] == g]
        n = len(fs)
        m = [f for f in fs if f.get("measurable", True)]   # detection and magnitude: measurable effects only
        out[g] = {"cases": n, "measurable": len(m), "detected": sum(f["detected"] for f in m),
                  "magnitude_ok": sum(f["magnitude_ok"] for f in m),
                  "victims": sum(len(f["victims"]) for f in fs), "whatif_ok": sum(f["whatif_ok"] for f in fs),
                  "s_ok": sum(f["s_ok"] for f in fs),
                  "worst_whatif_err": max((f["whatif_err"] for f in fs if f["whatif_err"] is not None), default=None)}
    o = out["overall"]
    n, nm = max(o["cases"], 1), max(o["measurable"], 1)
    clean_ok = sum(c["n_findings"] == 0 for c in clean)
    o.update(clean_runs=len(clean), clean_with_findings=len(clean) - clean_ok,
             clean_findings=sum(c["n_findings"] for c in clean),
             clean_structural=sum(c.get("n_structural", 0) for c in clean),
             clean_host=sum(c.get("n_host", 0) for c in clean),
             clean_with_any=sum(c["n_findings"] + c.get("n_host", 0) > 0 for c in clean))
    parts = [o["detected"] / nm, o["magnitude_ok"] / nm, o["whatif_ok"] / n, o["s_ok"] / n,
             max(0.0, 1.0 - o["victims"] / n), clean_ok / max(len(clean), 1)]
    o["score"] = float(np.mean(parts))
    return out


def _pct(x):
    return "n/a" if x is None else f"{100 * x:.0f} %"


def _ms(x):
    return "n/a" if x is None else f"{x:.1f}"


def _x(x):
    return "n/a" if x is None else f"{x:.2f}"


def render(s: dict) -> str:
    """The Markdown tables for RESULTS.md."""
    su = s["summary"]
    o = su["overall"]
    lines = [f"Overall score {o['score']:.2f} (mean of the fractions met; 1 = every target met). Targets: culprit "
             f"first 100 %, magnitude within ±{MAGNITUDE_TOL:.0%} of T_fault − T_clean, 0 victims named, 0 findings "
             f"on clean runs, what-if within max({WHATIF_MIN_TOL:.0%}, {SPREAD_FACTOR:g} × spread), S within "
             f"{SLOWDOWN_TOL:.0%}.", "",
             "Culprit first and magnitude are scored over the recordings whose fault measurably slowed the step "
             "(effect beyond the clean twin's run-to-run range); the others are marked 'no effect' below.", "",
             "| analysis | fault runs | measurable | culprit first | magnitude ±30 % | victims named | what-if in tol | "
             "worst what-if err | S ±10 % |",
             "|---|---|---|---|---|---|---|---|---|"]
    for g, r in su.items():
        m = r.get("measurable", r["cases"])
        lines.append(f"| {g} | {r['cases']} | {m} | {r['detected']}/{m} | {r['magnitude_ok']}/{m} | "
                     f"{r['victims']} | {r['whatif_ok']}/{r['cases']} | {_pct(r['worst_whatif_err'])} | {r['s_ok']}/{r['cases']} |")
    lines.append("| target | | | 100 % | 100 % | 0 | 100 % | | 100 % |")
    lines += ["", f"Clean runs (every recording): {o['clean_runs']}, with false findings: {o['clean_with_findings']} "
                  f"(target 0), false findings in all: {o['clean_findings']}; structural findings on a stage heavier "
                  f"by construction (not counted as false): {o.get('clean_structural', 0)}; slow-host findings (the "
                  f"recording machine's core, measured, not the job; not counted as false): {o.get('clean_host', 0)}; "
                  f"clean runs with any finding at all, these included: {o.get('clean_with_any', 0)}.", "",
              "| fault run | truth | T_fault / T_clean ms | effect ms | first finding | magnitude ms (err) | victims | "
              "what-if ms (err / tol) | S pred / meas |", "|---|---|---|---|---|---|---|---|---|"]
    for f in s["faults"]:
        lines.append(f"| {f['run']} | {f['kind']} r{','.join(map(str, f['culprit_ranks']))} | {_ms(f['t_fault_ms'])} / "
                     f"{_ms(f['t_clean_ms'])} | {_ms(f['effect_ms'])}{'' if f.get('measurable', True) else ' (no effect)'} | "
                     f"{f['first']}{' ✓' if f['detected'] else ' ✗'} | "
                     f"{_ms(f['magnitude_ms'])} ({_pct(f['magnitude_err'])}) | {f['victims'] or '-'} | "
                     f"{_ms(f['predicted_ms'])} ({_pct(f['whatif_err'])} / {_pct(f['whatif_tol'])}) | "
                     f"{_x(f['s_pred'])} / {_x(f['s_meas'])} |")
    lines += ["", "| clean run | step ms | findings |", "|---|---|---|"]
    for c in s["clean"]:
        lines.append(f"| {c['run']} | {c['step_ms']:.1f} | {'; '.join(c['findings']) or '0'} |")
    sp = {k: v for k, v in s["spreads"].items() if v is not None}
    if sp:
        lines += ["", "Run-to-run spread of the clean runs' measured step ((max − min) / median of the repeats): "
                  + ", ".join(f"{k} {_pct(v)}" for k, v in sp.items())
                  + f"; median {_pct(float(np.median(list(sp.values()))))}, max {_pct(max(sp.values()))}."]
    if s["structural"]:
        lines += ["", "| structural plan | on run | real re-run | predicted ms | measured ms | err |", "|---|---|---|---|---|---|"]
        n = (lambda p, k: f" (median of {p[k]})" if p.get(k, 1) > 1 else "")
        for p in s["structural"]:
            plan = ", ".join(f"{k}={v}" for k, v in p["plan"].items())
            if p.get("error"):
                lines.append(f"| {plan} | {p['run']} | {p['target']} | failed: {p['error'][:80]} | | |")
            else:
                lines.append(f"| {plan} | {p['run']} | {p['target']} | {p['predicted_step_ns'] / 1e6:.1f}{n(p, 'n_runs')} | "
                             f"{p['measured_step_ns'] / 1e6:.1f}{n(p, 'n_targets')} | {_pct(p['err'])} |")
    return "\n".join(lines) + "\n"
