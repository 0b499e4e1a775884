"""Every c10d collective once per step (and a subgroup's, and a send/recv pair): a matching corpus.

Not training: each step calls, in this order, all_reduce, broadcast, all_gather (list),
all_gather_into_tensor, gather, scatter, reduce, reduce_scatter (list, when the backend has it),
reduce_scatter_tensor, all_to_all_single, all_to_all (list), barrier, broadcast_object_list,
a send/recv ring, then an all_reduce and a broadcast on a subgroup (a second process group over
--subgroup-ranks, default all ranks: its own runloop threads on gloo). Each op has its own
message size (``--numel`` x its position), so a wrong pairing of enqueue and execution shows as
a wrong size. The Flight Recorder dump of each rank is the ground truth of every (op, group, seq):
ship the traces without it to test matching from the trace alone.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

from traceanalyzer import collect
from traceanalyzer.workloads import common

#: The ops each step calls, in order (what the ground truth lists; "subgroup:" = on the subgroup).
OPS = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "gather", "scatter", "reduce",
       "reduce_scatter", "reduce_scatter_tensor", "all_to_all_single", "all_to_all", "barrier",
       "broadcast_object_list", "send_recv", "subgroup:all_reduce", "subgroup:broadcast")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--numel", type=int, default=64, help="elements of the smallest message (op k sends k x this)")
    p.add_argument("--subgroup-ranks", default=None,
                   help="comma-separated global ranks of the subgroup (default: all ranks)")


def run(args: argparse.Namespace) -> None:
    rank, world, dev = common.init_distributed(args)
    sub_ranks = ([int(r) for r in args.subgroup_ranks.split(",")] if args.subgroup_ranks
                 else list(range(world)))
    subgroup = dist.new_group(sub_ranks)
    ops = [op for op in OPS if op != "reduce_scatter" or _has_list_reduce_scatter(world, dev)]
    ground_truth = {"workload": "collectives", "steps": args.steps, "ops_per_step": list(ops),
                    "subgroup_ranks": sub_ranks, "numel": args.numel, "record_shapes": args.record_shapes,
                    "slow_rank": None, "slow_ms": 0.0}
    with collect.profile(**common.profile_kwargs(args), layout=common.layout(dp=world),
                         ground_truth=ground_truth) as prof:
        for step in range(args.steps):
            for k, op in enumerate(ops, start=1):
                _call(op, args.numel * k * world, rank, world, dev, subgroup, sub_ranks, step)
            prof.step()
    dist.destroy_process_group()


def _has_list_reduce_scatter(world: int, dev: torch.device) -> bool:
    """gloo has no list reduce_scatter in some torch versions: probe it once (every rank)."""
    try:
        out = torch.zeros(1, device=dev)
        dist.reduce_scatter(out, [torch.ones(1, device=dev) for _ in range(world)])
        return True
    except (RuntimeError, NotImplementedError):
        return False


def _call(op: str, n: int, rank: int, world: int, dev: torch.device, subgroup, sub_ranks: list[int],
          step: int) -> None:
    """One call of `op` with messages of about `n` elements (a multiple of the world size)."""
    t = torch.full((n,), float(rank + 1), device=dev)
    chunk = n // world
    if op == "all_reduce":
        dist.all_reduce(t)
    elif op == "broadcast":
        dist.broadcast(t, src=0)
    elif op == "all_gather":
        dist.all_gather([torch.empty(chunk, device=dev) for _ in range(world)], t[:chunk].clone())
    elif op == "all_gather_into_tensor":
        dist.all_gather_into_tensor(torch.empty(n, device=dev), t[:chunk].clone())
    elif op == "gather":
        dist.gather(t[:chunk].clone(), [torch.empty(chunk, device=dev) for _ in range(world)] if rank == 0 else None,
                    dst=0)
    elif op == "scatter":
        out = torch.empty(chunk, device=dev)
        dist.scatter(out, list(t.chunk(world)) if rank == 0 else None, src=0)
    elif op == "reduce":
        dist.reduce(t, dst=0)
    elif op == "reduce_scatter":
        dist.reduce_scatter(torch.empty(chunk, device=dev), list(t.chunk(world)))
    elif op == "reduce_scatter_tensor":
        dist.reduce_scatter_tensor(torch.empty(chunk, device=dev), t)
    elif op == "all_to_all_single":
        dist.all_to_all_single(torch.empty(n, device=dev), t)
    elif op == "all_to_all":
        dist.all_to_all([torch.empty(chunk, device=dev) for _ in range(world)], list(t.chunk(world)))
    elif op == "barrier":
        dist.barrier()
    elif op == "broadcast_object_list":
        box = [{"step": step, "payload": list(range(n // 8))}] if rank == 0 else [None]
        dist.broadcast_object_list(box, src=0)
    elif op == "send_recv":
        if world > 1:
            nxt, prv = (rank + 1) % world, (rank - 1) % world
            out = torch.empty(chunk, device=dev)
            if rank % 2 == 0:
                dist.send(t[:chunk].clone(), dst=nxt)
                dist.recv(out, src=prv)
            else:
                dist.recv(out, src=prv)
                dist.send(t[:chunk].clone(), dst=nxt)
    elif op.startswith("subgroup:"):
        if rank in sub_ranks:
            if op == "subgroup:all_reduce":
                dist.all_reduce(t, group=subgroup)
            else:
                dist.broadcast(t, src=sub_ranks[0], group=subgroup)
    else:
        raise ValueError(f"unknown op {op!r}")
