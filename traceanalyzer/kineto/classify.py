"""Name and category rules that turn Kineto's raw categories into our event ``kind``.

Kept in one place because every generation of the profiler spells things differently
(``Kernel`` vs ``kernel``, ``ncclKernel_*`` vs ``ncclDevKernel_*``, ROCm's ``hip*`` calls).
"""
from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: Kineto categories of events that run on a device (lower-cased).
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "memcpy", "memset",
            "gpu_instant_event", "mtia_ccp_events")

#: Communication kernels: NCCL/RCCL before and after the 2.19 rename, and the non-NCCL
#: all-reduce kernels of torch symmetric memory and vLLM's custom all-reduce.
COMM_KERNEL_RE = (r"^nccl(Dev)?Kernel|^ncclKernel|^rccl|(^|[^a-z])nccl[A-Z_]|multimem_all_reduce|"
                  r"one_shot_all_reduce|two_shot_all_reduce|multimem_all_gather|cross_device_reduce|"
                  r"symm_mem|all_reduce_kernel|allreduce_kernel")

#: CPU-side communication: the c10d enqueue ops, record_param_comms, backend annotations,
#: symmetric-memory ops.
COMM_OP_RE = r"^(c10d::|c10d_functional::|_c10d_functional::|record_param_comms$|nccl:|gloo:|ucc:|mpi:|symm_mem::)"

#: Runtime calls that block the host on the device.
SYNC_RE = r"(cuda|hip)(Device|Stream|Event)Synchronize|(cuda|hip)StreamWaitEvent|(cuda|hip)StreamQuery"

STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")


def classify(cat: pa.Array, name: pa.Array, ph: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Return (kind, is_gpu) for arrays of category, name and phase."""
    cat_l = pc.utf8_lower(pc.fill_null(cat, ""))
    name = pc.fill_null(name, "")
    is_gpu = pc.is_in(cat_l, pa.array(GPU_CATS)).to_numpy(zero_copy_only=False)
    n = len(cat)
    kind = np.full(n, "other", dtype=object)

    def where(mask):
        return np.asarray(mask.to_numpy(zero_copy_only=False), dtype=bool)

    is_kernel = where(pc.equal(cat_l, "kernel"))
    comm_name = where(pc.match_substring_regex(name, COMM_KERNEL_RE))
    kind[is_kernel] = "compute_kernel"
    kind[is_kernel & comm_name] = "comm_kernel"
    kind[where(pc.is_in(cat_l, pa.array(["gpu_memcpy", "memcpy"])))] = "memcpy"
    kind[where(pc.is_in(cat_l, pa.array(["gpu_memset", "memset"])))] = "memset"
    kind[where(pc.equal(cat_l, "gpu_user_annotation"))] = "gpu_annotation"
    runtime = where(pc.is_in(cat_l, pa.array(["cuda_runtime", "cuda_driver", "runtime", "driver"])))
    sync = where(pc.match_substring_regex(name, SYNC_RE))
    kind[runtime] = "runtime"
    kind[(runtime & sync) | where(pc.equal(cat_l, "cuda_sync"))] = "sync"
    cpu = where(pc.is_in(cat_l, pa.array(["cpu_op", "operator", "user_annotation"])))
    kind[cpu] = "cpu_op"
    kind[where(pc.equal(cat_l, "user_annotation"))] = "annotation"
    kind[cpu & where(pc.match_substring_regex(name, COMM_OP_RE))] = "comm_op"
    kind[cpu & where(pc.starts_with(name, "ProfilerStep#"))] = "step"
    kind[where(pc.equal(cat_l, "python_function"))] = "python"
    kind[where(pc.equal(ph, "i"))] = "instant"
    return pa.array(kind, pa.string()), is_gpu
