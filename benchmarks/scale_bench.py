#!/usr/bin/env python3
"""Scale benchmark (issue 18 parts 4 and 6): ingest + analyze (+ report) at several rank counts,
with the peak RSS of every process, on a Dask LocalCluster.

For each N of ``--ranks`` (default 128,256): an N-rank job generated from the real 8-rank DLRM
traces (``analyses_bench.generate``: each rank >= ``--events-per-rank`` events, collectives joined
across all N ranks), then, each phase in its own process tree watched by ``harness.run_child``:

1. ``ingest(..., dask=CLUSTER)``;
2. ``analyze(store, dask=CLUSTER)``: the per-rank map (one task per rank on the cluster's workers),
   the summaries saved, the cross-rank reduce in the driver;
3. the same again: the summaries are current, nothing per rank is computed, no events read;
4. optionally (``--one-connection``) ``analyze(store, summaries=False)``: today's path, all ranks'
   events in one DuckDB connection, for the same-run comparison;
5. optionally (``--report``) ``traceanalyzer report --no-replay`` from the saved results.

Per phase: wall time, time per rank, peak RSS of the driver process and the largest peak of any
worker process. Targets (issue): every process <= 4 GB at every size; time per rank constant
within +-30 % from the smallest to the largest N. A script, not a test: it asserts nothing.

    PYTHONPATH=$PWD python benchmarks/scale_bench.py --ranks 128,256 --workdir /tmp/scale [--append]
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import shutil
import sys
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import analyses_bench as ab  # noqa: E402  (the N-rank job generator)
import harness  # noqa: E402

TARGET_PROCESS_BYTES = 4e9
TARGET_PER_RANK_SPREAD = 0.30


def phase(spec: dict) -> dict:
    import traceanalyzer as ta
    from traceanalyzer.analyses.results import analyze
    t0 = time.perf_counter()
    if spec["phase"] == "analyze" and spec.get("reused"):  # a store kept from an earlier run: map again
        from traceanalyzer.analyses.summaries import forget
        forget(spec["store"])
        t0 = time.perf_counter()
    if spec["phase"] == "ingest":
        if Path(spec["store"]).exists():
            shutil.rmtree(spec["store"])
        ta.ingest([spec["input"]], spec["store"], run="job", progress=False, dask=spec["dask"])
    elif spec["phase"] in ("analyze", "analyze_again"):
        res = analyze(spec["store"], dask=spec["dask"])
        rows = sum(len(d) for d in res.values())
    elif spec["phase"] == "one_connection":
        res = analyze(spec["store"], summaries=False)
        rows = sum(len(d) for d in res.values())
    elif spec["phase"] == "report":
        from traceanalyzer.cli.main import main
        main(["report", spec["store"], "--no-replay", "-o", str(Path(spec["store"]).parent / "report.json")])
    elif spec["phase"] in REPLAY_PHASES:
        out = _replay_phase(spec)
        out["seconds"] = time.perf_counter() - t0
        return out
    out = {"seconds": time.perf_counter() - t0}
    if spec["phase"] != "ingest" and spec["phase"] != "report":
        out["rows"] = rows
    return out


#: --report-replay: the replay graph (first: per-rank pieces built and saved; again: read from the
#: store; one connection: every event in one connection, the old build), then `report` with replay twice
REPLAY_PHASES = ("graph", "graph_again", "graph_one_connection", "report_replay", "report_replay_again")


def _replay_phase(spec: dict) -> dict:
    from traceanalyzer import replay
    from traceanalyzer.analyses import connect
    from traceanalyzer.replay.graph import pieces
    name = spec["phase"]
    if name in ("graph", "report_replay"):
        pieces.forget(spec["store"])       # the first build: no saved pieces
    t0 = time.process_time()
    if name.startswith("graph"):
        g = replay.build_graph(connect(spec["store"]) if name == "graph_one_connection" else spec["store"], "job",
                               dask=None if name == "graph_one_connection" else spec["dask"])
        return {"rows": g.n, "how": g.stats.get("pieces") or "one connection", "driver_cpu_s": time.process_time() - t0}
    from traceanalyzer.cli.main import main
    main(["report", spec["store"], "--replay-max-events", str(10**10), "-o",
          str(Path(spec["store"]).parent / f"{name}.json")])
    doc = json.loads((Path(spec["store"]).parent / f"{name}.json").read_text())
    rp = (doc.get("runs") or [{}])[0].get("replay", {})
    return {"how": f"replay {rp.get('status')}: {rp.get('reason') or ''}"[:200], "driver_cpu_s": time.process_time() - t0}


def run(phase_name: str, spec: dict, log: Path, timeout_s: float) -> dict:
    spec = {**spec, "phase": phase_name}
    res = harness.run_child([sys.executable, str(Path(__file__).resolve()), "_phase", json.dumps(spec)], log,
                            timeout_s=timeout_s, expect_result=True)
    res.pop("stdout", None)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="128,256")
    ap.add_argument("--events-per-rank", type=int, default=100_000)
    ap.add_argument("--source-dir", default=ab.DEFAULT_SOURCE_DIR)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/scale_bench"))
    ap.add_argument("--dask", default="local:2")
    ap.add_argument("--one-connection", action="store_true", help="also today's one-connection analyze")
    ap.add_argument("--report", action="store_true", help="also `report --no-replay`")
    ap.add_argument("--report-replay", action="store_true",
                    help="also the replay graph built (per-rank pieces), read back, built in one connection, and "
                         "`report` with replay twice")
    ap.add_argument("--phases", help="only these phases, comma-separated (with --reuse-store: e.g. graph,graph_again)")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--parts", action="store_true",
                    help="generate the job as collector-written Parquet parts (scale_parts.py), no JSON: ingest "
                         "validates and commits")
    ap.add_argument("--reuse-store", action="store_true", help="keep a store ingested by an earlier run (no ingest)")
    ap.add_argument("--append", action="store_true", help="append the table to benchmarks/RESULTS.md")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    start = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    machine = harness.machine_line()
    rows = []
    for n in [int(x) for x in args.ranks.split(",")]:
        if args.parts:   # the job as the collectors leave it: Parquet parts on every rank, no JSON
            import scale_parts
            gen = scale_parts.make(args.source_dir, args.workdir / f"parts-{n}", n, args.events_per_rank)
        else:
            gen = ab._ensure_input(SimpleNamespace(source_dir=args.source_dir, ranks=n,
                                                   events_per_rank=args.events_per_rank), args.workdir)
        store = str(args.workdir / f"store-{n}")
        reused = args.reuse_store and (Path(store) / "_store.json").exists()
        spec = {"input": gen["dir"], "store": store, "dask": args.dask, "reused": reused}
        row = {"ranks": n, "generate_seconds": gen.get("generate_seconds"), "copies": gen.get("copies_per_rank")}
        phases = ([] if reused else ["ingest"]) + ["analyze", "analyze_again"] + (["one_connection"] if args.one_connection else []) \
            + (["report"] if args.report else []) + (list(REPLAY_PHASES) if args.report_replay else [])
        if args.phases:
            phases = args.phases.split(",")
        for name in phases:
            res = run(name, spec, args.workdir / f"{name}-{n}.log", args.timeout)
            row[name] = {k: res.get(k) for k in ("ok", "error", "seconds", "wall_seconds", "rows", "polled_peak_kb",
                                                 "polled_worker_peak_kb", "max_tree_rss_kb", "log_tail", "cpu_seconds",
                                                 "driver_cpu_s", "how")}
            print(f"{n} ranks {name}: {json.dumps(row[name])[:400]}", flush=True)
            if not res.get("ok"):
                break
        if Path(store).exists():
            import traceanalyzer as ta
            con = ta.open(store)
            row["events"] = con.execute("SELECT count(*) FROM events").fetchone()[0]
            con.close()
        rows.append(row)
        if args.json_out:
            args.json_out.write_text(json.dumps(rows, indent=1))
    text = render(rows, args, start, machine)
    print(text)
    if args.append:
        harness.append_results(text)
    return 0


def _gb(kb) -> str:
    return "n/a" if not kb else f"{kb * 1024 / 1e9:.2f} GB"


def _rows(name: str, p: dict) -> str:
    if name not in REPLAY_PHASES:
        return str(p.get("rows") or "")
    nodes = f"{p['rows']:,} nodes; " if p.get("rows") else ""
    return (f"{nodes}CPU {p.get('cpu_seconds') or 0:.1f} s (driver {p.get('driver_cpu_s') or 0:.1f} s); "
            f"{str(p.get('how')).replace('|', '/')}")


def render(rows: list[dict], args, start: str, machine: str) -> str:
    out = [f"\n## Scale: per-rank map, cross-rank reduce (issue 18 parts 4 and 6): `benchmarks/scale_bench.py`, {start}\n",
           f"- command: `python benchmarks/scale_bench.py --ranks {args.ranks} --events-per-rank {args.events_per_rank} "
           f"--dask {args.dask}{' --parts' if args.parts else ''}{' --one-connection' if args.one_connection else ''}"
           f"{' --report' if args.report else ''}{' --report-replay' if args.report_replay else ''}`",
           f"- machine: {machine} (shared with other sessions' work: times are noisy)",
           f"- input: N ranks generated from `{args.source_dir}` (rank r = source r mod 8, repeated in time), "
           f">= {args.events_per_rank:,} events per rank"
           + ("; written as the collectors write it (Parquet parts per rank, no JSON: `scale_parts.py`)" if args.parts else "")
           + "; every phase in its own process tree, peak RSS polled per process\n",
           "| ranks | events | phase | time (s) | per rank (ms) | peak RSS driver | peak RSS largest worker | rows |",
           "|---:|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        for name in ("ingest", "analyze", "analyze_again", "one_connection", "report", *REPLAY_PHASES):
            p = r.get(name)
            if not p:
                continue
            secs = p.get("seconds") or p.get("wall_seconds")
            t = f"{secs:.1f}" if p.get("ok") else f"failed ({p.get('error')})"
            per = f"{1000 * secs / r['ranks']:.0f}" if p.get("ok") else "n/a"
            out.append(f"| {r['ranks']} | {r.get('events', 0):,} | {name} | {t} | {per} | {_gb(p.get('polled_peak_kb'))} | "
                       f"{_gb(p.get('polled_worker_peak_kb'))} | {_rows(name, p)} |")
    for r in rows:   # end to end: what a user waits for (ingest + the first analyze + the report)
        parts = [r.get(k) for k in ("ingest", "analyze", "report")]
        if all(p and p.get("ok") for p in parts):
            total = sum(p.get("seconds") or p.get("wall_seconds") for p in parts)
            out.append(f"\n{r['ranks']} ranks end to end (ingest + analyze + report): {total:.0f} s "
                       f"({1000 * total / r['ranks']:.0f} ms per rank)")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "_phase":
        harness.emit_result(phase(json.loads(sys.argv[2])))
    else:
        sys.exit(main())
