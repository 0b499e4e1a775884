#!/usr/bin/env python3
"""Ingest speed/memory benchmark: traceanalyzer vs. a bare typed JSON decode vs. HTA.

One run of this script

1. builds a large input in a temporary folder: N per-rank Kineto trace files
   (plain ``.json``), each made by repeating the ``traceEvents`` of a real
   trace, every copy shifted in time by the trace's span (and its correlation /
   flow ids offset so they stay unique), with ``distributedInfo.rank`` rewritten
   per file (and ``world_size`` / the default process group's ranks rewritten to
   the new world);
2. measures, with the same number of worker processes (``--workers``, default 2):

   * ``ours``  - ``traceanalyzer.ingest(paths, store, run=..., workers=W)``;
   * ``floor`` - a bare typed msgspec decode of the same bytes (events as a
     ``msgspec.Struct`` with ph/name/cat/pid/tid/ts/dur/args) that also turns
     ``ts``/``dur`` exactly into int64 nanoseconds (decoded as ``msgspec.Raw``,
     converted from their decimal text with pyarrow), one worker process per
     file in a pool of W processes;
   * ``hta``   - Holistic Trace Analysis 0.5.0 ``TraceAnalysis(trace_dir=...)``
     in its own venv (pandas<3; see ``setup_hta_venv.sh``), with its
     multiprocessing pool forced to W processes;

3. prints events/s for each, the ratios ours/HTA and ours/floor, and the peak
   RSS per worker divided by the size of the file it parses.

Every phase runs in its own subprocess; this driver process watches the
phase's process tree (``/proc/PID/status`` VmHWM of every descendant, every
50 ms), and the phase reports ``getrusage(RUSAGE_SELF/RUSAGE_CHILDREN)``
itself. The per-worker peak is the larger of the two.

This is a script, not a test: it asserts nothing about timings.
"""


import argparse
import datetime as _dt
import gzip
import hashlib
import json
import math
import os
import platform
import re
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

DEFAULT_SOURCE = "/work/shared/traces/external/hta/ddp_2rank_rank1.json.gz"
DEFAULT_HTA_PYTHON = os.environ.get("HTA_PYTHON", "/work/hta-venv/bin/python")
MB = 1_000_000

# Integer ids that link events; offset per copy so that copies do not collide.
ID_ARG_KEYS = (
    "External id",
    "correlation",
    "Ev Idx",
    "Record function id",
    "Sequence number",
    "Python id",
    "Python parent id",
)


_ID_KEYS_RE = b"|".join(k.encode() for k in ("id",) + ID_ARG_KEYS)
# "key": number  (key = ts or one of the id keys)
_NUM_FIELD_RE = re.compile(
    rb'("(ts|' + _ID_KEYS_RE + rb')"\s*:\s*)(-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)'
)


def _offset_ids_dict(d: dict, off: int) -> None:
    if isinstance(d.get("id"), int) and not isinstance(d.get("id"), bool):
        d["id"] = d["id"] + off
    a = d.get("args")
    if isinstance(a, dict):
        a = dict(a)
        for key in ID_ARG_KEYS:
            x = a.get(key)
            if isinstance(x, int) and not isinstance(x, bool):
                a[key] = x + off
        d["args"] = a


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------
def _read_bytes(path: str | Path) -> bytes:
    path = str(path)
    if path.endswith(".gz"):
        with gzip.open(path, "rb") as fh:
            return fh.read()
    with open(path, "rb") as fh:
        return fh.read()


# --------------------------------------------------------------------------
# input generation (runs in a subprocess: `ingest_bench.py _generate ...`)
# --------------------------------------------------------------------------
def _parse_decimal(text: bytes):
    """'123', '-1.5', '7.25' -> (negative, int_digits, frac_digits); None if absent."""
    if not text or text == b"null":
        return None
    s = text.decode()
    neg = s.startswith("-")
    if neg:
        s = s[1:]
    if "e" in s or "E" in s:
        raise ValueError(f"exponent notation in ts/dur not supported by the generator: {text!r}")
    ip, _, fp = s.partition(".")
    return neg, ip or "0", fp


