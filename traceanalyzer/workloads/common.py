"""What every workload shares: options, process-group setup, the injected faults, the layout."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch
import torch.distributed as dist

from traceanalyzer.collect import enable_flight_recorder
from traceanalyzer.workloads import neighbour

BACKENDS = ("gloo", "nccl")
DEVICES = ("cpu", "cuda")
DEFAULT_STEPS = 6  # wait 1 + warmup 1 + active 3 + 1 spare: exactly one profiling window
MODELS = ("mlp", "transformer")
DEFAULT_IMBALANCE_FACTOR = 2.0
DELAY_ANNOTATION = "slow_rank_delay"  # the user annotation of the sleep with --annotate-delay


def add_common_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="output folder; the run goes to OUT/RUN")
    # torchrun's own parser rejects "--run" (ambiguous prefix of its --run-path) even
    # after the script name, so "--run-name" is the spelling that works under torchrun.
    p.add_argument("--run-name", "--run", dest="run", default=None,
                   help="run name (default: torchrun's run id)")
    p.add_argument("--model", choices=MODELS, default="mlp")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slow-rank", type=int, default=None, help="rank to slow down (straggler)")
    p.add_argument("--slow-ms", type=float, default=0.0,
                   help="sleep per forward on --slow-rank (pipeline: per micro-batch forward)")
    p.add_argument("--slow-spin", action="store_true",
                   help="--slow-ms busy-waits on the training thread instead of sleeping: the rank's own untraced "
                        "code (Python-side preprocessing, logging), which keeps its core busy (a sleep hands it away)")
    p.add_argument("--annotate-delay", action="store_true",
                   help=f"ddp: wrap the --slow-ms sleep in record_function({DELAY_ANNOTATION!r}), as a user "
                        "would name a region (default: the sleep is not annotated)")
    p.add_argument("--noisy-rank", type=int, default=None,
                   help="rank whose CPU core is shared with a busy process (a noisy neighbour: a slow host)")
    p.add_argument("--noisy-pct", type=neighbour.pct_arg, default=50.0,
                   help="how busy the --noisy-rank neighbour keeps the core, %% of the time")
    p.add_argument("--imbalance-rank", type=int, default=None,
                   help="rank given more work than the others (what 'more' is depends on the workload)")
    p.add_argument("--imbalance-factor", type=float, default=DEFAULT_IMBALANCE_FACTOR,
                   help="how much more work --imbalance-rank does (x the others')")
    # Profiler schedule (torch.profiler.schedule); repeat=1 keeps one window per run.
    p.add_argument("--prof-wait", type=int, default=1)
    p.add_argument("--prof-warmup", type=int, default=1)
    p.add_argument("--prof-active", type=int, default=3)
    p.add_argument("--prof-repeat", type=int, default=1)
    p.add_argument("--no-record-shapes", dest="record_shapes", action="store_false",
                   help="record without the profiler's record_shapes (message sizes then stay unknown)")
    p.add_argument("--store", default=None, help="also ingest the run into this store at the end (rank 0)")
    p.add_argument("--no-parquet", dest="parquet", action="store_false",
                   help="do not convert each window to Parquet parts on its rank (ingest then parses the JSON)")
    p.add_argument("--no-keep-json", dest="keep_json", action="store_false",
                   help="delete each window's JSON once its Parquet parts are written")
    p.add_argument("--no-pin", dest="pin", action="store_false",
                   help="do not pin each rank (and its gloo threads) to one CPU core")
    p.add_argument("--backend", choices=BACKENDS, default="gloo",
                   help="process-group backend (default gloo; nccl needs one GPU per rank)")
    p.add_argument("--device", choices=DEVICES, default=None,
                   help="where the model and data live (default: cuda with nccl, else cpu); "
                        "with gloo, cuda ranks may share one GPU (gloo stages CUDA tensors through host memory)")


def profile_kwargs(args: argparse.Namespace) -> dict:
    return {"out_dir": args.out, "run": args.run, "wait": args.prof_wait,
            "warmup": args.prof_warmup, "active": args.prof_active, "repeat": args.prof_repeat,
            "store": args.store, "record_shapes": args.record_shapes, "parquet": args.parquet,
            "keep_json": args.keep_json}


def pin_to_core() -> None:
    """Pin this rank (and the threads it creates: gloo's runloops) to core LOCAL_RANK mod cores.

    Unpinned, 2-4 ranks and their gloo threads on a 2-core host are scheduled unevenly: one rank
    keeps losing its core to another rank's communication threads and looks like a straggler in a
    clean run. Pinned, every rank sees the same share of a core, as real jobs pin ranks to cores.
    """
    cores = sorted(os.sched_getaffinity(0))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    os.sched_setaffinity(0, {cores[local_rank % len(cores)]})


def device_of(args: argparse.Namespace) -> torch.device:
    """This rank's device: ``cpu``, or ``cuda:(LOCAL_RANK mod GPUs)`` (ranks share GPUs round robin)."""
    kind = args.device or ("cuda" if args.backend == "nccl" else "cpu")
    if kind == "cpu":
        if args.backend == "nccl":
            raise SystemExit("--backend nccl needs --device cuda (NCCL moves GPU tensors only)")
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit(f"--device cuda: no CUDA device is visible to this process (torch {torch.__version__})")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    gpus = torch.cuda.device_count()
    if args.backend == "nccl" and local_world > gpus:
        raise SystemExit(f"--backend nccl: {local_world} ranks on this host but {gpus} GPU(s); NCCL refuses "
                         "two ranks on one GPU: use --backend gloo --device cuda to share a GPU")
    return torch.device("cuda", local_rank % gpus)


def init_distributed(args: argparse.Namespace) -> tuple[int, int, torch.device]:
    """The process group (``--backend``: gloo, or NCCL) with one intra-op thread per rank (2-core
    hosts run 4 ranks); returns (rank, world, this rank's device). The rank's CUDA device (if any)
    is made current first, so NCCL and the profiler see the right GPU."""
    seed, pin, backend = args.seed, args.pin, args.backend
    device = device_of(args)
    if pin and hasattr(os, "sched_setaffinity"):
        pin_to_core()
    enable_flight_recorder()  # must precede the first process group
    torch.set_num_threads(1)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if getattr(args, "noisy_rank", None) == rank:
        neighbour.start(args.noisy_pct)
    torch.manual_seed(seed)  # same initial weights on every rank (DDP broadcasts anyway)
    return rank, world, device


def check_rank_flags(args: argparse.Namespace, world: int) -> None:
    """A fault aimed at a rank that does not exist would silently give a clean run."""
    for flag in ("slow_rank", "imbalance_rank", "noisy_rank"):
        value = getattr(args, flag, None)
        if value is not None and not 0 <= value < world:
            raise SystemExit(f"--{flag.replace('_', '-')} {value}: not a rank of this "
                             f"{world}-rank job")
    if args.imbalance_factor <= 0:
        raise SystemExit(f"--imbalance-factor must be > 0, got {args.imbalance_factor}")


def straggler_delay_s(args: argparse.Namespace, rank: int) -> float:
    return args.slow_ms / 1000.0 if args.slow_rank == rank else 0.0


def straggler(model: torch.nn.Module, args: argparse.Namespace, delay_s: float, annotate: bool = False) -> "Straggler":
    """``model`` wrapped to wait ``delay_s`` per forward, as ``--slow-spin`` says (busy or asleep)."""
    return Straggler(model, delay_s, annotate=annotate, spin=args.slow_spin)


def imbalance_factor(args: argparse.Namespace, rank: int) -> float:
    """How much work this rank does relative to the others (1.0 unless it is --imbalance-rank)."""
    return args.imbalance_factor if args.imbalance_rank == rank else 1.0


def scaled(n: int, factor: float) -> int:
    """`n` work units scaled by `factor`, at least 1."""
    return max(1, round(n * factor))


def fault_ground_truth(args: argparse.Namespace) -> dict:
    imbalanced = args.imbalance_rank is not None and args.imbalance_factor != 1.0
    return {"slow_rank": args.slow_rank if args.slow_ms > 0 else None,
            "slow_ms": args.slow_ms if args.slow_rank is not None else 0.0,
            "imbalance_rank": args.imbalance_rank if imbalanced else None,
            "imbalance_factor": args.imbalance_factor if imbalanced else 1.0,
            "slow_spin": args.slow_spin}


def injected_faults(args: argparse.Namespace, *, per_forward: int = 1) -> list[dict]:
    """The faults this run injected, one dict each, for the manifest's ``ground_truth["faults"]``:
    ``kind`` (slow_rank, imbalance, slow_host), the ``rank``, and how much: ``injected_ms`` (sleep per
    step: the per-forward sleep x ``per_forward`` forwards per step), ``factor`` (x the others' work) or
    ``busy_pct`` (of the rank's core, taken by a noisy neighbour).
    Workloads add their own (a pipeline's slow stage or worker, MoE routing skew, sequence lengths)."""
    gt = fault_ground_truth(args)
    out = []
    if gt["slow_rank"] is not None:
        out.append({"kind": "slow_rank", "rank": gt["slow_rank"], "sleep_ms": gt["slow_ms"],
                    "injected_ms": gt["slow_ms"] * per_forward})
    if gt["imbalance_rank"] is not None:
        out.append({"kind": "imbalance", "rank": gt["imbalance_rank"], "factor": gt["imbalance_factor"]})
    if getattr(args, "noisy_rank", None) is not None:
        out.append({"kind": "slow_host", "rank": args.noisy_rank, "busy_pct": args.noisy_pct})
    return out


def layout(*, dp: int = 1, tp: int = 1, pp: int = 1, ep: int = 1, cp: int = 1,
           **placement: Any) -> dict[str, Any]:
    """The declared parallel layout for the manifest: every degree, plus where things live
    (e.g. pipeline stages, experts) as lists indexed by stage/expert or by rank, JSON-safe."""
    return {"dp": dp, "tp": tp, "pp": pp, "ep": ep, "cp": cp, **placement}


class Straggler(torch.nn.Module):
    """Wraps a model; sleeps (or, with ``spin``, busy-waits) in its forward, making this rank a real
    straggler.

    By default the sleep is deliberately not annotated in the trace: the analyzer must
    find the straggler from its effect on the collectives, as with a real one. With
    ``annotate=True`` (``--annotate-delay``) it runs inside a user annotation named
    DELAY_ANNOTATION, as a user's ``record_function`` region would.
    """

    def __init__(self, model: torch.nn.Module, delay_s: float, annotate: bool = False, spin: bool = False):
        super().__init__()
        self.model = model
        self.delay_s = delay_s
        self.annotate = annotate
        self.spin = spin

    def _wait(self) -> None:
        if not self.spin:
            time.sleep(self.delay_s)
            return
        end = time.perf_counter() + self.delay_s
        while time.perf_counter() < end:
            pass

    def forward(self, *inputs):
        if self.delay_s > 0:
            if self.annotate:
                with torch.profiler.record_function(DELAY_ANNOTATION):
                    self._wait()
            else:
                self._wait()
        return self.model(*inputs)


def all_reduce_grads(stage_params: list[list[torch.nn.Parameter]], group, dp: int) -> None:
    """Average each group of parameters' gradients (a pipeline stage's) over the DP ``group``: one flat
    all_reduce per group, as the PP x DP workloads do after the pipeline step."""
    for params in stage_params:
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            continue
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=group)
        flat /= dp
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
