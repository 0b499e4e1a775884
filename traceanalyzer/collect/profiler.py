"""`profile`: the per-rank collector context manager (Kineto trace + its Parquet parts + FR dump +
manifest; or, with ``op_timeline=True``, the light op timeline instead of the profiler)."""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
from pathlib import Path
from typing import Any, Iterator, Mapping

from traceanalyzer.collect import files, manifest
from traceanalyzer.collect.cpu_sched import Sampler
from traceanalyzer.collect.fr_dump import dump_flight_recorder, enable_flight_recorder
from traceanalyzer.collect.op_timeline import OpTimeline
from traceanalyzer.collect.parquet import PARQUET_WAIT_S, Converter

log = logging.getLogger(__name__)


class Collector:
    """What `profile` yields: call `.step()` once at the end of every training step. In the light
    mode (``op_timeline=True``) mark the loop's phases with ``with c.op("forward-compute", microbatch=mb):``
    (the op vocabulary of :mod:`traceanalyzer.ingest.op_timeline`); ``c.timeline`` is the
    :class:`OpTimeline`."""

    def __init__(self, run: str, run_dir: Path, rank: int, converter: Converter | None = None,
                 timeline: OpTimeline | None = None):
        self.run = run
        self.run_dir = run_dir
        self.rank = rank
        self.traces: list[str] = []  # trace file names written so far, one per window
        self.parquet: list[str] = []  # parts folders written (relative to run_dir), filled at exit
        self.converter = converter
        self.timeline = timeline
        self.step_index = 0
        self._prof = None
        self.cpu = Sampler()  # CPU run/wait per step boundary (cpu_sched.py): sample 0 at entry

    def step(self) -> None:
        self.step_index += 1
        # before prof.step(): its own work (a window's trace export) falls outside ProfilerStep#k, as in the trace
        self.cpu.sample(self.step_index)
        if self._prof is not None:
            self._prof.step()

    def op(self, op: str, microbatch: int = -1, vpp: int = 0):
        """Time one phase of the current step (light mode only)."""
        if self.timeline is None:
            raise RuntimeError("Collector.op() records the light op timeline: use profile(..., op_timeline=True)")
        return self.timeline.op(op, self.step_index, microbatch, vpp)

    def _on_trace_ready(self, prof) -> None:
        name = files.trace_name(self.rank, len(self.traces))
        prof.export_chrome_trace(str(self.run_dir / name))  # ".gz" suffix: torch gzips it
        self.traces.append(name)
        if self.converter is not None:
            try:
                self.converter.start(self.run_dir / name)  # in the background: the loop goes on
            except OSError as exc:  # no process could start: the JSON stays the source
                log.warning("rank %d: cannot start the Parquet conversion of %s (%s); ingest will parse the JSON",
                            self.rank, name, exc)


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
            store: str | Path | None = None, parquet: bool = True, keep_json: bool = True,
            parquet_wait_s: float = PARQUET_WAIT_S, op_timeline: bool = False,
            coords: Mapping[str, int] | None = None) -> Iterator[Collector]:
    """Profile this rank of a (torchrun) job; enter it on every rank, after init_process_group.

    `wait`/`warmup`/`active`/`repeat` are torch.profiler.schedule's; each cycle ("window")
    becomes one trace file. `record_shapes` stays on by default: gloo message sizes
    exist only as op input shapes. `layout` is the declared parallel layout
    (e.g. {"dp": 4}), `ground_truth` what faults the workload injected. With `store`, rank 0
    ingests the whole run into that store once every rank has written its files (a clean exit
    only: after an error the files stay for `traceanalyzer ingest`).

    `parquet` (default on): every window is also converted, on this rank and in a background
    process, into the store's Parquet parts (``RUN/parquet/rank=R/window=W/``), so that `ingest`
    (and `store`) only validate and commit them; `profile` waits for them at exit (at most
    `parquet_wait_s`, then a warning and the JSON stays the source). `keep_json=False` deletes each
    JSON once its parts are written. `op_timeline=True` is the light mode: no profiler; the
    collector's ``op()`` times the loop's phases and each rank writes its own
    ``RUN/rank{R}.op_timeline.parquet`` at exit (`coords`: this rank's dp/pp/tp/cp/ep indices).
    """
    if op_timeline:
        with _light(out_dir, run, layout, ground_truth, store, coords) as collector:
            yield collector
        return
    import torch
    from torch.profiler import ProfilerActivity, schedule

    enable_flight_recorder()  # effective only if no process group exists yet
    rank, run, folder, clock = _start(out_dir, run)
    collector = Collector(run, folder, rank, Converter(rank, keep_json, parquet_wait_s) if parquet else None)
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
    with _recorded(collector, clock, layout, ground_truth, store), prof:
        collector.cpu.sample(0)  # ProfilerStep#0 starts here
        yield collector


