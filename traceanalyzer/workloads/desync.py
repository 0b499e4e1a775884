"""Desync (hang): one rank skips a gradient all-reduce, the others time out in it; all dump the FR.

The classic cause of a distributed hang is a rank that does not call a collective its peers call
(a data-dependent branch, uneven data). Here rank --skip-rank skips the all-reduce of step
--skip-step and then stays away (sleeps past the timeout, as a stuck rank would); the other ranks
wait in that all-reduce until the process group's short timeout (--timeout-s) raises. Every rank
then writes its Flight Recorder dump (the collector writes it on error exits too) and its rank
manifest. The injected fault is expected, so the job exits 0; ``traceanalyzer desync`` must name
the skipped collective and the missing rank.

Self-contained: a plain data-parallel loop with one all-reduce of the flattened gradients per
step (no DDP, whose hooks would hide which collective is skipped), on gloo, one thread per rank.
"""
from __future__ import annotations

import argparse
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from traceanalyzer import collect
from traceanalyzer.collect import enable_flight_recorder
from traceanalyzer.workloads import common, models

LR = 0.01
#: The skipping rank stays away this long after the others' timeout (a stuck rank, not an exit).
GRACE_S = 3.0


class InjectedDesync(RuntimeError):
    """Raised by the skipping rank once its peers have timed out: it marks its exit as the fault."""


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--skip-rank", type=int, default=1, help="rank that skips a collective")
    p.add_argument("--skip-step", type=int, default=5,
                   help="step whose all-reduce it skips (default: after the profiling window)")
    p.add_argument("--timeout-s", type=float, default=5.0, help="process group timeout (short: the hang ends fast)")


def run(args: argparse.Namespace) -> None:
    enable_flight_recorder()  # before the process group
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    if not 0 <= args.skip_rank < world or not 0 <= args.skip_step < args.steps:
        raise ValueError(f"--skip-rank {args.skip_rank} / --skip-step {args.skip_step} outside {world} ranks / "
                         f"{args.steps} steps: the run would not desync")
    torch.manual_seed(args.seed)
    model = models.build(args.model)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    data = torch.Generator().manual_seed(args.seed + 1 + rank)
    ground_truth = {"workload": "desync", "model": args.model, "steps": args.steps, "fault": "skipped_collective",
                    "skip_rank": args.skip_rank, "skip_step": args.skip_step, "skipped_op": "all_reduce",
                    "process_group": "0", "timeout_s": args.timeout_s}
    try:
        with collect.profile(**common.profile_kwargs(args), layout={"dp": world, "tp": 1, "pp": 1},
                             ground_truth=ground_truth) as prof:
            for step in range(args.steps):
                x, y = models.batch(args.model, data)
                opt.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(model(x), y).backward()
                if rank == args.skip_rank and step == args.skip_step:
                    time.sleep(args.timeout_s + GRACE_S)  # away while the others wait in the all-reduce
                    raise InjectedDesync(f"rank {rank} skipped the all_reduce of step {step}")
                allreduce_grads(list(model.parameters()), world)
                opt.step()
                prof.step()
    except RuntimeError as exc:  # InjectedDesync, or gloo's "Timed out waiting ...ms for recv/send operation"
        if not isinstance(exc, InjectedDesync) and not _is_comm_failure(exc):
            raise
        print(f"rank {rank}: desync as injected: {str(exc).splitlines()[0][:200]}", file=sys.stderr)
        return  # no destroy_process_group: the group is broken, as in a real hang
    dist.destroy_process_group()
    raise SystemExit(f"rank {rank}: the run did not desync (skip rank {args.skip_rank}, step {args.skip_step})")


def _is_comm_failure(exc: BaseException) -> bool:
    """The peers' side of the injected hang: gloo times out (or sees the skipping rank go away)."""
    text = str(exc)
    return isinstance(exc, getattr(dist, "DistBackendError", ())) or "Timed out" in text or "Connection closed" in text


def allreduce_grads(params: list[torch.nn.Parameter], world: int) -> None:
    """One all-reduce of all gradients, averaged."""
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset:offset + p.grad.numel()].view_as(p.grad))
        offset += p.grad.numel()
