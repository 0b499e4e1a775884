"""MoE expert-parallel training on gloo: top-1 routing, all_to_all_single dispatch/combine.

One expert per rank (ep = world size); the dense part (embedding, router, head) is
replicated and data-parallel (dp = world size). Each step, per MoE layer:
  1. every rank routes its tokens (noisy top-1 gating: the argmax of a learned
     router's logits plus Gumbel noise, i.e. a sample from the router's softmax)
     and exchanges the per-expert token counts (an all_to_all_single of `world`
     int64s, even splits);
  2. dispatch: all_to_all_single of the tokens, input split sizes = tokens this rank
     sends to each expert, output split sizes = tokens each rank sends to this one;
  3. the local expert (an FFN) runs on what arrived;
  4. combine: all_to_all_single back with the splits swapped.
Dispatch and combine are autograd-aware (torch.distributed.nn.functional), so
backward runs two more all_to_alls, with the splits swapped again. After backward,
the dense gradients are averaged with one flat all_reduce (the expert's are local).
On gloo (torch 2.13) the trace shows them as `c10d::alltoall_base_` enqueues (args:
`Input Dims`[0] is the OUTPUT tensor, [1] the input; `Concrete Inputs`[3] the output and
[4] the input split sizes, in rows, "[]" when even) executed as `gloo:all_to_all` spans
on the runloop thread (whose `Input Dims` hold the input tensor only), and
`c10d::allreduce_` / `gloo:all_reduce`.

Faults (ground truth in the manifest):
  --skew X [--skew-rank H]  the router prefers expert H (default: the last rank) by
                            adding log(X) to its logit; the router starts near uniform,
                            so rank H receives about X/(X + world - 1) of all tokens
                            instead of 1/world, and (routing being sampled) the
                            all_to_all split sizes differ per rank pair
  --imbalance-rank R --imbalance-factor F   rank R routes F x the tokens
  --slow-rank R --slow-ms MS                rank R sleeps MS per forward
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
from torch import nn

from traceanalyzer import collect
from traceanalyzer.workloads import common, models

TOKENS = 64  # per rank per step, before --imbalance-factor
DIM = 64
FFN_MULT = 4
MOE_LAYERS = 1
DEFAULT_SKEW = 1.0  # 1 = the router's own (unbiased) preference
LR = 0.01


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--skew", type=float, default=DEFAULT_SKEW,
                   help="expert --skew-rank gets about X times the tokens of any other expert")
    p.add_argument("--skew-rank", type=int, default=None,
                   help="rank whose expert the router prefers (default: the last rank)")
    p.add_argument("--tokens", type=int, default=TOKENS, help="tokens per rank per step")
    p.add_argument("--moe-layers", type=int, default=MOE_LAYERS)
    p.add_argument("--ffn-mult", type=int, default=FFN_MULT,
                   help="expert FFN hidden size = this x the model dim: how heavy the experts are "
                        "next to the dense part (a heavy expert makes routing skew cost time)")


class Expert(nn.Module):
    def __init__(self, ffn_mult: int = FFN_MULT):
        super().__init__()
        self.ffn = nn.Sequential(nn.Linear(DIM, ffn_mult * DIM), nn.ReLU(), nn.Linear(ffn_mult * DIM, DIM))

    def forward(self, x):
        return self.ffn(x)


class MoELayer(nn.Module):
    """Router (replicated) + this rank's expert; tokens travel to their expert's rank and back."""

    def __init__(self, world: int, bias: torch.Tensor, noise: torch.Generator, ffn_mult: int = FFN_MULT):
        super().__init__()
        self.world = world
        self.router = nn.Linear(DIM, world)
        self.register_buffer("bias", bias)  # the injected skew, fixed (not learned)
        self.expert = Expert(ffn_mult)
        self.noise = noise

    def forward(self, x):
        logits = self.router(x) + self.bias
        u = torch.rand(logits.shape, generator=self.noise).clamp_(min=1e-9).to(logits.device)
        dest = (logits.detach() - torch.log(-torch.log(u))).argmax(dim=-1)  # Gumbel-max sample
        gate = torch.softmax(logits, dim=-1).gather(1, dest.unsqueeze(1)).squeeze(1)
        order = torch.argsort(dest, stable=True)
        send_counts = torch.bincount(dest, minlength=self.world)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts)  # how many tokens each rank sends here
        in_splits, out_splits = send_counts.tolist(), recv_counts.tolist()
        received = x.new_empty(sum(out_splits), x.shape[1])
        received = dist_fn.all_to_all_single(received, x[order], out_splits, in_splits)
        y = self.expert(received)
        back = x.new_empty(x.shape[0], y.shape[1])
        back = dist_fn.all_to_all_single(back, y, in_splits, out_splits)
        out = torch.empty_like(back).index_copy(0, order, back)  # undo the sort
        return x + gate.unsqueeze(1) * out


class MoEModel(nn.Module):
    def __init__(self, world: int, bias: torch.Tensor, layers: int, noise: torch.Generator,
                 ffn_mult: int = FFN_MULT):
        super().__init__()
        self.embed = nn.Linear(models.MLP_IN, DIM)
        self.moe = nn.ModuleList(MoELayer(world, bias, noise, ffn_mult) for _ in range(layers))
        self.head = nn.Linear(DIM, models.CLASSES)

    def forward(self, x):
        h = self.embed(x)
        for layer in self.moe:
            h = layer(h)
        return self.head(h)

    def dense_parameters(self) -> list[nn.Parameter]:
        """Replicated parameters (all but the experts'): their grads are all-reduced."""
        expert = {id(p) for layer in self.moe for p in layer.expert.parameters()}
        return [p for p in self.parameters() if id(p) not in expert]


def router_bias(world: int, skew: float, hot: int) -> torch.Tensor:
    """log(skew) on the hot expert's logit: multiplies its softmax weight by `skew`."""
    bias = torch.zeros(world)
    bias[hot] = math.log(skew)
    return bias


def expected_share(world: int, skew: float) -> float:
    """Share of all tokens the hot expert gets if the router were otherwise uniform
    (it nearly is: small random init, a few SGD steps)."""
    return skew / (skew + world - 1)


def allreduce_mean(params: list[nn.Parameter], world: int) -> None:
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
        offset += p.numel()


def run(args: argparse.Namespace) -> None:
    rank, world, dev = common.init_distributed(args)
    common.check_rank_flags(args, world)
    hot = world - 1 if args.skew_rank is None else args.skew_rank
    if not 0 <= hot < world or args.skew <= 0:
        raise SystemExit(f"--skew {args.skew} --skew-rank {hot}: need skew > 0 and a rank < {world}")
    torch.manual_seed(args.seed)  # same dense weights everywhere; experts differ below
    noise = torch.Generator().manual_seed(args.seed + 200 + rank)  # routing differs per rank
    model = MoEModel(world, router_bias(world, args.skew, hot), args.moe_layers, noise, args.ffn_mult)
    with torch.no_grad():  # each rank's expert is a different expert
        gen = torch.Generator().manual_seed(args.seed + 100 + rank)
        for layer in model.moe:
            for p in layer.expert.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
    model.to(dev)
    net = common.straggler(model, args, common.straggler_delay_s(args, rank))
    dense = model.dense_parameters()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    data = torch.Generator().manual_seed(args.seed + 1 + rank)
    tokens = common.scaled(args.tokens, common.imbalance_factor(args, rank))
    skewed = args.skew != 1.0
    ground_truth = {"workload": "moe", "steps": args.steps, "tokens_per_rank": args.tokens,
                    "dim": DIM, "ffn_mult": args.ffn_mult, "moe_layers": args.moe_layers, "experts": world, "top_k": 1, "device": dev.type,
                    "skew": args.skew, "skew_rank": hot if skewed else None,
                    "expected_hot_share": expected_share(world, args.skew),
                    "all_to_alls_per_step": 5 * args.moe_layers,  # counts + 2 fwd + 2 bwd
                    **common.fault_ground_truth(args)}
    ground_truth["faults"] = common.injected_faults(args) + (
        [{"kind": "routing_skew", "rank": hot, "factor": args.skew}] if skewed else [])
    layout = common.layout(dp=world, ep=world, expert_to_rank=list(range(world)))
    with collect.profile(**common.profile_kwargs(args), layout=layout,
                         ground_truth=ground_truth) as prof:
        for _ in range(args.steps):
            x, y = (t.to(dev) for t in models.batch("mlp", data, rows=tokens))
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(net(x), y)
            loss.backward()
            allreduce_mean(dense, world)
            opt.step()
            prof.step()
    dist.destroy_process_group()
