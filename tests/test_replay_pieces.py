"""The replay graph stitched from per-rank pieces (replay/graph/pieces.py) is the graph of the
one-connection build, array for array, on real runs: a gloo CPU DDP run (4 ranks, runloop threads,
collectives on CPU lanes), a GPU run (kernels, launches, stream waits, gloo with CUDA tensors) and
a 1F1B pipeline (p2p); built by map tasks of one and of two ranks, then read back from the store by
a second build. A saved piece of a store that changed (a run ingested again from other
traces, a damaged file) is built again, never used; a read of saved pieces reads no events.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from conftest import TRACES, ingest_runs

RUNS = ["ddp_gloo_4rank", "ddp_gloo_cuda_2rank_slow1", "pp_1f1b_2rank_m4"]
_ARRAYS = ("ms", "me", "dur", "child", "lane", "rank", "kind", "label", "category", "inst", "rel", "ptr", "src", "lag",
           "is_lane_edge", "order")


def assert_same_graph(a, b):
    for f in _ARRAYS:
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and np.array_equal(x, y), f
    assert a.labels == b.labels and a.categories == b.categories
    pd.testing.assert_frame_equal(a.lanes, b.lanes)
    pd.testing.assert_frame_equal(a.instances, b.instances)
    pd.testing.assert_frame_equal(a.steps.drop(columns="gpu_nodes"), b.steps.drop(columns="gpu_nodes"))
    assert len(a.steps) == len(b.steps)
    for x, y in zip(a.steps["gpu_nodes"], b.steps["gpu_nodes"]):
        assert x.dtype == y.dtype and np.array_equal(x, y)
    assert (a.stages is None) == (b.stages is None)
    if a.stages is not None:
        pd.testing.assert_frame_equal(a.stages, b.stages)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return ingest_runs(tmp_path_factory, "pieces", RUNS)


def _one_connection(store, run):
    from traceanalyzer import replay
    from traceanalyzer.analyses import connect
    return replay.build_graph(connect(str(store)), run)


@pytest.mark.parametrize("run", RUNS)
def test_pieces_equal_one_connection_build(store, run):
    from traceanalyzer import replay
    from traceanalyzer.analyses import bind_views, connect
    from traceanalyzer.replay.graph import _params, _stages, pieces
    g0 = _one_connection(store, run)
    assert g0.n > 1000 and g0.stats.get("pieces") is None
    con = connect(str(store))
    bind_views(con, ["clock_offsets", "clock_alignment"])
    ranks = sorted(r for (r,) in con.execute("SELECT DISTINCT rank FROM events WHERE run = $r", {"r": run}).fetchall())
    assert len(ranks) >= 2
    pieces.forget(str(store), [run])
    chunks = [c for c in (ranks[:1], ranks[1:3], ranks[3:]) if c]        # map tasks of one rank and of two
    first = pieces.build(str(store), con, run, _params(run), chunks=chunks, stages=lambda: _stages(con, run, set()))
    assert_same_graph(g0, first)
    second = replay.build_graph(str(store), run)                # the saved pieces, no events read
    assert (first.stats["pieces"], second.stats["pieces"]) == ("built", "read")
    assert_same_graph(g0, second)
    a, b = replay.identity(g0), replay.identity(second)
    pd.testing.assert_frame_equal(a, b)
    plan = {"actions": [{"action": "idealize", "ranks": [ranks[-1]]}]}
    assert replay.what_if(g0, plan).job_step_ns() == replay.what_if(second, plan).job_step_ns()


def test_stale_pieces_are_built_again(tmp_path):
    """Pieces saved for a run are not used once the run is ingested again from other traces (its
    files, hence the key, changed), nor when a saved file is damaged: the graph is built again."""
    import traceanalyzer as ta
    from traceanalyzer import replay
    from traceanalyzer.replay.graph import pieces
    from traceanalyzer.store import files as st
    from traceanalyzer.store.check import check_store, remove_run
    store = tmp_path / "store"
    ta.ingest([str(TRACES / "ddp_gloo_2rank")], str(store), run="x", progress=False, workers=1)
    old = replay.build_graph(str(store), "x")
    assert old.stats["pieces"] == "built" and not len(old.stages)          # DDP: no pipeline stages
    saved = st.read_manifest(store).extra[pieces.ENTRY]["x"]
    remove_run(store, "x")
    ta.ingest([str(TRACES / "pp_1f1b_2rank_m4")], str(store), run="x", progress=False, workers=1)
    new = replay.build_graph(str(store), "x")
    assert new.stats["pieces"] == "built" and len(new.stages) == 2           # the pipeline's, not the old pieces
    assert st.read_manifest(store).extra[pieces.ENTRY]["x"]["key"] != saved["key"]
    assert_same_graph(_one_connection(store, "x"), new)
    # a damaged piece: built again (and equal), then read
    rel = st.read_manifest(store).extra[pieces.ENTRY]["x"]["chunks"][0]["files"]["nodes"]
    (store / rel).write_bytes((store / rel).read_bytes()[:100])
    again = replay.build_graph(str(store), "x")
    assert again.stats["pieces"] == "built"
    assert_same_graph(new, again)
    assert replay.build_graph(str(store), "x").stats["pieces"] == "read"
    # the store lists every piece it holds: no junk, nothing missing
    report = check_store(store)
    assert report.ok, report.text()
    # the read reads no events: with the run's events files emptied (same schema, no rows) it gives the same graph
    import pyarrow.parquet as pq
    for entry in st.read_manifest(store).traces:
        path = store / entry["files"]["events"]
        pq.write_table(pq.read_table(path).slice(0, 0), path)
    assert _one_connection(store, "x").n < new.n          # a build from the events would see them gone
    blind = replay.build_graph(str(store), "x")
    assert blind.stats["pieces"] == "read"
    assert_same_graph(new, blind)
