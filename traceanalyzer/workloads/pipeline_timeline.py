"""``pipeline --op-timeline``: the pipeline (PP x DP) recorded by the light collector, no profiler.

The loop is written out here (GPipe order: every micro-batch's forward, then every backward in
reverse) with blocking gloo ``send``/``recv`` between neighbouring stages on the default group,
so each phase is one timed op of :class:`traceanalyzer.collect.op_timeline.OpTimeline`:
``data-load``, ``forward-recv``, ``forward-compute``, ``forward-send``, ``backward-recv``,
``backward-compute``, ``backward-send``, ``grads-all-reduce`` (one flat all_reduce per stage over
its DP group when ``--dp`` > 1) and ``optimizer``. A receive's time includes the wait for its
sender, as in Megatron's timers. ``--slow-rank R --slow-ms MS`` sleeps in every micro-batch
forward of rank R (:class:`common.Straggler`); the ground truth is in the Parquet file's metadata
(``ground_truth``) and in the run manifest. Recorded with ``collect.profile(op_timeline=True)``: every
rank writes its own ``OUT/RUN/rank{R}.op_timeline.parquet`` (+ the manifests), ingested together.
"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

from traceanalyzer import collect
from traceanalyzer.workloads import common, models


def run(args: argparse.Namespace, n_stages: int, pp_group, dp_group) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    pp, dp = world // args.dp, args.dp
    replica, stage = rank // pp, rank % pp
    first, last = stage == 0, stage == pp - 1
    torch.manual_seed(args.seed + stage)
    module = models.stage_module(args.model, stage, pp, args.layers_per_stage)
    delay = common.straggler_delay_s(args, rank)
    if args.slow_stage is not None and args.slow_stage == stage:
        delay = args.slow_ms / 1000.0
    model = common.straggler(module, args, delay)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(args.seed + 1 + replica)
    rows = args.microbatch_rows
    act_shape = (rows, models.MLP_HIDDEN) if args.model == "mlp" else (rows, models.TF_SEQ, models.TF_DIM)
    truth = {"workload": "pipeline", "op_timeline": True, "schedule": "gpipe (written out, blocking p2p)",
             "dp": dp, "pp": pp, "microbatches": args.microbatches, "microbatch_rows": rows,
             "steps": args.steps, "model": args.model, **common.fault_ground_truth(args),
             "slow_stage": args.slow_stage if args.slow_ms > 0 else None}
    with collect.profile(args.out, run=args.run, store=args.store, op_timeline=True, coords={"dp": replica, "pp": stage},
                         layout=common.layout(dp=dp, pp=pp), ground_truth=truth) as prof:
        _loop(args, prof, model, opt, data, act_shape, first, last, dp, dp_group)
    dist.destroy_process_group()


def _loop(args, prof, model, opt, data, act_shape, first, last, dp, dp_group) -> None:
    tl = prof.timeline
    rows = args.microbatch_rows
    rank = dist.get_rank()
    prev, nxt = rank - 1, rank + 1
    for step in range(args.steps):
        with tl.op("data-load", step):
            x, y = models.batch(args.model, data, rows=args.microbatches * rows)
            xs, ys = x.split(rows), y.split(rows)
        opt.zero_grad(set_to_none=True)
        inputs, outputs = [], []
        for mb in range(args.microbatches):
            if first:
                inp = xs[mb]
            else:
                inp = torch.empty(act_shape)
                with tl.op("forward-recv", step, mb):
                    dist.recv(inp, src=prev)
                inp.requires_grad_(True)
            with tl.op("forward-compute", step, mb):
                out = model(inp)
                if last:
                    out = torch.nn.functional.cross_entropy(out, ys[mb])
            if not last:
                with tl.op("forward-send", step, mb):
                    dist.send(out.detach(), dst=nxt)
            inputs.append(inp)
            outputs.append(out)
        for mb in reversed(range(args.microbatches)):
            grad = None
            if not last:
                grad = torch.empty(act_shape)
                with tl.op("backward-recv", step, mb):
                    dist.recv(grad, src=nxt)
            with tl.op("backward-compute", step, mb):
                outputs[mb].backward(grad)
            if not first:
                with tl.op("backward-send", step, mb):
                    dist.send(inputs[mb].grad, dst=prev)
        if dp > 1:
            with tl.op("grads-all-reduce", step):
                common.all_reduce_grads([list(model.parameters())], dp_group, dp)
        with tl.op("optimizer", step):
            opt.step()
        prof.step()
