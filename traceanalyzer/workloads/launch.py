"""Launch a reference workload as a real torchrun job (used by the tests and ``traceanalyzer demo``).

Real launches fail rarely (about 2 in 110 here: one rank dies with SIGABRT),
so a failed launch is retried once, in a fresh folder; if it fails again the
error carries every rank's stderr, which torchrun otherwise only summarizes.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Sequence

REPO_ROOT = Path(__file__).resolve().parents[2]
RETRIES = 1
TAIL_CHARS = 4000  # of each log shown in a failure report
KILL_GRACE_S = 10  # after SIGTERM on timeout, before SIGKILL


class LaunchError(RuntimeError):
    pass


@dataclasses.dataclass
class Launch:
    out_dir: Path  # what the workload got as --out
    output: str  # torchrun's own stdout+stderr
    attempts: int


def launch(nproc: int, args: Sequence[str], tmp_path: Path, timeout: float = 120,
           env: Mapping[str, str] | None = None) -> Launch:
    """Run `torchrun --nproc_per_node=nproc -m traceanalyzer.workloads *args --out DIR`.

    `args` start with the workload (e.g. ["ddp", "--run-name", "r"]) and must not
    set --out: each attempt gets its own folder under `tmp_path`, returned as out_dir.
    "{attempt}" in an argument becomes that folder, so that whatever else the job writes
    (``--store {attempt}/store``) starts fresh on a retry too (out_dir.parent after success).
    """
    if "--out" in args:
        raise ValueError("launch() chooses --out itself; read it from the result")
    reports = []
    for attempt in range(RETRIES + 1):
        folder = Path(tmp_path) / f"attempt{attempt}"
        ok, output, report = _run_once(nproc, [str(a).replace("{attempt}", str(folder)) for a in args], folder,
                                       timeout, env)
        if ok:
            return Launch(out_dir=folder / "out", output=output, attempts=attempt + 1)
        reports.append(f"--- attempt {attempt} ---\n{report}")
    raise LaunchError(f"torchrun failed {RETRIES + 1} times: {list(args)}\n" + "\n".join(reports))


def _run_once(nproc, args, folder: Path, timeout, env) -> tuple[bool, str, str]:
    logs = folder / "logs"
    cmd = [sys.executable, "-m", "torch.distributed.run",
           "--standalone",  # rendezvous on a free port: parallel launches don't collide
           f"--nproc_per_node={nproc}",
           "--log-dir", str(logs), "--redirects", "3",  # each rank's stdout/stderr to files
           "-m", "traceanalyzer.workloads", *args, "--out", str(folder / "out")]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=_env(env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        output = _stop(proc)
        return False, output, _report(f"timed out after {timeout} s", output, logs)
    if proc.returncode == 0:
        return True, output, ""
    return False, output, _report(f"exit code {proc.returncode}", output, logs)


def _env(extra: Mapping[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    # The workload must import this checkout's traceanalyzer, installed or not.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")  # what torchrun would set anyway, minus its warning
    env.update(extra or {})
    return env


def _stop(proc: subprocess.Popen) -> str:
    """Stop the torchrun we started and its ranks (its own session), return what it printed."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        output, _ = proc.communicate(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
    return output


def _report(status: str, output: str, logs: Path) -> str:
    parts = [f"torchrun {status}; its output (tail):\n{output[-TAIL_CHARS:]}"]
    # torchrun writes LOG_DIR/<run id>/attempt_<n>/<local rank>/stderr.log
    for path in sorted(logs.glob("**/stderr.log")):
        rank = path.parent.name  # the local rank, which is the rank: --standalone is one node
        parts.append(f"rank {rank} stderr ({path}) (tail):\n{path.read_text()[-TAIL_CHARS:]}")
    if len(parts) == 1:
        parts.append(f"no rank logs found under {logs}")
    return "\n".join(parts)
