"""Issue 17: exposed_comm ranks each map task's exposed_top largest exposed intervals, attributed in
the task (overlap.sql's ``_exposed_top``), instead of ranking every exposed interval of the run (the
ranking ``exposed_intervals`` makes, now in exposed.sql and bound only when asked for) and
attributing the top ones in the reduce. Same rows, to the bit, as the SQL it replaced
(tests/reference/exposed_comm.sql), on random intervals: sizes tied across ranks, several runs,
ranks, windows, NULL steps, exposed_top from 0 to more than a run has, the ranks in one connection
or split into tasks in several ways; and ``exposed_intervals`` is still every one.
"""
from __future__ import annotations

import random
from pathlib import Path

import duckdb
import pytest

from traceanalyzer.analyses import modules as M

#: exposed_comm before issue 17's changes (view _ref_exposed_comm)
REFERENCE = Path(__file__).resolve().parent / "reference" / "exposed_comm.sql"


def _statement(con, module: str, view: str) -> str:
    for statement in con.extract_statements(M.modules()[module].text):
        m = M._VIEW_RE.match(statement.query)
        if m and m.group(1) == view:
            return statement.query
    raise KeyError(view)


def _data(con, rnd: random.Random) -> None:
    islands, intervals = [], []
    for run in ("a", "b"):
        for rank in range(rnd.randrange(1, 6)):
            for window in range(rnd.randrange(1, 3)):
                los = rnd.sample(range(0, 400, 4), rnd.randrange(0, 12))  # distinct starts on a rank
                for lo in los:
                    ns = rnd.choice([1, 2, 3, rnd.randrange(1, 4)])  # sizes tied across ranks
                    islands.append((run, rank, window, rnd.choice([None, 0, 1, 2]), lo, lo + ns, ns))
                    for _ in range(rnd.randrange(0, 3)):
                        a = lo + rnd.randrange(-3, 3)
                        intervals.append((run, rank, window, rnd.choice(["comm", "compute"]), a, a + rnd.randrange(1, 6),
                                          rnd.choice(["x", "y", "z"]), rnd.randrange(0, 5)))
    con.execute("CREATE TABLE _exposed_islands (run VARCHAR, rank INTEGER, window_id INTEGER, step INTEGER, "
                "lo_ns BIGINT, hi_ns BIGINT, exposed_ns HUGEINT)")
    if islands:
        con.executemany("INSERT INTO _exposed_islands VALUES (?, ?, ?, ?, ?, ?, ?)", islands)
    con.execute("CREATE TABLE activity_intervals (run VARCHAR, rank INTEGER, window_id INTEGER, category VARCHAR, "
                "lo_ns BIGINT, hi_ns BIGINT, name VARCHAR, comm_id BIGINT)")
    if intervals:
        con.executemany("INSERT INTO activity_intervals VALUES (?, ?, ?, ?, ?, ?, ?, ?)", intervals)
    con.execute("CREATE TABLE comms (run VARCHAR, rank INTEGER, window_id INTEGER, comm_id BIGINT, op VARCHAR, "
                "pg_name VARCHAR, seq BIGINT, in_bytes BIGINT, out_bytes BIGINT, exec_name VARCHAR)")
    con.execute("""INSERT INTO comms SELECT DISTINCT run, rank, window_id, comm_id, 'all_reduce', 'pg0', comm_id,
                   CASE WHEN comm_id % 2 = 0 THEN 64 * comm_id END, 128, 'c' || comm_id
                   FROM activity_intervals WHERE category = 'comm'""")


