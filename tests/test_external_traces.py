"""Every real GPU/NCCL trace in ../shared/traces/external ingests, and the store's counts match an
independent count made here from the raw JSON with the standard json module."""
from __future__ import annotations

import re

import pytest
from conftest import EXTERNAL, external_files, load_raw, need_external

import traceanalyzer as ta

COMM_KERNEL = re.compile(r"nccl|multimem_all_reduce", re.IGNORECASE)
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"}


def _expected(raw: dict) -> dict:
    events = [e for e in raw["traceEvents"] if e.get("ph") in ("X", "i")]
    xs = [e for e in events if e.get("ph") == "X"]
    cpu = [e for e in xs if e.get("cat") not in GPU_CATS]
    kernels = [e for e in xs if e.get("cat") == "kernel"]
    steps = {e["name"] for e in cpu if e["name"].startswith("ProfilerStep#")}
    # CPU-side issue points: the backend annotation (nccl:*, gloo:*) or a symmetric-memory op
    anchors = [e for e in cpu if e["name"].startswith(("nccl:", "gloo:", "symm_mem::"))]
    return {
        "events": len(events),
        "kernels": len(kernels),
        "comm_kernels": sum(1 for k in kernels if COMM_KERNEL.search(k["name"])),
        "steps": len(steps),
        "cpu_comm_ops": len(anchors),
    }


@pytest.mark.parametrize("path", external_files(), ids=lambda p: f"{p.parent.name}/{p.name[:40]}")
def test_external_trace_ingests_with_matching_counts(path, tmp_path):
    need_external()
    rank = 0 if "amd_mi250" in path.name else None  # the ROCm trace has no rank source at all
    report = ta.ingest([path], tmp_path / "store", run="ext", rank=rank)
    assert report.skipped == {}, report.skipped
    want = _expected(load_raw(path))
    con = ta.open(tmp_path / "store")
    got = con.execute("""
        SELECT (SELECT count(*) FROM events) AS events,
               (SELECT count(*) FROM events WHERE kind IN ('compute_kernel', 'comm_kernel')) AS kernels,
               (SELECT count(*) FROM events WHERE kind = 'comm_kernel') AS comm_kernels,
               (SELECT count(*) FROM steps) AS steps,
               (SELECT count(*) FROM comms WHERE enqueue_event_id IS NOT NULL OR NOT on_gpu) AS cpu_comm_ops,
               (SELECT count(*) FROM comms WHERE on_gpu) AS comms_on_gpu
    """).fetchone()
    got = dict(zip(["events", "kernels", "comm_kernels", "steps", "cpu_comm_ops", "comms_on_gpu"], got))
    assert got["events"] == want["events"]
    assert got["kernels"] == want["kernels"]
    assert got["comm_kernels"] == want["comm_kernels"]
    assert got["steps"] == want["steps"]
    # every communication kernel is one comms row; every CPU issue point is one comms row
    assert got["comms_on_gpu"] == want["comm_kernels"]
    assert got["cpu_comm_ops"] == want["cpu_comm_ops"]


def test_dlrm_8rank_collectives_join_across_all_ranks(tmp_path):
    """All 8 DLRM ranks: the k-th collective of each rank is the same op with the same size."""
    need_external()
    ta.ingest([EXTERNAL / "param_dlrm_8rank"], tmp_path / "s", run="dlrm")
    con = ta.open(tmp_path / "s")
    joined = con.sql("""
        SELECT seq, count(DISTINCT rank) AS ranks, count(DISTINCT op) AS ops, count(DISTINCT in_nelems) AS sizes
        FROM comms WHERE NOT is_p2p GROUP BY seq ORDER BY seq""").df()
    assert len(joined) == 8  # 5 all_to_all + 3 all_reduce per rank
    assert (joined["ranks"] == 8).all() and (joined["ops"] == 1).all()
    allreduce_sizes = con.sql("SELECT count(DISTINCT in_nelems) FROM comms WHERE op = 'all_reduce' GROUP BY seq").df()
    assert (allreduce_sizes.iloc[:, 0] == 1).all()


def test_nccl_2024_args_are_normalised(tmp_path):
    """nccl_parser_config (NCCL 2.17, record_param_comms with args): 15 all-reduces and 6 broadcasts
    on process group '0' of ranks [0, 1], sizes from 'In msg nelems' x 4 bytes (Float)."""
    need_external()
    ta.ingest([EXTERNAL / "hta" / "nccl_parser_config.json.gz"], tmp_path / "s")
    con = ta.open(tmp_path / "s")
    df = con.sql("SELECT op, pg_name, pg_ranks, group_size, in_nelems, in_bytes, dtype, dialect, seq FROM comms ORDER BY seq").df()
    assert df["op"].value_counts().to_dict() == {"all_reduce": 15, "broadcast": 6}
    assert set(df["pg_name"]) == {"0"} and all(list(r) == [0, 1] for r in df["pg_ranks"])
    assert (df["group_size"] == 2).all() and set(df["dialect"]) == {"nccl"}
    first_ar = df[df["op"] == "all_reduce"].iloc[0]
    assert first_ar["in_nelems"] == 2049000 and first_ar["in_bytes"] == 2049000 * 4
    assert list(df["seq"]) == list(range(21))


def test_renamed_nccl_kernels_and_symm_mem_are_communication(tmp_path):
    """NCCL >= 2.19 names kernels ncclDevKernel_*; vLLM's multimem all-reduce is not NCCL at all."""
    need_external()
    ta.ingest([EXTERNAL / "tracelens" / "vllm_b200_rank0_nccl2275.json.gz"], tmp_path / "s")
    con = ta.open(tmp_path / "s")
    rows = dict(con.execute("SELECT dialect, count(*) FROM comms GROUP BY dialect").fetchall())
    assert rows == {"nccl": 1, "symm_mem": 73}
    ag = con.execute("SELECT exec_name, op, pg_name, in_nelems, out_nelems, elem_bytes FROM comms WHERE dialect = 'nccl'").fetchone()
    assert ag[0].startswith("ncclDevKernel_AllGather") and ag[1:] == ("all_gather", "3", 25136, 201088, 2)
