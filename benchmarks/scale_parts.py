#!/usr/bin/env python3
"""An N-rank job as the collector leaves it (issue 18 parts 1 and 6): Parquet parts on every rank, no JSON.

At 512-1,024 ranks x 100 k events the JSON of ``analyses_bench.generate`` would take 20-40 GB of disk
and an hour of parsing on this machine, which is what the collectors' per-rank conversion exists to
avoid: in a real job every rank converts its own window while it trains
(``traceanalyzer.collect.parquet``), and ``ingest`` only validates and commits. This generator makes
that state for the scale benchmark (``scale_bench.py --parts``):

1. the job's template ranks (one per source rank of the real 8-rank DLRM traces, with the process
   groups already ``N`` wide: ``analyses_bench.generate(..., only_ranks=...)``) are converted by the
   collector's own converter (``prebuilt.write_parts``), exactly as on a rank;
2. every other rank r gets a copy of its template's parts (rank r of the JSON generator is template
   r mod 8 with only ``distributedInfo.rank`` changed, so the converter's output differs only there:
   ``ranks.distributed_info_json`` and ``summary.json``); ``verify`` checks that claim against the
   converter run on the generated JSON of a rank;
3. the JSON is removed (the collector's ``keep_json=False``): the parts are the only copy.

    PYTHONPATH=$PWD python benchmarks/scale_parts.py --ranks 16 --out /tmp/parts16 --verify 9
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import analyses_bench as ab  # noqa: E402  (the N-rank job generator)

RUN = "job"


def _trace_name(rank: int) -> str:
    return f"rank{rank}.window0.pt.trace.json"


def _copy_rank(template: Path, dest: Path, rank: int) -> None:
    """Rank ``rank``'s parts from its template's: every table copied, the rank's own identity rewritten."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from traceanalyzer.store import files as st
    tmp = dest.parent / f".tmp-{dest.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in template.iterdir():
        if f.name not in ("ranks.parquet", "summary.json"):
            shutil.copyfile(f, tmp / f.name)
    t = pq.read_table(template / "ranks.parquet")
    col = t.schema.get_field_index("distributed_info_json")
    infos = [json.dumps(dict(json.loads(x), rank=rank)) if x else x for x in t.column(col).to_pylist()]
    st.write_table(t.set_column(col, t.schema.field(col), pa.array(infos, t.schema.field(col).type)), tmp / "ranks.parquet")
    doc = json.loads((template / "summary.json").read_text())
    doc.update(rank=rank, trace=_trace_name(rank), trace_signature=None,
               distributed_info=dict(doc.get("distributed_info") or {}, rank=rank))
    (tmp / "summary.json").write_text(json.dumps(doc, sort_keys=True))
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)


def make(source_dir: str, out: Path, ranks: int, events_per_rank: int) -> dict:
    """Write ``out/job/parquet/rank=R/window=0/`` for every rank; returns a manifest."""
    from traceanalyzer.ingest import prebuilt
    t0 = time.perf_counter()
    run_dir = out / RUN
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    n_src = len(ab._source_files(source_dir))
    templates = list(range(min(n_src, ranks)))
    gen = ab.generate(source_dir, run_dir, ranks, events_per_rank, only_ranks=set(templates))
    for f in gen["files"]:
        p = Path(f["path"]).rename(run_dir / _trace_name(f["rank"]))
        prebuilt.write_parts(p, f["rank"], fr_path=None)
        p.unlink()                      # keep_json=False: the parts are the only copy
    convert_s = time.perf_counter() - t0
    for r in range(len(templates), ranks):
        folder = prebuilt.parts_dir(run_dir / _trace_name(r))
        folder.parent.mkdir(parents=True, exist_ok=True)
        _copy_rank(prebuilt.parts_dir(run_dir / _trace_name(r % n_src)), folder, r)
    return {"dir": str(run_dir), "ranks": ranks, "templates": len(templates), "events_per_rank": events_per_rank,
            "copies_per_rank": gen["copies_per_rank"], "convert_seconds": round(convert_s, 1),
            "generate_seconds": round(time.perf_counter() - t0, 1)}


def verify(source_dir: str, out: Path, ranks: int, events_per_rank: int, rank: int) -> list[str]:
    """Differences between rank ``rank``'s copied parts and the converter run on that rank's generated
    JSON (empty: the copy is what the rank's own collector would have written)."""
    import pyarrow.parquet as pq

    from traceanalyzer.ingest import prebuilt
    work = out / "verify"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (f,) = ab.generate(source_dir, work, ranks, events_per_rank, only_ranks={rank})["files"]
    p = Path(f["path"]).rename(work / _trace_name(rank))
    mine = prebuilt.write_parts(p, rank, fr_path=None)
    copied = prebuilt.parts_dir(out / RUN / _trace_name(rank))
    diffs = []
    for name in prebuilt.TRACE_TABLES:
        a, b = pq.read_table(mine / f"{name}.parquet"), pq.read_table(copied / f"{name}.parquet")
        if name == "ranks":
            a, b = a.drop(["trace_file"]), b.drop(["trace_file"])
        if not a.equals(b):
            diffs.append(f"{name}: {a.num_rows} vs {b.num_rows} rows, not equal")
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (mine, copied))
    for k in sorted(set(sa) | set(sb) - {"trace_signature"}):
        if k != "trace_signature" and sa.get(k) != sb.get(k):
            diffs.append(f"summary.json {k}: {sa.get(k)!r:.80} vs {sb.get(k)!r:.80}")
    shutil.rmtree(work, ignore_errors=True)
    return diffs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--events-per-rank", type=int, default=100_000)
    ap.add_argument("--source-dir", default=ab.DEFAULT_SOURCE_DIR)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--verify", type=int, default=None, metavar="RANK",
                    help="also check RANK's copied parts against the converter run on its generated JSON")
    a = ap.parse_args(argv)
    man = make(a.source_dir, a.out, a.ranks, a.events_per_rank)
    print(json.dumps(man))
    if a.verify is not None:
        diffs = verify(a.source_dir, a.out, a.ranks, a.events_per_rank, a.verify)
        print(f"verify rank {a.verify}: " + ("identical to its own conversion" if not diffs else "; ".join(diffs)))
        return 1 if diffs else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
