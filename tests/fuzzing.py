"""Seeded mutations of real shipped inputs (a gloo CPU trace, a gloo+CUDA trace, an NCCL trace
when ../shared has it, and a Flight Recorder dump), for ``tests/test_fuzz.py`` (a fixed budget
in the suite) and ``benchmarks/fuzz_bench.py`` (longer).

Every input is judged by :func:`judge`: ingest must either refuse it with one line naming the
file (no "internal error"), or accept it, and then ``info`` and ``analyze`` must run; after
every input the store (which holds a good run) must still be readable.
"""
from __future__ import annotations

import gzip
import json
import random
import re
import shutil
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "traces"
EXTERNAL = ROOT.parent / "shared" / "traces" / "external"

#: events kept from each base trace (the first ones, metadata included): mutations then cost
#: milliseconds to write and a fraction of a second to ingest
BASE_EVENTS = 1500

BASES = {
    "gloo_cpu": TRACES / "ddp_gloo_2rank" / "rank0.window0.pt.trace.json.gz",
    "gloo_cuda": TRACES / "ddp_gloo_cuda_2rank" / "rank0.window0.pt.trace.json.gz",
    "pp_gloo": TRACES / "pp_1f1b_2rank_m4" / "rank1.window0.pt.trace.json.gz",
}
FR_BASE = TRACES / "ddp_gloo_2rank" / "rank0.fr.json"

#: values that have broken readers before: out of range, wrong type, deep, odd text
NASTY = [None, -1, 0, 2**31, 2**31 - 1, 2**63 - 1, 2**63, 2**64, -2**63 - 1, 1e300, -1e-300, 0.5, "", "x",
         "12", "-3", [], {}, [1, "a"], {"a": {"b": []}}, True, False, "\u00e9\u4e2d\U0001F600", "a" * 5000,
         "ProfilerStep#99999999999", "ProfilerStep#-1", "nccl:all_reduce", "[0, 1]", "[\"a\"]"]
EVENT_FIELDS = ["ph", "name", "cat", "pid", "tid", "ts", "dur", "id", "args", "s", "bp"]
ARG_FIELDS = ["External id", "correlation", "stream", "device", "Collective name", "Process Group Name",
              "Process Group Ranks", "Group size", "In msg nelems", "Out msg nelems", "dtype", "Seq", "rank"]
META_PATHS = [("baseTimeNanoseconds",), ("deviceProperties",), ("distributedInfo",), ("distributedInfo", "rank"),
              ("distributedInfo", "world_size"), ("distributedInfo", "backend"), ("distributedInfo", "pg_config"),
              ("distributedInfo", "pg_config", 0, "ranks"), ("distributedInfo", "pg_config", 0, "pg_size"),
              ("distributedInfo", "pg_config", 0, "pg_name"), ("distributedInfo", "pg_config", 0, "pg_desc"),
              ("traceEvents",), ("host_name",), ("schemaVersion",)]
FR_FIELDS = ["collective_seq_id", "p2p_seq_id", "op_id", "record_id", "pg_id", "process_group", "profiling_name",
             "time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns", "duration_ms",
             "input_sizes", "output_sizes", "state", "timeout_ms", "is_p2p", "frames", "retired"]


def load_json(path: Path) -> dict:
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)


def bases() -> dict[str, dict]:
    out = {}
    for name, path in BASES.items():
        if path.exists():
            doc = load_json(path)
            doc["traceEvents"] = doc["traceEvents"][:BASE_EVENTS]
            out[name] = doc
    dlrm = sorted((EXTERNAL / "param_dlrm_8rank").glob("*.json.gz")) if EXTERNAL.exists() else []
    if dlrm:
        doc = load_json(dlrm[0])
        doc["traceEvents"] = doc["traceEvents"][:BASE_EVENTS]
        out["nccl_dlrm"] = doc
    return out


