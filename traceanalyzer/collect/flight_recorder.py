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


def dump_flight_recorder(path: Path) -> bool:
    """Write this process's FR buffer as JSON, with stack frames, to `path`; False if this torch
    cannot dump.

    torch 2.13's `_dump_fr_trace_json()` leaves out the entries' stack `frames`; its pickle dump
    `_dump_fr_trace()` has them. So the pickle is dumped here, in our own process, read back with
    the plain-data unpickler and written as JSON (same keys as torch's JSON; tuples become lists,
    missing times stay null, and "dumped_by" says where it came from). Torch's own JSON dump is
    the fallback. The file is written whole or not at all (write, then rename).
    """
    import torch

    c10d = torch._C._distributed_c10d
    data = None
    if hasattr(c10d, "_dump_fr_trace"):
        from traceanalyzer.safe_pickle import load_plain

        doc = load_plain(c10d._dump_fr_trace(), "<this process's Flight Recorder>")
        doc["dumped_by"] = "traceanalyzer.collect: torch._C._distributed_c10d._dump_fr_trace() as JSON"
        data = json.dumps(doc, separators=(",", ":")).encode()
    elif hasattr(c10d, "_dump_fr_trace_json"):
        data = c10d._dump_fr_trace_json()
    if data is None:
        return False
    tmp = Path(f"{path}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return True
