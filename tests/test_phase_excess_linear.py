"""``_phase_excess`` (and ``pipeline_slow_stages``' median of the other replicas) take each rank's
median of the others from the sorted values without its own (linear in the ranks) instead of
joining every rank with every other: the same rows, to the bit, as the self-join they replaced (the
spec here), with unknown (NULL) values, ties, huge values, a rank alone in its step, and a rank with
two rows of one step."""
from __future__ import annotations

import random

import duckdb
import pytest

from traceanalyzer.analyses import modules as M

PAIRWISE = """
WITH own AS (SELECT run, rank, step, forward_ns AS forward, backward_ns AS backward, optimizer_ns AS optimizer,
                    data_loading_ns AS data_loading FROM step_phases),
long AS (SELECT l.run, l.rank, l.step, l.phase, l.ns - coalesce(b.wait_ns, 0) AS ns
         FROM (UNPIVOT own ON forward, backward, optimizer, data_loading INTO NAME phase VALUE ns) l
         LEFT JOIN _collective_blocked b USING (run, rank, step, phase)),
others AS (SELECT a.run, a.rank, a.step, a.phase, a.ns, median(b.ns) AS others_ns
           FROM long a JOIN long b ON a.run = b.run AND a.step = b.step AND a.phase = b.phase AND a.rank <> b.rank
           GROUP BY ALL)
SELECT run, rank, step, phase, ns, others_ns, ns - others_ns AS excess_ns FROM others ORDER BY ALL"""


def _view_sql() -> str:
    con = duckdb.connect()
    for st in con.extract_statements(M.modules()["stragglers"].text):
        if "TEMP VIEW _phase_excess " in st.query:
            return st.query
    raise AssertionError("no _phase_excess in stragglers.sql")


def _connection(rnd: random.Random):
    con = duckdb.connect()
    con.execute("CREATE TABLE step_phases (run VARCHAR, rank INTEGER, step INTEGER, forward_ns BIGINT, backward_ns BIGINT, "
                "optimizer_ns BIGINT, data_loading_ns BIGINT)")
    con.execute("CREATE TABLE _collective_blocked (run VARCHAR, rank INTEGER, step INTEGER, phase VARCHAR, wait_ns HUGEINT)")
    value = lambda: rnd.choice([None, rnd.randrange(5), rnd.randrange(10**12), 9_007_199_254_740_993 + rnd.randrange(4)])
    rows, blocked = [], []
    for run in ("a", "b"):
        n = rnd.randrange(1, 9)
        for rank in range(n):
            for step in range(rnd.randrange(1, 4)):
                for _ in range(2 if rnd.random() < 0.08 else 1):  # sometimes two rows of one rank and step
                    rows.append((run, rank, step, value(), value(), value(), value()))
                if rnd.random() < 0.3:
                    blocked.append((run, rank, step, rnd.choice(["forward", "backward", "optimizer"]), rnd.randrange(3)))
    con.executemany("INSERT INTO step_phases VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
    if blocked:
        con.executemany("INSERT INTO _collective_blocked VALUES (?, ?, ?, ?, ?)", blocked)
    return con


@pytest.mark.parametrize("seed", range(3))
def test_same_rows_as_the_pairwise_median(seed):
    rnd, view = random.Random(seed), _view_sql()
    compared = 0
    for _ in range(25):
        con = _connection(rnd)
        con.execute(view)
        got = con.execute("SELECT * FROM _phase_excess ORDER BY ALL").fetchall()
        want = con.execute(PAIRWISE).fetchall()
        assert got == want
        compared += len(want)
        con.close()
    assert compared > 200


PAIRWISE_DP = """
SELECT a.run, a.rank, a.step, median(b.own_ns) AS peer_own_ns
FROM own a JOIN own b ON a.run = b.run AND a.stage = b.stage AND a.step = b.step AND a.pipeline_id <> b.pipeline_id
GROUP BY ALL ORDER BY ALL"""


def _dp_peers_sql() -> str:
    """``pipeline_slow_stages``' median of the other replicas' same stage (its CTEs dp_counted .. dp_peers)."""
    text = M.modules()["bubbles"].text
    body = text[text.index("dp_counted AS ("):text.index("excess AS (", text.index("dp_peers AS ("))].rstrip().rstrip(",")
    return f"WITH {body} SELECT * FROM dp_peers ORDER BY ALL"


@pytest.mark.parametrize("seed", range(2))
def test_replicas_median_same_rows_as_the_pairwise_one(seed):
    """pipeline_slow_stages' dp_peers: the same leave-one-out median, by pipeline instead of rank."""
    rnd, sql = random.Random(seed), _dp_peers_sql()
    compared = 0
    for _ in range(25):
        con = duckdb.connect()
        con.execute("CREATE TABLE own (run VARCHAR, rank INTEGER, pipeline_id INTEGER, stage INTEGER, step INTEGER, own_ns HUGEINT)")
        rows = []
        for run in ("a", "b"):
            pp, dp = rnd.randrange(1, 4), rnd.randrange(1, 7)
            for d in range(dp):
                for s in range(pp):
                    for step in range(rnd.randrange(1, 3)):
                        for _ in range(2 if rnd.random() < 0.08 else 1):
                            rows.append((run, d * pp + s, d, s, step,
                                         rnd.choice([None, rnd.randrange(5), rnd.randrange(10**12), 2**53 + rnd.randrange(4)])))
        con.executemany("INSERT INTO own VALUES (?, ?, ?, ?, ?, ?)", rows)
        got = con.execute(sql).fetchall()
        assert got == con.execute(PAIRWISE_DP).fetchall()
        compared += len(got)
        con.close()
    assert compared > 100