def _set(doc, path, value, rng):
    obj = doc
    for k in path[:-1]:
        if isinstance(obj, dict) and k in obj:
            obj = obj[k]
        elif isinstance(obj, list) and isinstance(k, int) and len(obj) > k:
            obj = obj[k]
        else:
            return
    last = path[-1]
    if isinstance(obj, dict):
        if rng.random() < 0.15:
            obj.pop(last, None)
        else:
            obj[last] = value
    elif isinstance(obj, list) and isinstance(last, int) and len(obj) > last:
        obj[last] = value


def _nasty(rng):
    if rng.random() < 0.05:  # nested lists, put in as text after json.dumps (which would recurse)
        return f"__DEEP_{rng.choice([50, 900, 1200, 3000])}__"
    return rng.choice(NASTY)


def _deepen(data: bytes) -> bytes:
    return re.sub(rb'"__DEEP_(\d+)__"', lambda m: b"[" * int(m.group(1)) + b"]" * int(m.group(1)), data)


def mutate_trace(doc: dict, rng: random.Random) -> bytes:
    """One mutated trace as bytes (JSON, sometimes gzipped, sometimes damaged at the byte level)."""
    doc = json.loads(json.dumps(doc))
    events = doc["traceEvents"]
    for _ in range(rng.choice([1, 1, 2, 3, 8])):
        op = rng.random()
        if op < 0.45 and events:
            e = rng.choice(events)
            if rng.random() < 0.3 and isinstance(e.get("args"), dict):
                e["args"][rng.choice(ARG_FIELDS)] = _nasty(rng)
            else:
                _set(e, (rng.choice(EVENT_FIELDS),), _nasty(rng), rng)
        elif op < 0.7:
            _set(doc, rng.choice(META_PATHS), _nasty(rng), rng)
        elif op < 0.8 and events:
            i = rng.randrange(len(events))
            events.insert(rng.randrange(len(events)), json.loads(json.dumps(events[i])))
        elif op < 0.9 and events:
            del events[rng.randrange(len(events))]
        else:
            events.append(_nasty(rng))
    data = _deepen(json.dumps(doc, ensure_ascii=rng.random() < 0.5).encode())
    data = _bytes_mutation(data, rng)
    return gzip.compress(data, 1) if rng.random() < 0.3 else data


def _bytes_mutation(data: bytes, rng: random.Random) -> bytes:
    r = rng.random()
    if r < 0.55:
        return data
    b = bytearray(data)
    if r < 0.7:  # flip bytes
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
    elif r < 0.8:  # truncate
        del b[rng.randrange(1, len(b)):]
    elif r < 0.9:  # insert junk (invalid UTF-8 too)
        i = rng.randrange(len(b))
        b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    else:  # duplicate a slice (duplicate keys, repeated events)
        i = rng.randrange(len(b))
        j = min(len(b), i + rng.randint(1, 2000))
        b[j:j] = b[i:j]
    return bytes(b)


def mutate_fr(doc: dict, rng: random.Random) -> bytes:
    doc = json.loads(json.dumps(doc))
    entries = doc.get("entries") or []
    for _ in range(rng.choice([1, 2, 4])):
        if entries and rng.random() < 0.75:
            e = rng.choice(entries)
            _set(e, (rng.choice(FR_FIELDS),), _nasty(rng), rng)
        else:
            _set(doc, (rng.choice(["version", "pg_config", "pg_status", "entries", "comm_lib_version"]),), _nasty(rng), rng)
    return _bytes_mutation(_deepen(json.dumps(doc).encode()), rng)


@dataclass
class Tally:
    tried: int = 0
    clean: int = 0
    accepted: int = 0
    crashes: list = field(default_factory=list)  # (case id, what happened)

    def line(self) -> str:
        return (f"{self.tried} inputs: {self.clean} refused with one line, {self.accepted} accepted "
                f"(info and analyze ran), {len(self.crashes)} crashes")