def generate(source: str, out_dir: Path, ranks: int, mb_per_rank: float) -> dict:
    import msgspec

    raw = _read_bytes(source)
    doc = msgspec.json.decode(raw)
    events = doc.get("traceEvents") or []

    class _TsDur(msgspec.Struct):
        ts: msgspec.Raw = msgspec.Raw(b"")

    class _Doc(msgspec.Struct):
        traceEvents: list[_TsDur] = []

    class _RawDoc(msgspec.Struct):
        traceEvents: list[msgspec.Raw] = []

    ts_raw = [bytes(e.ts) for e in msgspec.json.decode(raw, type=_Doc).traceEvents]
    # each event's original text (Kineto's pretty-printed layout is kept)
    ev_raw = [bytes(r) for r in msgspec.json.decode(raw, type=_RawDoc).traceEvents]
    del raw
    assert len(ts_raw) == len(events) == len(ev_raw)

    # ts as exact scaled integers (units of 10**-F us, F = max fraction digits seen).
    parsed = [_parse_decimal(t) for t in ts_raw]
    F = max((len(p[2]) for p in parsed if p is not None), default=0)
    scale = 10**F
    ts_scaled: list[int | None] = []
    for p in parsed:
        if p is None:
            ts_scaled.append(None)
            continue
        neg, ip, fp = p
        v = int(ip) * scale + (int(fp.ljust(F, "0")) if F else 0)
        ts_scaled.append(-v if neg else v)

    def ts_text(v: int) -> bytes:
        if F == 0:
            return str(v).encode()
        sign = "-" if v < 0 else ""
        q, r = divmod(abs(v), scale)
        return f"{sign}{q}.{r:0{F}d}".encode()

    # span of the trace -> time shift per copy (whole microseconds, plus 1 us)
    lo = min(v for v in ts_scaled if v is not None)
    hi = lo
    for e, v in zip(events, ts_scaled):
        if v is None:
            continue
        d = e.get("dur")
        end = v + (int(math.ceil(float(d) * scale)) if isinstance(d, (int, float)) else 0)
        hi = max(hi, end)
    shift = (-(-(hi - lo) // scale) + 1) * scale  # ceil to whole us, +1 us

    # id stride
    max_id = 0
    for e in events:
        i = e.get("id")
        if isinstance(i, int):
            max_id = max(max_id, i)
        a = e.get("args")
        if isinstance(a, dict):
            for k in ID_ARG_KEYS:
                v = a.get(k)
                if isinstance(v, int) and not isinstance(v, bool):
                    max_id = max(max_id, v)
    id_stride = max_id + 1

    # world rewrite (rank independent): world_size and full-world process groups
    dist = dict(doc.get("distributedInfo") or {})
    w0 = dist.get("world_size")
    world_rewrites = 0
    if isinstance(w0, int) and w0 != ranks:
        full0 = list(range(w0))
        full0_txt = str(full0)
        for e in events:
            a = e.get("args")
            if not isinstance(a, dict):
                continue
            if a.get("Group size") == w0:
                a["Group size"] = ranks
                world_rewrites += 1
            pgr = a.get("Process Group Ranks")
            if pgr == full0:
                a["Process Group Ranks"] = list(range(ranks))
            elif pgr == full0_txt:
                a["Process Group Ranks"] = str(list(range(ranks)))
        pgs = []
        for pg in dist.get("pg_config") or []:
            pg = dict(pg)
            if pg.get("ranks") == full0:
                pg["ranks"] = list(range(ranks))
                pg["pg_size"] = ranks
            pgs.append(pg)
        if "pg_config" in dist:
            dist["pg_config"] = pgs
        dist["world_size"] = ranks

    enc = msgspec.json.Encoder()
    reencode = set()  # events whose args were rewritten above: encoded anew
    if world_rewrites or (isinstance(w0, int) and w0 != ranks):
        for i, e in enumerate(events):
            a = e.get("args")
            if isinstance(a, dict) and ("Group size" in a or "Process Group Ranks" in a):
                reencode.add(i)
    is_meta = [e.get("ph") == "M" for e in events]

    def patch(i: int, k: int) -> bytes:
        """Event i of copy k: its original text with ts shifted and ids offset."""
        v = ts_scaled[i]
        b = ev_raw[i]
        if i in reencode:
            d = dict(events[i])
            if v is not None:
                d["ts"] = msgspec.Raw(ts_text(v + k * shift))
            if k:
                _offset_ids_dict(d, k * id_stride)
            return enc.encode(d)
        if k == 0:
            return b
        off = k * id_stride
        new_ts = ts_text(v + k * shift) if v is not None else None
        done_ts = False

        def sub(m):
            nonlocal done_ts
            key = m.group(2)
            if key == b"ts":
                if done_ts or new_ts is None or m.group(3) != ts_raw[i]:
                    return m.group(0)
                done_ts = True
                return m.group(1) + new_ts
            num = m.group(3)
            if b"." in num or b"e" in num or b"E" in num:
                return m.group(0)
            return m.group(1) + str(int(num) + off).encode()

        out = _NUM_FIELD_RE.sub(sub, b)
        if new_ts is not None and not done_ts:  # unusual layout: encode anew
            d = dict(events[i])
            d["ts"] = msgspec.Raw(new_ts)
            _offset_ids_dict(d, off)
            return enc.encode(d)
        return out

    def encode_copy(k: int) -> list[tuple[int, int | None, bytes]]:
        """[(event index, ts, bytes)] for copy k (metadata events only in copy 0)."""
        return [
            (i, ts_scaled[i], patch(i, k))
            for i in range(len(events))
            if not (k and is_meta[i])
        ]

    target = int(mb_per_rank * MB)
    chunks: list[bytes] = []
    total = 0
    n_events = 0
    copies = 0
    partial_fraction = 1.0
    k = 0
    while total < target:
        enc_k = encode_copy(k)
        size_k = sum(len(b) + 4 for _, _, b in enc_k)
        if total + size_k <= target or not enc_k:
            chunks.extend(b for _, _, b in enc_k)
            total += size_k
            n_events += len(enc_k)
            copies += 1
        else:
            # partial copy: the first part of its timeline, kept in file order
            need = target - total
            by_ts = sorted(
                (x for x in enc_k if x[1] is not None), key=lambda x: x[1]
            )
            acc = 0
            cutoff = None
            for _, v, b in by_ts:
                acc += len(b) + 4
                cutoff = v
                if acc >= need:
                    break
            kept = [b for _, v, b in enc_k if v is None or v <= cutoff]
            chunks.extend(kept)
            total += sum(len(b) + 4 for b in kept)
            n_events += len(kept)
            partial_fraction = len(kept) / len(enc_k)
            copies += 1
            break
        k += 1
        if not enc_k:
            break
    body = b"  " + b",\n  ".join(chunks)
    del chunks

    out_dir.mkdir(parents=True, exist_ok=True)
    header_keys = [k for k in doc if k != "traceEvents"]
    files = []
    for r in range(ranks):
        d = dict(dist)
        d["rank"] = r
        # Kineto layout: one top-level key per line, distributedInfo before traceEvents
        # (HTA finds a file's rank with the regex '"rank":\s+(\d+)' read line by line).
        parts = [b"{\n"]
        for key in header_keys:
            val = d if key == "distributedInfo" else doc[key]
            parts.append(f"  {json.dumps(key)}: {json.dumps(val)},\n".encode())
        if "distributedInfo" not in doc:
            parts.append(f'  "distributedInfo": {json.dumps(d)},\n'.encode())
        parts.append(b'  "traceEvents": [\n')
        path = out_dir / f"rank{r}.trace.json"
        with open(path, "wb") as fh:
            fh.write(b"".join(parts))
            fh.write(body)
            fh.write(b"\n  ]\n}\n")
        files.append({"path": str(path), "rank": r, "bytes": path.stat().st_size, "events": n_events})

    return {
        "source": source,
        "source_events": len(events),
        "ts_fraction_digits": F,
        "shift_per_copy_us": shift / scale,
        "id_stride": id_stride,
        "copies_per_rank": copies,
        "last_copy_fraction": round(partial_fraction, 4),
        "world_rewrites": world_rewrites,
        "files": files,
    }


# --------------------------------------------------------------------------
# floor: bare typed msgspec decode + exact ts/dur -> int64 ns
# --------------------------------------------------------------------------
_FLOOR_TYPES = None


def _floor_types():
    global _FLOOR_TYPES
    if _FLOOR_TYPES is None:
        from typing import Any

        import msgspec

        class Event(msgspec.Struct):
            ph: str | None = None
            name: str | None = None
            cat: str | None = None
            pid: int | str | None = None
            tid: int | str | None = None
            ts: msgspec.Raw = msgspec.Raw(b"")
            dur: msgspec.Raw = msgspec.Raw(b"")
            args: dict[str, Any] | None = None

        class Trace(msgspec.Struct):
            traceEvents: list[Event] = []
            distributedInfo: dict[str, Any] | None = None

        _FLOOR_TYPES = (Event, Trace)
    return _FLOOR_TYPES


def decimal_text_to_ns(raws) -> "object":
    """Exact conversion of JSON number texts (microseconds) to int64 nanoseconds.

    ``raws``: sequence of bytes-like (msgspec.Raw); empty or ``null`` -> null.
    Digits beyond the third decimal (sub-ns) are truncated.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    blob = b"\n".join(raws)
    s = pc.list_flatten(pc.split_pattern(pa.array([blob], pa.large_binary()).cast(pa.large_string()), "\n"))
    m = pc.extract_regex(s, r"^(?P<neg>-?)(?P<i>\d+)(?:\.(?P<f>\d*))?$")
    ip = pc.struct_field(m, "i")
    fp = pc.utf8_slice_codeunits(pc.utf8_rpad(pc.struct_field(m, "f"), 3, "0"), 0, 3)
    ns = pc.add(pc.multiply(ip.cast(pa.int64()), 1000), fp.cast(pa.int64()))
    neg = pc.equal(pc.struct_field(m, "neg"), "-")
    ns = pc.if_else(neg, pc.negate(ns), ns)
    bad = pc.and_(pc.is_null(m), pc.not_equal(s, ""))
    bad = pc.and_(bad, pc.not_equal(s, "null"))
    if pc.any(bad).as_py():  # rare forms (exponent): exact fallback via Decimal
        from decimal import Decimal

        vals = ns.to_pylist()
        for i in pc.indices_nonzero(bad).to_pylist():
            vals[i] = int(Decimal(s[i].as_py()) * 1000)
        ns = pa.array(vals, pa.int64())
    return ns


def floor_parse_file(path: str) -> dict:
    import msgspec
    import pyarrow  # noqa: F401 - imported before the baseline reading

    _, Trace = _floor_types()
    rss_before_kb = harness.proc_status_kb("VmRSS")
    with open(path, "rb") as fh:
        buf = fh.read()
    doc = msgspec.json.decode(buf, type=Trace)
    del buf
    ev = doc.traceEvents
    ts = decimal_text_to_ns([e.ts for e in ev])
    dur = decimal_text_to_ns([e.dur for e in ev])
    return {
        "events": len(ev),
        "ts_nonnull": len(ts) - ts.null_count,
        "dur_nonnull": len(dur) - dur.null_count,
        "rank": (doc.distributedInfo or {}).get("rank"),
        "rss_before_kb": rss_before_kb,
        "hwm_after_kb": harness.proc_status_kb("VmHWM"),
    }


# --------------------------------------------------------------------------
# phases (each runs in its own subprocess: `ingest_bench.py _phase NAME ...`)
# --------------------------------------------------------------------------
def phase_floor(files: list[str], workers: int, workdir: Path) -> dict:
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as ex:
        res = list(ex.map(floor_parse_file, files))
    t1 = time.perf_counter()
    return {
        "seconds": t1 - t0,
        "events": sum(r["events"] for r in res),
        "extra": {"per_file": res, "start_method": "spawn"},
        "versions": harness.versions(["msgspec", "pyarrow"]),
    }


def _report_summary(rep) -> dict:
    out = {"type": type(rep).__name__}
    try:
        r = repr(rep)
        out["repr"] = r if len(r) <= 600 else r[:600] + "..."
    except Exception as exc:  # noqa: BLE001
        out["repr"] = f"<repr failed: {exc}>"
    fields = {}
    src = rep if isinstance(rep, dict) else getattr(rep, "__dict__", {})
    if not src and hasattr(rep, "__dataclass_fields__"):
        src = {k: getattr(rep, k) for k in rep.__dataclass_fields__}
    for k, v in dict(src).items():
        if isinstance(v, (int, float, str, bool)) or v is None:
            fields[k] = v
    for attr in ("n_events", "skipped"):
        try:
            v = getattr(rep, attr)
            fields[attr] = v if isinstance(v, (int, float, str, bool, dict)) else repr(v)
        except Exception:  # noqa: BLE001
            pass
    try:
        fields["summary"] = rep.summary()
    except Exception:  # noqa: BLE001
        pass
    out["fields"] = fields
    return out


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _stop_forkserver() -> None:
    """Stop (and reap) multiprocessing's forkserver, if one was started, so that the
    peak RSS of the workers it forked reaches RUSAGE_CHILDREN of this process."""
    try:
        from multiprocessing import forkserver

        fs = forkserver._forkserver
        if getattr(fs, "_forkserver_pid", None):
            fs._stop()
    except Exception:  # noqa: BLE001 - private API; the /proc poller still sees the workers
        pass


def _source_digest(pkg_dir: Path) -> str:
    h = hashlib.sha1()
    for f in sorted(pkg_dir.rglob("*.py")):
        h.update(str(f.relative_to(pkg_dir)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def phase_ours(files: list[str], workers: int, workdir: Path) -> dict:
    import traceanalyzer

    pkg_dir = Path(traceanalyzer.__file__).resolve().parent
    digest = _source_digest(pkg_dir)

    store = workdir / f"store-ours-{os.getpid()}"
    if store.exists():
        shutil.rmtree(store)
    t0 = time.perf_counter()
    rep = traceanalyzer.ingest(files, str(store), run="bench", workers=workers, progress=False)
    t1 = time.perf_counter()
    _stop_forkserver()
    info = {
        "package_dir": str(pkg_dir),
        "source_digest": digest,
        "report": _report_summary(rep),
        "store_bytes": _dir_bytes(store) if store.exists() else None,
        "store_files": sum(1 for p in store.rglob("*") if p.is_file()) if store.exists() else None,
    }
    shutil.rmtree(store, ignore_errors=True)
    vers = harness.versions(["traceanalyzer", "pandas", "pyarrow", "duckdb", "msgspec", "numpy"])
    return {"seconds": t1 - t0, "events": None, "extra": info, "versions": vers}


def phase_hta(trace_dir: str, workers: int, workdir: Path) -> dict:
    # HTA sizes its pool as min(mp.cpu_count(), #ranks) for <= 8 ranks, and from a
    # tracemalloc probe (get_mp_pool_size) above 8 ranks: force W processes.
    import multiprocessing

    multiprocessing.cpu_count = lambda: workers  # type: ignore[assignment]
    import hta.common.trace as hta_trace

    hta_trace.get_mp_pool_size = lambda *a, **k: workers  # type: ignore[assignment]
    from hta.trace_analysis import TraceAnalysis

    t0 = time.perf_counter()
    ta = TraceAnalysis(trace_dir=trace_dir)
    t1 = time.perf_counter()
    traces = ta.t.traces
    rows = {int(r): int(len(df)) for r, df in traces.items()}
    return {
        "seconds": t1 - t0,
        "events": None,
        "extra": {
            "ranks_loaded": sorted(rows),
            "dataframe_rows": sum(rows.values()),
            "parser_backend": str(hta_trace.ParserConfig.get_default_cfg().parser_backend or "default (json)"),
        },
        "versions": harness.versions(["holistictraceanalysis", "pandas", "numpy"]),
    }


def run_phase_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("name", choices=["floor", "ours", "hta"])
    p.add_argument("--spec", required=True)
    a = p.parse_args(argv)
    spec = json.loads(a.spec)
    workdir = Path(spec["workdir"])
    if a.name == "floor":
        res = phase_floor(spec["files"], spec["workers"], workdir)
    elif a.name == "ours":
        res = phase_ours(spec["files"], spec["workers"], workdir)
    else:
        res = phase_hta(spec["trace_dir"], spec["workers"], workdir)
    res["python"] = platform.python_version()
    res["executable"] = sys.executable
    harness.emit_result(res)


# --------------------------------------------------------------------------
# driver: process-tree memory watcher
# --------------------------------------------------------------------------
def run_phase(python: str, name: str, spec: dict, log_path: Path, limit_gb: float | None) -> dict:
    """Run a phase in its own process under ``python`` (harness.run_child: wall, CPU, tree RSS)."""
    res = harness.run_child([python, str(Path(__file__).resolve()), "_phase", name, "--spec", json.dumps(spec)],
                            log_path, limit_gb=limit_gb, expect_result=True)
    res.pop("stdout", None)
    res["polled_coordinator_peak_kb"] = res.get("polled_peak_kb", 0)
    if res["ok"]:
        res["worker_peak_kb"] = max(res.get("children_maxrss_kb") or 0, res["polled_worker_peak_kb"])
    return res


# --------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------
def _ensure_input(args, workdir: Path) -> dict:
    params = {
        "source": os.path.abspath(args.source),
        "ranks": args.ranks,
        "mb_per_rank": args.mb_per_rank,
        "v": 3,
    }
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
    out = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "_generate",
            "--source",
            args.source,
            "--out",
            str(in_dir / "traces"),
            "--ranks",
            str(args.ranks),
            "--mb-per-rank",
            str(args.mb_per_rank),
        ],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        sys.exit(f"input generation failed:\n{out.stderr[-4000:]}")
    man = json.loads(out.stdout.strip().splitlines()[-1])
    man["generate_seconds"] = round(time.perf_counter() - t0, 1)
    man["dir"] = str(in_dir / "traces")
    manifest_path.write_text(json.dumps(man, indent=1))
    man["reused"] = False
    return man


def _warm_page_cache(paths) -> None:
    for p in paths:
        with open(p, "rb") as fh:
            while fh.read(16 << 20):
                pass


def _best(runs: list[dict]) -> dict:
    ok = [r for r in runs if r.get("ok")]
    if not ok:
        return runs[-1]
    best = min(ok, key=lambda r: r["seconds"])
    best = dict(best)
    best["all_seconds"] = [round(r["seconds"], 3) for r in ok]
    best["worker_peak_kb"] = max(r["worker_peak_kb"] for r in ok)
    best["self_maxrss_kb"] = max(r.get("self_maxrss_kb") or 0 for r in ok)
    best["max_tree_rss_kb"] = max(r["max_tree_rss_kb"] for r in ok)
    return best


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_phase"]:
        run_phase_main(argv[1:])
        return 0
    if argv[:1] == ["_generate"]:
        g = argparse.ArgumentParser()
        g.add_argument("--source", required=True)
        g.add_argument("--out", required=True)
        g.add_argument("--ranks", type=int, required=True)
        g.add_argument("--mb-per-rank", type=float, required=True)
        a = g.parse_args(argv[1:])
        print(json.dumps(generate(a.source, Path(a.out), a.ranks, a.mb_per_rank)))
        return 0

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", default=DEFAULT_SOURCE, help="real Kineto trace (.json or .json.gz) to replicate")
    p.add_argument("--ranks", type=int, default=8, help="number of rank files (default 8)")
    p.add_argument("--mb-per-rank", type=float, default=200.0, help="uncompressed MB (1e6 B) per rank file (default 200)")
    p.add_argument("--quick", action="store_true", help="smoke size: 8 ranks x 20 MB, best of 3")
    p.add_argument("--workers", type=int, default=2, help="worker processes for every contender (default 2)")
    p.add_argument("--repeat", type=int, default=None, help="runs of floor and ours, best kept (default 1; 3 with --quick)")
    p.add_argument("--workdir", default=None, help="folder for inputs and stores (default: a new temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep the work folder (inputs are reused on the next run with the same --workdir)")
    p.add_argument("--hta-python", default=DEFAULT_HTA_PYTHON, help="python of the HTA venv (setup_hta_venv.sh)")
    p.add_argument("--hta-ranks", type=int, default=None, help="give HTA only the first K rank files (memory); default all")
    p.add_argument("--hta-mem-limit-gb", type=float, default=16.0, help="kill HTA if its process tree's RSS exceeds this")
    p.add_argument("--mem-limit-gb", type=float, default=20.0, help="kill ours/floor if its process tree's RSS exceeds this")
    p.add_argument("--skip", action="append", default=[], choices=["floor", "ours", "hta"], help="skip a contender")
    p.add_argument("--json-out", default=None, help="write all measurements as JSON here")
    p.add_argument("--markdown-out", default=None, help="write a Markdown results section here")
    args = p.parse_args(argv)
    if args.quick:
        args.mb_per_rank = 20.0
        args.ranks = 8 if args.ranks == p.get_default("ranks") else args.ranks
    repeat = args.repeat or (3 if args.quick else 1)

    started = _dt.datetime.now().astimezone()
    loadavg_start = [round(x, 2) for x in os.getloadavg()]
    git_start = harness.git_state()
    own_tmp = args.workdir is None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="ta-ingest-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    command = " ".join([sys.executable, sys.argv[0], *argv])

    try:
        man = _ensure_input(args, workdir)
        files = [f["path"] for f in man["files"]]
        in_bytes = sum(f["bytes"] for f in man["files"])
        in_events = sum(f["events"] for f in man["files"])
        file_bytes = max(f["bytes"] for f in man["files"])
        print(
            f"input: {len(files)} files x {harness.fmt_bytes(file_bytes)} = {harness.fmt_bytes(in_bytes)}, "
            f"{in_events:,} events ({man['copies_per_rank']} copies/rank of {man['source_events']:,} events, "
            f"last copy {man['last_copy_fraction']:.0%}) in {man['dir']}",
            flush=True,
        )
        results: dict = {}
        _warm_page_cache(files)

        if "floor" not in args.skip:
            runs = []
            for i in range(repeat):
                r = run_phase(sys.executable, "floor", {"files": files, "workers": args.workers, "workdir": str(workdir)},
                              workdir / f"floor-{i}.log", args.mem_limit_gb)
                runs.append(r)
                if r.get("ok"):
                    print(f"floor run {i + 1}: {r['seconds']:.2f} s", flush=True)
                else:
                    print(f"floor run {i + 1} FAILED: {r['error']}\n{r['log_tail']}", flush=True)
            results["floor"] = _best(runs)
            results["floor"]["input_events"] = in_events
            results["floor"]["input_bytes"] = in_bytes
            results["floor"]["file_bytes"] = file_bytes

        if "ours" not in args.skip:
            runs = []
            for i in range(repeat):
                r = run_phase(sys.executable, "ours", {"files": files, "workers": args.workers, "workdir": str(workdir)},
                              workdir / f"ours-{i}.log", args.mem_limit_gb)
                runs.append(r)
                if r.get("ok"):
                    print(f"ours run {i + 1}: {r['seconds']:.2f} s", flush=True)
                else:
                    print(f"ours run {i + 1} FAILED: {r['error']}\n{r['log_tail']}", flush=True)
            results["ours"] = _best(runs)
            results["ours"]["input_events"] = in_events
            results["ours"]["input_bytes"] = in_bytes
            results["ours"]["file_bytes"] = file_bytes

        if "hta" not in args.skip:
            if not Path(args.hta_python).exists():
                results["hta"] = {"ok": False, "error": f"{args.hta_python} not found: run benchmarks/setup_hta_venv.sh"}
            else:
                k = args.hta_ranks or len(files)
                hta_files = man["files"][:k]
                if k < len(files):
                    hdir = workdir / f"hta-input-{k}"
                    shutil.rmtree(hdir, ignore_errors=True)
                    hdir.mkdir()
                    for f in hta_files:
                        os.symlink(f["path"], hdir / Path(f["path"]).name)
                    trace_dir = str(hdir)
                else:
                    trace_dir = man["dir"]
                r = run_phase(args.hta_python, "hta", {"trace_dir": trace_dir, "workers": args.workers,
                                                        "workdir": str(workdir)},
                              workdir / "hta.log", args.hta_mem_limit_gb)
                r["input_events"] = sum(f["events"] for f in hta_files)
                r["input_bytes"] = sum(f["bytes"] for f in hta_files)
                r["file_bytes"] = max(f["bytes"] for f in hta_files)
                r["ranks_given"] = k
                if r.get("ok"):
                    print(f"hta: {r['seconds']:.2f} s", flush=True)
                else:
                    print(f"hta FAILED: {r['error']}\n{r.get('log_tail', '')}", flush=True)
                results["hta"] = r

        finished = _dt.datetime.now().astimezone()
        summary = summarize(results)
        payload = {
            "command": command,
            "started": started.isoformat(timespec="seconds"),
            "finished": finished.isoformat(timespec="seconds"),
            "machine": harness.machine_info(),
            "loadavg_start": loadavg_start,
            "git_start": git_start,
            "git_end": harness.git_state(),
            "workers": args.workers,
            "repeat": repeat,
            "input": {k: v for k, v in man.items() if k != "files"}
            | {"files": len(files), "file_bytes": file_bytes, "total_bytes": in_bytes, "total_events": in_events},
            "results": results,
            "summary": summary,
        }
        md = render_markdown(payload)
        print()
        print(md)
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(payload, indent=1, default=str))
        if args.markdown_out:
            Path(args.markdown_out).write_text(md)
        return 0
    finally:
        if own_tmp and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        elif args.keep or not own_tmp:
            print(f"work folder kept: {workdir}")


def summarize(results: dict) -> dict:
    s: dict = {}
    for name, r in results.items():
        if not r.get("ok"):
            s[name] = {"ok": False, "error": r.get("error")}
            continue
        eps = r["input_events"] / r["seconds"]
        s[name] = {
            "ok": True,
            "seconds": r["seconds"],
            "events": r["input_events"],
            "events_per_s": eps,
            "mb_per_s": r["input_bytes"] / MB / r["seconds"],
            "worker_peak_bytes": r["worker_peak_kb"] * 1024,
            "worker_peak_over_file": r["worker_peak_kb"] * 1024 / r["file_bytes"],
            "coordinator_peak_bytes": (r.get("self_maxrss_kb") or 0) * 1024,
            "tree_peak_bytes": r["max_tree_rss_kb"] * 1024,
        }
    if s.get("ours", {}).get("ok") and s.get("hta", {}).get("ok"):
        s["ours_over_hta_speed"] = s["ours"]["events_per_s"] / s["hta"]["events_per_s"]
    if s.get("ours", {}).get("ok") and s.get("floor", {}).get("ok"):
        s["ours_over_floor_time"] = s["ours"]["seconds"] / s["floor"]["seconds"]
        s["ours_over_floor_time_same_input"] = True
    return s


def render_markdown(payload: dict) -> str:
    m = payload["machine"]
    inp = payload["input"]
    s = payload["summary"]
    res = payload["results"]
    la0 = payload.get("loadavg_start")
    la1 = m.get("loadavg")
    lines = [
        f"- command: `{payload['command']}`",
        f"- date: {payload['started']} .. {payload['finished']}",
        f"- machine: {m.get('cores')} cores ({m.get('cpu', '?')}), {m.get('mem_total_gib', '?')} GiB RAM, "
        f"{m.get('platform')}, Python {m.get('python')}; load average (1/5/15 min) {la0} at start, {la1} at end",
    ]
    if "ours" in res and res["ours"].get("versions"):
        v = res["ours"]["versions"]
        def _g(g):
            return f"{g.get('head')}{' + uncommitted changes in traceanalyzer/' if g.get('traceanalyzer_dirty') else ''}"
        gs, ge = payload.get("git_start", {}), payload.get("git_end", {})
        git_txt = f"git {_g(gs)}" if gs == ge else f"git {_g(gs)} at start, {_g(ge)} at end"
        dig = res["ours"].get("extra", {}).get("source_digest")
        lines.append("- ours: " + ", ".join(f"{k} {v[k]}" for k in v)
                     + f" ({git_txt}; sha1 of traceanalyzer/**/*.py as imported: {dig})")
    if "floor" in res and res["floor"].get("versions"):
        v = res["floor"]["versions"]
        lines.append("- floor: " + ", ".join(f"{k} {v[k]}" for k in v))
    if "hta" in res and res["hta"].get("versions"):
        v = res["hta"]["versions"]
        lines.append("- HTA venv: " + ", ".join(f"{k} {v[k]}" for k in v) + f", Python {res['hta'].get('python')}")
    lines.append(
        f"- input: {inp['files']} rank files (plain .json) x {harness.fmt_bytes(inp['file_bytes'])} = "
        f"{harness.fmt_bytes(inp['total_bytes'])}, {inp['total_events']:,} events; each file = "
        f"{inp['copies_per_rank']} time-shifted copies (last one {inp['last_copy_fraction']:.0%}) of "
        f"`{Path(inp['source']).name}` ({inp['source_events']:,} events)"
    )
    lines.append(f"- workers: {payload['workers']} processes for every contender; best of {payload['repeat']} for floor and ours, HTA once")
    if "hta" in res and res["hta"].get("ranks_given") and res["hta"]["ranks_given"] < inp["files"]:
        lines.append(f"- HTA was given only the first {res['hta']['ranks_given']} rank files (memory); its events/s is over that input")
    lines.append("")
    lines.append("| contender | time (s) | events | events/s | MB/s | peak RSS / worker | / file size | coordinator peak RSS | tree peak RSS |")
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    labels = {"ours": "ours (traceanalyzer.ingest)", "floor": "floor (msgspec typed decode + exact ts/dur)",
              "hta": "HTA 0.5.0 TraceAnalysis"}
    for name in ("ours", "floor", "hta"):
        if name not in s:
            continue
        x = s[name]
        if not x.get("ok"):
            lines.append(f"| {labels[name]} | FAILED: {x.get('error')} | | | | | | | |")
            continue
        lines.append(
            f"| {labels[name]} | {x['seconds']:.2f} | {x['events']:,} | {x['events_per_s']:,.0f} | {x['mb_per_s']:.1f} | "
            f"{harness.fmt_bytes(x['worker_peak_bytes'])} | {x['worker_peak_over_file']:.2f}x | "
            f"{harness.fmt_bytes(x['coordinator_peak_bytes'])} | {harness.fmt_bytes(x['tree_peak_bytes'])} |"
        )
    lines.append("")
    if "ours_over_hta_speed" in s:
        lines.append(f"- ours / HTA speed (events/s): **{s['ours_over_hta_speed']:.1f}x** (target >= 30x)")
    if "ours_over_floor_time" in s:
        lines.append(f"- ours / floor time: **{s['ours_over_floor_time']:.2f}x** (target <= 2x)")
    if s.get("ours", {}).get("ok"):
        lines.append(f"- ours peak RSS per worker / file size: **{s['ours']['worker_peak_over_file']:.2f}x** (target <= 3x)")
    if s.get("hta", {}).get("ok"):
        lines.append(f"- HTA peak RSS per worker / file size: **{s['hta']['worker_peak_over_file']:.2f}x**")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
