#!/usr/bin/env bash
# Record the GPU reference runs shipped in traces/ (the *_cuda_* folders); see traces/README.md.
#
# Usage, on a machine with one (or more) CUDA GPUs, from the repo root:
#     traces/record_gpu.sh OUTDIR [DEADLINE_S]
# Each run is a real torchrun job of `python -m traceanalyzer.workloads` with the collector on.
# With one GPU, NCCL refuses two ranks on it, so the multi-rank runs use gloo with CUDA tensors
# (ranks share the GPU; gloo stages each collective through host memory: kernels, memcpys and
# streams are real, the transfer is gloo's). The NCCL run has world size 1 (NCCL's own
# record_param_comms, FR with timing, the NCCL debug log; no transfer). A run is skipped once
# DEADLINE_S (default 300) seconds have passed, and each run gets at most RUN_TIMEOUT_S (120).
# ONLY="name ..." records just those runs; REPEATS=N then adds N interleaved re-runs of the clean and
# slow-rank DDP pair (names *_r1..*_rN) for the replay validation (benchmarks/replay_validate_gpu.py).
set -u
OUTD=${1:?usage: traces/record_gpu.sh OUTDIR [DEADLINE_S]}
DEADLINE_S=${2:-300}
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-120}
PY=${PYTHON:-python3}
mkdir -p "$OUTD"
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
START=$(date +%s)

run() {  # run NAME NPROC WORKLOAD ARGS...
    local name=$1 nproc=$2
    shift 2
    if [[ -n "${ONLY:-}" && $name != *_r[0-9]* && " $ONLY " != *" $name "* ]]; then return; fi
    if (( $(date +%s) - START > DEADLINE_S )); then echo "$name: skipped (deadline)"; return; fi
    local t0=$(date +%s)
    timeout -k 10 "$RUN_TIMEOUT_S" "$PY" -m torch.distributed.run --standalone --nproc_per_node="$nproc" \
        -m traceanalyzer.workloads "$@" --out "$OUTD" --run-name "$name" >"$OUTD/$name.log" 2>&1
    local rc=$?
    echo "$name: rc=$rc in $(( $(date +%s) - t0 )) s; files: $(ls "$OUTD/$name" 2>/dev/null | tr '\n' ' ')"
    if (( rc != 0 )); then tail -n 25 "$OUTD/$name.log"; fi
}

# DDP on an MLP of 7.4 M parameters (28 MB of fp32 grads, 4 MB buckets): 2 ranks, clean and slow rank 1
run ddp_gloo_cuda_2rank 2 ddp --device cuda --width 1024 --depth 8 --bucket-mb 4
run ddp_gloo_cuda_2rank_slow1 2 ddp --device cuda --width 1024 --depth 8 --bucket-mb 4 --slow-rank 1 --slow-ms 20
# NCCL, world size 1: NCCL's dialect (record_param_comms, kernels), FR with start/end times, debug log
mkdir -p "$OUTD/ddp_nccl_cuda_1rank"
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,COLL NCCL_DEBUG_FILE="$OUTD/ddp_nccl_cuda_1rank/nccl_debug.%h.%p.log" \
TORCH_NCCL_ENABLE_TIMING=1 \
    run ddp_nccl_cuda_1rank 1 ddp --backend nccl --device cuda --width 1024 --depth 8 --bucket-mb 4
# MoE all_to_all with skewed routing, FSDP2, 1F1B pipeline: best effort (gloo's CUDA support varies by op)
run moe_gloo_cuda_2rank_skew 2 moe --device cuda --skew 4 --ffn-mult 32 --tokens 256
run fsdp_gloo_cuda_2rank 2 fsdp --device cuda
run pp_1f1b_gloo_cuda_2rank 2 pipeline --device cuda --schedule 1f1b
run ddp_gloo_cuda_4rank 4 ddp --device cuda --width 1024 --depth 8 --bucket-mb 4
for i in $(seq 1 "${REPEATS:-0}"); do
    run ddp_gloo_cuda_2rank_r$i 2 ddp --device cuda --width 1024 --depth 8 --bucket-mb 4
    run ddp_gloo_cuda_2rank_slow1_r$i 2 ddp --device cuda --width 1024 --depth 8 --bucket-mb 4 --slow-rank 1 --slow-ms 20
done
echo "all runs: $(( $(date +%s) - START )) s"