def ingest_verdict(paths: list[Path], store: Path, run: str) -> tuple[str, str]:
    """('clean', message) | ('accepted', '') | ('crash', what happened), for the ingest alone."""
    import traceanalyzer as ta
    from traceanalyzer.errors import TraceAnalyzerError
    try:
        ta.ingest([str(p) for p in paths], str(store), run=run, progress=False, workers=1)
    except TraceAnalyzerError as exc:
        msg = str(exc)
        if "\n" in msg or "internal error" in msg:
            return "crash", msg
        if not any(str(p) in msg or str(p.resolve()) in msg for p in paths):
            return "crash", "message names no input file: " + msg
        return "clean", msg
    except Exception:  # noqa: BLE001 - that is what we are looking for
        return "crash", traceback.format_exc()
    return "accepted", ""


def readable(store: Path) -> None:
    """The store opens and every run's rows can be counted (raises otherwise)."""
    from traceanalyzer.store import open_store
    con = open_store(store)
    try:
        con.execute("SELECT run, count(*) FROM events GROUP BY run").fetchall()
        con.execute("SELECT run, count(*) FROM comms GROUP BY run").fetchall()
    finally:
        con.close()


def analyze_all(store: Path, runs: list[str]) -> list[tuple[str, str]]:
    """``info`` and ``analyze`` over the whole store at once (they cost about the same for one run
    as for fifty); when that fails, run by run to name the input that broke them."""
    from traceanalyzer.analyses.results import analyze
    from traceanalyzer.analyses.summary import format_info, info
    try:
        format_info(info(str(store)), str(store))
        analyze(str(store), save_results=False)
        return []
    except Exception:  # noqa: BLE001
        pass
    failed = []
    for run in runs:
        try:
            analyze(str(store), run=run, save_results=False)
        except Exception:  # noqa: BLE001
            failed.append((run, traceback.format_exc().strip().splitlines()[-1][:300]))
    return failed


def run_fuzz(workdir: Path, budget_s: float, seed: int = 15, min_cases: int = 0, log=None) -> Tally:
    """Mutate and ingest until ``budget_s`` is spent (at least ``min_cases``), checking after every
    input that the store (which holds a good run) is readable; then ``info`` and ``analyze`` over
    every accepted input."""
    import traceanalyzer as ta
    rng = random.Random(seed)
    base = bases()
    fr = load_json(FR_BASE)
    store = workdir / "store"
    ta.ingest([str(TRACES / "ddp_gloo_2rank")], str(store), run="good", progress=False, workers=1)
    tally = Tally()
    accepted: dict[str, str] = {}
    t_end = time.monotonic() + budget_s
    i = 0
    while time.monotonic() < t_end or i < min_cases:
        case = workdir / f"case{i}"
        case.mkdir()
        if rng.random() < 0.8:
            name = rng.choice(sorted(base))
            paths = [case / "rank0.window0.pt.trace.json"]
            paths[0].write_bytes(mutate_trace(base[name], rng))
            label = f"seed {seed} case {i} ({name})"
        else:
            paths = [case / "rank0.fr.json", case / "rank0.window0.pt.trace.json.gz"]
            paths[0].write_bytes(mutate_fr(fr, rng))
            shutil.copy(BASES["gloo_cpu"], paths[1])
            label = f"seed {seed} case {i} (flight recorder)"
        verdict, msg = ingest_verdict(paths, store, run=f"fuzz{i}")
        tally.tried += 1
        if verdict == "clean":
            tally.clean += 1
        elif verdict == "accepted":
            tally.accepted += 1
            accepted[f"fuzz{i}"] = label
        else:
            tally.crashes.append((label, msg.strip().splitlines()[-1][:300], _keep(workdir, case)))
        try:
            readable(store)
        except Exception as exc:  # noqa: BLE001
            tally.crashes.append((label, f"store unreadable afterwards: {exc}", _keep(workdir, case)))
            break
        shutil.rmtree(case, ignore_errors=True)
        if log:
            log(f"{label}: {verdict} {msg.strip().splitlines()[-1][:160] if msg else ''}")
        i += 1
    for run, what in analyze_all(store, list(accepted)):
        tally.crashes.append((accepted.get(run, run), "accepted, then analyze failed: " + what, ""))
    return tally


def _keep(workdir: Path, case: Path) -> str:
    keep = workdir / "crashes" / case.name
    shutil.copytree(case, keep, dirs_exist_ok=True)
    return str(keep)
