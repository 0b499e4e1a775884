"""The communication vocabulary shared by every input: canonical op names and dtype sizes.

Every source spells an op its own way (``c10d::_allgather_base_``, ``nccl:all_reduce``,
``ncclDevKernel_AllGather_RING_LL``, a Flight Recorder ``profiling_name``, an NCCL log's
``AllGather``); :func:`normalize_op` maps them all to one name, so that rows of different sources
join on it.
"""
from __future__ import annotations

import re

#: Bytes per element for the dtype spellings found in traces (record_param_comms, Input type).
DTYPE_BYTES = {
    "float": 4, "float32": 4, "int": 4, "int32": 4, "uint32": 4,
    "double": 8, "float64": 8, "long": 8, "int64": 8, "long int": 8, "uint64": 8,
    "complexfloat": 8, "complexdouble": 16,
    "half": 2, "float16": 2, "bfloat16": 2, "short": 2, "int16": 2, "uint16": 2,
    "char": 1, "signed char": 1, "unsigned char": 1, "byte": 1, "int8": 1, "uint8": 1,
    "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
}

#: Normalised op names, by the text left once prefixes and underscores are stripped.
_OP_ALIASES = {
    "allreduce": "all_reduce", "all_reduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "allreduce_sparse": "all_reduce",
    "allgather": "all_gather", "all_gather": "all_gather", "allgather_base": "all_gather",
    "all_gather_base": "all_gather", "allgather_into_tensor": "all_gather",
    "all_gather_into_tensor": "all_gather", "allgather_into_tensor_coalesced": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather", "allgather_coalesced": "all_gather",
    "reducescatter": "reduce_scatter", "reduce_scatter": "reduce_scatter",
    "reduce_scatter_base": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "alltoall": "all_to_all", "alltoall_base": "all_to_all", "all_to_all": "all_to_all",
    "all_to_all_single": "all_to_all", "alltoallv": "all_to_all",
    "broadcast": "broadcast", "reduce": "reduce", "gather": "gather", "scatter": "scatter",
    "barrier": "barrier", "send": "send", "recv": "recv", "recv_any_source": "recv",
    "sendrecv": "send_recv", "send_recv": "send_recv", "coalesced": "coalesced",
    "multimem_all_reduce": "all_reduce", "one_shot_all_reduce": "all_reduce",
    "two_shot_all_reduce": "all_reduce", "multimem_all_gather": "all_gather",
}

P2P_OPS = {"send", "recv", "send_recv"}
_KERNEL_OP_RE = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)")


def normalize_op(text: str | None) -> str | None:
    """'c10d::_allgather_base_' / 'nccl:all_reduce' / 'ncclDevKernel_AllGather_RING_LL' -> canonical op."""
    if not text:
        return None
    m = _KERNEL_OP_RE.search(text)
    if m:
        word = re.sub(r"(?<!^)(?=[A-Z])", "_", m.group(1)).lower()  # AllGather -> all_gather
        return _OP_ALIASES.get(word.replace("_", ""), _OP_ALIASES.get(word, word))
    for kernel_word in ("multimem_all_reduce", "one_shot_all_reduce", "two_shot_all_reduce", "multimem_all_gather"):
        if kernel_word in text:
            return _OP_ALIASES[kernel_word]
    t = text.split("(")[0]
    t = re.sub(r"^(c10d::|_c10d_functional::|c10d_functional::|nccl:|gloo:|ucc:|mpi:|symm_mem::)", "", t)
    t = t.strip("_").lower()
    return _OP_ALIASES.get(t, _OP_ALIASES.get(t.replace("_", ""), t))


def dtype_bytes(dtype: str | None) -> int | None:
    if not dtype:
        return None
    d = dtype.lower().replace("c10::", "").replace("at::", "").replace("torch.", "")
    return DTYPE_BYTES.get(d)
