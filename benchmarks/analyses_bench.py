#!/usr/bin/env python3
"""Analyses speed/memory benchmark: the whole analysis suite over a 128-rank job.

One run of this script

1. builds, in a temporary folder, ONE consistent N-rank job (default 128 ranks) from the real
   traces of all ranks of a job (default: the 8 DLRM ranks in
   ``/work/shared/traces/external/param_dlrm_8rank``, NCCL all_to_all + all_reduce, GPU kernels):
   rank r is source rank (r mod 8), its ``traceEvents`` repeated C times in time (every copy shifted
   by the same amount on every rank, the span of all sources + 1 us, so the collectives of copy k
   line up across all ranks), each copy renamed to its own ``ProfilerStep#N`` (copy k of step S is
   step S + k * steps-per-source), ids offset per copy as in ``ingest_bench.py``;
   ``distributedInfo.rank`` = r, ``world_size`` = N, full-world process groups (``pg_config``,
   ``Group size``, ``Process Group Ranks``) rewritten to the N ranks. Every rank issues the same
   collectives in the same order, so ``comms`` joins each collective across all N ranks by seq.
   C is the smallest number of copies that gives every rank >= ``--events-per-rank`` events
   (default 100,000);
2. ingests it with ``traceanalyzer.ingest(..., workers=W)`` (timed; not part of the analysis
   budget);
3. in one fresh process: the baseline (``SELECT count(*), sum(dur_ns) FROM events`` over the same
   store, best of 3), then ``traceanalyzer.analyses.results.analyze(store)`` (every analysis, saving
   the results into the store): wall time and peak RSS of the process (DuckDB runs in-process);
4. each analysis alone, in its own fresh process: ``compute(traceanalyzer.open(store), only=[name])``
   (time and peak RSS), so that slow or memory-hungry ones are visible;
5. optionally (``--views``) the time of each intermediate SQL view (``SELECT count(*) FROM view``)
   and (``--explain NAME``) DuckDB's ``EXPLAIN ANALYZE`` of an analysis' query.

Every time is also given as a ratio to the baseline scan measured in the same run. Targets (issue):
analyze <= 120 s and <= 8 GB on the 2-core machine. This is a script, not a test: it asserts
nothing about timings. Timing, memory and machine/git info come from ``harness.py``; decimal time
parsing and id offsets from ``ingest_bench.py``.
"""

import argparse
import datetime as _dt
import hashlib
import json
import math
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import harness  # noqa: E402  (timing, memory, machine: benchmarks/harness.py)
import ingest_bench as ib  # noqa: E402  (input generation helpers shared with the ingest benchmark)

DEFAULT_SOURCE_DIR = "/work/shared/traces/external/param_dlrm_8rank"
TARGET_SECONDS = 120.0
TARGET_BYTES = 8e9
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")


# --------------------------------------------------------------------------
# input generation (runs in a subprocess: `analyses_bench.py _generate ...`)
# --------------------------------------------------------------------------
def _load_source(path: str) -> dict:
    import msgspec

    raw = ib._read_bytes(path)
    doc = msgspec.json.decode(raw)

    class _TsRaw(msgspec.Struct):
        ts: msgspec.Raw = msgspec.Raw(b"")

    class _Doc(msgspec.Struct):
        traceEvents: list[_TsRaw] = []

    ts_raw = [bytes(e.ts) for e in msgspec.json.decode(raw, type=_Doc).traceEvents]
    events = doc.get("traceEvents") or []
    assert len(ts_raw) == len(events)
    return {"path": path, "doc": doc, "events": events,
            "ts": [ib._parse_decimal(t) for t in ts_raw]}


def _source_files(source_dir: str) -> list[str]:
    p = Path(source_dir)
    files = sorted(str(f) for f in p.rglob("*") if f.is_file() and re.search(r"\.json(\.gz)?$", f.name))
    traces = [f for f in files if re.search(r"trace\.json(\.gz)?$", f)]  # Kineto's *.pt.trace.json(.gz)
    files = traces or [f for f in files if not re.search(r"(\.fr|manifest)\.json$", f)]
    if not files:
        raise SystemExit(f"{source_dir}: no .json/.json.gz traces")
    return files


