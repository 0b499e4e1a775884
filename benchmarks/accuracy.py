"""Accuracy benchmark: do the report's findings and the replay's what-ifs match the ground truth?

Records a corpus of real runs of our own workloads (torchrun, gloo, CPU; the faults each run injected
are in its manifest's ``ground_truth["faults"]``), each fault run with a clean twin recorded the same
way, then per run: ingest -> report (``traceanalyzer.report``, its JSON document) -> replay
("idealise the culprit", and structural plans against real re-runs), and scores the lot with
``benchmarks/accuracy_score.py`` (per analysis and overall, targets beside them; see that module).

    PYTHONPATH=$PWD python benchmarks/accuracy.py --corpus /tmp/acc_corpus            # record what is missing, score
    PYTHONPATH=$PWD python benchmarks/accuracy.py --corpus DIR --only 'pp*' --no-append
    PYTHONPATH=$PWD python benchmarks/accuracy.py --corpus DIR --record-only

The corpus folder is a cache: runs already recorded there (``DIR/runs/NAME/manifest.json``) are
reused; ``DIR/analysis-CACHE/reports/NAME.json`` caches each run's report and replay numbers (``--cache NAME``:
a fresh cache re-analyses every run, e.g. after changing the analyses). Clean runs are recorded ``--repeats`` times
(``NAME``, ``NAME_r1``, ...) to measure the run-to-run spread the what-if target is relative to; fault runs
``--fault-repeats`` times, each repeat scored on its own against the twin (one recording of a fault is one
draw of the machine's noise: a score over several shows what is the analysis and what was that draw).
Results are appended to ``benchmarks/RESULTS.md`` with the command and the machine.

Record on a quiet machine: a recording is one draw of the host's noise, and on 2 cores another
job's CPU, cache or disk traffic slows whole recordings (session 18: the same clean 4-rank pipeline
ran 38 ms and 63 ms a step in two recordings). Session 18's corpus was recorded with the recorder at
nice -15 and every other process at nice 19 (autogroup scheduling off, so that nice applies across
sessions); the analyses, which do not depend on load, ran beside other work.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import platform
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import accuracy_score as sc  # noqa: E402
import harness  # noqa: E402  (RESULTS.md: benchmarks/harness.py)

from traceanalyzer.workloads.launch import LaunchError, launch  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
LAUNCH_TIMEOUT_S = 300
PP = ["pipeline", "--microbatches", "8"]
PPDP = ["pipeline", "--schedule", "1f1b", "--microbatches", "4", "--dp", "2"]
MOE = ["moe", "--tokens", "256", "--ffn-mult", "32"]
#: Every recording profiles 8 steps (the workloads' default is 3): one recording's mean step is then
#: less one draw of this machine's noise (session 17: a clean 2-rank MoE run's 3 steps spread 16-46 ms).
PROFILE = ["--steps", "11", "--prof-active", "8"]


@dataclass
class Case:
    name: str
    nproc: int
    args: list
    twin: str | None = None      # the clean twin of a fault run (None: this is a clean run)


#: The corpus. Delays are sized to stand well above the run-to-run spread of 2-8 ranks on 2 cores.
CASES = [
    Case("ddp2", 2, ["ddp"]), Case("ddp4", 4, ["ddp"]), Case("ddp8", 8, ["ddp"]),
    Case("ddp4_slow2", 4, ["ddp", "--slow-rank", "2", "--slow-ms", "20"], "ddp4"),
    Case("ddp8_slow5", 8, ["ddp", "--slow-rank", "5", "--slow-ms", "40"], "ddp8"),
    Case("ddp2_imb1", 2, ["ddp", "--imbalance-rank", "1", "--imbalance-factor", "3"], "ddp2"),
    Case("ddp2_nooverlap", 2, ["ddp", "--no-overlap"], "ddp2"),
    Case("fsdp2", 2, ["fsdp"]),
    Case("fsdp2_slow1", 2, ["fsdp", "--slow-rank", "1", "--slow-ms", "20"], "fsdp2"),
    Case("pp_1f1b4", 4, PP + ["--schedule", "1f1b"]),
    Case("pp_1f1b4_stage2", 4, PP + ["--schedule", "1f1b", "--slow-stage", "2", "--slow-ms", "10"], "pp_1f1b4"),
    Case("pp_1f1b4_rank1", 4, PP + ["--schedule", "1f1b", "--slow-rank", "1", "--slow-ms", "10"], "pp_1f1b4"),
    Case("pp_gpipe4", 4, PP + ["--schedule", "gpipe"]),
    Case("pp_gpipe4_stage1", 4, PP + ["--schedule", "gpipe", "--slow-stage", "1", "--slow-ms", "10"], "pp_gpipe4"),
    Case("pp_gpipe4_rank2", 4, PP + ["--schedule", "gpipe", "--slow-rank", "2", "--slow-ms", "10"], "pp_gpipe4"),
    Case("pp_int4", 4, PP + ["--schedule", "interleaved1f1b", "--stages-per-rank", "2"]),
    # the same 8 layers as pp_int4 in 4 stages of 2: the 1F1B run its Interleaved1F1B plan re-cuts
    Case("pp_1f1b4_l2", 4, PP + ["--schedule", "1f1b", "--layers-per-stage", "2"]),
    Case("pp_int4_stage5", 4, PP + ["--schedule", "interleaved1f1b", "--stages-per-rank", "2", "--slow-stage", "5",
                                    "--slow-ms", "10"], "pp_int4"),
    Case("pp_int4_rank1", 4, PP + ["--schedule", "interleaved1f1b", "--stages-per-rank", "2", "--slow-rank", "1",
                                   "--slow-ms", "5"], "pp_int4"),
    Case("ppdp_2x2", 4, PPDP), Case("ppdp_4x2", 8, PPDP),
    Case("ppdp_2x2_w1", 4, PPDP + ["--slow-rank", "1", "--slow-ms", "10"], "ppdp_2x2"),
    Case("ppdp_4x2_w4", 8, PPDP + ["--slow-rank", "4", "--slow-ms", "10"], "ppdp_4x2"),
    Case("moe4", 4, MOE), Case("moe4_skew2", 4, MOE + ["--skew", "4", "--skew-rank", "2"], "moe4"),
    # one rank per core (2 ranks on 2 cores): the same faults where no rank shares a core, so a
    # culprit's sleep does not hand its core to a peer (the contention the 4-8 rank cases carry)
    Case("ddp2_slow1", 2, ["ddp", "--slow-rank", "1", "--slow-ms", "10"], "ddp2"),
    # the slow rank busy in its own code (a busy-wait on its training thread, untraced): its extra CPU
    # and its threads' wait behind it are its own, not its host's; with 4 ranks on 2 cores it keeps
    # its core as busy as work does (a sleep hands it to the core-mate)
    Case("ddp2_spin1", 2, ["ddp", "--slow-rank", "1", "--slow-ms", "10", "--slow-spin"], "ddp2"),
    Case("ddp4_spin2", 4, ["ddp", "--slow-rank", "2", "--slow-ms", "20", "--slow-spin"], "ddp4"),
    # a host fault: a noisy neighbour busy half the time on the rank's core (one rank per core here;
    # with 4 ranks on 2 cores it would slow the rank sharing that core too)
    Case("ddp2_noisy0", 2, ["ddp", "--noisy-rank", "0", "--noisy-pct", "50"], "ddp2"),
    Case("fsdp2_noisy1", 2, ["fsdp", "--noisy-rank", "1", "--noisy-pct", "50"], "fsdp2"),
    Case("pp_1f1b2", 2, PP + ["--schedule", "1f1b"]),
    Case("pp_1f1b2_rank1", 2, PP + ["--schedule", "1f1b", "--slow-rank", "1", "--slow-ms", "5"], "pp_1f1b2"),
    Case("pp_gpipe2", 2, PP + ["--schedule", "gpipe"]),
    Case("pp_gpipe2_stage0", 2, PP + ["--schedule", "gpipe", "--slow-stage", "0", "--slow-ms", "5"], "pp_gpipe2"),
    # the 4-rank MoE case's clean recordings spread 42 % (2 ranks a core, all_to_all every layer): its
    # skew had no measurable effect in any of 3 recordings; with one rank per core, 4/5 of the tokens to rank 1
    Case("moe2", 2, MOE), Case("moe2_skew1", 2, MOE + ["--skew", "4", "--skew-rank", "1"], "moe2"),
    Case("seqlen4", 4, ["seqlen"]),
    Case("seqlen4_jitter", 4, ["seqlen", "--jitter", "0.3"]),
    Case("seqlen4_long1", 4, ["seqlen", "--jitter", "0.3", "--long-rank", "1", "--long-factor", "2"], "seqlen4_jitter"),
]
#: The pipeline and PP x DP faults again, busy-waiting (``NAME_spin``): a stage busy on its core, as a
#: device busy computing, keeps the contention of 4-8 ranks on 2 cores that of the clean twin (a
#: sleeping stage hands its core to its core-mate, which then computes faster than in the twin); on 2 ranks
#: (one a core) it shows what the sleep itself does to the recording (session 27: both stages slow down).
SPIN_OF = ("pp_1f1b4_stage2", "pp_1f1b4_rank1", "pp_gpipe4_stage1", "pp_int4_stage5", "ppdp_2x2_w1", "ppdp_4x2_w4",
           "pp_1f1b2_rank1", "pp_gpipe2_stage0")
CASES += [Case(c.name + "_spin", c.nproc, c.args + ["--slow-spin"], c.twin) for c in CASES if c.name in SPIN_OF]
#: Clean runs that are not fault-free (a twin with per-step jitter): not counted as clean runs.
NOT_CLEAN = {"seqlen4_jitter"}
#: Structural what-ifs against real re-runs: (run, plan, run it should predict).
STRUCTURAL = [
    ("pp_1f1b4", {"action": "pipeline", "schedule": "gpipe", "microbatches": 8}, "pp_gpipe4"),
    ("pp_gpipe4", {"action": "pipeline", "schedule": "1f1b", "microbatches": 8}, "pp_1f1b4"),
    ("pp_1f1b2", {"action": "pipeline", "schedule": "gpipe", "microbatches": 8}, "pp_gpipe2"),
    ("pp_gpipe2", {"action": "pipeline", "schedule": "1f1b", "microbatches": 8}, "pp_1f1b2"),
    # the re-run must hold the same model: pp_int4 has 8 layers (8 stages of 1), pp_1f1b4 only 4
    ("pp_1f1b4_l2", {"action": "pipeline", "schedule": "interleaved1f1b", "microbatches": 8, "stages_per_rank": 2},
     "pp_int4"),
]
#: Shipped pairs (traces/): (run, plan, run).
SHIPPED_STRUCTURAL = [
    ("ddp_gloo_2rank_big_b25", {"action": "ddp", "bucket_mb": 4}, "ddp_gloo_2rank_big_b4"),
    ("pp_gpipe_2rank_m4", {"action": "pipeline", "schedule": "1f1b", "microbatches": 4}, "pp_1f1b_2rank_m4"),
    ("pp_1f1b_2rank_m4", {"action": "pipeline", "schedule": "1f1b", "microbatches": 8}, "pp_1f1b_2rank_m8"),
    # the same 8 layers cut in 2 chunks per rank, on 2 ranks (one core each): the Interleaved1F1B
    # plan where no two ranks share a core (the 4-rank pair above runs two ranks per core)
    ("pp_1f1b_2rank_m4", {"action": "pipeline", "schedule": "interleaved1f1b", "microbatches": 4, "stages_per_rank": 2},
     "pp_interleaved_2rank_m4"),
]


def all_runs(cases, repeats: int, fault_repeats: int = 1) -> list[tuple[str, Case]]:
    """(recording name, case): a clean case ``repeats`` times, a fault case ``fault_repeats`` times."""
    out = []
    for c in cases:
        out.append((c.name, c))
        out += [(f"{c.name}_r{i}", c) for i in range(1, repeats if c.twin is None else fault_repeats)]
    return out


def record(corpus: Path, name: str, case: Case) -> Path:
    """Record one run into corpus/runs/NAME (reused when it is already there)."""
    dest = corpus / "runs" / name
    if (dest / "manifest.json").exists():
        return dest
    tmp = corpus / "tmp" / name
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.perf_counter()
    res = launch(case.nproc, case.args + PROFILE + ["--run-name", name], tmp, timeout=LAUNCH_TIMEOUT_S)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(dest, ignore_errors=True)
    shutil.move(str(res.out_dir / name), str(dest))
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"recorded {name} ({case.nproc} ranks) in {time.perf_counter() - t0:.0f} s, attempts {res.attempts}",
          flush=True)
    return dest


def measured_step_ns(store: Path, run: str) -> float:
    """The measured job step: per rank the mean of its steps, the slowest rank (as the replay's
    ``job_step_ns``), from the store's ``steps``."""
    from traceanalyzer.store import open_store
    con = open_store(store)
    try:
        return float(con.execute("SELECT max(m) FROM (SELECT rank, avg(dur_ns) AS m FROM steps WHERE run = ? "
                                 "GROUP BY rank)", [run]).fetchone()[0])
    finally:
        con.close()


