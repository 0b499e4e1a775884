"""Damage to a store stays with the run it hits.

* :func:`damaged_runs`: the runs whose listed files are missing, truncated (no Parquet footer)
  or unreadable as listed (a rank outside int32); :func:`~.files.open_store` leaves them out of
  every view and says so in one warning line, so that ``info``, ``analyze``, ``report``, ``sql``,
  ``export`` and ``diff`` keep working on the healthy runs.
* :func:`check_store` (``traceanalyzer check STORE``): the damaged runs, plus the junk a killed
  writer leaves (unlisted files, ``._store.json.*.tmp``, staging folders, a lock of a dead
  process), each with what to do; ``repair=True`` drops the damaged runs' listings and removes
  the junk, in one atomic manifest commit under the store lock.
* :func:`remove_run` (``traceanalyzer rm STORE --run R``): the same commit, for a run the user names.

Opening a store reads four bytes per listed file (its footer magic), never the data. ``check``
reads the footers too: a file an ingest marked as holding its table's columns exactly (the entry's
``schema``, :func:`~.files.same_columns`) whose columns differ (changed by hand) damages its run
like a truncated one (local stores; an object store's files are checked by their listing only).
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from .. import schema as S
from ..errors import StoreError, StoreWarning
from . import files as st
from . import writers
from .runs import no_run_message

_PARQUET_MAGIC = b"PAR1"
_INT32_MAX = 2**31 - 1


def file_problem(path: Path) -> str | None:
    """None for a file that looks like whole Parquet, else what is wrong with it."""
    try:
        size = path.stat().st_size
        if size < 12:
            return "truncated"
        with open(path, "rb") as fh:
            if fh.read(4) != _PARQUET_MAGIC:
                return "not Parquet"
            fh.seek(size - 4)
            if fh.read(4) != _PARQUET_MAGIC:
                return "truncated"
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    return None


def column_problem(path: Path, table: str) -> str | None:
    """None when Parquet file ``path`` holds table ``table``'s columns exactly (names, order and
    types; the partition keys are in its path), else what differs."""
    import pyarrow.parquet as pq
    spec = S.TABLES[table]
    want = [f for f in spec.arrow_schema if f.name not in spec.partition]
    try:
        got = pq.read_schema(path)
    except Exception as exc:  # noqa: BLE001 - a footer pyarrow cannot read: what it says
        return f"unreadable ({exc})"
    names = [f.name for f in want]
    missing = [n for n in names if n not in got.names]
    extra = [n for n in got.names if n not in names]
    retyped = [f"{f.name} ({got.field(f.name).type}, not {f.type})" for f in want
               if f.name in got.names and got.field(f.name).type != f.type]
    if got.names == names and not retyped:
        return None
    parts = ([f"missing {', '.join(missing)}"] if missing else []) + ([f"extra {', '.join(extra)}"] if extra else [])
    parts += [f"retyped {', '.join(retyped)}"] if retyped else []
    return f"holds other columns than the {table} table's ({'; '.join(parts) or 'in another order'})"


def column_problems(store: Path, manifest: st.Manifest, skip=()) -> dict[str, str]:
    """run -> its first file whose columns are not its table's, among the entries marked exact (the
    runs in ``skip`` left out). Reads each such file's footer (~1 ms a file)."""
    out: dict[str, str] = {}
    for entry in manifest.traces + manifest.sidecars:
        run = entry.get("run", "?")
        if run in out or run in skip or entry.get("schema") != S.SCHEMA_VERSION:
            continue
        for table, rel in entry.get("files", {}).items():
            problem = column_problem(store / rel, table) if table in S.TABLES else None
            if problem:
                out[run] = f"{rel} {problem}"
                break
    return out


def _problem_of(store, manifest: st.Manifest):
    """rel -> None or what is wrong with that listed file: its footer on a local store; one listing
    of a remote one (an object is written whole or not at all)."""
    if isinstance(store, Path):
        return lambda rel: file_problem(store / rel)
    from .remote import problems
    rels = [f for t in manifest.traces + manifest.sidecars for f in t.get("files", {}).values()]
    rels += [f for r in manifest.extra.get("results", {}).values() for f in r.get("files", {}).values()]
    found = problems(store, rels) if rels else {}
    return found.get


