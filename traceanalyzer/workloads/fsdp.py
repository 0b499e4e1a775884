"""FSDP2 (fully_shard) data-parallel training on gloo (CPU), optionally with a straggler or imbalance.

Each hidden layer (mlp: Linear, transformer: encoder layer) is its own FSDP unit,
plus the root for what is left, so a step is a chain of per-unit all-gathers in
forward (and again in backward when resharding after forward) and per-unit
reduce-scatters of the gradients. On gloo (torch 2.13), FSDP2 issues them as
`c10d::_allgather_base_` / `gloo:all_gather` and `c10d::_reduce_scatter_base_`
(executed as a `gloo:all_reduce` span on the group's runloop thread), inside its own
ranges "FSDP::all_gather (model.N)", "FSDP::pre_forward (model.N)",
"FSDP::post_backward_reduce (model.N)", ... (model.N: the unit's module path).

--imbalance-rank R --imbalance-factor F: rank R trains on F x the batch (mlp) or
F x the sequence length (transformer).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from traceanalyzer import collect
from traceanalyzer.workloads import common, models

LR = 0.01


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-reshard", action="store_true",
                   help="keep parameters gathered after forward (no re-gather in backward)")


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The submodules that become FSDP units of their own (the root takes what is left)."""
    if isinstance(model, models.TinyTransformer):
        return list(model.encoder.layers)
    return [m for m in model.modules() if isinstance(m, nn.Linear)]


def run(args: argparse.Namespace) -> None:
    rank, world, dev = common.init_distributed(args)
    common.check_rank_flags(args, world)
    mesh = init_device_mesh(dev.type, (world,))
    reshard = not args.no_reshard
    inner = models.build(args.model).to(dev)
    units = shard_units(inner)
    model = common.straggler(inner, args, common.straggler_delay_s(args, rank))
    for unit in units:
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    data = torch.Generator().manual_seed(args.seed + 1 + rank)
    work = common.imbalance_factor(args, rank)
    ground_truth = {"workload": "fsdp", "fsdp_version": 2, "model": args.model, "steps": args.steps,
                    "batch": models.BATCH, "reshard_after_forward": reshard, "device": dev.type,
                    "shard_units": len(units) + 1, **common.fault_ground_truth(args),
                    "faults": common.injected_faults(args)}
    layout = common.layout(dp=world, dp_shard=world)
    with collect.profile(**common.profile_kwargs(args), layout=layout,
                         ground_truth=ground_truth) as prof:
        for _ in range(args.steps):
            x, y = (t.to(dev) for t in models.skewed_batch(args.model, data, work))
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            prof.step()
    dist.destroy_process_group()
