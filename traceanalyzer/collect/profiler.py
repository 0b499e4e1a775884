"""`profile`: the per-rank collector context manager (Kineto trace + FR dump + manifest)."""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
from pathlib import Path
from typing import Any, Iterator, Mapping

from traceanalyzer.collect import files, manifest
from traceanalyzer.collect.fr_dump import dump_flight_recorder, enable_flight_recorder

log = logging.getLogger(__name__)


class Collector:
    """What `profile` yields: call `.step()` once at the end of every training step."""

    def __init__(self, run: str, run_dir: Path, rank: int):
        self.run = run
        self.run_dir = run_dir
        self.rank = rank
        self.traces: list[str] = []  # trace file names written so far, one per window
        self._prof = None

    def step(self) -> None:
        self._prof.step()

    def _on_trace_ready(self, prof) -> None:
        name = files.trace_name(self.rank, len(self.traces))
        prof.export_chrome_trace(str(self.run_dir / name))  # ".gz" suffix: torch gzips it
        self.traces.append(name)


def _dist():
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _resolve_run_id(run: str | None) -> str:
    """All ranks must agree on the run folder: torchrun's run id, else rank 0's clock."""
    if run:
        return run
    elastic_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    if elastic_id != "none":
        return elastic_id
    box = [datetime.datetime.now(datetime.timezone.utc).strftime("run-%Y%m%dT%H%M%SZ")]
    if (dist := _dist()) is not None:
        dist.broadcast_object_list(box, src=0)
    return box[0]


@contextlib.contextmanager
def profile(out_dir: str | Path, run: str | None = None, wait: int = 1, warmup: int = 1,
            active: int = 3, record_shapes: bool = True, layout: Mapping | None = None,
            ground_truth: Mapping | None = None, repeat: int = 0,
            store: str | Path | None = None) -> Iterator[Collector]:
    """Profile this rank of a (torchrun) job; enter it on every rank, after init_process_group.

    `wait`/`warmup`/`active`/`repeat` are torch.profiler.schedule's; each cycle ("window")
    becomes one trace file. `record_shapes` stays on by default: gloo message sizes
    exist only as op input shapes. `layout` is the declared parallel layout
    (e.g. {"dp": 4}), `ground_truth` what faults the workload injected. With `store`, rank 0
    ingests the whole run into that store once every rank has written its files (a clean exit
    only: after an error the files stay for `traceanalyzer ingest`).
    """
    import torch
    from torch.profiler import ProfilerActivity, schedule

    enable_flight_recorder()  # effective only if no process group exists yet
    dist = _dist()
    rank = dist.get_rank() if dist else int(os.environ.get("RANK", 0))
    run = _resolve_run_id(run)
    folder = files.run_dir(out_dir, run)
    folder.mkdir(parents=True, exist_ok=True)
    if dist:
        dist.barrier()  # all ranks read their clocks at (nearly) the same instant
    clock = manifest.clock_pair()

    collector = Collector(run, folder, rank)
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    prof = torch.profiler.profile(
        activities=activities,
        schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=repeat),
        on_trace_ready=collector._on_trace_ready,
        record_shapes=record_shapes,
    )
    collector._prof = prof
    exit_status = "ok"
    try:
        with prof:
            yield collector
    except BaseException as exc:
        exit_status = f"error: {type(exc).__name__}: {exc}"
        raise
    finally:
        _write_outputs(collector, clock, exit_status, layout, ground_truth)
    if store is not None:
        _ingest_run(collector, store)


def _ingest_run(collector: Collector, store: str | Path) -> None:
    """Rank 0 ingests the run folder after a barrier (every rank's trace, FR dump, manifest)."""
    dist = _dist()
    if dist:
        dist.barrier()
    if collector.rank == 0:
        from ..ingest.batch import ingest
        report = ingest([collector.run_dir], store, run=collector.run, workers=1)
        log.warning("%s", report.summary())     # warning: seen in a job whose logging is not configured
    if dist:
        dist.barrier()  # nobody tears the group down while rank 0 still ingests


def _write_outputs(collector: Collector, clock: dict[str, int], exit_status: str,
                   layout: Mapping | None, ground_truth: Mapping | None) -> None:
    """FR dump and manifests; runs on error exits too, and never masks the original error."""
    rank, folder = collector.rank, collector.run_dir
    written: dict[str, Any] = {"traces": list(collector.traces), "flight_recorder": None}
    try:
        if dump_flight_recorder(folder / files.fr_name(rank)):
            written["flight_recorder"] = files.fr_name(rank)
    except Exception as exc:  # noqa: BLE001 - a failed dump must not hide the run's own result
        log.error("rank %d: Flight Recorder dump failed: %r", rank, exc)
    part = manifest.rank_part(run=collector.run, rank=rank, clock=clock, files=written,
                              exit_status=exit_status)
    manifest.write_json(folder / files.rank_manifest_name(rank), part)
    if rank == 0:
        dist = _dist()
        world = dist.get_world_size() if dist else int(os.environ.get("WORLD_SIZE", 1))
        run_part = manifest.run_part(
            run=collector.run, world_size=world, backend=dist.get_backend() if dist else None,
            layout=layout, ground_truth=ground_truth,
            rank_manifests=[files.rank_manifest_name(r) for r in range(world)])
        manifest.write_json(folder / files.RUN_MANIFEST, run_part)