def analyse(cache: Path, name: str, run_dir: Path, truth, full: bool) -> dict:
    """Ingest, report (JSON document) and replay one run; cached in CACHE/reports/NAME.json.
    Not ``full``: the measured step only. Every recording is analysed in full (a clean run's repeats
    too: a false finding may show on one recording of three). The what-if of a
    fault (``truth``): idealise the culprit ranks; for a run without overlap, the DDP step model
    with overlap on (the fix the ground truth names)."""
    from traceanalyzer import ingest, replay, report
    from traceanalyzer.errors import TraceInputError
    out_path = cache / "reports" / f"{name}.json"
    if out_path.exists():
        doc = json.loads(out_path.read_text())
        if "report" in doc or not full:
            return doc      # (caches older than session 17 hold no report of a clean run's repeats)
    store = cache / "store"
    t0 = time.perf_counter()
    try:
        ingest([run_dir], store, run=name)
    except TraceInputError:   # already in the store (an interrupted pass)
        pass
    doc = {"run": name, "measured_step_ns": measured_step_ns(store, name),
           "ground_truth": _ground_truth(run_dir)}
    if full:
        doc["report"] = report.report_dict(report.build_report(store, run=name, figures=False))["runs"][0]
    culprit_ranks = truth.ranks if truth else None
    if full and truth and truth.kind == "no_overlap":
        from traceanalyzer.replay import ddp
        w = ddp.predict(store, run=name, overlap=True)
        doc["whatif"] = {"plan": "ddp overlap", "identity_step_ns": w.job_step_ns("identity_ns"),
                         "predicted_step_ns": w.job_step_ns(), "identity_error": w.identity_error}
    elif full and culprit_ranks:
        g = replay.build_graph(store, run=name)
        w = replay.what_if(g, {"actions": [{"action": "idealize", "ranks": culprit_ranks}]})
        doc["whatif"] = {"ranks": culprit_ranks, "identity_step_ns": w.job_step_ns("identity_ns"),
                         "predicted_step_ns": w.job_step_ns(), "identity_error": w.identity_error}
    doc["analyse_s"] = time.perf_counter() - t0
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(sc.plain(doc)))
    print(f"analysed {name}: {len(doc['report']['findings']) if full else '-'} findings, {doc['analyse_s']:.0f} s",
          flush=True)
    return doc