def damaged_runs(store: Path, manifest: st.Manifest, problem_of=None) -> dict[str, str]:
    """run -> what is wrong (the first problem found), for every damaged run."""
    problem_of = problem_of or _problem_of(store, manifest)
    out: dict[str, str] = {}
    for entry in manifest.traces + manifest.sidecars:
        run = entry.get("run", "?")
        if run in out:
            continue
        rank = entry.get("rank")
        if not isinstance(rank, int) or not 0 <= rank <= _INT32_MAX:
            out[run] = f"rank {rank!r} is outside [0, {_INT32_MAX}]"
            continue
        for rel in entry.get("files", {}).values():
            problem = problem_of(rel)
            if problem:
                out[run] = f"{rel} is {problem}"
                break
    return out


def healthy(store: Path, manifest: st.Manifest, warn: bool = True, bad: dict[str, str] | None = None) -> st.Manifest:
    """The manifest without its damaged runs (the same object when none is damaged); one warning
    line per damaged run. ``bad``: the damaged runs when the caller found them (``check``)."""
    problem_of = _problem_of(store, manifest)
    bad = damaged_runs(store, manifest, problem_of) if bad is None else bad
    bad_results = [rel for r in manifest.extra.get("results", {}).values()
                   for run, rel in r.get("files", {}).items() if run not in bad and problem_of(rel)]
    if not bad and not bad_results:
        return manifest
    if warn:
        for run, problem in sorted(bad.items()):
            warnings.warn(StoreWarning(f"{store}: run '{run}' is damaged ({problem}) and left out; "
                                       f"`traceanalyzer check {store}` says what to do"), stacklevel=3)
        if bad_results:
            warnings.warn(StoreWarning(f"{store}: saved result {bad_results[0]} is damaged and left out "
                                       f"(`traceanalyzer analyze` recomputes it)"), stacklevel=3)
    results = {name: dict(r, files={k: v for k, v in r.get("files", {}).items()
                                    if k not in bad and v not in bad_results})
               for name, r in manifest.extra.get("results", {}).items()}
    return st.Manifest(manifest.schema_version, manifest.generation,
                       [t for t in manifest.traces if t.get("run") not in bad],
                       dict(manifest.extra, results=results) if results else dict(manifest.extra),
                       [t for t in manifest.sidecars if t.get("run") not in bad])


@dataclass
class CheckReport:
    store: str
    damaged: dict[str, str] = field(default_factory=dict)
    bad_results: list[str] = field(default_factory=list)  # saved result files missing or truncated
    junk: list[str] = field(default_factory=list)  # relative paths of files/folders no manifest lists
    stale_lock: bool = False
    repaired: bool = False

    @property
    def ok(self) -> bool:
        return not (self.damaged or self.bad_results or self.junk or self.stale_lock)

    def text(self) -> str:
        lines = []
        for run, problem in sorted(self.damaged.items()):
            lines.append(f"damaged run '{run}': {problem}" + (" -> its listing removed; re-ingest its traces"
                                                                if self.repaired else ""))
        for rel in self.bad_results:
            lines.append(f"damaged saved result {rel}" + (" -> dropped; `traceanalyzer analyze` recomputes it"
                                                           if self.repaired else ""))
        if self.junk:
            shown = ", ".join(self.junk[:5]) + (f" and {len(self.junk) - 5} more" if len(self.junk) > 5 else "")
            lines.append(f"{len(self.junk)} leftover file(s) of an interrupted write: {shown}"
                         + (" -> removed" if self.repaired else ""))
        if self.stale_lock:
            lines.append(f"stale lock {st.LOCK} (its process is gone)" + (" -> removed" if self.repaired else ""))
        if self.ok:
            return f"{self.store}: store OK"
        if not self.repaired:
            todo = []
            if self.damaged:
                todo.append(f"`traceanalyzer rm {self.store} --run RUN` (or `check --repair`) removes a damaged run, "
                            "then re-ingest its traces")
            todo.append(f"`traceanalyzer check {self.store} --repair` fixes all of the above")
            lines.append("to do: " + "; ".join(todo))
        return "\n".join(f"{self.store}: {line}" for line in lines)


