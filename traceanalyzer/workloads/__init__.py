"""Reference workloads: small real distributed training jobs with the collector on.

Run one per torchrun job, e.g.
    torchrun --nproc_per_node=2 -m traceanalyzer.workloads ddp --out traces --run-name ddp_gloo_2rank

Each workload is a module here with `add_args(parser)` and `run(args)`, listed in
WORKLOADS (subcommand -> module); it is imported only when chosen, so this
package imports without torch.
"""

WORKLOADS = {
    "ddp": "traceanalyzer.workloads.ddp",
    "fsdp": "traceanalyzer.workloads.fsdp",
    "pipeline": "traceanalyzer.workloads.pipeline",
    "moe": "traceanalyzer.workloads.moe",
    "desync": "traceanalyzer.workloads.desync",
    "collectives": "traceanalyzer.workloads.collectives",
    "seqlen": "traceanalyzer.workloads.seqlen",
}
