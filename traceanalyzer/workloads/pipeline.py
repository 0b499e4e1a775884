"""Pipeline-parallel training (torch.distributed.pipelining) on gloo: GPipe, 1F1B, Interleaved1F1B.

One pipeline over all ranks by default (pp = world size, no data parallelism). With
`--dp D` the world is D pipeline replicas of pp = world / D ranks each (PP x DP): replica
d is global ranks d*pp .. d*pp + pp - 1, runs its own pipeline over its own process group
(`dist.new_group`) and draws its own batches; after each step the gradients of every stage
are averaged across the replicas with one all_reduce per stage over that stage's DP group
(the ranks holding the same pipeline position in every replica).
Inside a pipeline, stage s runs on pipeline rank s % pp: one stage per rank for
gpipe/1f1b, `--stages-per-rank v` stages per rank (s, s + pp, ...) for interleaved1f1b,
as ScheduleInterleaved1F1B expects.
Activations and gradients move between neighbouring stages as gloo p2p: `c10d::send`
/ `c10d::recv_` enqueue ops on the caller thread with `gloo:send` / `gloo:recv` spans
on the same thread (record_shapes=True, the collector's default, keeps the tensor
shapes; the peer and tag are the ops' Concrete Inputs).

What each schedule emits into the trace in torch 2.13 (checked in recorded traces;
the source is torch/distributed/pipelining/schedules.py):
  * gpipe: `record_function` ranges "Forward {mb}" and "Backward {mb}" around each
    micro-batch's recv + compute + send (ScheduleGPipe._step_microbatches).
  * 1f1b: no schedule annotations at all (Schedule1F1B._step_microbatches uses none);
    micro-batches are visible only through the stage's own ops and the p2p.
  * interleaved1f1b: one range per schedule action, "PP:" + str(_Action):
    "PP:{stage}F{mb}" / "PP:{stage}B{mb}" for compute (the F/B range also holds the
    wait for that micro-batch's recv), "PP:{stage}SEND_F{mb}", "PP:{stage}RECV_F{mb}",
    "PP:{stage}SEND_B{mb}", "PP:{stage}RECV_B{mb}" for posting p2p, and once per
    stage and step "PP:{stage}UNSHARD", "PP:{stage}RESHARD" (no-ops without FSDP)
    and "PP:{stage}REDUCE_GRAD" (_PipelineScheduleRuntime._step_microbatches).
  Every schedule's first step also runs the stages' warm-up vote (blocking
  send/recv of one int32) and, without static shapes, a metadata exchange; both
  fall in the collector's `wait` step, outside the profiled window.

Where the waiting shows on gloo (torch 2.13, seen in these traces): an irecv blocks
inside its `c10d::recv_` op until the data is there, and the `gloo:recv` span only
starts after it (tens of us); a send's `gloo:send` span lasts until the peer has
taken the data, and `c10d::send` itself can block for ms when the pair is busy.
The Flight Recorder records no gloo p2p (only collectives), so p2p ops have no FR
sequence id; they are matched by (src, dst, tag) order instead.

Faults (ground truth in the manifest):
  --slow-stage S --slow-ms MS   stage S sleeps MS in every micro-batch forward (in every
                                replica)
  --slow-rank R --slow-ms MS    every stage on (global) rank R does so
  --imbalance-rank R --imbalance-factor F
                                the stages on rank R get F x --layers-per-stage
                                layers (an uneven partition of the model)
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)

from traceanalyzer import collect
from traceanalyzer.workloads import common, models

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B,
             "interleaved1f1b": ScheduleInterleaved1F1B}
#: Names of the schedule's own trace annotations (see the module docstring).
ANNOTATIONS = {"gpipe": "Forward {mb} / Backward {mb}", "1f1b": None,
               "interleaved1f1b": "PP:{stage}{action}{mb}"}
DEFAULT_SCHEDULE = "1f1b"
DEFAULT_MICROBATCHES = 4  # 1F1B needs at least as many micro-batches as stages
DEFAULT_MICROBATCH_ROWS = 8
DEFAULT_LAYERS_PER_STAGE = 1
LR = 0.01


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--schedule", choices=sorted(SCHEDULES), default=DEFAULT_SCHEDULE)
    p.add_argument("--microbatches", type=int, default=DEFAULT_MICROBATCHES)
    p.add_argument("--microbatch-rows", type=int, default=DEFAULT_MICROBATCH_ROWS,
                   help="rows (samples) per micro-batch; the step's batch is microbatches x this")
    p.add_argument("--stages-per-rank", type=int, default=1,
                   help="stages on each rank (more than 1 only for interleaved1f1b)")
    p.add_argument("--layers-per-stage", type=int, default=DEFAULT_LAYERS_PER_STAGE)
    p.add_argument("--slow-stage", type=int, default=None,
                   help="stage that sleeps --slow-ms in every micro-batch forward")
    p.add_argument("--dp", type=int, default=1,
                   help="pipeline replicas (data parallel); each runs a pipeline of world/dp ranks")
    p.add_argument("--op-timeline", action="store_true",
                   help="no profiler: the light collector's op timeline (OUT/RUN/rank{R}.op_timeline.parquet) of a "
                        "written-out GPipe loop (see pipeline_timeline.py)")


def stage_to_rank(n_stages: int, world: int) -> list[int]:
    """Rank of each stage: round robin, which is 1 stage per rank when n_stages == world
    and the looped placement ScheduleInterleaved1F1B computes otherwise."""
    return [s % world for s in range(n_stages)]


def _check(args: argparse.Namespace, world: int) -> int:
    common.check_rank_flags(args, world)
    if args.backend == "gloo" and args.device == "cuda":
        # seen with torch 2.11 on an H200: gloo's tcp pair fails in writev ("Bad address")
        raise SystemExit("pipeline --device cuda needs --backend nccl: gloo's point-to-point send/recv "
                         "cannot move CUDA tensors (only its collectives stage them through host memory)")
    if args.dp < 1 or world % args.dp or world // args.dp < 2:
        raise SystemExit(f"--dp {args.dp}: the {world} ranks must split into dp pipelines of "
                         "at least 2 ranks each")
    if args.stages_per_rank < 1 or (args.stages_per_rank > 1 and args.schedule != "interleaved1f1b"):
        raise SystemExit(f"--stages-per-rank {args.stages_per_rank}: only interleaved1f1b "
                         "runs more than one stage per rank")
    n_stages = world // args.dp * args.stages_per_rank
    if args.slow_stage is not None and not 0 <= args.slow_stage < n_stages:
        raise SystemExit(f"--slow-stage {args.slow_stage}: the pipeline has {n_stages} stages")
    return n_stages


def groups(world: int, dp: int) -> tuple[list[list[int]], list[list[int]]]:
    """(pipelines, dp_groups): the global ranks of each replica's pipeline (indexed by
    pipeline rank) and of each pipeline position's data-parallel group (indexed by replica)."""
    pp = world // dp
    pipelines = [list(range(d * pp, (d + 1) * pp)) for d in range(dp)]
    return pipelines, [[pipe[k] for pipe in pipelines] for k in range(pp)]


