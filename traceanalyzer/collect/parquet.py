"""Each rank converts its own windows into the store's Parquet parts, off the training loop.

When a window's JSON is written, :class:`Converter` starts ``python -m traceanalyzer.ingest.prebuilt
build TRACE`` as a child process (a fresh interpreter: nothing of the training process is forked,
torch's threads included, and the training script is not re-imported) and returns: the loop waits
only for the process to start. When ``profile`` exits, :meth:`Converter.finish` waits for them (at
most ``wait_s``), rebuilds ``comms`` with the Flight Recorder dump written at exit (``refresh``),
and, with ``keep_json=False``, deletes each JSON whose parts were written. A conversion that fails
or does not finish in time leaves one warning line and the JSON stays the source for ``ingest``.
Parts layout and validation: :mod:`traceanalyzer.ingest.prebuilt`.
"""
from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

from ..ingest import prebuilt

log = logging.getLogger(__name__)

#: How long ``profile`` waits at exit for this rank's conversions (all windows together).
PARQUET_WAIT_S = 300.0
#: A child's log (its stderr) in the parts folder's parent, kept when it fails.
LOG_SUFFIX = ".convert.log"


class Converter:
    """The conversion processes of one rank."""

    def __init__(self, rank: int, keep_json: bool = True, wait_s: float = PARQUET_WAIT_S):
        self.rank, self.keep_json, self.wait_s = rank, keep_json, wait_s
        self.jobs: list[tuple[Path, subprocess.Popen, Path]] = []   # (trace, process, its log)

    def start(self, trace: Path) -> None:
        """Start converting ``trace`` (its JSON is complete) in the background."""
        folder = prebuilt.parts_dir(trace)
        folder.parent.mkdir(parents=True, exist_ok=True)
        log_path = folder.parent / f"{folder.name}{LOG_SUFFIX}"
        with open(log_path, "wb") as err:
            proc = subprocess.Popen([sys.executable, "-m", "traceanalyzer.ingest.prebuilt", "build", str(trace),
                                     "--rank", str(self.rank)], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=err)
        self.jobs.append((trace, proc, log_path))

    def finish(self, fr_path: Path | None) -> list[Path]:
        """Wait for the conversions, give their comms the FR dump; returns the parts folders written."""
        deadline = time.monotonic() + self.wait_s
        done = []
        for trace, proc, log_path in self.jobs:
            if self._wait(proc, deadline, f"converting {trace.name}", log_path):
                done.append(trace)
        if fr_path is not None and done:
            folders = [str(prebuilt.parts_dir(t)) for t in done]
            log_path = prebuilt.parts_dir(done[0]).parent / f"fr-refresh{LOG_SUFFIX}"
            with open(log_path, "wb") as err:
                proc = subprocess.Popen([sys.executable, "-m", "traceanalyzer.ingest.prebuilt", "refresh", *folders,
                                         "--fr", str(fr_path)], stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=err)
            if not self._wait(proc, deadline, f"adding the Flight Recorder dump {fr_path.name} to the parts",
                              log_path):
                return []   # the parts' FR signature says they are stale: ingest parses the JSON
        if not self.keep_json:
            for trace in done:
                if isinstance(prebuilt.check(trace), tuple):
                    trace.unlink()
        return [prebuilt.parts_dir(t) for t in done]

    def _wait(self, proc: subprocess.Popen, deadline: float, what: str, log_path: Path) -> bool:
        try:
            rc = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            log.warning("rank %d: %s to Parquet did not finish within %.0f s; ingest will parse the JSON",
                        self.rank, what, self.wait_s)
            return False
        if rc != 0:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
            log.warning("rank %d: %s to Parquet failed (exit %d: %s; log %s); ingest will parse the JSON",
                        self.rank, what, rc, tail[0], log_path)
            return False
        log_path.unlink(missing_ok=True)
        return True
