"""Where ingest runs its one-task-per-file work (and report its one task per run): in this process,
in a local process pool, or on a Dask cluster. One interface, so that ingest has one code path
whatever runs the tasks; :func:`run_all` is the in-order form ``report`` uses.

``executor.map_unordered(fn, calls, names)`` yields ``(i, result, failure)`` as tasks finish, in
any order: ``result`` is ``fn(*calls[i])``, or None when the task died with the process that ran it
(killed, out of memory, a lost Dask worker); ``failure`` then says so in a few words. Closing the
generator (the caller stops at the first error) cancels the tasks not yet finished.

:func:`open_executor` picks the executor: ``dask=None`` keeps the local path (inline for one worker,
else a process pool: one fresh process per file); ``dask="local"`` / ``"local:N"`` starts a Dask
``LocalCluster`` of N single-threaded worker processes and closes it afterwards; any other string is
a scheduler address (``tcp://HOST:8786``) to connect to; a ``distributed.Client`` is used as it is
(and left open). Dask is imported only here and only when asked for.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
import re
import uuid
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import closing, contextmanager
from typing import Callable, Iterator, Sequence

from ..errors import TraceAnalyzerError

#: How long connecting to a Dask scheduler may take before ingest gives up (seconds).
DASK_CONNECT_TIMEOUT_S = 10
#: Dask reruns a task whose worker died on another worker up to this many times; ingest wants the
#: first death to be the error (a file that kills its worker would kill the next one too). Applied
#: to the clusters ingest starts itself; a running scheduler keeps its own setting.
DASK_ALLOWED_FAILURES = 0
#: The Dask log level on the clusters ingest starts (Dask sets it on its own loggers): their
#: warnings and errors (a worker restarted, a task failed) would drown ingest's one error line.
DASK_LOG_LEVEL = logging.CRITICAL

_INSTALL_HINT = "ingest on a Dask cluster needs dask[distributed]: pip install 'traceanalyzer[dask]'"

Outcome = tuple  # (index of the call, result or None, failure text or None)


class Inline:
    """Runs every task in this process, one after the other."""

    def map_unordered(self, fn: Callable, calls: Sequence[tuple], names: Sequence[str] = ()) -> Iterator[Outcome]:
        for i, args in enumerate(calls):
            yield i, fn(*args), None


class ProcessPool:
    """A local pool of ``n_workers`` processes (forkserver, one fresh process per task, so that a
    task's memory is returned to the system when it ends)."""

    def __init__(self, n_workers: int, preload: Sequence[str] = (), initializer: Callable | None = None):
        self.n_workers, self.preload, self.initializer = n_workers, list(preload), initializer

    def map_unordered(self, fn: Callable, calls: Sequence[tuple], names: Sequence[str] = ()) -> Iterator[Outcome]:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(self.preload)
        with ProcessPoolExecutor(self.n_workers, mp_context=ctx, max_tasks_per_child=1,
                                 initializer=self.initializer) as pool:
            futures = {pool.submit(fn, *args): i for i, args in enumerate(calls)}
            try:
                for fut in as_completed(futures):
                    try:
                        result = fut.result()
                    except Exception as exc:  # the worker died (killed, out of memory)
                        yield futures[fut], None, f"worker process died ({type(exc).__name__}: {exc})"
                    else:
                        yield futures[fut], result, None
            finally:  # stopped early: the pool's exit waits for the running tasks only
                for fut in futures:
                    fut.cancel()


class Dask:
    """Tasks on a Dask cluster through ``client`` (one task per call, no retries; task keys
    ``traceanalyzer-NAME-BATCH-I``, so that the dashboard names the file)."""

    def __init__(self, client):
        self.client = client

    def map_unordered(self, fn: Callable, calls: Sequence[tuple], names: Sequence[str] = ()) -> Iterator[Outcome]:
        from distributed import as_completed as dask_completed
        batch = uuid.uuid4().hex[:8]
        names = list(names) or [str(i) for i in range(len(calls))]
        keys = [re.sub(r"[^A-Za-z0-9._-]+", "_", f"traceanalyzer-{names[i]}-{batch}-{i}") for i in range(len(calls))]
        futures = [self.client.submit(fn, *args, key=keys[i], pure=False, retries=0) for i, args in enumerate(calls)]
        index = {fut.key: i for i, fut in enumerate(futures)}
        try:
            for fut in dask_completed(futures, loop=self.client.loop):
                try:
                    result = fut.result()
                except TraceAnalyzerError:  # the task's own one-line error: as it would be in this process
                    raise
                except Exception as exc:
                    yield index[fut.key], None, _dask_failure(exc)
                else:
                    yield index[fut.key], result, None
        finally:  # running tasks finish on their workers; what they stage after this is discarded
            self.client.cancel(futures)


def _dask_failure(exc: BaseException) -> str:
    """A task that did not return, in a few words (Dask's own messages run over several lines)."""
    name = type(exc).__name__
    if name == "KilledWorker":
        return "the Dask worker running it died (killed, or out of memory); the store is unchanged"
    if isinstance(exc, ModuleNotFoundError):
        return f"the Dask workers cannot import {exc.name!r}: install traceanalyzer on every worker"
    first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
    return f"the task failed on the Dask cluster ({name}{': ' + first if first else ''})"


def parse_local_spec(spec: str) -> int | None:
    """``local`` -> None (as many workers as asked or CPUs), ``local:N`` -> N; anything else is an error."""
    head, sep, n = spec.partition(":")
    if head != "local" or (sep and not (n.isdigit() and int(n) > 0)):
        raise TraceAnalyzerError(f"--dask {spec!r}: expected local or local:N (N worker processes); "
                                 "to use a running cluster, give --scheduler tcp://HOST:PORT")
    return int(n) if sep else None


@contextmanager
def open_executor(dask=None, n_workers: int = 1, n_tasks: int = 1, preload: Sequence[str] = (),
                  initializer: Callable | None = None):
    """The executor for one batch of ``n_tasks`` tasks (see the module docstring for ``dask``)."""
    if dask is None:
        yield Inline() if n_workers <= 1 else ProcessPool(n_workers, preload, initializer)
        return
    if not isinstance(dask, str):  # a distributed.Client the caller owns
        if not callable(getattr(dask, "submit", None)):
            raise TraceAnalyzerError(f"dask={dask!r}: expected 'local', 'local:N', a scheduler address "
                                     "(tcp://HOST:8786) or a distributed.Client")
        yield Dask(dask)
        return
    local = dask == "local" or dask.startswith("local:")
    n_local = parse_local_spec(dask) if local else None
    try:
        import dask as _dask
        from distributed import Client, LocalCluster
    except ImportError:
        raise TraceAnalyzerError(_INSTALL_HINT) from None
    if local:
        n = max(1, min(n_local or n_workers or os.cpu_count() or 1, n_local or n_tasks))
        with _dask.config.set({"distributed.scheduler.allowed-failures": DASK_ALLOWED_FAILURES}):
            cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None,
                                   silence_logs=DASK_LOG_LEVEL)
        try:
            with Client(cluster, set_as_default=False) as client:
                if initializer is not None:
                    client.run(initializer)  # our own worker processes
                yield Dask(client)
        finally:
            cluster.close()
        return
    try:
        client = Client(dask, timeout=DASK_CONNECT_TIMEOUT_S, set_as_default=False)
    except (OSError, ValueError) as exc:  # TimeoutError is an OSError
        raise TraceAnalyzerError(f"cannot reach the Dask scheduler at {dask} ({type(exc).__name__}: "
                                 f"{str(exc).strip().splitlines()[0][:160] if str(exc).strip() else 'no answer'})") from None
    with client:
        yield Dask(client)


def run_all(dask, fn: Callable, calls: Sequence[tuple], names: Sequence[str]) -> list:
    """``[fn(*args) for args in calls]``, in order: in this process (``dask=None``), else one task
    each on the Dask cluster ``dask`` names. A task whose worker died raises one line naming it."""
    out = [None] * len(calls)
    with open_executor(dask, n_workers=1 if dask is None else os.cpu_count() or 1, n_tasks=len(calls)) as ex, \
            closing(ex.map_unordered(fn, calls, names)) as outcomes:
        for i, result, failure in outcomes:
            if failure is not None:
                raise TraceAnalyzerError(f"{names[i]}: {failure}")
            out[i] = result
    return out
