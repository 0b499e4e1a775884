"""Sequence-length imbalance: DDP training of the tiny transformer where every rank draws its own
sequence length each step, as with unpacked variable-length text.

Each step, rank r trains on `--batch` sequences of length L(r, step) = round(`--seq` x f(r) x
(1 + u)), u uniform in [-`--jitter`, +`--jitter`] (drawn from a generator seeded by the rank
and the step, so a re-run with the same flags draws the same lengths), f(r) = `--long-factor`
for `--long-rank` and 1 for the others. Attention costs O(L^2), so the longest rank of a step
makes the others wait in the gradient all-reduce. `--jitter 0` and no `--long-rank` is the clean
run (every rank the same length every step).

Ground truth: the lengths per rank and step (`seq_lens[step][rank]`), and the fault (the long
rank and its factor) in `faults`.
"""

from __future__ import annotations

import argparse
import random

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from traceanalyzer import collect
from traceanalyzer.workloads import common, models

DEFAULT_SEQ = 32
DEFAULT_BATCH = 8
LR = 0.01


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seq", type=int, default=DEFAULT_SEQ, help="mean sequence length")
    p.add_argument("--batch", type=int, default=DEFAULT_BATCH, help="sequences per rank and step")
    p.add_argument("--jitter", type=float, default=0.0,
                   help="each rank's length varies per step by up to this fraction of --seq (0: fixed)")
    p.add_argument("--long-rank", type=int, default=None, help="rank that draws longer sequences")
    p.add_argument("--long-factor", type=float, default=2.0, help="x the length on --long-rank")


def seq_len(args: argparse.Namespace, rank: int, step: int) -> int:
    u = random.Random(args.seed * 1_000_003 + rank * 7919 + step).uniform(-args.jitter, args.jitter)
    factor = args.long_factor if rank == args.long_rank else 1.0
    return max(1, round(args.seq * factor * (1.0 + u)))


def run(args: argparse.Namespace) -> None:
    rank, world, dev = common.init_distributed(args)
    common.check_rank_flags(args, world)
    if args.long_rank is not None and not 0 <= args.long_rank < world:
        raise SystemExit(f"--long-rank {args.long_rank}: not a rank of this {world}-rank job")
    if not 0 <= args.jitter < 1:
        raise SystemExit(f"--jitter {args.jitter}: must be in [0, 1)")
    model = common.straggler(models.TinyTransformer(), args, common.straggler_delay_s(args, rank)).to(dev)
    ddp = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    data = torch.Generator().manual_seed(args.seed + 1 + rank)
    lens = [[seq_len(args, r, s) for r in range(world)] for s in range(args.steps)]
    faults = common.injected_faults(args)
    if args.long_rank is not None and args.long_factor != 1.0:
        faults.append({"kind": "seqlen_imbalance", "rank": args.long_rank, "factor": args.long_factor})
    ground_truth = {"workload": "seqlen", "model": "transformer", "steps": args.steps, "batch": args.batch,
                    "seq": args.seq, "jitter": args.jitter, "long_rank": args.long_rank,
                    "long_factor": args.long_factor if args.long_rank is not None else 1.0,
                    "seq_lens": lens, "device": dev.type, **common.fault_ground_truth(args), "faults": faults}
    with collect.profile(**common.profile_kwargs(args), layout=common.layout(dp=world),
                         ground_truth=ground_truth) as prof:
        for step in range(args.steps):
            x, y = (t.to(dev) for t in models.batch("transformer", data, rows=args.batch, seq=lens[step][rank]))
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
            prof.step()
    dist.destroy_process_group()