def generate(source_dir: str, out_dir: Path, ranks: int, events_per_rank: int, only_ranks=None) -> dict:
    """Write ``ranks`` trace files (rank{R}.trace.json) forming one job; returns a manifest.
    ``only_ranks``: write only these ranks' files (the job is still ``ranks`` wide)."""
    import msgspec

    srcs = [_load_source(f) for f in _source_files(source_dir)]
    # order the sources by their own rank (distributedInfo.rank), so rank r uses source r mod n
    srcs.sort(key=lambda s: ((s["doc"].get("distributedInfo") or {}).get("rank", 0), s["path"]))
    n_src = len(srcs)

    # one exact time base for all sources: ts as integers in units of 10**-F us
    F = max((len(p[2]) for s in srcs for p in s["ts"] if p is not None), default=0)
    scale = 10**F
    for s in srcs:
        vals = []
        for p in s["ts"]:
            if p is None:
                vals.append(None)
                continue
            neg, ip, fp = p
            v = int(ip) * scale + (int(fp.ljust(F, "0")) if F else 0)
            vals.append(-v if neg else v)
        s["ts_scaled"] = vals

    def ts_text(v: int) -> str:
        if F == 0:
            return str(v)
        sign = "-" if v < 0 else ""
        q, r = divmod(abs(v), scale)
        return f"{sign}{q}.{r:0{F}d}"

    # the same shift for every source: the span of all of them (whole us) + 1 us
    lo, hi = None, None
    max_id, steps = 0, []
    for s in srcs:
        for e, v in zip(s["events"], s["ts_scaled"]):
            if v is None or e.get("ph") == "M":
                continue
            d = e.get("dur")
            end = v + (int(math.ceil(float(d) * scale)) if isinstance(d, (int, float)) else 0)
            lo = v if lo is None else min(lo, v)
            hi = end if hi is None else max(hi, end)
            i = e.get("id")
            if isinstance(i, int) and not isinstance(i, bool):
                max_id = max(max_id, i)
            a = e.get("args")
            if isinstance(a, dict):
                for k in ib.ID_ARG_KEYS:
                    x = a.get(k)
                    if isinstance(x, int) and not isinstance(x, bool):
                        max_id = max(max_id, x)
            m = _STEP_RE.match(str(e.get("name", "")))
            if m:
                steps.append(int(m.group(1)))
    shift = (-(-(hi - lo) // scale) + 1) * scale
    id_stride = max_id + 1
    step_stride = (max(steps) - min(steps) + 1) if steps else 0

    # events that land in the store's `events` table: complete and instant events
    def store_events(s):
        return sum(1 for e in s["events"] if e.get("ph") in ("X", "i", "I"))

    per_copy = [store_events(s) for s in srcs]
    copies = max(1, -(-events_per_rank // max(1, min(per_copy))))

    out_dir.mkdir(parents=True, exist_ok=True)
    enc = msgspec.json.Encoder()
    full_new = list(range(ranks))
    files, sources = [], []
    for si, s in enumerate(srcs):
        doc, events = s["doc"], s["events"]
        dist = dict(doc.get("distributedInfo") or {})
        w0 = dist.get("world_size")
        rewrites = 0
        if isinstance(w0, int) and w0 != ranks:
            full0 = list(range(w0))
            for e in events:
                a = e.get("args")
                if not isinstance(a, dict):
                    continue
                if a.get("Group size") == w0:
                    a["Group size"] = ranks
                    rewrites += 1
                pgr = a.get("Process Group Ranks")
                if pgr == full0:
                    a["Process Group Ranks"] = full_new
                    rewrites += 1
                elif pgr == str(full0):
                    a["Process Group Ranks"] = str(full_new)
                    rewrites += 1
            pgs = []
            for pg in dist.get("pg_config") or []:
                pg = dict(pg)
                if pg.get("ranks") == full0:
                    pg["ranks"] = full_new
                    pg["pg_size"] = ranks
                    rewrites += 1
                pgs.append(pg)
            if "pg_config" in dist:
                dist["pg_config"] = pgs
        dist["world_size"] = ranks

        chunks = []
        for k in range(copies):
            for e, v in zip(events, s["ts_scaled"]):
                if k and e.get("ph") == "M":
                    continue  # metadata once
                d = dict(e)
                if v is not None:
                    d["ts"] = msgspec.Raw(ts_text(v + k * shift).encode())
                if k:
                    ib._offset_ids_dict(d, k * id_stride)
                    m = _STEP_RE.match(str(d.get("name", "")))
                    if m:
                        d["name"] = f"ProfilerStep#{int(m.group(1)) + k * step_stride}"
                chunks.append(enc.encode(d))
        n_events = len(chunks)
        body = b",\n".join(chunks)
        del chunks
        header_keys = [k for k in doc if k not in ("traceEvents", "distributedInfo")]
        for r in range(si, ranks, n_src):
            if only_ranks is not None and r not in only_ranks:
                continue
            di = dict(dist, rank=r)
            head = {"distributedInfo": di} | {k: doc[k] for k in header_keys}
            path = out_dir / f"rank{r}.trace.json"
            with open(path, "wb") as fh:
                fh.write(enc.encode(head)[:-1] + b', "traceEvents": [\n')
                fh.write(body)
                fh.write(b"\n]}\n")
            files.append({"path": str(path), "rank": r, "source": Path(s["path"]).name,
                          "bytes": path.stat().st_size, "events": n_events})
        sources.append({"file": Path(s["path"]).name, "rank": dist.get("rank"),
                        "trace_events": len(events), "store_events_per_copy": per_copy[si],
                        "world_rewrites": rewrites})
        del body
    files.sort(key=lambda f: f["rank"])
    return {
        "source_dir": source_dir,
        "sources": sources,
        "ranks": ranks,
        "copies_per_rank": copies,
        "shift_per_copy_us": shift / scale,
        "id_stride": id_stride,
        "step_stride": step_stride,
        "files": files,
    }


# --------------------------------------------------------------------------
# phases (each runs in its own subprocess: `analyses_bench.py _phase NAME --spec JSON`)
# --------------------------------------------------------------------------
def _duckdb_settings(con) -> dict:
    out = {}
    for name in ("threads", "memory_limit", "temp_directory", "preserve_insertion_order"):
        try:
            out[name] = con.execute(f"SELECT current_setting('{name}')").fetchone()[0]
        except Exception as exc:  # noqa: BLE001
            out[name] = f"? ({exc})"
    return out


def _duckdb_memory(con) -> dict:
    try:
        rows = con.execute("SELECT tag, memory_usage_bytes, temporary_storage_bytes FROM duckdb_memory() "
                           "WHERE memory_usage_bytes > 0 OR temporary_storage_bytes > 0").fetchall()
        return {t: {"memory": m, "temporary": tmp} for t, m, tmp in rows}
    except Exception as exc:  # noqa: BLE001
        return {"error": str(exc)}


BASELINE_SQL = "SELECT count(*), sum(dur_ns) FROM events"


def _baseline(store: str, repeat: int = 3) -> dict:
    import traceanalyzer as ta

    times, value = [], None
    for _ in range(repeat):
        con = ta.open(store)
        t0 = time.perf_counter()
        value = con.execute(BASELINE_SQL).fetchone()
        times.append(time.perf_counter() - t0)
        con.close()
    return {"sql": BASELINE_SQL, "seconds": min(times), "all_seconds": [round(t, 3) for t in times],
            "events": value[0], "sum_dur_ns": value[1]}


def phase_ingest(spec: dict) -> dict:
    import traceanalyzer

    store = Path(spec["store"])
    if store.exists():
        shutil.rmtree(store)
    t0 = time.perf_counter()
    rep = traceanalyzer.ingest(spec["files"], str(store), run=spec["run"], workers=spec["workers"], progress=False)
    t1 = time.perf_counter()
    ib._stop_forkserver()
    return {"seconds": t1 - t0, "report": ib._report_summary(rep),
            "store_bytes": ib._dir_bytes(store), "store_files": sum(1 for p in store.rglob("*") if p.is_file())}


def phase_stats(spec: dict) -> dict:
    import traceanalyzer as ta

    con = ta.open(spec["store"])
    q = lambda sql: con.execute(sql).fetchone()  # noqa: E731
    per_rank = con.execute("SELECT rank, count(*) FROM events GROUP BY rank").fetchall()
    ev = [n for _, n in per_rank]
    out = {
        "ranks": len(per_rank),
        "events_total": sum(ev),
        "events_per_rank_min": min(ev),
        "events_per_rank_max": max(ev),
        "steps_per_rank": q("SELECT max(n) FROM (SELECT rank, count(*) AS n FROM steps GROUP BY rank)")[0],
        "distinct_steps": q("SELECT count(DISTINCT step) FROM steps")[0],
        "kernels": q("SELECT count(*) FROM events WHERE kind IN ('compute_kernel', 'comm_kernel')")[0],
        "comms": q("SELECT count(*) FROM comms")[0],
        "flows": q("SELECT count(*) FROM flows")[0],
        "collectives": q("SELECT count(*) FROM (SELECT DISTINCT run, coalesce(pg_name, '?'), seq FROM comms "
                         "WHERE NOT is_p2p AND seq IS NOT NULL)")[0],
        "ranks_per_collective_min": q("SELECT min(n) FROM (SELECT count(*) AS n FROM comms WHERE NOT is_p2p AND "
                                      "seq IS NOT NULL GROUP BY run, coalesce(pg_name, '?'), seq)")[0],
        "ranks_per_collective_max": q("SELECT max(n) FROM (SELECT count(*) AS n FROM comms WHERE NOT is_p2p AND "
                                      "seq IS NOT NULL GROUP BY run, coalesce(pg_name, '?'), seq)")[0],
        "dialects": dict(con.execute("SELECT dialect, count(*) FROM comms GROUP BY ALL").fetchall()),
        "ops": dict(con.execute("SELECT op, count(*) FROM comms GROUP BY ALL").fetchall()),
        "seq_sources": dict(con.execute("SELECT seq_source, count(*) FROM comms GROUP BY ALL").fetchall()),
        "hosts": q("SELECT count(DISTINCT host) FROM ranks")[0],
    }
    events_bytes = 0
    for p in Path(spec["store"]).joinpath("events").rglob("*.parquet"):
        events_bytes += p.stat().st_size
    out["events_parquet_bytes"] = events_bytes
    return out


def _code_digest(pkg_dir: Path) -> str:
    """sha1 of traceanalyzer/**/*.py and **/*.sql (the SQL modules are read at prepare time)."""
    h = hashlib.sha1()
    for f in sorted(list(pkg_dir.rglob("*.py")) + list(pkg_dir.rglob("*.sql"))):
        h.update(str(f.relative_to(pkg_dir)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def phase_analyze(spec: dict) -> dict:
    import traceanalyzer as ta
    from traceanalyzer.analyses import prepare
    from traceanalyzer.analyses import results as R

    poller = harness.RssPoller()
    rss_import_kb = harness.proc_status_kb("VmRSS")
    base = _baseline(spec["store"])
    base_peak_kb = poller.peak_kb()
    con = ta.open(spec["store"])
    settings = _duckdb_settings(con)
    tp = time.perf_counter()
    prepare(con)  # loading the SQL modules alone (analyze does it again on its own connection)
    prepare_s = time.perf_counter() - tp
    con.close()
    poller.mark()
    rss_before_kb = harness.proc_status_kb("VmRSS")
    t0 = time.perf_counter()
    res = R.analyze(spec["store"])
    t1 = time.perf_counter()
    peak_kb = poller.peak_kb()
    poller.stop()
    return {
        "seconds": t1 - t0,
        "prepare_seconds": prepare_s,
        "rows": {k: int(len(v)) for k, v in res.items()},
        "baseline": base,
        "rss_after_import_kb": rss_import_kb,
        "rss_before_analyze_kb": rss_before_kb,
        "baseline_peak_kb": base_peak_kb,
        "analyze_peak_rss_kb": peak_kb,
        "self_maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "duckdb_settings": settings,
        "versions": harness.versions(["traceanalyzer", "duckdb", "pandas", "pyarrow", "numpy"]),
        "source_digest": _code_digest(Path(ta.__file__).resolve().parent),
    }


# --what-if: analyze() again with changes applied at run time (no file is edited), cumulative:
#   prepare_once  the SQL modules loaded once per connection (the critical-path producer loads them
#                 again on the connection compute() already prepared: DuckDB binds every view again)
#   materialize   + activity_intervals and the sweeps over it (activity_segments,
#                 _activity_window_segments) computed once per connection as temp tables, instead of
#                 being inlined (and recomputed) in every analysis, and several times in some queries
WHAT_IF = ("prepare_once", "materialize")
MATERIALIZE = ("activity_intervals", "activity_segments", "_activity_window_sums")  # in dependency order


def phase_whatif(spec: dict) -> dict:
    import traceanalyzer.analyses as A
    import traceanalyzer.analyses.critical_path as CP
    import traceanalyzer.analyses.results as R

    level = WHAT_IF.index(spec["variant"])
    applied = {v: i <= level for i, v in enumerate(WHAT_IF)}
    orig_prepare = A.prepare
    prepared = {}

    def prepare(con, **params):
        key = tuple(sorted(params.items()))
        if prepared.get(id(con)) == key:
            return con
        orig_prepare(con, **params)
        if level >= 1:
            have = {v for (v,) in con.execute("SELECT view_name FROM duckdb_views()").fetchall()}
            for view in [v for v in MATERIALIZE if v in have]:
                con.execute(f"CREATE OR REPLACE TEMP TABLE _whatif_{view} AS SELECT * FROM {view}")
                con.execute(f"CREATE OR REPLACE TEMP VIEW {view} AS SELECT * FROM _whatif_{view}")
        prepared[id(con)] = key
        return con

    A.prepare = R.prepare = CP.prepare = prepare
    poller = harness.RssPoller()
    t0 = time.perf_counter()
    res = R.analyze(spec["store"], save_results=False)
    t1 = time.perf_counter()
    peak = poller.peak_kb()
    poller.stop()
    return {"seconds": t1 - t0, "peak_rss_kb": peak, "rows": {k: int(len(v)) for k, v in res.items()},
            "applied": applied}


def phase_one(spec: dict) -> dict:
    """One analysis, alone, on a fresh connection."""
    import traceanalyzer as ta
    from traceanalyzer.analyses import prepare
    from traceanalyzer.analyses import results as R

    poller = harness.RssPoller()
    con = ta.open(spec["store"])  # prepare alone (loading the SQL modules), on its own connection
    tp = time.perf_counter()
    prepare(con)
    prepare_s = time.perf_counter() - tp
    con.close()
    con = ta.open(spec["store"])
    rss_before_kb = harness.proc_status_kb("VmRSS")
    poller.mark()
    t0 = time.perf_counter()
    out = R.compute(con, only=[spec["name"]])
    t1 = time.perf_counter()
    peak_kb = poller.peak_kb()
    poller.stop()
    mem = _duckdb_memory(con)
    con.close()
    return {"seconds": t1 - t0, "prepare_seconds": prepare_s, "rows": int(len(out[spec["name"]])),
            "rss_before_kb": rss_before_kb,
            "peak_rss_kb": peak_kb, "self_maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            "duckdb_memory_after": mem}


#: intermediate views timed by --views (each alone, SELECT count(*)), read from the SQL modules
#: themselves so the list follows the current SQL: every view they create, in module order,
#: except HTA's compatibility views (timed by the parity tests) and macros (they take arguments)
def _sql_views() -> list[str]:
    sys.path.insert(0, str(REPO))
    from traceanalyzer.analyses.modules import closure, modules
    sql_dir = REPO / "traceanalyzer" / "analyses" / "sql"
    out = []
    for mod in closure(sorted(modules())):     # every module, each after what it reads
        f = sql_dir / f"{mod}.sql"
        if mod == "hta_compat" or not f.exists():
            continue
        out += re.findall(r"CREATE OR REPLACE (?:TEMP )?VIEW (\w+)", f.read_text())
    return out


VIEWS = _sql_views()


def phase_view(spec: dict) -> dict:
    import traceanalyzer as ta
    from traceanalyzer.analyses import prepare

    poller = harness.RssPoller()
    con = prepare(ta.open(spec["store"]))
    have = {v for (v,) in con.execute("SELECT view_name FROM duckdb_views()").fetchall()}
    if spec["view"] not in have:
        raise SystemExit(f"no view {spec['view']} in the current SQL modules")
    poller.mark()
    t0 = time.perf_counter()
    n = con.execute(f"SELECT count(*) FROM {spec['view']}").fetchone()[0]
    t1 = time.perf_counter()
    peak = poller.peak_kb()
    poller.stop()
    return {"seconds": t1 - t0, "rows": n, "peak_rss_kb": peak}


def phase_explain(spec: dict) -> dict:
    """DuckDB's profile of one analysis' query (JSON profiling): the operators that took the most
    time, with their join conditions and row counts, and the planning times."""
    import traceanalyzer as ta
    from traceanalyzer.analyses import prepare
    from traceanalyzer.analyses import results as R

    con = prepare(ta.open(spec["store"]))
    sql = R.QUERIES.get(spec["name"]) or f"SELECT * FROM {spec['name']}"
    prof = Path(spec["out"]).with_suffix(".json")
    con.execute("SET enable_profiling = 'json'")
    con.execute(f"SET profiling_output = '{prof}'")
    t0 = time.perf_counter()
    con.execute(sql).fetchall()
    t1 = time.perf_counter()
    con.execute("SET enable_profiling = 'no_output'")
    doc = json.loads(prof.read_text())
    ops = []

    def walk(node, depth):
        info = node.get("extra_info") or {}
        ops.append({"type": node.get("type") or node.get("name"), "seconds": float(node.get("timing") or 0),
                    "rows": node.get("intermediate_rows") or node.get("operator_cardinality"),
                    "bytes": node.get("intermediate_size_bytes"), "depth": depth,
                    "info": {k: v for k, v in info.items() if k in ("Join Type", "Conditions", "Groups", "Aggregates",
                                                                      "Projections", "CTE Name", "Function")}})
        for c in node.get("children") or []:
            walk(c, depth + 1)

    for root in doc.get("operator") or doc.get("children") or []:
        walk(root, 0)
    top = sorted(ops, key=lambda o: -o["seconds"])[:12]
    phases = {k: doc[k] for k in ("planner", "physical_planner") if isinstance(doc.get(k), (int, float))}
    lines = [f"query: {sql}", f"wall: {t1 - t0:.2f} s; operators: {len(ops)}; "
             f"operator time total {sum(o['seconds'] for o in ops):.2f} s", ""]
    for o in top:
        lines.append(f"{o['seconds']:8.2f} s  {o['type']:<24} rows {o['rows'] or 0:>13,}  {json.dumps(o['info'])[:300]}")
    Path(spec["out"]).write_text("\n".join(lines) + "\n")
    return {"seconds": t1 - t0, "out": spec["out"], "top_operators": top, "planning": phases}


PHASES = {"ingest": phase_ingest, "stats": phase_stats, "analyze": phase_analyze, "one": phase_one,
          "view": phase_view, "explain": phase_explain, "whatif": phase_whatif}


def run_phase_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("name", choices=sorted(PHASES))
    p.add_argument("--spec", required=True)
    a = p.parse_args(argv)
    res = PHASES[a.name](json.loads(a.spec))
    harness.emit_result(res)


# --------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------
def run_phase(name: str, spec: dict, log_path: Path, cwd: Path, limit_gb: float | None,
              timeout_s: float | None) -> dict:
    """Run a phase in its own process (harness.run_child: its own session, its tree's memory
    watched, killed over the memory limit or the timeout)."""
    res = harness.run_child([sys.executable, str(Path(__file__).resolve()), "_phase", name, "--spec", json.dumps(spec)],
                            log_path, limit_gb=limit_gb, timeout_s=timeout_s, cwd=cwd, expect_result=True)
    res.pop("stdout", None)
    return res


def _ensure_input(args, workdir: Path) -> dict:
    params = {"source_dir": os.path.abspath(args.source_dir), "ranks": args.ranks,
              "events_per_rank": args.events_per_rank, "v": 1}
    key = hashlib.sha1(json.dumps(params, sort_keys=True).encode()).hexdigest()[:12]
    in_dir = workdir / f"input-{key}"
    manifest_path = in_dir / "manifest.json"
    if manifest_path.exists():
        man = json.loads(manifest_path.read_text())
        if all(Path(f["path"]).exists() for f in man["files"]):
            man["reused"] = True
            return man
    if in_dir.exists():
        shutil.rmtree(in_dir)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "_generate", "--source-dir",
                          args.source_dir, "--out", str(in_dir / "traces"), "--ranks", str(args.ranks),
                          "--events-per-rank", str(args.events_per_rank)], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"input generation failed:\n{out.stderr[-4000:]}")
    man = json.loads(out.stdout.strip().splitlines()[-1])
    man["generate_seconds"] = round(time.perf_counter() - t0, 1)
    man["dir"] = str(in_dir / "traces")
    manifest_path.write_text(json.dumps(man, indent=1))
    man["reused"] = False
    return man


def _gb(kb: int | float) -> float:
    return kb * 1024 / 1e9


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_phase"]:
        run_phase_main(argv[1:])
        return 0
    if argv[:1] == ["_generate"]:
        g = argparse.ArgumentParser()
        g.add_argument("--source-dir", required=True)
        g.add_argument("--out", required=True)
        g.add_argument("--ranks", type=int, required=True)
        g.add_argument("--events-per-rank", type=int, required=True)
        a = g.parse_args(argv[1:])
        print(json.dumps(generate(a.source_dir, Path(a.out), a.ranks, a.events_per_rank)))
        return 0

    from traceanalyzer.analyses.results import ALL

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source-dir", default=DEFAULT_SOURCE_DIR,
                   help="folder with the traces of every rank of one real job (default: the 8 DLRM ranks)")
    p.add_argument("--ranks", type=int, default=128, help="ranks of the generated job (default 128)")
    p.add_argument("--events-per-rank", type=int, default=100_000, help="at least this many events per rank (default 100000)")
    p.add_argument("--workers", type=int, default=2, help="ingest worker processes (default 2)")
    p.add_argument("--workdir", default=None, help="folder for the input and the store (default: a new temporary folder, deleted)")
    p.add_argument("--keep", action="store_true", help="keep the work folder (the input is reused by a later run with the same --workdir)")
    p.add_argument("--reuse-store", action="store_true", help="with --workdir: skip ingest when the store from an earlier run is there")
    p.add_argument("--ingest-only", action="store_true",
                   help="only generate + ingest the input (and print the store's stats), e.g. for replay_bench.py --store")
    p.add_argument("--skip-per-analysis", action="store_true", help="do not time each analysis alone")
    p.add_argument("--only", action="append", default=None, choices=ALL, help="time only these analyses alone (repeatable)")
    p.add_argument("--views", action="store_true", help="also time each intermediate SQL view (SELECT count(*))")
    p.add_argument("--explain", action="append", default=[], metavar="NAME",
                   help="write DuckDB's EXPLAIN ANALYZE of this analysis (or view) into the work folder (repeatable)")
    p.add_argument("--what-if", action="store_true",
                   help="also run the whole suite with candidate changes applied at run time (see WHAT_IF); nothing is edited")
    p.add_argument("--timeout-s", type=float, default=1800.0, help="kill the whole-suite phase after this (default 1800)")
    p.add_argument("--analysis-timeout-s", type=float, default=600.0, help="kill one analysis or view after this (default 600)")
    p.add_argument("--mem-limit-gb", type=float, default=16.0, help="kill any phase whose process tree exceeds this RSS (default 16)")
    p.add_argument("--json-out", default=None, help="write all measurements as JSON here")
    p.add_argument("--markdown-out", default=None, help="write a Markdown results section here")
    args = p.parse_args(argv)

    started = _dt.datetime.now().astimezone()
    loadavg_start = [round(x, 2) for x in os.getloadavg()]
    git_start = harness.git_state()
    own_tmp = args.workdir is None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="ta-analyses-bench-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    command = " ".join([sys.executable, sys.argv[0], *argv])
    lim, tmo = args.mem_limit_gb, args.analysis_timeout_s
    try:
        man = _ensure_input(args, workdir)
        files = [f["path"] for f in man["files"]]
        in_bytes = sum(f["bytes"] for f in man["files"])
        print(f"input: {len(files)} rank files, {harness.fmt_bytes(in_bytes)} JSON, {man['copies_per_rank']} copies "
              f"(steps) per rank of {len(man['sources'])} source ranks, in {man['dir']}"
              f"{' (reused)' if man.get('reused') else ''}", flush=True)
        store = workdir / f"store-{Path(man['dir']).parent.name}"
        spec = {"store": str(store)}

        ingest = None
        if not (args.reuse_store and (store / "_store.json").exists()):
            ib._warm_page_cache(files)
            ingest = run_phase("ingest", {"files": files, "store": str(store), "run": f"job{args.ranks}",
                                          "workers": args.workers}, workdir / "ingest.log", workdir, lim, None)
            if not ingest["ok"]:
                print(f"ingest FAILED: {ingest['error']}\n{ingest['log_tail']}")
                return 1
            print(f"ingest: {ingest['seconds']:.1f} s, store {harness.fmt_bytes(ingest['store_bytes'])}", flush=True)
        stats = run_phase("stats", spec, workdir / "stats.log", workdir, lim, None)
        if not stats["ok"]:
            print(f"stats FAILED: {stats['error']}\n{stats['log_tail']}")
            return 1
        print(f"store: {stats['ranks']} ranks, {stats['events_total']:,} events "
              f"({stats['events_per_rank_min']:,}..{stats['events_per_rank_max']:,} per rank), "
              f"{stats['distinct_steps']} steps, {stats['collectives']} collectives x "
              f"{stats['ranks_per_collective_min']}..{stats['ranks_per_collective_max']} ranks", flush=True)
        if args.ingest_only:
            print(f"store: {store}")
            return 0

        suite = run_phase("analyze", spec, workdir / "analyze.log", workdir, lim, args.timeout_s)
        if suite["ok"]:
            b = suite["baseline"]["seconds"]
            print(f"baseline scan: {b:.3f} s; prepare (SQL modules loaded once): {suite['prepare_seconds']:.1f} s; "
                  f"analyze (whole suite): {suite['seconds']:.1f} s "
                  f"({suite['seconds'] / b:.0f}x the scan), peak RSS {_gb(suite['self_maxrss_kb']):.2f} GB", flush=True)
        else:
            print(f"analyze FAILED: {suite['error']}\n{suite['log_tail']}", flush=True)

        per = {}
        if not args.skip_per_analysis:
            for name in args.only or ALL:
                r = run_phase("one", dict(spec, name=name), workdir / f"one-{name}.log", workdir, lim, tmo)
                per[name] = r
                if r["ok"]:
                    print(f"  {name:24s} {r['seconds']:8.2f} s (prepare alone {r['prepare_seconds']:.2f} s) "
                          f"{r['rows']:>8,} rows  peak RSS "
                          f"{_gb(r['self_maxrss_kb']):.2f} GB", flush=True)
                else:
                    print(f"  {name:24s} FAILED: {r['error']}", flush=True)

        views = {}
        if args.views:
            for v in VIEWS:
                r = run_phase("view", dict(spec, view=v), workdir / f"view-{v}.log", workdir, lim, tmo)
                views[v] = r
                print(f"  view {v:24s} " + (f"{r['seconds']:8.2f} s  {r['rows']:>10,} rows  peak RSS "
                                            f"{_gb(r['self_maxrss_kb']):.2f} GB" if r["ok"] else f"FAILED: {r['error']}"),
                      flush=True)
        whatif = {}
        if args.what_if:
            for v in WHAT_IF:
                r = run_phase("whatif", dict(spec, variant=v), workdir / f"whatif-{v}.log", workdir, lim, args.timeout_s)
                whatif[v] = r
                print(f"  what-if {v:14s} " + (f"{r['seconds']:8.1f} s  peak RSS {_gb(r['self_maxrss_kb']):.2f} GB  "
                                              f"applied {r['applied']}" if r["ok"] else f"FAILED: {r['error']}"), flush=True)
        explains = {}
        for name in args.explain:
            out = workdir / f"explain-{name}.txt"
            r = run_phase("explain", dict(spec, name=name, out=str(out)), workdir / f"explain-{name}.log",
                          workdir, lim, tmo)
            explains[name] = r
            print(f"  EXPLAIN ANALYZE {name}: " + (f"{r['seconds']:.1f} s -> {out}" if r["ok"] else r["error"]), flush=True)

        finished = _dt.datetime.now().astimezone()
        payload = {
            "command": command,
            "started": started.isoformat(timespec="seconds"),
            "finished": finished.isoformat(timespec="seconds"),
            "machine": harness.machine_info(),
            "loadavg_start": loadavg_start,
            "git_start": git_start,
            "git_end": harness.git_state(),
            "code_digest_end": _code_digest(REPO / "traceanalyzer"),
            "workers": args.workers,
            "input": {k: v for k, v in man.items() if k != "files"} | {"files": len(files), "total_bytes": in_bytes},
            "ingest": ingest,
            "store": stats,
            "analyze": suite,
            "per_analysis": per,
            "views": views,
            "what_if": whatif,
            "explain": explains,
        }
        md = render_markdown(payload)
        print()
        print(md)
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(payload, indent=1, default=str))
        if args.markdown_out:
            Path(args.markdown_out).write_text(md)
        return 0 if suite["ok"] else 1
    finally:
        if own_tmp and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"work folder kept: {workdir}")


def render_markdown(payload: dict) -> str:
    m, inp, st = payload["machine"], payload["input"], payload["store"]
    suite, ing = payload["analyze"], payload["ingest"]
    base = suite.get("baseline", {}).get("seconds") if suite.get("ok") else None

    def ratio(s):
        return f"{s / base:,.0f}x" if base else "-"

    g = payload.get("git_start", {})
    git_txt = f"{g.get('head')}{' + uncommitted changes in traceanalyzer/' if g.get('traceanalyzer_dirty') else ''}"
    lines = [
        f"- command: `{payload['command']}`",
        f"- date: {payload['started']} .. {payload['finished']}",
        f"- machine: {m.get('cores')} cores ({m.get('cpu', '?')}), {m.get('mem_total_gib', '?')} GiB RAM, "
        f"{m.get('platform')}, Python {m.get('python')}; load average (1/5/15 min) {payload['loadavg_start']} at "
        f"start, {m.get('loadavg')} at end",
    ]
    if suite.get("ok"):
        v = suite["versions"]
        ds = suite["duckdb_settings"]
        lines.append("- code: " + ", ".join(f"{k} {v[k]}" for k in v) + f" (git {git_txt}; sha1 of "
                     f"traceanalyzer/**/*.py and *.sql at the suite's start: {suite['source_digest']}"
                     f"{'' if payload.get('code_digest_end') == suite['source_digest'] else ', CHANGED during the run: ' + str(payload.get('code_digest_end'))}"
                     f"); DuckDB threads "
                     f"{ds.get('threads')}, memory_limit {ds.get('memory_limit')}")
    srcs = inp["sources"]
    lines.append(
        f"- input: {inp['ranks']} rank files (plain .json, {harness.fmt_bytes(inp['total_bytes'])}); rank r = source rank "
        f"r mod {len(srcs)} of `{inp['source_dir']}` ({', '.join(str(s['trace_events']) for s in srcs)} trace events), "
        f"repeated {inp['copies_per_rank']} times in time (shift {inp['shift_per_copy_us']:,.0f} us, one ProfilerStep "
        f"per copy)")
    lines.append(
        f"- store: {st['ranks']} ranks, **{st['events_per_rank_min']:,}..{st['events_per_rank_max']:,} events per "
        f"rank**, {st['events_total']:,} events in all, {st['kernels']:,} kernels, {st['comms']:,} comms rows, "
        f"{st['flows']:,} flows, {st['distinct_steps']} steps per rank, {st['collectives']:,} collectives joined "
        f"across {st['ranks_per_collective_min']}..{st['ranks_per_collective_max']} ranks each "
        f"({', '.join(f'{k} {n:,}' for k, n in st['ops'].items())}; dialect "
        f"{', '.join(st['dialects'])}; seq from {', '.join(st['seq_sources'])}); "
        + (f"store {harness.fmt_bytes(ing['store_bytes'])} on disk ({ing['store_files']} files), " if ing else "")
        + f"events Parquet {harness.fmt_bytes(st['events_parquet_bytes'])}")
    lines.append("")
    lines.append("| measure | time (s) | ÷ baseline scan | peak RSS of the process | rows | of which prepare (s) |")
    lines.append("|---|---:|---:|---:|---:|---:|")
    if base:
        bl = suite["baseline"]
        lines.append(f"| baseline: `{bl['sql']}` (best of 3) | {base:.3f} | 1x | {_gb(suite['baseline_peak_kb']):.2f} GB | "
                     f"{bl['events']:,} events | |")
    if ing:
        lines.append(f"| ingest ({payload['workers']} workers; not in the budget) | {ing['seconds']:.1f} | "
                     f"{ratio(ing['seconds'])} | {_gb(ing['max_tree_rss_kb']):.2f} GB (tree) | | |")
    if suite.get("ok"):
        tot_rows = sum(suite["rows"].values())
        lines.append(f"| **analyze: the whole suite, results saved** | **{suite['seconds']:.1f}** | "
                     f"{ratio(suite['seconds'])} | **{_gb(suite['self_maxrss_kb']):.2f} GB** | {tot_rows:,} | "
                     f"{suite['prepare_seconds']:.1f} (once, measured apart) |")
    else:
        lines.append(f"| analyze: the whole suite | FAILED: {suite.get('error')} | | "
                     f"{_gb(suite.get('max_tree_rss_kb', 0)):.2f} GB | | |")
    per = payload["per_analysis"]
    if per:
        ok = {k: r for k, r in per.items() if r.get("ok")}
        lines.append(f"| each analysis alone, sum ({len(ok)} of {len(per)}) | {sum(r['seconds'] for r in ok.values()):.1f} | "
                     f"{ratio(sum(r['seconds'] for r in ok.values()))} | | | |")
        for name, r in sorted(per.items(), key=lambda kv: -kv[1].get("seconds", 1e18)):
            if r.get("ok"):
                lines.append(f"| &nbsp;&nbsp;{name} | {r['seconds']:.2f} | {ratio(r['seconds'])} | "
                             f"{_gb(r['self_maxrss_kb']):.2f} GB | {r['rows']:,} | {r['prepare_seconds']:.2f} |")
            else:
                lines.append(f"| &nbsp;&nbsp;{name} | FAILED: {r['error']} | | {_gb(r['max_tree_rss_kb']):.2f} GB | | |")
    views = payload.get("views") or {}
    if views:
        lines.append("")
        lines.append("Intermediate views, each alone (`SELECT count(*) FROM view` on a fresh connection):")
        lines.append("")
        lines.append("| view | time (s) | ÷ baseline scan | peak RSS | rows |")
        lines.append("|---|---:|---:|---:|---:|")
        for name, r in views.items():
            if r.get("ok"):
                lines.append(f"| {name} | {r['seconds']:.2f} | {ratio(r['seconds'])} | {_gb(r['self_maxrss_kb']):.2f} GB | {r['rows']:,} |")
            else:
                lines.append(f"| {name} | FAILED: {r['error']} | | | |")
    wi = payload.get("what_if") or {}
    if wi:
        lines.append("")
        lines.append("What if (the whole suite again, results not saved, with changes applied at run time, cumulative; "
                     "`--what-if`; nothing is edited):")
        lines.append("")
        lines.append("| variant | time (s) | ÷ baseline scan | peak RSS | applied |")
        lines.append("|---|---:|---:|---:|---|")
        for name, r in wi.items():
            if r.get("ok"):
                ap = ", ".join(k for k, v in r["applied"].items() if v) or "nothing"
                lines.append(f"| {name} | {r['seconds']:.1f} | {ratio(r['seconds'])} | {_gb(r['self_maxrss_kb']):.2f} GB | {ap} |")
            else:
                lines.append(f"| {name} | FAILED: {r['error']} | | | |")
    lines.append("")
    if suite.get("ok"):
        t_ok = suite["seconds"] <= TARGET_SECONDS
        m_ok = suite["self_maxrss_kb"] * 1024 <= TARGET_BYTES
        lines.append(f"- analyze time: **{suite['seconds']:.1f} s** (target <= {TARGET_SECONDS:.0f} s: "
                     f"{'met' if t_ok else 'NOT met'})")
        lines.append(f"- analyze peak RSS: **{_gb(suite['self_maxrss_kb']):.2f} GB** (target <= {TARGET_BYTES / 1e9:.0f} GB: "
                     f"{'met' if m_ok else 'NOT met'}); the process held {_gb(suite['rss_before_analyze_kb']):.2f} GB "
                     f"before the call")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
