"""Flight Recorder (FR): c10d's ring buffer of recent collectives, per process.

In torch 2.13 the buffer size is read once, when the FlightRecorder singleton
is first used (i.e. when the first process group is created), from
TORCH_FR_BUFFER_SIZE, falling back to the older TORCH_NCCL_TRACE_BUFFER_SIZE,
defaulting to 2000 entries (torch/csrc/distributed/c10d/FlightRecorder.hpp).
The same buffer serves gloo. Older torch releases defaulted to 0 (off), so we
set the variable explicitly rather than rely on the default; it only takes
effect if set before `init_process_group`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

FR_BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
FR_BUFFER_ENV_OLD = "TORCH_NCCL_TRACE_BUFFER_SIZE"
# Entries kept per process; a short reference run issues far fewer collectives.
FR_BUFFER_ENTRIES = 2000


def enable_flight_recorder(entries: int = FR_BUFFER_ENTRIES) -> None:
    """Turn the FR on unless the user already chose a size. Call before creating process groups."""
    if FR_BUFFER_ENV not in os.environ and FR_BUFFER_ENV_OLD not in os.environ:
        os.environ[FR_BUFFER_ENV] = str(entries)


def _plain_dumps(c10d) -> list[tuple[str, dict]]:
    """This process's FR buffers as plain dicts: NCCL's own recorder (CUDA builds,
    ``_dump_nccl_trace``) and the device-agnostic one that gloo uses (``_dump_fr_trace``).
    Both pickles carry the entries' stack frames."""
    from traceanalyzer.ingest.safe_pickle import load_plain

    docs = []
    for name in ("_dump_nccl_trace", "_dump_fr_trace"):
        fn = getattr(c10d, name, None)
        if fn is None:
            continue
        try:
            raw = fn()
        except Exception:  # noqa: BLE001 - a recorder that is off or unused raises in some releases
            continue
        docs.append((name, load_plain(raw, f"<this process's Flight Recorder ({name})>")))
    return docs


def merge_dumps(docs: list[tuple[str, dict]]) -> dict:
    """One FR document from several recorders of one process (a job with NCCL and gloo groups
    has entries in both): entries ordered by creation time and renumbered (``record_id`` must
    be monotonic per rank), ``pg_config``/``pg_status`` united, the rest from the first
    recorder that has entries. ``dumped_by`` names the recorders."""
    with_entries = [d for _, d in docs if d.get("entries")] or [d for _, d in docs[:1]]
    out = dict(with_entries[0])
    if len(docs) > 1:
        entries = [e for _, d in docs for e in (d.get("entries") or [])]
        entries.sort(key=lambda e: (e.get("time_created_ns") or 0, e.get("record_id") or 0))
        for i, e in enumerate(entries):
            e["record_id"] = i
        out["entries"] = entries
        for key in ("pg_config", "pg_status"):
            merged: dict = {}
            for _, d in docs:
                merged.update(d.get(key) or {})
            out[key] = merged
    names = "+".join(f"torch._C._distributed_c10d.{n}()" for n, _ in docs)
    out["dumped_by"] = f"traceanalyzer.collect: {names} as JSON"
    return out


def dump_flight_recorder(path: Path) -> bool:
    """Write this process's FR buffer(s) as JSON, with stack frames, to `path`; False if this
    torch cannot dump.

    torch 2.13's `_dump_fr_trace_json()` leaves out the entries' stack `frames`; the pickle dumps
    (`_dump_fr_trace()`, and NCCL's own recorder `_dump_nccl_trace()` in CUDA builds) have them.
    So the pickles are dumped here, in our own process, read back with the plain-data unpickler,
    merged (:func:`merge_dumps`) and written as JSON (same keys as torch's JSON; tuples become
    lists, missing times stay null, and "dumped_by" says where it came from). Torch's own JSON
    dump is the fallback. The file is written whole or not at all (write, then rename).
    """
    import torch

    c10d = torch._C._distributed_c10d
    data = None
    docs = _plain_dumps(c10d)
    if docs:
        data = json.dumps(merge_dumps(docs), separators=(",", ":")).encode()
    elif hasattr(c10d, "_dump_fr_trace_json"):
        data = c10d._dump_fr_trace_json()
    if data is None:
        return False
    tmp = Path(f"{path}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return True
