"""Every real GPU/NCCL trace in ../shared/traces/external ingests, and the store's counts match an
independent count made here from the raw JSON with the standard json module."""
from __future__ import annotations

import re

import pytest
from conftest import external_files, external_run_name, load_raw, need_external

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
def test_external_trace_ingests_with_matching_counts(path, tmp_path, external_store):
    """Each file alone: a file of its own trace set is its run of the session's external store (ingested
    there once, alone in its run: conftest.external_store); a DLRM rank file is ingested here by itself."""
    need_external()
    rank = 0 if "amd_mi250" in path.name else None  # the ROCm trace has no rank source at all
    run = external_run_name(f"{path.parent.name}/{path.name}")
    store, reports = external_store
    if run in reports:
        report = reports[run]
        if rank is not None:   # given there as here
            assert [t.rank for t in report.traces] == [rank]
    else:
        run, store = "ext", tmp_path / "store"
        report = ta.ingest([path], store, run=run, rank=rank)
    assert report.skipped == {}, report.skipped
    assert len(report.traces) == 1, report.traces   # the run holds this file only
    want = _expected(load_raw(path))
    con = ta.open(store)
    got = con.execute("""
        SELECT (SELECT count(*) FROM events WHERE run = $run) AS events,
               (SELECT count(*) FROM events WHERE run = $run AND kind IN ('compute_kernel', 'comm_kernel')) AS kernels,
               (SELECT count(*) FROM events WHERE run = $run AND kind = 'comm_kernel') AS comm_kernels,
               (SELECT count(*) FROM steps WHERE run = $run) AS steps,
               (SELECT count(*) FROM comms WHERE run = $run AND (enqueue_event_id IS NOT NULL OR NOT on_gpu)) AS cpu_comm_ops,
               (SELECT count(*) FROM comms WHERE run = $run AND on_gpu) AS comms_on_gpu
    """, {"run": run}).fetchone()
    got = dict(zip(["events", "kernels", "comm_kernels", "steps", "cpu_comm_ops", "comms_on_gpu"], got))
    assert got["events"] == want["events"]
    assert got["kernels"] == want["kernels"]
    assert got["comm_kernels"] == want["comm_kernels"]
    assert got["steps"] == want["steps"]
    # every communication kernel is one comms row; every CPU issue point is one comms row
    assert got["comms_on_gpu"] == want["comm_kernels"]
    assert got["cpu_comm_ops"] == want["cpu_comm_ops"]


def test_dlrm_8rank_collectives_join_across_all_ranks(external_store):
    """All 8 DLRM ranks: the k-th collective of each rank is the same op with the same size."""
    need_external()
    con = ta.open(external_store[0])
    run = [external_run_name("param_dlrm_8rank/")]
    joined = con.execute("""
        SELECT seq, count(DISTINCT rank) AS ranks, count(DISTINCT op) AS ops, count(DISTINCT in_nelems) AS sizes
        FROM comms WHERE run = ? AND NOT is_p2p GROUP BY seq ORDER BY seq""", run).df()
    assert len(joined) == 8  # 5 all_to_all + 3 all_reduce per rank
    assert (joined["ranks"] == 8).all() and (joined["ops"] == 1).all()
    allreduce_sizes = con.execute("SELECT count(DISTINCT in_nelems) FROM comms WHERE run = ? AND op = 'all_reduce' "
                                  "GROUP BY seq", run).df()
    assert (allreduce_sizes.iloc[:, 0] == 1).all()


def test_nccl_2024_args_are_normalised(external_store):
    """nccl_parser_config (NCCL 2.17, record_param_comms with args): 15 all-reduces and 6 broadcasts
    on process group '0' of ranks [0, 1], sizes from 'In msg nelems' x 4 bytes (Float)."""
    need_external()
    con = ta.open(external_store[0])
    df = con.execute("SELECT op, pg_name, pg_ranks, group_size, in_nelems, in_bytes, dtype, dialect, seq FROM comms "
                     "WHERE run = ? ORDER BY seq", [external_run_name("hta/nccl_parser_config.json.gz")]).df()
    assert df["op"].value_counts().to_dict() == {"all_reduce": 15, "broadcast": 6}
    assert set(df["pg_name"]) == {"0"} and all(list(r) == [0, 1] for r in df["pg_ranks"])
    assert (df["group_size"] == 2).all() and set(df["dialect"]) == {"nccl"}
    first_ar = df[df["op"] == "all_reduce"].iloc[0]
    assert first_ar["in_nelems"] == 2049000 and first_ar["in_bytes"] == 2049000 * 4
    assert list(df["seq"]) == list(range(21))


def test_renamed_nccl_kernels_and_symm_mem_are_communication(external_store):
    """NCCL >= 2.19 names kernels ncclDevKernel_*; vLLM's multimem all-reduce is not NCCL at all."""
    need_external()
    con = ta.open(external_store[0])
    run = [external_run_name("tracelens/vllm_b200_rank0_nccl2275.json.gz")]
    rows = dict(con.execute("SELECT dialect, count(*) FROM comms WHERE run = ? GROUP BY dialect", run).fetchall())
    assert rows == {"nccl": 1, "symm_mem": 73}
    ag = con.execute("SELECT exec_name, op, pg_name, in_nelems, out_nelems, elem_bytes FROM comms "
                     "WHERE run = ? AND dialect = 'nccl'", run).fetchone()
    assert ag[0].startswith("ncclDevKernel_AllGather") and ag[1:] == ("all_gather", "3", 25136, 201088, 2)
