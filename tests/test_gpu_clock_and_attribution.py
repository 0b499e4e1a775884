"""GPU-side trust checks on real traces: a CPU/GPU clock offset is detected from the launches (and
only then), and exposed communication on NCCL traces is attributed to its collective."""
from __future__ import annotations

import gzip
import json

import pandas as pd
import pytest
from conftest import EXTERNAL, TRACES, need_external

import traceanalyzer as ta
from traceanalyzer import analyses as A

ROCM = EXTERNAL / "hta" / "amd_mi250_rocm62.json.gz"
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"}
OFFSET_NS = 30_000_000  # what the ROCm MI300X traces show (21-38 ms on every launch)


def _launch_stats(tmp_path, path, rank=None):
    store = tmp_path / "s"
    ta.ingest([path], store, run="r", rank=rank)
    return A.launch_stats(store)


def _shifted(src, dst, offset_ns: int):
    """The real ROCm trace with its GPU clock moved by offset_ns (GPU ops and the flow ends bound to
    them), as a CPU/GPU clock offset records it."""
    with gzip.open(src, "rt") as fh:
        doc = json.load(fh)
    for e in doc["traceEvents"]:
        if e.get("cat") in GPU_CATS or (e.get("ph") == "f" and e.get("cat") == "ac2g"):
            e["ts"] = e["ts"] + offset_ns / 1000
    with gzip.open(dst, "wt") as fh:
        json.dump(doc, fh)
    return dst


def test_rocm_trace_as_recorded_has_no_clock_offset(tmp_path):
    need_external()
    ls = _launch_stats(tmp_path, ROCM, rank=0)
    assert len(ls) == 1
    row = ls.iloc[0]
    assert row["launches"] == 16 and row["min_launch_delay_ns"] < 10_000
    assert pd.isna(row["clock_offset_ns"]) and pd.isna(row["clock_offset_reason"])


@pytest.mark.parametrize("offset_ns", [OFFSET_NS, -OFFSET_NS])
def test_clock_offset_detected_and_corrected(tmp_path, offset_ns):
    need_external()
    path = _shifted(ROCM, tmp_path / "rocm_offset.json.gz", offset_ns)
    ls = _launch_stats(tmp_path, path, rank=0)
    row = ls.iloc[0]
    assert row["clock_offset_reason"] and "clock" in row["clock_offset_reason"]
    if offset_ns > 0:
        # the recorded delays are the offset; the estimate is off by the quickest true delay (a copy that
        # started 44 us before its call returned), the corrected delays are microseconds again
        assert row["median_launch_delay_ns"] > 0.99 * OFFSET_NS
        assert abs(row["clock_offset_ns"] - OFFSET_NS) < 100_000
        assert row["corrected_median_launch_delay_ns"] < 100_000 and row["delay_outliers"] == 0
    else:
        assert row["clock_offset_ns"] < -0.99 * OFFSET_NS


@pytest.mark.parametrize("name", ["hta/torchrec_16rank_rank0.json.gz", "hta/ns_resolution_rank0.json.gz",
                                  "hta/nccl_parser_config.json.gz"])
def test_no_clock_offset_on_real_gpu_traces(tmp_path, name):
    """torchrec and ns_resolution keep the GPU backlogged (median launch delay 77-162 ms): long but
    varying delays, with some launches starting at once, are no clock offset."""
    need_external()
    ls = _launch_stats(tmp_path, EXTERNAL / name)
    assert len(ls) and ls["clock_offset_ns"].isna().all() and ls["clock_offset_reason"].isna().all()
    assert (ls["min_launch_delay_ns"] < 0).all()


def test_no_clock_offset_on_our_h200_runs(tmp_path):
    ls = _launch_stats(tmp_path, TRACES / "ddp_gloo_cuda_2rank")
    assert len(ls) == 2 and ls["clock_offset_ns"].isna().all()


@pytest.mark.parametrize("name,op", [("hta/nccl_parser_config.json.gz", "all_reduce")])
def test_exposed_nccl_communication_is_attributed_to_its_collective(tmp_path, name, op):
    need_external()
    store = tmp_path / "s"
    ta.ingest([EXTERNAL / name], store, run="r")
    con = ta.open(store)
    A.prepare(con)
    exposed = con.sql("SELECT * FROM exposed_comm").df()
    assert len(exposed) > 0
    assert exposed["op"].notna().all() and exposed["seq"].notna().all() and exposed["bytes"].notna().all()
    assert set(exposed["op"]) == {op} and set(exposed["pg"]) == {"0"}
    # the attributed row is the comms row whose kernel it is, with that row's seq and bytes
    check = con.sql("""SELECT count(*) AS n FROM exposed_comm x JOIN comms c
                       ON c.run = x.run AND c.rank = x.rank AND c.window_id = x.window_id AND c.seq = x.seq
                       AND c.pg_name = x.pg AND c.on_gpu AND c.exec_name = x.comm_name
                       AND coalesce(c.in_bytes, c.out_bytes) = x.bytes
                       AND c.start_ts_ns < x.hi_ns AND c.end_ts_ns > x.lo_ns""").df()["n"][0]
    assert check == len(exposed)


def test_exposed_communication_attributed_on_every_dlrm_rank(tmp_path):
    need_external()
    store = tmp_path / "s"
    ta.ingest([EXTERNAL / "param_dlrm_8rank"], store, run="r")
    con = ta.open(store)
    A.prepare(con)
    exposed = con.sql("SELECT rank, op, seq, bytes FROM exposed_comm").df()
    assert len(exposed) > 0 and exposed["op"].notna().all() and exposed["seq"].notna().all()


def test_report_states_the_clock_offset(tmp_path):
    need_external()
    from traceanalyzer.report import build_report

    path = _shifted(ROCM, tmp_path / "rocm_offset.json.gz", OFFSET_NS)
    store = tmp_path / "s"
    ta.ingest([path], store, run="r", rank=0)
    caveats = build_report(store, figures=False, replay=False).runs[0].caveats
    clock = [c for c in caveats if "clock offset" in c]
    assert len(clock) == 1 and clock[0].startswith("Rank 0: every one of 16 GPU ops started 30.0 ms or more")
