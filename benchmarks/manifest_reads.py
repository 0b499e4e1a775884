#!/usr/bin/env python3
"""Rank manifest reads of one ingest (issue 18 part 3), before/after in the same run.

For each N of ``--ranks``: N traces with a collector ``rank{R}.manifest.json`` beside each (the
collector's fields, ``collect.manifest.rank_part``'s layout: a default process group of all N
ranks, so a manifest grows with N), then in a child process per code version:

* ``before``: the code at ``--before`` (a ``git archive`` copy; default: the commit before the
  change), where each parse task reads every manifest of its folder, twice (the rank check and the
  run id): 2 x N x N reads;
* ``after``: this tree, where the driver reads each manifest once (``sidecars.manifests_for``) and
  hands each task its own part.

By default the child does the manifest work of the parse tasks alone, as that version's
``batch._parse_one`` does it (no trace parsed: the traces are empty files, whose names are what the
checks read); with ``--ingest`` it runs a whole ``ingest`` (``workers=1``) of a job generated from
the real DLRM traces (``analyses_bench.generate``, one copy a rank). Reads are counted by a counter
around ``Path.read_text`` for ``rank*.manifest.json`` in the child (every read happens there).
Reported: reads, JSON bytes read, CPU and wall seconds, the bytes the driver hands the tasks, and
the ratio after/before of the same run. A script, not a test.

    PYTHONPATH=$PWD python benchmarks/manifest_reads.py --ranks 256,512 [--ingest] [--append]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import analyses_bench as ab  # noqa: E402
import harness  # noqa: E402

#: the commit before "Ingest reads each rank manifest once" (b8ad8c3)
BEFORE = "b8ad8c3^"


def _count_manifest_reads():
    """In a benchmark child only (its own process, never a library): count the rank manifests read
    through ``Path.read_text`` from now on; returns (reads, size) counters (``n``, ``bytes``)."""
    from collections import Counter
    reads, size = Counter(), Counter()
    real = Path.read_text

    def counted(self, *a, **k):
        text = real(self, *a, **k)
        if self.name.startswith("rank") and self.name.endswith(".manifest.json"):
            reads["n"] += 1
            size["bytes"] += len(text)
        return text
    Path.read_text = counted
    return reads, size


def child(folder: str, store: str, workers: int) -> None:
    """In the child: one ingest, its manifest reads counted."""
    reads, size = _count_manifest_reads()
    import traceanalyzer as ta
    t0, c0 = time.perf_counter(), time.process_time()
    rep = ta.ingest([folder], store, run="job", progress=False, workers=workers)
    harness.emit_result({"traces": len(rep.traces), "reads": reads["n"], "json_bytes": size["bytes"],
                         "wall_s": time.perf_counter() - t0, "cpu_s_self": time.process_time() - c0,
                         "where": ta.__file__})


def child_checks(folder: str) -> None:
    """In the child: the manifest work of one ingest's parse tasks alone (no trace parsed), as that
    code version's ``batch._parse_one`` / ``_parse_all`` do it: before, each task reads its folder's
    manifests for the rank check and again for the run id; after, the driver reads them once
    (``sidecars.manifests_for``) and each task checks against its own part."""
    import pickle
    reads, size = _count_manifest_reads()
    import traceanalyzer as ta
    from traceanalyzer.ingest import sidecars
    from traceanalyzer.ingest.consistency import collector_run_id
    traces = sorted(Path(folder).glob("rank*.trace.json"), key=lambda p: int(p.name[4:].split(".")[0]))
    ranks = [int(p.name[4:].split(".")[0]) for p in traces]
    t0, c0 = time.perf_counter(), time.process_time()
    if hasattr(sidecars, "manifests_for"):        # after: the driver reads, each task gets its part
        parts = sidecars.manifests_for([str(p) for p in traces], {})
        payload = sum(len(pickle.dumps(part)) for part in parts)
    else:
        parts, payload = [None] * len(traces), 0
    ids = set()
    for p, r, part in zip(traces, ranks, parts):  # the tasks
        sidecars.check_rank_manifest(p, r, "content", part)
        ids.add(collector_run_id(p, part))
    assert ids == {"job"}, ids
    harness.emit_result({"traces": len(traces), "reads": reads["n"], "json_bytes": size["bytes"],
                         "wall_s": time.perf_counter() - t0, "cpu_s_self": time.process_time() - c0,
                         "task_payload_bytes": payload, "where": ta.__file__})


def write_manifests(folder: Path, files: list[dict], ranks: int) -> int:
    """A collector rank manifest beside each generated trace; returns their total bytes."""
    from traceanalyzer.collect.manifest import MANIFEST_VERSION, write_json
    total = 0
    for f in files:
        r = f["rank"]
        doc = {"manifest_version": MANIFEST_VERSION, "run_id": "job", "rank": r, "local_rank": r % 8,
               "host": f"node{r // 8}", "pid": 10_000 + r, "device": f"cuda:{r % 8}",
               "process_groups": [{"name": "0", "desc": "default_pg", "backend": "nccl", "size": ranks,
                                   "ranks": list(range(ranks))}],
               "env": {"NCCL_DEBUG": "WARN", "OMP_NUM_THREADS": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"},
               "clock": {"wall_ns": 1_795_983_563_969_904_429 + r, "monotonic_ns": 2_508_594_771_148 + r},
               "files": {"traces": [Path(f["path"]).name]}, "exit": "ok"}
        path = folder / f"rank{r}.manifest.json"
        write_json(path, doc)
        total += path.stat().st_size
    return total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="256,512", help="rank counts, comma-separated")
    ap.add_argument("--ingest", action="store_true",
                    help="a whole ingest of a generated job (traces parsed) instead of the manifest work alone")
    ap.add_argument("--before", default=BEFORE, help=f"git revision of the 'before' code (default {BEFORE})")
    ap.add_argument("--source-dir", default=ab.DEFAULT_SOURCE_DIR)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/manifest_reads"))
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--append", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = ap.parse_args(argv)
    work = args.workdir
    shutil.rmtree(work, ignore_errors=True)
    before = work / "before"
    before.mkdir(parents=True)
    tar = subprocess.run(["git", "-C", str(harness.REPO), "archive", args.before, "traceanalyzer"],
                         check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(before)], input=tar, check=True)
    rows, sizes = {}, {}
    for n in [int(x) for x in args.ranks.split(",")]:
        folder = work / f"job{n}"
        if args.ingest:
            files = ab.generate(args.source_dir, folder, n, 1)["files"]
        else:  # the checks never open a trace: its name beside the manifests is what they read
            folder.mkdir()
            files = [{"path": str(folder / f"rank{r}.trace.json"), "rank": r} for r in range(n)]
            for f in files:
                Path(f["path"]).touch()
        sizes[n] = write_manifests(folder, files, n)
        for name, root in (("before", before), ("after", harness.REPO)):
            call = (f"m.child({str(folder)!r}, {str(work / f'store-{name}-{n}')!r}, 1)" if args.ingest
                    else f"m.child_checks({str(folder)!r})")
            code = (f"import sys; sys.path.insert(0, {str(root)!r}); import traceanalyzer; "  # that version's, first
                    f"sys.path.insert(1, {str(HERE)!r}); import manifest_reads as m; {call}")
            res = harness.run_child([sys.executable, "-c", code], log_path=work / f"{name}-{n}.log",
                                    timeout_s=args.timeout, expect_result=True, cwd=work,
                                    env={**os.environ, "PYTHONPATH": str(root)})
            if not res["ok"]:
                print(f"{name} {n} ranks: {res['error']}\n{res.get('log_tail', '')}", file=sys.stderr)
                return 1
            assert str(root) in res["where"], res["where"]
            rows[(n, name)] = res
            print(f"{n} ranks, {name:6s}: {res['traces']} traces, reads {res['reads']:,} "
                  f"({res['json_bytes'] / 1e6:.1f} MB), CPU {res['cpu_s_self']:.2f} s (child {res['cpu_seconds']:.1f} s), "
                  f"wall {res['wall_s']:.2f} s", flush=True)
    text = render(rows, args, sizes)
    print(text)
    if args.append:
        harness.append_results(text)
    return 0


def render(rows: dict, args, sizes: dict) -> str:
    info = harness.machine_info()
    what = ("`ingest` of the folder (traces parsed, `workers=1`: every read and all the CPU in the child)"
            if args.ingest else "the manifest work of the parse tasks alone, as each version's ingest does it (the "
            "rank check and the run id of every trace; no trace parsed)")
    lines = [f"\n## Rank manifest reads of one ingest (issue 18 part 3), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n",
             f"`benchmarks/manifest_reads.py --ranks {args.ranks}{' --ingest' if args.ingest else ''}` on "
             f"{harness.machine_line(info)}: N traces with a collector rank manifest beside each (a default "
             f"process group of all N ranks: the manifest grows with N); {what}, in a child per code version "
             f"(before: `{args.before}`, where each task read its folder's N manifests twice). CPU: the measured "
             "part in the child (`process_time`).\n",
             "| ranks | manifest KB | code | manifest reads | JSON read | CPU s | wall s | handed to the tasks |",
             "|---|---|---|---|---|---|---|---|"]
    for (n, name), r in rows.items():
        payload = f"{r.get('task_payload_bytes', 0) / 1e6:.2f} MB" if name == "after" else "-"
        lines.append(f"| {n} | {sizes[n] / n / 1e3:.1f} | {name} | {r['reads']:,} | {r['json_bytes'] / 1e6:.1f} MB | "
                     f"{r['cpu_s_self']:.2f} | {r['wall_s']:.2f} | {payload} |")
    for n in sorted({n for n, _ in rows}):
        b, a = rows[(n, "before")], rows[(n, "after")]
        lines.append(f"\n{n} ranks: reads {b['reads']:,} -> {a['reads']:,}; CPU after/before "
                     f"{harness.ratio(a['cpu_s_self'], b['cpu_s_self']):.3f}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
