"""Run manifest: what ran, where, and what was injected (the ground truth).

Kept torch-free except where it asks torch.distributed about the live job,
so the env handling can be unit-tested without torch.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any, Mapping

MANIFEST_VERSION = 1
# Only these env families are recorded: they change comms/threading behaviour.
ENV_PREFIXES = ("NCCL_", "TORCH_", "CUDA_", "OMP_")
# A variable whose name contains one of these is recorded with its value hidden.
SECRET_MARKERS = ("TOKEN", "SECRET", "KEY", "PASSWORD")
REDACTED = "<redacted>"


def allowed_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allow-listed env vars, secret-looking values redacted."""
    environ = os.environ if environ is None else environ
    out = {}
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIXES):
            continue
        secret = any(marker in name.upper() for marker in SECRET_MARKERS)
        out[name] = REDACTED if secret else environ[name]
    return out


def clock_pair() -> dict[str, int]:
    """Wall clock and monotonic clock read back to back, to map one onto the other."""
    return {"wall_ns": time.time_ns(), "monotonic_ns": time.monotonic_ns()}


def process_groups() -> list[dict[str, Any]]:
    """This rank's process groups (name, description, backend, ranks)."""
    from torch.distributed import distributed_c10d as c10d

    if not c10d.is_initialized():
        return []
    return [
        {"name": cfg["pg_name"], "desc": cfg["pg_desc"], "backend": cfg["backend_config"],
         "size": cfg["pg_size"], "ranks": list(cfg["ranks"])}
        for cfg in c10d._get_all_pg_configs()
    ]


def current_device() -> str:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return f"cuda:{torch.cuda.current_device()}"
    return "cpu"


def nccl_version() -> str | None:
    """The NCCL this torch is built with ("2.27.5"), None without CUDA/NCCL."""
    import torch

    try:
        v = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - CPU builds have no NCCL
        return None
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def rank_part(*, run: str, rank: int, clock: dict[str, int], files: dict[str, Any],
              exit_status: str) -> dict[str, Any]:
    return {
        "manifest_version": MANIFEST_VERSION,
        "run_id": run,
        "rank": rank,
        "local_rank": int(os.environ.get("LOCAL_RANK", rank)),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "device": current_device(),
        "process_groups": process_groups(),
        "env": allowed_env(),
        "clock": clock,
        "files": files,
        "exit": exit_status,
    }


def run_part(*, run: str, world_size: int, backend: str | None, layout: Mapping | None,
             ground_truth: Mapping | None, rank_manifests: list[str]) -> dict[str, Any]:
    import torch

    return {
        "manifest_version": MANIFEST_VERSION,
        "run_id": run,
        "world_size": world_size,
        "backend": backend,
        "torch_version": torch.__version__,
        "nccl_version": nccl_version(),
        "cuda_version": torch.version.cuda,
        "process_groups": process_groups(),
        "layout": dict(layout or {}),
        "ground_truth": dict(ground_truth or {}),
        "rank_manifests": rank_manifests,
    }


def write_json(path: Path, obj: Any) -> None:
    # Write then rename, so a reader never sees half a manifest.
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True))
    os.replace(tmp, path)
