"""DDP plans as a graph for the one simulator (replay/ddp_graph.py), on a real 2-rank gloo run: the
buckets run one after the other on their lane after the gradients they hold, every rank resumes
after the last bucket (plus the run's resume gap), and the shared core only ever slows a step."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import TRACES

import traceanalyzer as ta
from traceanalyzer.replay import ddp


@pytest.fixture(scope="module")
def con(tmp_path_factory):
    store = tmp_path_factory.mktemp("ddp_graph") / "store"
    ta.ingest([TRACES / "ddp_gloo_2rank"], store, run="ddp_gloo_2rank", progress=False, workers=1)
    c = ta.open(store)
    yield c
    c.close()


def test_buckets_in_order_and_ranks_resume_after_the_last(con):
    r = ddp.predict(con, "ddp_gloo_2rank", bucket_mb=0.25)
    tl = r.timeline
    n_buckets = int((r.buckets.scenario == "predicted").sum())
    assert n_buckets > 2
    gap = r.stats["resume_gap_ns"]
    steps = 0
    for _, rank_tl in tl.groupby("rank"):
        comm = rank_tl[rank_tl.lane == "comm"]
        compute = rank_tl[rank_tl.lane == "compute"].set_index("name")
        for k in range(0, len(comm), n_buckets):          # one step's buckets
            b = comm.iloc[k:k + n_buckets]
            assert (b.start_ns.to_numpy()[1:] >= b.end_ns.to_numpy()[:-1]).all()   # FIFO, one at a time
            steps += 1
        waits = compute.loc["wait for buckets"]
        last_end = comm.end_ns.to_numpy()[n_buckets - 1::n_buckets]
        assert (waits.end_ns.to_numpy() >= last_end + gap - 1).all()
    assert steps == len(r.steps)


def test_shared_core_fixed_point_only_slows_and_converges(con):
    """Same inputs (the run's steps, its gradients, a 0.25 MiB bucketing, the fitted alpha-beta),
    the core free vs shared: sharing stretches, never shortens, and the fixed point converges."""
    from traceanalyzer.replay import alphabeta, ddp_graph
    d = ddp._load(con, "ddp_gloo_2rank")
    rs, _ = ddp._rank_steps(d, True)
    ab = alphabeta.fit(con, "ddp_gloo_2rank", center="mean")
    n_grads = max({len(x.sizes) for x in rs}, key=[len(x.sizes) for x in rs].count)
    slower = 0
    for step in sorted({x.step for x in rs}):
        ranks = [x for x in rs if x.step == step and len(x.sizes) == n_grads]
        if len(ranks) < 2:
            continue
        work = [ddp._pure_work(x, ddp.CORE_SHARE) for x in ranks]
        sizes = ranks[0].sizes
        ends = ddp.assign_buckets(sizes, 0.25 * ddp.MIB)
        starts = [0] + [e + 1 for e in ends[:-1]]
        bbytes = np.array([sizes[a:b + 1].sum() for a, b in zip(starts, ends)])
        cost = np.asarray(ab.time_ns("all_reduce", bbytes, 2), dtype=float)
        free = ddp_graph.simulate_step(ranks, work, ends, bbytes, cost, True, 0.0, 0.0, 0.0)
        shared = ddp_graph.simulate_step(ranks, work, ends, bbytes, cost, True, 0.0, ddp.CORE_SHARE, 0.0)
        assert free[4] == 1 and 1 < shared[4] < ddp_graph.FIXED_POINT_ITERATIONS
        assert all(s >= f - 1_000 for s, f in zip(shared[2], free[2]))      # step ends
        assert all(s >= f - 1_000 for s, f in zip(shared[0], free[0]))      # backward ends
        slower += any(s > f + 1_000 for s, f in zip(shared[2], free[2]))
    assert slower > 0
