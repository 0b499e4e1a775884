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
    """Return (kind, is_gpu) for arrays of category, name and phase.

    The rules run once per distinct (cat, name, ph) -- a trace has thousands of distinct names
    but millions of events -- and the result is spread back with the dictionary indices.
    """
    codes, uniques = [], []
    for arr in (cat, name, ph):
        enc = pc.dictionary_encode(pc.fill_null(arr, ""))
        codes.append(enc.indices.to_numpy(zero_copy_only=False).astype(np.int64))
        uniques.append(enc.dictionary)
    n_name, n_ph = len(uniques[1]), max(len(uniques[2]), 1)
    key = (codes[0] * n_name + codes[1]) * n_ph + codes[2]
    distinct, inverse = np.unique(key, return_inverse=True)
    cat_i, rest = np.divmod(distinct, n_name * n_ph)
    name_i, ph_i = np.divmod(rest, n_ph)
    kind_u, gpu_u = _classify_unique(uniques[0].take(pa.array(cat_i)), uniques[1].take(pa.array(name_i)),
                                     uniques[2].take(pa.array(ph_i)))
    return pa.array(kind_u[inverse], pa.string()), gpu_u[inverse]


def _classify_unique(cat: pa.Array, name: pa.Array, ph: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    cat_l = pc.utf8_lower(cat)

    def where(mask):
        return np.asarray(mask.to_numpy(zero_copy_only=False), dtype=bool)

    is_gpu = where(pc.is_in(cat_l, pa.array(GPU_CATS)))
    kind = np.full(len(cat), "other", dtype=object)
    is_kernel = where(pc.equal(cat_l, "kernel"))
    kind[is_kernel] = "compute_kernel"
    kind[is_kernel & where(pc.match_substring_regex(name, COMM_KERNEL_RE))] = "comm_kernel"
    kind[where(pc.is_in(cat_l, pa.array(["gpu_memcpy", "memcpy"])))] = "memcpy"
    kind[where(pc.is_in(cat_l, pa.array(["gpu_memset", "memset"])))] = "memset"
    kind[where(pc.equal(cat_l, "gpu_user_annotation"))] = "gpu_annotation"
    runtime = where(pc.is_in(cat_l, pa.array(["cuda_runtime", "cuda_driver", "runtime", "driver"])))
    kind[runtime] = "runtime"
    kind[(runtime & where(pc.match_substring_regex(name, SYNC_RE))) | where(pc.equal(cat_l, "cuda_sync"))] = "sync"
    cpu = where(pc.is_in(cat_l, pa.array(["cpu_op", "operator", "user_annotation"])))
    kind[cpu] = "cpu_op"
    kind[where(pc.equal(cat_l, "user_annotation"))] = "annotation"
    kind[cpu & where(pc.match_substring_regex(name, COMM_OP_RE))] = "comm_op"
    kind[cpu & where(pc.starts_with(name, "ProfilerStep#"))] = "step"
    kind[where(pc.equal(cat_l, "python_function"))] = "python"
    kind[where(pc.equal(ph, "i"))] = "instant"
    return kind, is_gpu
