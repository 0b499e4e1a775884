"""Named bad inputs of issue 15, built from the real shipped traces (shared by the hardening
tests and ``benchmarks/fuzz_bench.py``). Each case writes files into a folder and returns the
paths to ingest; ``outcome`` runs ingest -> info -> analyze and classifies what happened."""
from __future__ import annotations

import gzip
import json
import os
import shutil
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "traces"
RUN2 = TRACES / "ddp_gloo_2rank"
TRACE0 = RUN2 / "rank0.window0.pt.trace.json.gz"
TRACE1 = RUN2 / "rank1.window0.pt.trace.json.gz"
FR0 = RUN2 / "rank0.fr.json"


def load(path: Path = TRACE0) -> dict:
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)


def dump(doc, path: Path) -> Path:
    path.write_bytes(doc if isinstance(doc, bytes) else json.dumps(doc).encode())
    return path


def _first(doc, ph="X"):
    return next(e for e in doc["traceEvents"] if e.get("ph") == ph)


def _di(doc, **kw):
    doc["distributedInfo"].update(kw)
    return doc


def _mut(fn, name="rank0.json"):
    def case(d: Path):
        doc = load()
        out = fn(doc)
        return [dump(doc if out is None else out, d / name)]
    return case


def _pair(fn0, fn1=None):
    """Both ranks of the 2-rank run, each changed by its function."""
    def case(d: Path):
        out = []
        for i, (src, fn) in enumerate(((TRACE0, fn0), (TRACE1, fn1))):
            doc = load(src)
            if fn:
                doc = fn(doc) or doc
            out.append(dump(doc, d / f"rank{i}.json"))
        return out
    return case


def _set_first(field, value, ph="X"):
    def fn(doc):
        _first(doc, ph)[field] = value
    return fn


def _deep(doc):
    text = json.dumps(doc)
    return text.replace('"traceEvents": [', '"junk": ' + "[" * 10_000 + "]" * 10_000 + ', "traceEvents": [', 1).encode()


def _deep_args(doc):
    text = json.dumps(doc)
    i = text.index('"args": {') + len('"args": {')
    return (text[:i] + '"deep": ' + "[" * 5000 + "]" * 5000 + ", " + text[i:]).encode()


def _utf8_args(doc):
    e = _first(doc)
    e.setdefault("args", {})["note"] = "MARK"
    return json.dumps(doc).replace("MARK", "\\u00e9MARK").encode().replace(b"MARK", b"\xff\xfe bad")


def _dup_trace_events(doc):
    text = json.dumps(doc)
    return text[:-1].encode() + b', "traceEvents": [' + json.dumps(doc["traceEvents"][:5]).encode()[1:] + b"}"


def _dup_rank(doc):
    text = json.dumps(doc)
    return text.replace('"rank": 0', '"rank": 0, "rank": 1', 1).encode()


def _no_tid(doc):
    for e in doc["traceEvents"][:50]:
        e.pop("tid", None)


def _fr(fn):
    def case(d: Path):
        doc = json.loads(FR0.read_text())
        fn(doc)
        shutil.copy(TRACE0, d / "rank0.window0.pt.trace.json.gz")
        return [dump(doc, d / "rank0.fr.json"), d / "rank0.window0.pt.trace.json.gz"]
    return case


def _fr_entry(field, value):
    def fn(doc):
        doc["entries"][0][field] = value
    return fn


def _fr_deep(d: Path):
    """An FR dump whose first entry's frames nest 3,000 deep (found by fuzzing: RecursionError)."""
    text = FR0.read_text().replace('"frames":', '"frames": ' + "[" * 3000 + "]" * 3000 + ', "frames_old":', 1)
    (d / "rank0.fr.json").write_text(text)
    shutil.copy(TRACE0, d / "rank0.window0.pt.trace.json.gz")
    return [d / "rank0.fr.json", d / "rank0.window0.pt.trace.json.gz"]


def _other_process(d: Path):
    """The same rank twice, 1 s apart, from another process."""
    doc = load()
    doc2 = load()
    doc2["baseTimeNanoseconds"] += 1_000_000_000 + (doc2["traceEvents"][-1]["ts"] - doc2["traceEvents"][0]["ts"]) * 0
    span_us = max(e.get("ts", 0) + e.get("dur", 0) for e in doc["traceEvents"]) - min(e.get("ts", 0) for e in doc["traceEvents"] if "ts" in e)
    doc2["baseTimeNanoseconds"] = doc["baseTimeNanoseconds"] + int(span_us * 1000) + 1_000_000_000
    for e in doc2["traceEvents"]:
        if e.get("pid") == doc["traceEvents"][0]["pid"]:
            e["pid"] = e["pid"] + 1
    return [dump(doc, d / "a" / "rank0.json") if (d / "a").mkdir() is None else None,
            dump(doc2, d / "b" / "rank0.json") if (d / "b").mkdir() is None else None]


def _fifo(d: Path):
    p = d / "rank0.json"
    os.mkfifo(p)
    return [p]


def _bomb(d: Path):
    """A small gzip that inflates to 2 GiB (whitespace, then a valid trace)."""
    p = d / "rank0.json.gz"
    chunk = b" " * (1 << 24)
    with gzip.open(p, "wb", compresslevel=9) as fh:
        for _ in range(128):
            fh.write(chunk)
        fh.write(json.dumps(load()).encode())
    return [p]