def _new_groups(world: int, dp: int, rank: int):
    """Create every pipeline and DP group (each rank must create all of them, in one order);
    returns this rank's (pipeline group, DP group), both None when dp == 1."""
    if dp == 1:
        return None, None
    pipelines, dp_groups = groups(world, dp)
    mine = [dist.new_group(g) for g in pipelines], [dist.new_group(g) for g in dp_groups]
    pp = world // dp
    return mine[0][rank // pp], mine[1][rank % pp]


def _faults(args: argparse.Namespace, n_stages: int, pp: int, dp: int, placement: list[int]) -> list[dict]:
    """The injected faults for the manifest, with where they are: a slow stage (on every replica's
    rank holding it), a slow worker (its global rank, replica and stages), an uneven partition.
    ``injected_ms``: the sleep per step on the slowed rank (per micro-batch forward x micro-batches
    x the rank's slowed stages)."""
    out = []
    if args.slow_ms > 0 and args.slow_stage is not None:
        ranks = [d * pp + placement[args.slow_stage] for d in range(dp)]
        out.append({"kind": "slow_stage", "stage": args.slow_stage, "ranks": ranks, "rank": ranks[0],
                    "sleep_ms": args.slow_ms, "injected_ms": args.slow_ms * args.microbatches})
    if args.slow_ms > 0 and args.slow_rank is not None:
        stages = [s for s in range(n_stages) if placement[s] == args.slow_rank % pp]
        out.append({"kind": "slow_worker" if dp > 1 else "slow_rank", "rank": args.slow_rank,
                    "worker": {"replica": args.slow_rank // pp, "pp_rank": args.slow_rank % pp},
                    "stages": stages, "sleep_ms": args.slow_ms,
                    "injected_ms": args.slow_ms * args.microbatches * len(stages)})
    if args.imbalance_rank is not None and args.imbalance_factor != 1.0:
        out.append({"kind": "imbalance", "rank": args.imbalance_rank, "factor": args.imbalance_factor,
                    "stages": [s for s in range(n_stages) if placement[s] == args.imbalance_rank % pp]})
    return out


def run(args: argparse.Namespace) -> None:
    rank, world, dev = common.init_distributed(args)
    n_stages = _check(args, world)
    pp, dp = world // args.dp, args.dp
    replica, pp_rank = rank // pp, rank % pp
    pp_group, dp_group = _new_groups(world, dp, rank)
    if args.op_timeline:
        if args.schedule != "gpipe" or args.stages_per_rank != 1:
            raise SystemExit("--op-timeline runs its own GPipe loop: use --schedule gpipe (one stage per rank)")
        from traceanalyzer.workloads import pipeline_timeline
        return pipeline_timeline.run(args, n_stages, pp_group, dp_group)
    placement = stage_to_rank(n_stages, pp)  # stage -> pipeline rank (global: + replica * pp)
    mine = [s for s in range(n_stages) if placement[s] == pp_rank]
    layers = {s: common.scaled(args.layers_per_stage,
                               common.imbalance_factor(args, replica * pp + placement[s]))
              for s in range(n_stages)}
    slow_s = args.slow_ms / 1000.0
    stages, params, stage_params = [], [], []
    for s in mine:
        torch.manual_seed(args.seed + s)  # a stage's weights don't depend on the placement
        module = models.stage_module(args.model, s, n_stages, layers[s])
        delay = slow_s if s == args.slow_stage or rank == args.slow_rank else 0.0
        module = common.straggler(module, args, delay).to(dev)  # sleeps once per micro-batch forward
        params += list(module.parameters())
        stage_params.append(list(module.parameters()))
        stages.append(PipelineStage(module, s, n_stages, dev, group=pp_group))
    schedule_cls = SCHEDULES[args.schedule]
    loss_fn = torch.nn.functional.cross_entropy
    schedule = (schedule_cls(stages, args.microbatches, loss_fn=loss_fn)
                if args.schedule == "interleaved1f1b"
                else schedule_cls(stages[0], args.microbatches, loss_fn=loss_fn))
    opt = torch.optim.SGD(params, lr=LR)
    # first and last stage of a replica draw the same batch; replicas draw different ones
    data = torch.Generator().manual_seed(args.seed + 1 + replica)
    has_first, has_last = 0 in mine, n_stages - 1 in mine

    ground_truth = {
        "workload": "pipeline", "dp": dp, "model": args.model, "device": dev.type, "steps": args.steps,
        "schedule": args.schedule, "schedule_class": schedule_cls.__name__,
        "schedule_annotations": ANNOTATIONS[args.schedule],
        "microbatches": args.microbatches, "microbatch_rows": args.microbatch_rows,
        "n_stages": n_stages, "stages_per_rank": args.stages_per_rank,
        "layers_per_stage": [layers[s] for s in range(n_stages)],  # stage -> rank: see layout
        **common.fault_ground_truth(args)}
    slow_stages = [s for s in range(n_stages) if args.slow_ms > 0
                   and (s == args.slow_stage or (args.slow_rank is not None
                                                 and args.slow_rank % pp == placement[s]))]
    ground_truth.update(slow_stage=args.slow_stage if args.slow_ms > 0 else None,
                        slow_stages=slow_stages, slow_ms=args.slow_ms if slow_stages else 0.0,
                        faults=_faults(args, n_stages, pp, dp, placement))
    # stage_to_rank: the pipeline rank of each stage (= the global rank when dp == 1);
    # rank_to_stages: indexed by global rank; pipelines / dp_groups: global ranks (dp > 1)
    extra = {}
    if dp > 1:
        pipelines, dp_groups = groups(world, dp)
        extra = {"pipelines": pipelines, "dp_groups": dp_groups}
    layout = common.layout(dp=dp, pp=pp, stages=n_stages, stage_to_rank=placement,
                           rank_to_stages=[[s for s in range(n_stages) if placement[s] == r % pp]
                                           for r in range(world)], **extra)
    with collect.profile(**common.profile_kwargs(args), layout=layout,
                         ground_truth=ground_truth) as prof:
        for _ in range(args.steps):
            x, y = (t.to(dev) for t in models.batch(args.model, data,
                                                    rows=args.microbatches * args.microbatch_rows))
            opt.zero_grad(set_to_none=True)
            losses: list[torch.Tensor] = []
            schedule.step(*([x] if has_first else []), target=y if has_last else None,
                          losses=losses if has_last else None)
            if dp > 1:
                common.all_reduce_grads(stage_params, dp_group, dp)
            opt.step()
            prof.step()
    dist.destroy_process_group()