def peer_compute(cache: Path, docs: dict, twins: dict) -> str:
    """A diagnostic of the corpus, not a score: per fault run, the compute per step (median over
    steps of temporal_breakdown.compute_ns, mean over ranks) of the ranks that are NOT the culprit,
    against the same ranks in the clean twin. The replay keeps those ranks' recorded durations, so
    a ratio far from 1 (ranks sharing cores compute faster while the culprit sleeps) is an error of
    the what-if that no graph can remove. The workloads pin rank r to core r mod cores (one host:
    local rank = rank; ``cores`` those of this machine, where the corpus is recorded): the culprit's
    core-mates are shown apart, as they get its core while it sleeps."""
    import duckdb
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    files = str(cache / "store" / "_results" / "temporal_breakdown" / "*.parquet")   # one file per analysed run
    per = duckdb.sql(f"SELECT run, rank, median(compute_ns) AS c FROM read_parquet('{files}') GROUP BY run, rank").df()
    rows = [f"| fault run | peers' compute per step, fault / twin ms | ratio | the culprit's core-mates (rank mod {cores}) "
            f"| the other peers |", "|---|---|---|---|---|"]
    for name, twin in twins.items():
        doc = docs.get(name)
        if not twin or not doc or twin not in docs:
            continue
        t = sc.truth(doc["ground_truth"])
        culprits = set(t.ranks or []) if t else set()
        f = per[(per["run"] == name) & ~per["rank"].isin(culprits)].set_index("rank")["c"]
        c = per[(per["run"] == twin) & per["rank"].isin(f.index)].set_index("rank")["c"]
        if f.empty or c.empty:
            continue
        mates = f.index.isin([r for r in f.index if any(r % cores == k % cores for k in culprits)])

        def ratio(sel):
            return f"{f[sel].mean() / c.reindex(f.index[sel]).mean():.2f}" if sel.any() else "-"
        rows.append(f"| {name} | {f.mean() / 1e6:.1f} / {c.mean() / 1e6:.1f} | {f.mean() / c.mean():.2f} "
                    f"| {ratio(mates)} | {ratio(~mates)} |")
    return "\n".join(rows) + "\n"


