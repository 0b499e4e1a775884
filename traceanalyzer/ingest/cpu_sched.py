"""The collector's CPU scheduling samples (:mod:`traceanalyzer.collect.cpu_sched`) -> the ``cpu_sched`` table.

One file per rank, ``rank{R}.cpu_sched.json``: ``rank``, ``host``, ``pid``, ``columns`` (the names
of each sample's values), ``samples`` (one list per step boundary), ``cores``, ``cpu_count``. They
are per-process inputs (:mod:`.sidecars`, kind ``cpu_sched``), found by name in a folder or beside
a trace named on its own. A rank without the file (older collectors, a platform without
schedstat: its rank manifest's ``cpu_sched.unavailable`` says why) has no rows: its CPU wait is
unknown, never 0. A malformed file is refused in one line naming it.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa

from .. import schema as S
from ..errors import TraceInputError

#: The collector's samples files (``collect/files.py``'s cpu_sched_name).
_NAME_RE = re.compile(r"^rank\d+\.cpu_sched\.json$")
#: The sample values this reader needs, by the names the collector writes in ``columns``.
NEEDED = ("ts_ns", "step", "proc_run_ns", "proc_wait_ns", "main_run_ns", "main_wait_ns", "n_threads")


def is_samples_file(path: Path) -> bool:
    return bool(_NAME_RE.match(Path(path).name))


def _bad(path: Path, problem: str) -> TraceInputError:
    return TraceInputError(path, f"malformed CPU wait samples: {problem}; fix or remove the file")


def _int_or_none(value, path: Path, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _bad(path, f"'{what}' is {value!r}, not a whole number >= 0")
    return value


def read(path: Path) -> tuple[int, pa.Table]:
    """(rank, its ``cpu_sched`` rows) of one samples file; :class:`TraceInputError` when malformed."""
    try:
        entry = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise _bad(path, f"not readable JSON ({exc})") from None
    if not isinstance(entry, dict):
        raise _bad(path, f"expected an object, found {type(entry).__name__}")
    if isinstance(entry.get("rank"), bool) or not isinstance(entry.get("rank"), int) or entry["rank"] < 0:
        raise _bad(path, "no integer 'rank'")
    named = re.match(r"rank(\d+)\.", Path(path).name)
    if named and int(named.group(1)) != entry["rank"]:
        raise _bad(path, f"it says rank {entry['rank']}, its name rank {named.group(1)}")
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
    host, pid = entry.get("host"), entry.get("pid")
    data.update(cores=[cores] * n, cpu_count=[cpu_count] * n, host=[host if isinstance(host, str) else None] * n,
                pid=[pid if isinstance(pid, int) and not isinstance(pid, bool) else None] * n,
                source_file=[str(Path(path).resolve())] * n)
    return entry["rank"], pa.table({c: pa.array(data[c], type=t.field(c).type) for c in S.CPU_SCHED.column_names})
