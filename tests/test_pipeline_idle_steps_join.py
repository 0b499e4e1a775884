"""``pipeline_idle`` matches the calls pending during each idle gap per step (each call first
joined to the steps whose gaps it may overlap) instead of filtering every gap of a rank against
every call of it (quadratic in the steps: at 64 op-timeline ranks x 50 steps that join was 18 of
the view's 20 CPU s). The same rows, to the bit, as the per-rank join it replaced (the spec here),
with unknown (NULL) times, ranks and steps, touching and nested intervals, several runs and ranks."""
from __future__ import annotations

import random

import duckdb
import pytest

from traceanalyzer.analyses import modules as M

NEW_JOIN = """FROM gaps g JOIN pending_steps p ON p.run = g.run AND p.rank = g.rank AND p.step IS NOT DISTINCT FROM g.step
         AND p.lo_ns < g.hi_ns AND p.hi_ns > g.lo_ns"""
PER_RANK_JOIN = "FROM gaps g JOIN pending_next p ON p.run = g.run AND p.rank = g.rank AND p.lo_ns < g.hi_ns AND p.hi_ns > g.lo_ns"


def _charged_sql() -> str:
    """``pipeline_idle``'s CTEs gap_spans .. charged (over tables gaps and pending_next), as a query."""
    text = M.modules()["pipeline_gaps"].text
    start = text.index("gap_spans AS (")
    body = text[start:text.index("\ncharged_keyed AS (", start)].rstrip().rstrip(",")
    return f"WITH {body} SELECT * FROM charged ORDER BY ALL"


def _connection(rnd: random.Random):
    con = duckdb.connect()
    con.execute("SET VARIABLE p2p_wait_max_tail_ns = 7")
    con.execute("CREATE TABLE gaps (run VARCHAR, rank BIGINT, step INTEGER, kind VARCHAR, lo_ns BIGINT, hi_ns BIGINT)")
    con.execute("CREATE TABLE pending_next (run VARCHAR, rank BIGINT, src_rank BIGINT, is_send BOOLEAN, lo_ns BIGINT, "
                "call_end_ns BIGINT, hi_ns BIGINT, next_call_ns BIGINT)")
    maybe = lambda v: None if rnd.random() < 0.04 else v
    gaps, calls = [], []
    for run in ("a", "b", None):
        for rank in range(rnd.randrange(1, 5)):
            t = rnd.randrange(0, 20)
            for step in range(rnd.randrange(1, 4)):
                t -= rnd.randrange(0, 4)  # steps' gaps may overlap
                for _ in range(rnd.randrange(0, 6)):
                    lo = t + rnd.randrange(0, 6)
                    t = lo + rnd.randrange(0, 6)
                    gaps.append((run, maybe(rank), maybe(step), rnd.choice(["gap", "gap", "warmup"]), maybe(lo), maybe(t)))
            for _ in range(rnd.randrange(0, 12)):
                lo = rnd.randrange(0, t + 5)
                hi = lo + rnd.randrange(0, 15)
                calls.append((run, maybe(rank), rnd.randrange(4), rnd.random() < 0.5, maybe(lo), lo + rnd.randrange(0, 4),
                              maybe(hi), maybe(hi + rnd.randrange(0, 10))))
    if gaps:
        con.executemany("INSERT INTO gaps VALUES (?, ?, ?, ?, ?, ?)", gaps)
    if calls:
        con.executemany("INSERT INTO pending_next VALUES (?, ?, ?, ?, ?, ?, ?, ?)", calls)
    return con


@pytest.mark.parametrize("seed", range(3))
def test_same_rows_as_the_per_rank_join(seed):
    rnd, new = random.Random(seed), _charged_sql()
    assert NEW_JOIN in new
    old = new.replace(NEW_JOIN, PER_RANK_JOIN)
    compared = 0
    for _ in range(20):
        con = _connection(rnd)
        want = con.execute(old).fetchall()
        assert con.execute(new).fetchall() == want
        compared += len(want)
        con.close()
    assert compared > 50