def _by_tasks(con, tasks: list[list[int]]) -> None:
    """_exposed_top as the map makes it: one task per list of ranks (each sees its ranks' rows only),
    the tasks' rows together in one table, as the reduce reads them."""
    for t in ("_exposed_islands", "activity_intervals", "comms"):
        con.execute(f"ALTER TABLE {t} RENAME TO _all{t}")
    con.execute("CREATE TABLE _tasks (run VARCHAR, rank INTEGER, window_id INTEGER, step INTEGER, lo_ns BIGINT, "
                "hi_ns BIGINT, exposed_ns HUGEINT, op VARCHAR, pg VARCHAR, seq BIGINT, bytes BIGINT, comm_name VARCHAR, "
                "compute_before VARCHAR, compute_after VARCHAR)")
    top = _statement(con, "overlap", "_exposed_top")
    for ranks in tasks:
        inside = ", ".join(map(str, ranks)) or "NULL"
        for t in ("_exposed_islands", "activity_intervals", "comms"):
            con.execute(f"CREATE OR REPLACE VIEW {t} AS SELECT * FROM _all{t} WHERE rank IN ({inside})")
        con.execute(M._AS_TABLE_RE.sub(r"CREATE OR REPLACE TEMP VIEW \1 AS", top))
        con.execute("INSERT INTO _tasks SELECT * FROM _exposed_top")
    for t in ("_exposed_islands", "activity_intervals", "comms"):
        con.execute(f"DROP VIEW {t}")
        con.execute(f"ALTER TABLE _all{t} RENAME TO {t}")
    con.execute("DROP VIEW _exposed_top")
    con.execute("ALTER TABLE _tasks RENAME TO _exposed_top")


@pytest.mark.parametrize("seed, tasks", [(0, None), (1, None), (2, [[0], [1, 2], [3, 4, 5]]), (3, [[0, 2, 4], [1, 3, 5]]),
                                         (4, [[r] for r in range(6)])])
def test_exposed_comm_same_rows_as_ranking_every_interval(seed, tasks):
    """tasks: None, every rank in one connection; else the map's tasks (lists of ranks)."""
    rnd = random.Random(seed)
    con = duckdb.connect()
    con.execute("SET threads = 1")  # tiny tables: threads only cost here
    _data(con, rnd)
    con.execute("SET VARIABLE exposed_context_max_ns = 5")
    con.execute(_statement(con, "exposed", "exposed_intervals"))
    con.execute(REFERENCE.read_text())
    n_islands = con.execute("SELECT count(*) FROM _exposed_islands").fetchone()[0]
    assert con.execute("SELECT count(*) FROM exposed_intervals").fetchone()[0] == n_islands  # every one
    for top in (0, 1, 3, 100):
        con.execute(f"SET VARIABLE exposed_top = {top}")
        for kind in {k for (k,) in con.execute("SELECT table_type FROM information_schema.tables "
                                                "WHERE table_name = '_exposed_top'").fetchall()}:
            con.execute(f"DROP {'VIEW' if kind == 'VIEW' else 'TABLE'} _exposed_top")
        if tasks is None:
            con.execute(M._AS_TABLE_RE.sub(r"CREATE OR REPLACE TEMP VIEW \1 AS", _statement(con, "overlap", "_exposed_top")))
        else:
            _by_tasks(con, tasks)
        con.execute(M._AS_TABLE_RE.sub(r"CREATE OR REPLACE TEMP VIEW \1 AS", _statement(con, "overlap", "exposed_comm")))
        rows = con.execute("SELECT count(*) FROM exposed_comm").fetchone()[0]
        assert rows == min(top, con.execute("SELECT count(*) FROM _exposed_islands WHERE run = 'a'").fetchone()[0]) \
            + min(top, con.execute("SELECT count(*) FROM _exposed_islands WHERE run = 'b'").fetchone()[0])
        diff = sum(con.execute(f"SELECT count(*) FROM (SELECT * FROM {x} EXCEPT ALL SELECT * FROM {y})").fetchone()[0]
                   for x, y in (("exposed_comm", "_ref_exposed_comm"), ("_ref_exposed_comm", "exposed_comm")))
        assert diff == 0, (seed, top)
        # a task keeps at most exposed_top candidates of a run: the reduce reads that many a task
        most = con.execute("SELECT max(n) FROM (SELECT count(*) AS n FROM _exposed_top GROUP BY run)").fetchone()[0]
        assert most is None or most <= top * len(tasks or [0])
