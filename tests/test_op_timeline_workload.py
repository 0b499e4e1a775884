"""The light collector in a real torchrun job: ``pipeline --op-timeline`` (PP 2 x DP 2, gloo) writes
one op timeline per rank (``profile(op_timeline=True)``), which ingest reads together as the
canonical tables."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch", reason="torch (the 'collect' extra) is needed to run workloads")

import pandas as pd  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from launch_util import launch  # noqa: E402

import traceanalyzer as ta  # noqa: E402


def test_pipeline_op_timeline_records_every_rank(tmp_path):
    steps, mbs = 2, 2
    result = launch(4, ["pipeline", "--run-name", "tl", "--schedule", "gpipe", "--op-timeline", "--dp", "2",
                        "--microbatches", str(mbs), "--steps", str(steps), "--slow-rank", "3", "--slow-ms", "5"], tmp_path)
    folder = result.out_dir / "tl"
    files = sorted(folder.glob("rank*.op_timeline.parquet"))   # every rank writes its own rows
    assert [p.name for p in files] == [f"rank{r}.op_timeline.parquet" for r in range(4)]
    assert not list(folder.glob("*.pt.trace.json*"))  # no profiler traces: the light mode
    t = pq.read_table(files[0])
    assert json.loads(t.schema.metadata[b"ground_truth"])["slow_rank"] == 3
    rows = pd.concat([pq.read_table(f).to_pandas() for f in files])
    assert sorted(rows["rank"].unique()) == [0, 1, 2, 3]
    per_rank = rows.groupby(["rank", "op"]).size().unstack(fill_value=0)
    # stage 0 (ranks 0, 2) sends activations and receives gradients, stage 1 the reverse; one all_reduce per step
    assert (per_rank.loc[[0, 2], "forward-send"] == steps * mbs).all() and (per_rank.loc[[1, 3], "backward-send"] == steps * mbs).all()
    assert (per_rank["grads-all-reduce"] == steps).all() and (per_rank["optimizer"] == steps).all()
    slow = rows[rows["op"] == "forward-compute"].groupby("rank")["duration_ns"].min()
    assert slow[3] >= 5_000_000  # the injected 5 ms sleep is inside rank 3's forward
    report = ta.ingest([folder], tmp_path / "store")
    assert sorted(s.rank for s in report.traces) == [0, 1, 2, 3]
    con = ta.open(tmp_path / "store")
    assert con.execute("SELECT count(*) FROM comms WHERE op = 'send'").fetchone()[0] == 2 * 2 * steps * mbs