def _other_run_id(d: Path):
    """rank 0 of one recorded job and rank 1 of another (the collector's manifests say so)."""
    out = []
    for sub, src, r in (("a", RUN2, 0), ("b", TRACES / "ddp_gloo_2rank_imb1", 1)):
        (d / sub).mkdir()
        for f in (f"rank{r}.window0.pt.trace.json.gz", f"rank{r}.manifest.json"):
            shutil.copy(src / f, d / sub / f)
        out.append(d / sub / f"rank{r}.window0.pt.trace.json.gz")
    return out


def _mixed_world(d: Path):
    return _pair(None, lambda doc: _di(doc, world_size=4))(d)


CASES = {
    "rank_2pow31": _mut(lambda doc: _di(doc, rank=2**31)),
    "rank_minus1": _mut(lambda doc: _di(doc, rank=-1)),
    "rank_7_of_2": _mut(lambda doc: _di(doc, rank=7)),
    "ts_times_1000_overflow": _mut(_set_first("ts", 9.3e15)),
    "ts_plus_base_overflow": _mut(_set_first("ts", 8e15)),
    "negative_ts": _mut(_set_first("ts", -5.0)),
    "base_time_2pow63": _mut(lambda doc: doc.__setitem__("baseTimeNanoseconds", 2**63)),
    "base_time_text": _mut(lambda doc: doc.__setitem__("baseTimeNanoseconds", "soon")),
    "nested_10000": _mut(_deep),
    "nested_args_5000": _mut(_deep_args),
    "invalid_utf8_in_args": _mut(_utf8_args),
    "event_without_tid": _mut(_no_tid),
    "pid_2pow64": _mut(_set_first("pid", 2**64)),
    "tid_2pow64": _mut(_set_first("tid", 2**64)),
    "pid_float_1e300": _mut(_set_first("pid", 1e300)),
    "correlation_1e400": _mut(lambda doc: doc.__setitem__("traceEvents", doc["traceEvents"]) or json.dumps(doc).replace(
        '"args": {', '"args": {"correlation": 1e400, ', 1).encode()),
    "flow_id_2pow64": _mut(_set_first("id", 2**64, ph="s")),
    "world_size_2pow64": _mut(lambda doc: _di(doc, world_size=2**64)),
    "pg_size_2pow64": _mut(lambda doc: doc["distributedInfo"]["pg_config"][0].__setitem__("pg_size", 2**64)),
    "backend_list": _mut(lambda doc: _di(doc, backend=["gloo"])),
    "pg_desc_dict": _mut(lambda doc: doc["distributedInfo"]["pg_config"][0].__setitem__("pg_desc", {"a": 1})),
    "group_ranks_strings": _mut(lambda doc: doc["distributedInfo"]["pg_config"][0].__setitem__("ranks", ["a", "b"])),
    "group_ranks_huge": _mut(lambda doc: doc["distributedInfo"]["pg_config"][0].__setitem__("ranks", [0, 2**40])),
    "device_properties_number": _mut(lambda doc: doc.__setitem__("deviceProperties", 7)),
    "profiler_step_huge": _mut(lambda doc: next(e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")).__setitem__("name", "ProfilerStep#99999999999")),
    "dur_2pow64": _mut(_set_first("dur", 2**64)),
    "duplicate_trace_events": _mut(_dup_trace_events),
    "duplicate_rank": _mut(_dup_rank),
    "distributed_info_list": _mut(lambda doc: doc.__setitem__("distributedInfo", [1, 2])),
    "fr_collective_seq_2pow64": _fr(_fr_entry("collective_seq_id", 2**64)),
    "fr_time_created_2pow64": _fr(_fr_entry("time_created_ns", 2**64)),
    "fr_input_sizes_2pow64": _fr(_fr_entry("input_sizes", [[2**64]])),
    "fr_record_id_text": _fr(_fr_entry("record_id", "x")),
    "fr_duration_ms_2pow64": _fr(_fr_entry("duration_ms", 2**64)),
    "fr_timeout_ms_huge": _fr(_fr_entry("timeout_ms", 2**62)),
    "fr_nested_3000": _fr_deep,
    "fr_entries_dict": _fr(lambda doc: doc.__setitem__("entries", {"a": 1})),
    "mixed_world_sizes": _mixed_world,
    "other_job_run_id": _other_run_id,
    "other_job_backend": _pair(None, lambda doc: _di(doc, backend="nccl")),
    "other_job_pg_layout": _pair(None, lambda doc: doc["distributedInfo"]["pg_config"][0].__setitem__("ranks", [0, 1, 2])),
    "same_rank_other_process": _other_process,
    "fifo": _fifo,
}

SLOW_CASES = {"gzip_bomb_2gib": _bomb}


def outcome(paths, store: Path, run: str = "bad") -> tuple[str, str]:
    """('clean', message) | ('accepted', '') | ('crash', traceback): ingest, then info and analyze."""
    import traceanalyzer as ta
    from traceanalyzer.analyses.results import analyze
    from traceanalyzer.analyses.summary import info
    from traceanalyzer.errors import TraceAnalyzerError
    try:
        ta.ingest([str(p) for p in paths], str(store), run=run, progress=False, workers=1)
    except TraceAnalyzerError as exc:
        msg = str(exc)
        if "\n" in msg or "internal error" in msg:
            return "crash", msg
        return "clean", msg
    except Exception:
        return "crash", traceback.format_exc()
    try:
        info(str(store))
        analyze(str(store), run=run, save_results=False)
    except Exception:
        return "crash", "accepted but then: " + traceback.format_exc()
    return "accepted", ""
