"""Real gloo DDP runs (traces/, recorded with torchrun on this kind of machine) ingest, and each
all-reduce is joined across all ranks by its sequence index."""
from __future__ import annotations

import shutil

import pytest
from conftest import TRACES

import traceanalyzer as ta

JOIN = """
SELECT pg_name, seq, count(DISTINCT rank) AS ranks, count(DISTINCT op) AS ops,
       count(DISTINCT in_bytes) AS sizes, any_value(op) AS op, any_value(in_bytes) AS bytes,
       -- a real all-reduce: no rank can leave before the last one has arrived
       max(start_ts_ns) < min(end_ts_ns) AS all_inside_together,
       any_value(pg_source) AS pg_source, any_value(seq_source) AS seq_source
FROM comms WHERE NOT is_p2p GROUP BY pg_name, seq ORDER BY pg_name, seq
"""


@pytest.mark.parametrize("run,world", [("ddp_gloo_2rank", 2), ("ddp_gloo_4rank", 4), ("ddp_gloo_4rank_slow2", 4)])
def test_allreduce_joins_across_ranks_with_flight_recorder(run, world, tmp_path):
    report = ta.ingest([TRACES / run], tmp_path / "s")
    assert sorted(t.rank for t in report.traces) == list(range(world))
    con = ta.open(tmp_path / "s")
    joined = con.sql(JOIN).df()
    # 8 profiled steps x 4 DDP buckets (bucket_cap_mb=1 on the 0.8 M-parameter mlp)
    assert len(joined) == 32
    assert (joined["ranks"] == world).all() and (joined["ops"] == 1).all() and (joined["sizes"] == 1).all()
    assert set(joined["op"]) == {"all_reduce"} and set(joined["pg_source"]) == {"flight_recorder"}
    assert joined["all_inside_together"].all()
    # the FR numbers the group's collectives 1, 2, ...: the window holds 32 consecutive ones
    assert list(joined["seq"]) == list(range(joined["seq"].min(), joined["seq"].min() + 32))
    # DDP's buckets, in bytes (float32): the same 4 sizes every step
    assert sorted(set(joined["bytes"])) == [33280 * 4, 262656 * 4, 267786 * 4]


def test_allreduce_joins_without_flight_recorder(tmp_path):
    """Without FR dumps the group comes from the runloop threads (inferred) and seq from order."""
    src = tmp_path / "traces"
    src.mkdir()
    for f in (TRACES / "ddp_gloo_4rank").glob("*.pt.trace.json.gz"):
        shutil.copy(f, src / f.name)
    ta.ingest([src], tmp_path / "s", run="nofr")
    con = ta.open(tmp_path / "s")
    joined = con.sql(JOIN).df()
    assert list(joined["seq"]) == list(range(32))
    assert (joined["ranks"] == 4).all() and (joined["sizes"] == 1).all() and joined["all_inside_together"].all()
    assert set(joined["pg_source"]) == {"runloop_thread"} and set(joined["seq_source"]) == {"order"}
    inferred = con.execute("SELECT bool_and(pg_inferred) FROM comms").fetchone()[0]
    assert inferred is True


def test_gloo_enqueue_precedes_execution_and_sizes_come_from_shapes(tmp_path):
    ta.ingest([TRACES / "ddp_gloo_2rank"], tmp_path / "s")
    con = ta.open(tmp_path / "s")
    bad = con.execute("""SELECT count(*) FROM comms
                         WHERE enqueue_ts_ns IS NULL OR start_ts_ns < enqueue_ts_ns OR in_bytes IS NULL
                            OR exec_name <> 'gloo:all_reduce' OR dtype <> 'float'""").fetchone()[0]
    assert bad == 0
    # every execution span runs on a runloop thread of that rank, never on the caller thread
    threads = con.execute("""SELECT DISTINCT t.name FROM comms c JOIN threads t
                             ON c.run = t.run AND c.rank = t.rank AND c.exec_tid = t.tid""").fetchall()
    assert threads and all("pt_gloo_runloop" in n for (n,) in threads)


def test_steps_are_aligned_across_ranks(tmp_path):
    ta.ingest([TRACES / "ddp_gloo_4rank_slow2"], tmp_path / "s")
    con = ta.open(tmp_path / "s")
    steps = con.sql("SELECT rank, list(step ORDER BY step) AS steps FROM steps GROUP BY rank ORDER BY rank").df()
    assert all(list(s) == list(range(2, 10)) for s in steps["steps"])