def _start(out_dir, run) -> tuple:
    """This rank, the run every rank agrees on, its folder, and the clock pair read by all ranks
    at (nearly) the same instant (after a barrier)."""
    dist = _dist()
    rank = dist.get_rank() if dist else int(os.environ.get("RANK", 0))
    run = _resolve_run_id(run)
    folder = files.run_dir(out_dir, run)
    folder.mkdir(parents=True, exist_ok=True)
    if dist:
        dist.barrier()
    return rank, run, folder, manifest.clock_pair()


@contextlib.contextmanager
def _recorded(collector: Collector, clock, layout, ground_truth, store) -> Iterator[None]:
    """Around the training loop: the outputs and manifests at exit, error exits included (the
    exit status says which), then, after a clean exit, the run committed to ``store``."""
    exit_status = "ok"
    try:
        yield
    except BaseException as exc:
        exit_status = f"error: {type(exc).__name__}: {exc}"
        raise
    finally:
        _write_outputs(collector, clock, exit_status, layout, ground_truth)
    if store is not None:
        _ingest_run(collector, store)


def _ingest_run(collector: Collector, store: str | Path) -> None:
    """Rank 0 ingests the run folder after a barrier (every rank's trace, FR dump, manifest); the
    traces every rank converted to Parquet parts are only validated and committed."""
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
    """FR dump, the windows' Parquet parts, manifests; runs on error exits too, and never masks
    the original error."""
    rank, folder = collector.rank, collector.run_dir
    written: dict[str, Any] = {"traces": list(collector.traces), "flight_recorder": None}
    if collector.timeline is None:
        try:
            if dump_flight_recorder(folder / files.fr_name(rank)):
                written["flight_recorder"] = files.fr_name(rank)
        except Exception as exc:  # noqa: BLE001 - a failed dump must not hide the run's own result
            log.error("rank %d: Flight Recorder dump failed: %r", rank, exc)
    if collector.converter is not None:
        try:
            fr = folder / written["flight_recorder"] if written["flight_recorder"] else None
            parts = collector.converter.finish(fr)
            written["parquet"] = [str(p.relative_to(folder)) for p in parts]
        except Exception as exc:  # noqa: BLE001 - the JSON stays the source
            log.warning("rank %d: Parquet conversion failed (%r); ingest will parse the JSON", rank, exc)
    if collector.timeline is not None:
        path = folder / files.op_timeline_name(rank)
        collector.timeline.write_rank(path, {"ground_truth": dict(ground_truth or {})})
        written["op_timeline"] = path.name
    part = manifest.rank_part(run=collector.run, rank=rank, clock=clock, files=written,
                              exit_status=exit_status)
    try:
        cpu_file = files.cpu_sched_name(rank) if collector.cpu.write(folder / files.cpu_sched_name(rank), rank) else None
    except OSError as exc:  # the samples are a side show: never lose the run's manifest for them
        collector.cpu.unavailable, cpu_file = f"CPU wait samples not written: {exc}", None
    part["cpu_sched"] = collector.cpu.summary(cpu_file)
    manifest.write_json(folder / files.rank_manifest_name(rank), part)
    if rank == 0:
        dist = _dist()
        world = dist.get_world_size() if dist else int(os.environ.get("WORLD_SIZE", 1))
        run_part = manifest.run_part(
            run=collector.run, world_size=world, backend=dist.get_backend() if dist else None,
            layout=layout, ground_truth=ground_truth,
            rank_manifests=[files.rank_manifest_name(r) for r in range(world)])
        manifest.write_json(folder / files.RUN_MANIFEST, run_part)


@contextlib.contextmanager
def _light(out_dir, run, layout, ground_truth, store, coords) -> Iterator[Collector]:
    """``profile(op_timeline=True)``: the loop's own phases, no profiler, no FR dump."""
    rank, run, folder, clock = _start(out_dir, run)
    collector = Collector(run, folder, rank, timeline=OpTimeline(rank, **dict(coords or {})))
    with _recorded(collector, clock, layout, ground_truth, store):
        collector.cpu.sample(0)
        yield collector