def _ground_truth(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "manifest.json").read_text()).get("ground_truth") or {}
    except (OSError, ValueError):
        return {}


def _recordings(name: str, run_dirs: dict) -> list[str]:
    """``name`` and its repeats (``name_r1``, ...) among the recorded runs."""
    return [n for n in run_dirs if n == name or (n.startswith(name + "_r") and n[len(name) + 2:].isdigit())]


def structural(cache: Path, pairs, run_dirs: dict) -> list[dict]:
    """Each structural plan's predicted job step against the measured step of the real re-run: the
    median of the predictions made from every recording of the run against the median measured step
    of every recording of the re-run (one recording of each is one draw of the machine's noise)."""
    from traceanalyzer import ingest, replay
    from traceanalyzer.errors import TraceInputError
    store = cache / "store"
    out = []
    for run, action, target in pairs:
        if run not in run_dirs or target not in run_dirs:
            continue
        runs, targets = _recordings(run, run_dirs), _recordings(target, run_dirs)
        for r in runs + targets:
            try:
                ingest([run_dirs[r]], store, run=r)
            except TraceInputError:   # already in the store
                pass
        layers = [sum(_ground_truth(run_dirs[r]).get("layers_per_stage") or []) for r in (run, target)]
        if layers[0] != layers[1]:   # a re-run of another model is no ground truth for the plan
            out.append({"run": run, "plan": action, "target": target,
                        "error": f"not the same model: {layers[0]} vs {layers[1]} layers"})
            continue
        try:
            preds = [replay.run_plan(store, {"actions": [action]}, run=r).job_step_ns() for r in runs]
            meas = [measured_step_ns(store, r) for r in targets]
        except Exception as exc:  # noqa: BLE001 - a failed plan is a result too
            out.append({"run": run, "plan": action, "target": target, "error": f"{type(exc).__name__}: {exc}"})
            continue
        out.append({"run": run, "plan": action, "target": target, "predicted_step_ns": float(statistics.median(preds)),
                    "measured_step_ns": float(statistics.median(meas)), "n_runs": len(runs), "n_targets": len(targets)})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", default="/tmp/traceanalyzer-accuracy", help="cache folder (runs, store, reports)")
    p.add_argument("--only", default="*", help="comma-separated globs over case names, analysed in that order "
                                                "(twins are added)")
    p.add_argument("--cached-only", action="store_true",
                   help="record and analyse nothing: score the runs already analysed in the cache")
    p.add_argument("--repeats", type=int, default=2, help="recordings of each clean run (spread)")
    p.add_argument("--fault-repeats", type=int, default=1, help="recordings of each fault run (each scored)")
    p.add_argument("--record-only", action="store_true")
    p.add_argument("--slow-spin", action="store_true",
                   help="the slow ranks busy-wait their delay (workloads' --slow-spin) instead of sleeping: "
                        "their core is not handed to the ranks sharing it (record into a corpus of its own)")
    p.add_argument("--cache", default="default",
                   help="name of the analysis cache (CORPUS/analysis-NAME: store and per-run results); a new name "
                        "re-analyses every run (e.g. after changing the code)")
    p.add_argument("--no-append", action="store_true", help="print, do not append to RESULTS.md")
    p.add_argument("--label", default="", help="a label for the RESULTS.md section (e.g. baseline)")
    a = p.parse_args(argv)
    corpus = Path(a.corpus)
    by_name = {c.name: c for c in CASES}
    globs = a.only.split(",")
    chosen = {c.name for c in CASES if any(fnmatch.fnmatch(c.name, g) for g in globs)}
    chosen |= {by_name[n].twin for n in chosen if by_name[n].twin}
    cases = sorted((c for c in CASES if c.name in chosen),
                   key=lambda c: min([i for i, g in enumerate(globs) if fnmatch.fnmatch(c.name, g)] or [len(globs)]))
    if a.slow_spin:
        cases = [replace(c, args=c.args + ["--slow-spin"]) if "--slow-ms" in c.args else c for c in cases]
    cache = corpus / f"analysis-{a.cache}"
    if a.cached_only:
        done = {p.stem for p in (cache / "reports").glob("*.json")}
        cases = [c for c in cases if c.name in done and (c.twin is None or c.twin in done)]
        a.fault_repeats = max([a.fault_repeats] + [int(n.rsplit("_r", 1)[1]) + 1 for c in cases if c.twin
                                                   for n in done if n.startswith(c.name + "_r")
                                                   and n.rsplit("_r", 1)[1].isdigit()])
    t0 = time.perf_counter()
    run_dirs, failed = {}, []
    for name, case in all_runs(cases, a.repeats, a.fault_repeats):
        if a.cached_only and not (corpus / "runs" / name / "manifest.json").exists():
            continue   # --cached-only records nothing
        try:
            run_dirs[name] = record(corpus, name, case)
        except LaunchError as exc:
            failed.append(name)
            print(f"FAILED to record {name}: {str(exc).splitlines()[0]}", flush=True)
    record_s = time.perf_counter() - t0
    if a.record_only:
        return 1 if failed else 0
    docs = {}
    for name, case in all_runs(cases, a.repeats, a.fault_repeats):
        if name not in run_dirs:
            continue
        gt = json.loads((run_dirs[name] / "manifest.json").read_text()).get("ground_truth", {})
        truth = sc.truth(gt)
        docs[name] = analyse(cache, name, run_dirs[name], truth, full=True)
    shipped = Path(__file__).resolve().parents[1] / "traces"
    run_dirs.update({r: shipped / r for pair in SHIPPED_STRUCTURAL for r in (pair[0], pair[2])})
    plans = structural(cache, [s for s in STRUCTURAL + SHIPPED_STRUCTURAL if s[0] in run_dirs], run_dirs)
    twins = {c.name: c.twin for c in cases}
    scores = sc.score_corpus(docs, twins, not_clean=NOT_CLEAN, structural=plans)
    text = sc.render(scores)
    text += ("\nContention check (a diagnostic, not scored): the compute of the ranks that are not the culprit, "
             "fault run against its clean twin; the replay keeps their recorded durations.\n\n"
             + peer_compute(cache, docs, twins))
    cmd = "PYTHONPATH=$PWD python benchmarks/accuracy.py " + " ".join(argv if argv is not None else sys.argv[1:])
    head = (f"\n## Accuracy{(' (' + a.label + ')') if a.label else ''}: `benchmarks/accuracy.py`, "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n\n`{cmd}`  \n"
            f"{platform.node()}: {os.cpu_count()} cores, {platform.python_version()}, torch "
            f"{__import__('torch').__version__}; {len(run_dirs)} runs (recording {record_s:.0f} s, total "
            f"{time.perf_counter() - t0:.0f} s)" + (f"; FAILED to record: {', '.join(failed)}" if failed else "") + "\n\n")
    print(head + text)
    (cache / "scores.json").write_text(json.dumps(sc.plain(scores), indent=1))
    if not a.no_append:
        harness.append_results(head + text, RESULTS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
