"""DDP data-parallel training on gloo (CPU), optionally with a straggler, imbalance or without overlap.

--imbalance-rank R --imbalance-factor F: rank R trains on F x the batch (mlp) or
F x the sequence length (transformer), so its compute, not its gradients, grows.
"""

from __future__ import annotations

import argparse
import contextlib

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from traceanalyzer import collect
from traceanalyzer.workloads import common, models

DEFAULT_BUCKET_MB = 1.0  # small, so the small models still split into several allreduces
LR = 0.01


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bucket-mb", type=float, default=DEFAULT_BUCKET_MB, help="DDP bucket_cap_mb")
    p.add_argument("--no-overlap", action="store_true",
                   help="allreduce grads after backward instead of during it")
    p.add_argument("--width", type=int, default=models.MLP_HIDDEN, help="mlp hidden size")
    p.add_argument("--depth", type=int, default=models.MLP_LAYERS, help="mlp hidden layers")
    p.add_argument("--op-timeline", action="store_true",
                   help="no profiler: the light collector's op timeline of the loop's phases "
                        "(OUT/RUN/rank{R}.op_timeline.parquet; DDP's overlapped all-reduce is inside backward-compute)")


def run(args: argparse.Namespace) -> None:
    rank, world, dev = common.init_distributed(args)
    common.check_rank_flags(args, world)
    work = common.imbalance_factor(args, rank)
    model = common.straggler(models.build(args.model, width=args.width, depth=args.depth), args,
                             common.straggler_delay_s(args, rank), annotate=args.annotate_delay).to(dev)
    ddp = DDP(model, bucket_cap_mb=args.bucket_mb,
              device_ids=[dev.index] if dev.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    data = torch.Generator().manual_seed(args.seed + 1 + rank)
    overlap = not args.no_overlap
    ground_truth = {"workload": "ddp", "model": args.model, "steps": args.steps,
                    "bucket_mb": args.bucket_mb, "overlap": overlap, "batch": models.BATCH,
                    "delay_annotation": common.DELAY_ANNOTATION if args.annotate_delay else None,
                    "width": args.width, "depth": args.depth, "device": dev.type,
                    **common.fault_ground_truth(args), "faults": common.injected_faults(args)}
    layout = common.layout(dp=world)
    light = {"op_timeline": True, "coords": {"dp": rank}} if args.op_timeline else {}
    with collect.profile(**common.profile_kwargs(args), layout=layout,
                         ground_truth=dict(ground_truth, **({"op_timeline": True} if light else {})), **light) as prof:
        phase = prof.op if args.op_timeline else (lambda name: contextlib.nullcontext())
        for _ in range(args.steps):
            with phase("data-load"):
                x, y = (t.to(dev) for t in models.skewed_batch(args.model, data, work))
            opt.zero_grad(set_to_none=True)
            # no_sync() keeps DDP from reducing during backward; we then reduce afterwards.
            with contextlib.nullcontext() if overlap else ddp.no_sync():
                with phase("forward-compute"):
                    loss = torch.nn.functional.cross_entropy(ddp(x), y)
                with phase("backward-compute"):
                    loss.backward()
            if not overlap:
                with phase("grads-all-reduce"):
                    allreduce_grads(list(ddp.parameters()), world, args.bucket_mb)
            with phase("optimizer"):
                opt.step()
            prof.step()
    dist.destroy_process_group()


def allreduce_grads(params: list[torch.nn.Parameter], world: int, bucket_mb: float) -> None:
    """Average grads in buckets of about `bucket_mb`, last layer first, as DDP would, but serially."""
    limit = bucket_mb * 2**20
    bucket, size = [], 0
    for p in reversed(params):
        bucket.append(p.grad)
        size += p.grad.numel() * p.grad.element_size()
        if size >= limit:
            _allreduce_bucket(bucket, world)
            bucket, size = [], 0
    if bucket:
        _allreduce_bucket(bucket, world)


def _allreduce_bucket(grads: list[torch.Tensor], world: int) -> None:
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
