"""The replay graph builder (traceanalyzer/replay/graph.py, numpy) builds the same graph as the
builder it replaced (tests/reference/replay_graph_v1.py, pandas; kept only for this test), on
every shipped trace and on the external 8-rank DLRM trace: same nodes (times, durations, lanes,
kinds, labels, categories, communication instances, release times), the same incoming edges of
every node with the same fitted lags (compared as sets: the order inside a node's list is free),
the same topological order, lanes, steps (with their GPU nodes) and pipeline stages, hence the
same identity-replay step times. The new builder runs on a connection without the analysis views
(it binds only the clock offsets) except for pipelines, whose stages need them all.
"""
from __future__ import annotations

import importlib.util
import sys
import time

import numpy as np
import pandas as pd
import pytest
from conftest import EXTERNAL, ROOT, TRACES, ingest_runs

RUNS = sorted(p.name for p in TRACES.iterdir() if p.is_dir())


def _reference():
    spec = importlib.util.spec_from_file_location("replay_graph_v1", ROOT / "tests" / "reference" / "replay_graph_v1.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod   # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return ingest_runs(tmp_path_factory, "equiv", RUNS, dlrm=True)


def _edges(g):
    """Incoming edges as a set: rows (dst, is_lane, src, lag) sorted."""
    dst = np.repeat(np.arange(g.n), np.diff(g.ptr))
    o = np.lexsort((g.lag, g.src, ~g.is_lane_edge, dst))
    return np.stack([dst[o], g.is_lane_edge[o].astype(np.int64), g.src[o], g.lag[o]])


def _same(new, old, run):
    assert new.n == old.n and len(new.src) == len(old.src), (run, new.n, old.n, len(new.src), len(old.src))
    for f in ("ms", "me", "dur", "lane", "rank", "kind", "inst", "rel", "ptr", "order"):
        np.testing.assert_array_equal(getattr(new, f), getattr(old, f), err_msg=f"{run}: {f}")
    for f, table in (("label", "labels"), ("category", "categories")):
        a = np.asarray(getattr(new, table), dtype=object)[getattr(new, f)]
        b = np.asarray(getattr(old, table), dtype=object)[getattr(old, f)]
        assert (a == b).all(), (run, f)
    np.testing.assert_array_equal(_edges(new), _edges(old), err_msg=f"{run}: edges")
    pd.testing.assert_frame_equal(new.lanes, old.lanes, check_dtype=False, obj=f"{run} lanes")
    pd.testing.assert_frame_equal(new.instances, old.instances, check_dtype=False, obj=f"{run} instances")
    cols = ["rank", "step", "measured_ns", "start_node", "start_uses_end", "end_node", "end_uses_end"]
    pd.testing.assert_frame_equal(new.steps[cols], old.steps[cols], check_dtype=False, obj=f"{run} steps")
    for a, b in zip(new.steps["gpu_nodes"], old.steps["gpu_nodes"]):
        np.testing.assert_array_equal(a, b, err_msg=f"{run}: gpu_nodes")
    assert len(new.stages if new.stages is not None else []) == len(old.stages if old.stages is not None else []), run
    if old.stages is not None and len(old.stages):
        pd.testing.assert_frame_equal(new.stages, old.stages, check_dtype=False, obj=f"{run} stages")


def test_same_graph_as_reference_builder(store):
    import traceanalyzer as ta
    from traceanalyzer import replay
    from traceanalyzer.analyses import prepare
    ref = _reference()
    con_old = prepare(ta.open(str(store)))
    con_new = ta.open(str(store))   # no analysis views bound: the builder binds only what it needs
    runs = RUNS + (["dlrm"] if (EXTERNAL / "param_dlrm_8rank").exists() else [])
    checked = []
    for run in runs:
        old = ref.build_graph(con_old, run)
        t = time.perf_counter()
        # a pipeline needs every analysis view (its stages): binding them costs ~10 s, done once on con_old
        (sends,) = con_old.execute("SELECT count(*) FROM comms WHERE run = $run AND op = 'send'", {"run": run}).fetchone()
        new = replay.build_graph(con_old if sends else con_new, run)
        new_s = time.perf_counter() - t
        _same(new, old, run)
        a, b = replay.identity(new), replay.identity(old)
        np.testing.assert_array_equal(a["simulated_ns"].to_numpy(), b["simulated_ns"].to_numpy(), err_msg=run)
        checked.append((run, new.n, len(new.src), round(new_s, 2)))
    # every shipped trace (plus DLRM when present) was compared, and they are not trivial
    assert len(checked) >= len(RUNS) and all(n > 100 and e > 100 for _, n, e, _ in checked), checked
    print(checked)


def test_string_path_same_graph(store, monkeypatch):
    """Event names normally leave DuckDB as a hash modulo a number under which the run's names stay
    distinct (graph._modulus); where no such number is found, as full hashes; on a hash collision
    the builder fetches the strings instead. All three paths must give the same graph (a GPU run
    and a gloo run)."""
    import traceanalyzer as ta
    from traceanalyzer import replay
    from traceanalyzer.replay import graph
    con = ta.open(str(store))
    runs = ["ddp_gloo_4rank"] + (["dlrm"] if (EXTERNAL / "param_dlrm_8rank").exists() else [])
    hashed = {run: replay.build_graph(con, run) for run in runs}
    monkeypatch.setattr(graph, "_MAX_MODULUS", 0)
    for run in runs:
        _same(replay.build_graph(con, run), hashed[run], run)
    monkeypatch.setattr(graph, "_HASH_NAMES", False)
    for run in runs:
        _same(replay.build_graph(con, run), hashed[run], run)


def test_modulus_keeps_hashes_distinct():
    """_modulus finds m with distinct h % m from n^2 up, and gives 0 where it cannot."""
    from traceanalyzer.replay import graph
    rng = np.random.default_rng(7)
    for n in (1, 2, 50, 300, 2000):
        h = np.unique(rng.integers(0, 2 ** 63, n, dtype=np.uint64) * np.uint64(2) + np.uint64(1))
        m = graph._modulus(h)
        assert m >= len(h) ** 2 and len(np.unique(h % np.uint64(m))) == len(h), (n, m)
    assert graph._modulus(np.arange(10_000, dtype=np.uint64)) == 0      # 10^8 > _MAX_MODULUS: full hashes


def test_compiled_join_same_as_sort_join(store, monkeypatch):
    """The compiled merge join of launches and GPU ops (_jit._merge_join) gives _inner_join's pairs
    in _inner_join's order (duplicate keys on both sides, other rows interleaved), refuses unsorted
    input and a too-short output (the sort join runs then), and a whole graph built with numba
    equals one built without it (GPU runs need the join)."""
    pytest.importorskip("numba")
    import traceanalyzer as ta
    from traceanalyzer import replay
    from traceanalyzer.replay import graph
    from traceanalyzer.replay._jit import join_kernel
    join = join_kernel()
    rng = np.random.default_rng(3)
    n = 5000
    rank = np.sort(rng.integers(0, 4, n))
    corr = np.concatenate([np.sort(rng.integers(0, 300, (rank == r).sum())) for r in range(4)])
    is_l = rng.random(n) < 0.5
    rt, gp = np.flatnonzero(is_l), np.flatnonzero(~is_l)
    want = graph._inner_join(*graph._pair_keys(rank[rt], corr[rt], rank[gp], corr[gp]))
    assert len(want[0]) > len(rt)                       # duplicates on both sides
    li, gi = np.empty(3 * n, np.int64), np.empty(3 * n, np.int64)
    k = join(rt, gp, rank, corr, li, gi)
    np.testing.assert_array_equal(li[:k], want[0])
    np.testing.assert_array_equal(gi[:k], want[1])
    for got, w in zip(graph._launch_join(rt, gp, rank, corr), want):    # output too short: -2, sort join
        np.testing.assert_array_equal(got, w)
    shuffled = rng.permutation(rt)
    assert join(shuffled, gp, rank, corr, li, gi) == -1
    for got, w in zip(graph._launch_join(shuffled, gp, rank, corr),
                      graph._inner_join(*graph._pair_keys(rank[shuffled], corr[shuffled], rank[gp], corr[gp]))):
        np.testing.assert_array_equal(got, w)
    con = ta.open(str(store))
    runs = ["ddp_gloo_4rank"] + (["dlrm"] if (EXTERNAL / "param_dlrm_8rank").exists() else [])
    compiled = {run: replay.build_graph(con, run) for run in runs}
    monkeypatch.setenv("TRACEANALYZER_NO_NUMBA", "1")
    for run in runs:
        _same(replay.build_graph(con, run), compiled[run], run)


def test_compiled_sweep_same_as_python(store, monkeypatch):
    """The simulator's head sweep compiled by numba (replay/_jit.py) gives the same integers as the
    plain Python loop, on every shipped run, for the identity replay and for perturbed durations
    (each rank's work scaled differently, so the binding predecessors change); the compiled repair
    of the topological order gives the order of the numpy passes (some runs need a repair)."""
    pytest.importorskip("numba")
    import traceanalyzer as ta
    from traceanalyzer import replay
    from traceanalyzer.replay import graph
    from traceanalyzer.replay._jit import sweep_kernel
    con = ta.open(str(store))
    runs = RUNS + (["dlrm"] if (EXTERNAL / "param_dlrm_8rank").exists() else [])
    moved = repaired = 0
    for run in runs:
        g = replay.build_graph(con, run)
        dst = np.repeat(np.arange(g.n), np.diff(g.ptr))
        monkeypatch.delenv("TRACEANALYZER_NO_NUMBA", raising=False)
        fast_order = graph._topo_order(g.ms, g.kind, g.src, dst, g.n, g.is_lane_edge, g.ptr)
        monkeypatch.setenv("TRACEANALYZER_NO_NUMBA", "1")
        np.testing.assert_array_equal(fast_order, graph._topo_order(g.ms, g.kind, g.src, dst, g.n, g.is_lane_edge, g.ptr),
                                      err_msg=run)
        np.testing.assert_array_equal(fast_order, g.order, err_msg=run)
        repaired += not np.array_equal(fast_order, graph._topo_order(g.ms, g.kind, g.src[:0], dst[:0], g.n))
        sim = replay.Simulator(g)
        factor = 0.5 + (np.maximum(g.rank, 0) % 3) * 0.4           # ranks 0,1,2 -> x0.5, x0.9, x1.3
        durs = [None, (g.dur * factor).astype(np.int64)]
        monkeypatch.delenv("TRACEANALYZER_NO_NUMBA", raising=False)
        assert sweep_kernel() is not None
        fast = [sim.run(d) for d in durs]
        monkeypatch.setenv("TRACEANALYZER_NO_NUMBA", "1")
        assert sweep_kernel() is None
        slow = [sim.run(d) for d in durs]
        for a, b in zip(fast, slow):
            np.testing.assert_array_equal(a.start, b.start, err_msg=run)
            np.testing.assert_array_equal(a.end, b.end, err_msg=run)
        moved += int((fast[1].end != fast[0].end).sum())
    assert len(runs) >= 10 and moved > 1000 and repaired >= 1, (runs, moved, repaired)


def test_nested_column_matches_window_definition(store):
    """events.nested (ingest, numpy) equals the definition written as one DuckDB window query: per
    CPU thread, in (start, longest first, file order), the event starts before and ends no later
    than the latest end before it (ProfilerStep, instants, GPU annotations and the profiler's own
    spans not counted). Checked on every event of every shipped run (and DLRM)."""
    import traceanalyzer as ta
    con = ta.open(str(store))
    (bad, total, nested) = con.execute("""
        WITH w AS (
            SELECT run, rank, window_id, event_id, ts_ns, ts_ns + dur_ns AS te,
                   max(ts_ns + dur_ns) OVER (PARTITION BY run, rank, window_id, tid
                                             ORDER BY ts_ns, dur_ns DESC, event_id
                                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_max
            FROM events
            WHERE ph = 'X' AND NOT is_gpu AND kind NOT IN ('step', 'instant', 'gpu_annotation')
              AND NOT (kind = 'other' AND name LIKE 'PyTorch Profiler%'))
        SELECT count(*) FILTER (WHERE e.nested IS DISTINCT FROM coalesce(w.te <= w.prev_max AND w.ts_ns < w.prev_max, false)),
               count(*), count(*) FILTER (WHERE e.nested)
        FROM events e LEFT JOIN w USING (run, rank, window_id, event_id)""").fetchone()
    assert bad == 0 and nested > 0.3 * total, (bad, total, nested)


def test_graph_same_without_skipping_nested(store, monkeypatch):
    """The builder leaves nested cpu_ops in the store (replay/graph.py _NOT_NESTED); fetching them
    anyway, as it does on a store written before schema 1.3, gives the same graph."""
    import traceanalyzer as ta
    from traceanalyzer import replay
    from traceanalyzer.replay import graph
    con = ta.open(str(store))
    runs = ["ddp_gloo_4rank", "pp_1f1b_4rank", "ddp_gloo_cuda_2rank_slow1"] + \
        (["dlrm"] if (EXTERNAL / "param_dlrm_8rank").exists() else [])
    skipped = {run: replay.build_graph(con, run) for run in runs}
    monkeypatch.setattr(graph, "_SKIP_NESTED", False)
    for run in runs:
        _same(replay.build_graph(con, run), skipped[run], run)
