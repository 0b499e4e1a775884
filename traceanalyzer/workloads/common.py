"""What every workload shares: options, process-group setup, the straggler fault."""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist

from traceanalyzer.collect import enable_flight_recorder

BACKEND = "gloo"  # CPU-only reference runs
DEFAULT_STEPS = 6  # wait 1 + warmup 1 + active 3 + 1 spare: exactly one profiling window
MODELS = ("mlp", "transformer")


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
    p.add_argument("--slow-ms", type=float, default=0.0, help="sleep per forward on --slow-rank")
    # Profiler schedule (torch.profiler.schedule); repeat=1 keeps one window per run.
    p.add_argument("--prof-wait", type=int, default=1)
    p.add_argument("--prof-warmup", type=int, default=1)
    p.add_argument("--prof-active", type=int, default=3)
    p.add_argument("--prof-repeat", type=int, default=1)


def profile_kwargs(args: argparse.Namespace) -> dict:
    return {"out_dir": args.out, "run": args.run, "wait": args.prof_wait,
            "warmup": args.prof_warmup, "active": args.prof_active, "repeat": args.prof_repeat}


def init_distributed(seed: int) -> tuple[int, int]:
    """gloo process group on one thread per rank (2-core hosts run 4 ranks); returns (rank, world)."""
    enable_flight_recorder()  # must precede the first process group
    torch.set_num_threads(1)
    dist.init_process_group(BACKEND)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)  # same initial weights on every rank (DDP broadcasts anyway)
    return rank, world


def straggler_delay_s(args: argparse.Namespace, rank: int) -> float:
    return args.slow_ms / 1000.0 if args.slow_rank == rank else 0.0


def fault_ground_truth(args: argparse.Namespace) -> dict:
    return {"slow_rank": args.slow_rank if args.slow_ms > 0 else None,
            "slow_ms": args.slow_ms if args.slow_rank is not None else 0.0}


class Straggler(torch.nn.Module):
    """Wraps a model; sleeps in its forward, making this rank a real straggler.

    The sleep is deliberately not annotated in the trace: the analyzer must find
    the straggler from its effect on the collectives, as with a real one.
    """

    def __init__(self, model: torch.nn.Module, delay_s: float):
        super().__init__()
        self.model = model
        self.delay_s = delay_s

    def forward(self, x):
        if self.delay_s > 0:
            time.sleep(self.delay_s)
        return self.model(x)
