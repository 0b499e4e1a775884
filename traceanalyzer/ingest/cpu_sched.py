"""The collector's CPU scheduling samples (:mod:`traceanalyzer.collect.cpu_sched`) -> the ``cpu_sched`` table.

They are the ``cpu_sched`` entry of a rank manifest (``rank{R}.manifest.json``): ``columns`` (the
names of each sample's values), ``samples`` (one list per step boundary), ``cores``, ``cpu_count``,
``unavailable`` (why there are none). A folder's rank manifests holding samples are per-process
inputs (:mod:`.sidecars`, kind ``cpu_sched``); a manifest without samples (older collectors,
a platform without schedstat) gives no rows: the CPU wait is unknown, never 0. A malformed entry is
refused in one line naming the manifest.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa

from .. import schema as S
from ..errors import TraceInputError

#: Rank manifests of the collector (``collect/files.py``'s rank_manifest_name).
_NAME_RE = re.compile(r"^rank\d+\.manifest\.json$")
#: The sample values this reader needs, by the names the collector writes in ``columns``.
NEEDED = ("ts_ns", "step", "proc_run_ns", "proc_wait_ns", "main_run_ns", "main_wait_ns", "n_threads")


def is_rank_manifest(path: Path) -> bool:
    return bool(_NAME_RE.match(path.name))


def has_samples(path: Path) -> bool:
    """A rank manifest with a ``cpu_sched`` entry (malformed or not: the reader says what is wrong)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("cpu_sched") is not None and bool(
        not isinstance(doc["cpu_sched"], dict) or doc["cpu_sched"].get("samples"))


def _bad(path: Path, problem: str) -> TraceInputError:
    return TraceInputError(path, f"malformed cpu_sched entry of a rank manifest: {problem}; fix or remove it")


def _int_or_none(value, path: Path, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _bad(path, f"'{what}' is {value!r}, not a whole number >= 0")
    return value


def read(path: Path) -> tuple[int, pa.Table]:
    """(rank, its ``cpu_sched`` rows) of one rank manifest; :class:`TraceInputError` when malformed."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise TraceInputError(path, f"unreadable rank manifest ({exc})") from None
    if not isinstance(doc, dict) or isinstance(doc.get("rank"), bool) or not isinstance(doc.get("rank"), int):
        raise TraceInputError(path, "unreadable rank manifest: no integer 'rank'")
    entry = doc.get("cpu_sched")
    if not isinstance(entry, dict):
        raise _bad(path, f"expected an object, found {type(entry).__name__}")
    cols, samples = entry.get("columns"), entry.get("samples")
    if not isinstance(cols, list) or not set(NEEDED) <= set(cols):
        raise _bad(path, f"'columns' must list {', '.join(NEEDED)}")
    if not isinstance(samples, list):
        raise _bad(path, "'samples' must be a list")
    cores = _int_or_none(entry.get("cores"), path, "cores")
    cpu_count = _int_or_none(entry.get("cpu_count"), path, "cpu_count")
    at = [cols.index(c) for c in NEEDED]
    rows: list[list[int]] = []
    for i, s in enumerate(samples):
        if (not isinstance(s, list) or len(s) != len(cols)
                or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in s)):
            raise _bad(path, f"sample {i} is {str(s)[:80]}: expected {len(cols)} whole numbers >= 0")
        row = [s[j] for j in at]
        if rows and (row[1] <= rows[-1][1] or any(row[k] < rows[-1][k] for k in (0, 2, 3, 4, 5))):
            raise _bad(path, f"sample {i} (step {row[1]}) goes back from the one before: samples are cumulative, "
                             "in step order")
        rows.append(row)
    n = len(rows)
    cols_out = {name: [r[k] for r in rows] for k, name in enumerate(NEEDED)}
    t = S.CPU_SCHED.arrow_schema
    data = {c: cols_out.get(c) for c in S.CPU_SCHED.column_names}
    data.update(cores=[cores] * n, cpu_count=[cpu_count] * n, host=[doc.get("host")] * n,
                pid=[doc.get("pid") if isinstance(doc.get("pid"), int) else None] * n,
                source_file=[str(Path(path).resolve())] * n)
    return doc["rank"], pa.table({c: pa.array(data[c], type=t.field(c).type) for c in S.CPU_SCHED.column_names})
