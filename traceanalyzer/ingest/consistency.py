"""One job per run: the traces of a run (this batch and what the store already holds for it)
must agree on the collector's run id (``rank{R}.manifest.json``), the world size, the backend and
the process-group layout, and two traces of one
rank must be profiling windows of one process (same host, same pid).

A trace from another job mixed into a run is otherwise accepted and shows up as a huge skew or
imbalance; a restarted job's rank 1 s after the first one as a second window, which breaks the
critical path. Each disagreement is refused with one line naming the file, what it says and
what the run already says, so that the user can pick another ``--run``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..errors import TraceInputError


def job_of(tables: dict[str, pa.Table]) -> dict[str, Any]:
    """What identifies the job and the process, from one trace's ``ranks`` and ``process_groups`` rows."""
    r = tables["ranks"].to_pylist()[0]
    pgs = tables["process_groups"].select(["pg_name", "pg_ranks"]).to_pylist()
    return {"world_size": r["world_size"], "backend": r["backend"], "host": r["host"], "pid": r["pid"],
            "pg_layout": {p["pg_name"]: p["pg_ranks"] for p in pgs if p["pg_ranks"] is not None}}


def collector_run_id(trace_path: str | Path, cache: dict | None = None) -> str | None:
    """The ``run_id`` of the collector's ``rank{R}.manifest.json`` that lists this trace, if any
    (``cache``: :func:`.sidecars.rank_manifests`)."""
    from .sidecars import rank_manifests
    trace_path = Path(trace_path)
    for m, doc in rank_manifests(trace_path.parent, cache):
        try:
            listed = doc.get("files", {}).get("traces") or []
        except (OSError, ValueError, AttributeError):
            continue  # sidecars.check_rank_manifest refuses an unreadable one
        if trace_path.name in listed and isinstance(doc.get("run_id"), str):
            return doc["run_id"]
    return None


def _stored_jobs(store: Path, entries: list[dict]) -> list[tuple[str, int, dict]]:
    """(trace file, rank, job) of the traces the store already holds for the run."""
    import pyarrow.parquet as pq
    out = []
    for t in entries:
        job = t.get("job")
        if job is None:  # stores written before the job was kept in the manifest
            try:
                tables = {k: pq.read_table(store / t["files"][k]) for k in ("ranks", "process_groups")}
                job = job_of(tables)
            except (OSError, KeyError, pa.ArrowException, IndexError):
                continue  # a damaged run: `traceanalyzer check` reports it
        out.append((t["trace_file"], t["rank"], job))
    return out


def check_run(store: Path, manifest, run: str, summaries: list) -> None:
    """Refuse the batch when a trace disagrees with the others of its run (see the module doc).
    Each trace is checked against an index of those before it (:class:`_Seen`), not each of them:
    the same first disagreement as a pairwise check, in time linear in the ranks (an op timeline
    of 8,192 ranks is 33 M pairs)."""
    seen = _Seen()
    for other_file, other_rank, other in _stored_jobs(store, [t for t in manifest.traces if t["run"] == run]):
        seen.add(other_file, other_rank, other)
    for s in summaries:
        first = seen.first_conflict(s.path, s.rank, s.job)
        if first is not None:  # raises the pairwise check's message for that trace
            _compare(s.path, s.rank, s.job, *seen.entries[first], run)
        seen.add(s.path, s.rank, s.job)


class _Seen:
    """The traces checked so far, indexed by what :func:`_compare` compares: per key the first
    trace with each value, per process group the first trace with each layout, per rank its traces."""

    _KEYS = ("run_id", "world_size", "backend")

    def __init__(self):
        self.entries: list[tuple[str, int, dict]] = []
        self.values: dict[str, dict] = {k: {} for k in self._KEYS}
        self.layouts: dict[str, dict[tuple, int]] = {}
        self.by_rank: dict[int, list[int]] = {}

    def add(self, path: str, rank: int, job: dict) -> None:
        i = len(self.entries)
        self.entries.append((path, rank, job))
        for k in self._KEYS:
            if job.get(k) is not None:
                self.values[k].setdefault(job[k], i)
        for pg, members in (job.get("pg_layout") or {}).items():
            self.layouts.setdefault(pg, {}).setdefault(tuple(members), i)
        self.by_rank.setdefault(rank, []).append(i)

    def first_conflict(self, path: str, rank: int, job: dict) -> int | None:
        """The index of the first trace :func:`_compare` would refuse ``job`` against, or None."""
        hits = [i for k in self._KEYS if job.get(k) is not None
                for v, i in self.values[k].items() if v != job[k]]
        for pg, members in (job.get("pg_layout") or {}).items():
            mine = tuple(members)
            hits += [i for layout, i in self.layouts.get(pg, {}).items() if layout != mine]
        for i in self.by_rank.get(rank, ()):
            try:
                _compare(path, rank, job, *self.entries[i], "")
            except TraceInputError:
                hits.append(i)
                break
        return min(hits, default=None)


def _compare(path: str, rank: int, job: dict, other_file: str, other_rank: int, other: dict, run: str) -> None:
    hint = f"; a trace of another job belongs in another --run than '{run}'"
    for key, what in (("run_id", "collector run id"), ("world_size", "world size"), ("backend", "backend")):
        a, b = job.get(key), other.get(key)
        if a is not None and b is not None and a != b:
            raise TraceInputError(path, f"{what} {a!r} differs from {b!r} of {other_file} (rank {other_rank}){hint}")
    layout, other_layout = job.get("pg_layout") or {}, other.get("pg_layout") or {}
    for pg in sorted(set(layout) & set(other_layout)):
        if list(layout[pg]) != list(other_layout[pg]):
            raise TraceInputError(path, f"process group '{pg}' has ranks {_ranks(layout[pg])}, but "
                                        f"{_ranks(other_layout[pg])} in {other_file} (rank {other_rank}){hint}")
    if rank == other_rank and Path(path) != Path(other_file):
        same_host = (job.get("host") or "") == (other.get("host") or "")
        if job.get("pid") is not None and other.get("pid") is not None and (job["pid"] != other["pid"] or not same_host):
            raise TraceInputError(path, (
                f"rank {rank} is already given by process {other['pid']} on host {other.get('host') or '?'} "
                f"({other_file}); this trace comes from process {job['pid']} on host {job.get('host') or '?'}: "
                f"two traces of one rank must be profiling windows of one process (another job, or a restart?){hint}"))


def _ranks(ranks) -> str:
    return json.dumps(list(ranks))