def check_store(store: str | os.PathLike, repair: bool = False) -> CheckReport:
    store = st.location(store)
    if not st.has_manifest(store):
        raise StoreError(_no_store(store))
    manifest = st.read_manifest(store)
    report = _inspect(store, manifest)
    if repair and not report.ok:
        with st.locked(store):  # takes over a lock of a dead process
            manifest = st.read_manifest(store)
            report = _inspect(store, manifest)
            report.stale_lock = report.stale_lock or False
            if report.damaged or report.bad_results:
                fixed = healthy(store, manifest, warn=False, bad=report.damaged)
                _drop_results(fixed, report.bad_results)
                fixed.generation += 1
                writers.retire(manifest, fixed)  # what is still whole there, a reader may be reading
                st.write_manifest(store, fixed)
                manifest = fixed
            st.collect_garbage(store, manifest)
        report.repaired = True
    return report


def _no_store(store) -> str:
    if isinstance(store, Path):
        return f"{store}: no traceanalyzer store here (missing {st.MANIFEST})"
    return st.not_a_store(store)


def _drop_results(manifest: st.Manifest, bad: list[str]) -> None:
    for r in manifest.extra.get("results", {}).values():
        r["files"] = {k: v for k, v in r.get("files", {}).items() if v not in bad}


def _inspect(store: Path, manifest: st.Manifest) -> CheckReport:
    problem_of = _problem_of(store, manifest)
    report = CheckReport(str(store), damaged=damaged_runs(store, manifest, problem_of))
    if isinstance(store, Path):
        report.damaged.update(column_problems(store, manifest, skip=report.damaged))
    for r in manifest.extra.get("results", {}).values():
        for run, rel in r.get("files", {}).items():
            if run not in report.damaged and problem_of(rel):
                report.bad_results.append(rel)
    live = {f for t in manifest.traces + manifest.sidecars for f in t.get("files", {}).values()}
    live |= {f for r in manifest.extra.get("results", {}).values() for f in r.get("files", {}).values()}
    live |= st.summary_files(manifest) | writers.retained(manifest)  # retired: a reader may still hold them
    if not isinstance(store, Path):  # old unlisted objects; no lock, no staging on a remote store
        from .remote import unlisted
        report.junk = unlisted(store, live)
        return report
    for table in [*S.TABLES, "_results", "_summaries"]:
        root = store / table
        if root.exists():
            report.junk += sorted(p.relative_to(store).as_posix() for p in root.rglob("*.parquet")
                                  if p.relative_to(store).as_posix() not in live)
    report.junk += sorted(p.name for p in store.iterdir()
                          if p.name.startswith((f".{st.MANIFEST}.", ".staging-", ".write-test-"))
                          or p.name.startswith(writers.WORK) and not writers.work_owner_alive(p))
    lock = store / st.LOCK
    if lock.exists():
        report.stale_lock = not st.owner_alive(*st.lock_owner(lock))
    return report


def remove_run(store: str | os.PathLike, run: str) -> int:
    """Remove every trace, per-process input, saved result and summary of ``run`` in one atomic
    commit; returns how many traces and inputs were listed. The files are retired, not deleted
    (:func:`.writers.retire`): a reader that listed them (an analyze, a notebook's ``ta.open``)
    keeps reading them for RETIRED_KEEP_S, also when the run is ingested again meanwhile."""
    store = st.location(store)
    if not st.has_manifest(store):
        raise StoreError(_no_store(store))
    st.check_writable(store)

    def change(manifest: st.Manifest) -> int:
        runs = sorted({t.get("run") for t in manifest.traces + manifest.sidecars})
        if run not in runs:
            raise StoreError(f"{store}: {no_run_message(run, runs)}")
        n = sum(t.get("run") == run for t in manifest.traces + manifest.sidecars)
        manifest.traces = [t for t in manifest.traces if t.get("run") != run]
        manifest.sidecars = [t for t in manifest.sidecars if t.get("run") != run]
        for r in manifest.extra.get("results", {}).values():
            r["files"] = {k: v for k, v in r.get("files", {}).items() if k != run}
        manifest.extra.get("summaries", {}).pop(run, None)
        manifest.extra.get("replay_graph", {}).pop(run, None)
        return n
    return writers.update(store, change, wait_s=0)  # the commit point; garbage collection keeps the retired files
