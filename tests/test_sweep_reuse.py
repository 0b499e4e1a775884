"""Issue 17: the activity sweep and pipeline_idle's gaps, made cheaper, give the same rows, to the bit,
as the SQL they replaced (the specs here), on random intervals with unknown (NULL) steps, steps that
overlap (by one ns, or nested), touch or lie apart, zero-length and reversed intervals, several runs,
ranks and windows:

- ``activity_segments``: one running sum over all partitions instead of a partitioned one;
- ``_activity_window_sums``: each one-step island's step sums (``_activity_steps``) reused, only
  islands of overlapping steps swept again, instead of a second sweep of every interval;
- ``pipeline_idle``'s idle gaps: one running max over the busy segments instead of islands + lead.
"""
from __future__ import annotations

import random

import duckdb
import pytest
from conftest import TRACES

import traceanalyzer as ta
from traceanalyzer.analyses import modules as M

#: the sweep before issue 17 (session 16): a partitioned running sum, every interval swept twice
SPEC_SWEEP = """
CREATE MACRO spec_sweep(per_step) AS TABLE
WITH deltas AS (
    SELECT run, rank, window_id, CASE WHEN per_step THEN step END AS step, lo_ns AS t,
           (category = 'compute')::INT AS d_compute, (category = 'comm')::INT AS d_comm, (category = 'memory')::INT AS d_memory
    FROM activity_intervals
    UNION ALL
    SELECT run, rank, window_id, CASE WHEN per_step THEN step END, hi_ns,
           -(category = 'compute')::INT, -(category = 'comm')::INT, -(category = 'memory')::INT
    FROM activity_intervals
),
merged AS (
    SELECT run, rank, window_id, step, t, sum(d_compute) AS d_compute, sum(d_comm) AS d_comm, sum(d_memory) AS d_memory
    FROM deltas GROUP BY ALL
),
running AS (
    SELECT run, rank, window_id, step, t AS lo_ns,
           lead(t) OVER w AS hi_ns,
           CAST(sum(d_compute) OVER w AS BIGINT) AS n_compute, CAST(sum(d_comm) OVER w AS BIGINT) AS n_comm,
           CAST(sum(d_memory) OVER w AS BIGINT) AS n_memory
    FROM merged
    WINDOW w AS (PARTITION BY run, rank, window_id, step ORDER BY t ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
)
SELECT run, rank, window_id, step, lo_ns, hi_ns, hi_ns - lo_ns AS dur_ns,
       CASE WHEN n_compute > 0 THEN 'compute' WHEN n_comm > 0 THEN 'comm' WHEN n_memory > 0 THEN 'memory'
            ELSE 'idle' END AS label,
       n_compute, n_comm, n_memory
FROM running WHERE hi_ns IS NOT NULL AND hi_ns > lo_ns
"""

#: pipeline_idle's gaps before issue 17: the busy segments merged into islands, gaps from lead()
SPEC_GAPS = """
WITH busy_keyed AS (SELECT {'run': run, 'rank': rank, 'step': step} AS grp, * FROM busy),
islands AS (
    SELECT run, rank, step, any_value(s0) AS s0, any_value(s1) AS s1, island, min(lo_ns) AS lo_ns, max(hi_ns) AS hi_ns
    FROM _interval_islands(busy_keyed) GROUP BY run, rank, step, island
),
gaps AS (
    SELECT run, rank, step, 'warmup' AS kind, s0 AS lo_ns, min(lo_ns) AS hi_ns FROM islands GROUP BY run, rank, step, s0
    UNION ALL
    SELECT run, rank, step, 'cooldown', max(hi_ns), s1 FROM islands GROUP BY run, rank, step, s1
    UNION ALL
    SELECT run, rank, step, 'gap', hi_ns, next_lo FROM (
        SELECT *, lead(lo_ns) OVER (PARTITION BY run, rank, step ORDER BY lo_ns) AS next_lo FROM islands)
    WHERE next_lo IS NOT NULL AND next_lo > hi_ns
)
SELECT * FROM gaps ORDER BY ALL
"""


def _window_sums(con) -> list[tuple]:
    """What overlap_ranks and temporal_ranks read of the window's sweep, added up here in Python from
    the spec's segments: per window, its first and last end, the time communication was active, with
    compute too, and the time of each label."""
    out = {}
    for run, rank, win, _, lo, hi, dur, label, n_compute, n_comm, _ in con.execute("SELECT * FROM spec_sweep(false)").fetchall():
        w = out.setdefault((run, rank, win), [lo, hi, 0, 0, 0, 0, 0, 0])
        w[0], w[1] = min(w[0], lo), max(w[1], hi)
        w[2] += dur if n_comm > 0 else 0
        w[3] += dur if n_comm > 0 and n_compute > 0 else 0
        w[4 + ("compute", "comm", "memory", "idle").index(label)] += dur
    return sorted(k + tuple(v) for k, v in out.items())


def _intervals(rnd: random.Random) -> list[tuple]:
    rows = []
    for run in ("a", "b"):
        for rank in range(rnd.randrange(1, 4)):
            for window in range(rnd.randrange(1, 3)):
                t = rnd.randrange(0, 50)
                for step in [None, *range(rnd.randrange(1, 6))]:
                    # steps apart, touching, overlapping by 1 ns, or nested in the previous one
                    t += rnd.choice([5, 0, -1, -rnd.randrange(1, 30)])
                    start = t
                    for _ in range(rnd.randrange(1, 8)):
                        lo = start + rnd.randrange(0, 20)
                        dur = rnd.choice([rnd.randrange(1, 15), rnd.randrange(1, 15), 0, -2])
                        rows.append((run, rank, window, step, rnd.choice(["compute", "comm", "memory"]), lo, lo + dur))
                        t = max(t, lo + dur)
    return rows


def _same(con, a: str, b: str) -> int:
    """Rows in one query and not the other (either way, duplicates counted); the types must match."""
    ta = [r[1] for r in con.execute(f"DESCRIBE {a}").fetchall()]
    tb = [r[1] for r in con.execute(f"DESCRIBE {b}").fetchall()]
    assert ta == tb
    return sum(con.execute(f"SELECT count(*) FROM ({x} EXCEPT ALL {y})").fetchone()[0] for x, y in ((a, b), (b, a)))


@pytest.mark.parametrize("seed", range(3))
def test_sweep_same_rows_as_the_partitioned_sweep_of_every_interval(seed):
    rnd = random.Random(seed)
    con = duckdb.connect()
    con.execute("CREATE TABLE activity_intervals (run VARCHAR, rank INTEGER, window_id INTEGER, step INTEGER, "
                "category VARCHAR, lo_ns BIGINT, hi_ns BIGINT)")
    con.executemany("INSERT INTO activity_intervals VALUES (?, ?, ?, ?, ?, ?, ?)", _intervals(rnd))
    text = M.modules()["activity"].text
    for statement in con.extract_statements(text):
        # (_activity_ops reads the names, which these intervals have not)
        if "VIEW activity_intervals" not in statement.query and "VIEW _activity_ops" not in statement.query:
            con.execute(statement)
    con.execute(SPEC_SWEEP)
    # the data has what each path takes: steps alone (reused) and overlapping steps (swept again)
    spans = """SELECT run, rank, window_id, step, least(min(lo_ns), min(hi_ns)) AS t0, greatest(max(lo_ns), max(hi_ns)) AS t1
               FROM activity_intervals GROUP BY ALL"""
    overlapping = con.execute(f"""WITH s AS ({spans}) SELECT count(*) FROM s a JOIN s b USING (run, rank, window_id)
                                  WHERE a.step IS DISTINCT FROM b.step AND a.t0 < b.t1 AND b.t0 < a.t1""").fetchone()[0]
    # ... and idle time between islands
    assert overlapping > 0 and con.execute("SELECT count(*) FROM spec_sweep(false) WHERE label = 'idle'").fetchone()[0] > 0
    assert _same(con, "SELECT * FROM activity_segments", "SELECT * FROM spec_sweep(true)") == 0
    # what the view adds up: the sums of the window's sweep, per window
    assert con.execute("SELECT * FROM _activity_window_sums ORDER BY ALL").fetchall() == _window_sums(con)
    # the islands of several steps swept in numpy (what bind makes _activity_several_segments with): the SQL's rows
    from traceanalyzer.analyses import sweep as S
    assert S._swept(con, "np_several", "_activity_several")
    assert con.execute("SELECT count(*) FROM np_several").fetchone()[0] > 0
    assert _same(con, "SELECT * FROM np_several", "SELECT * FROM _activity_several_segments") == 0


def _busy(rnd: random.Random) -> list[tuple]:
    rows = []
    for run in ("a", "b"):
        for rank in range(rnd.randrange(1, 4)):
            for step in [None, *range(rnd.randrange(1, 4))]:
                s0 = rnd.randrange(0, 100)
                t = s0
                for _ in range(rnd.randrange(1, 10)):
                    lo = t + rnd.choice([0, 0, 1, 3, -2])     # touching, apart, overlapping
                    hi = lo + rnd.randrange(1, 6)
                    rows.append((run, rank, step, s0, s0 + 60, lo, hi))
                    t = max(t, hi) if rnd.random() < 0.7 else lo + 1  # sometimes nested
    return rows


@pytest.mark.parametrize("seed", range(3))
def test_pipeline_gaps_same_rows_as_islands(seed):
    rnd = random.Random(seed)
    con = duckdb.connect()
    con.execute("CREATE TABLE busy (run VARCHAR, rank INTEGER, step INTEGER, s0 BIGINT, s1 BIGINT, lo_ns BIGINT, hi_ns BIGINT)")
    con.executemany("INSERT INTO busy VALUES (?, ?, ?, ?, ?, ?, ?)", _busy(rnd))
    for statement in con.extract_statements(M.modules()["intervals"].text):
        con.execute(statement)
    text = M.modules()["pipeline_gaps"].text
    start = text.index("ordered AS (")
    body = text[start:text.index("\nSELECT * FROM gaps;", start)].rstrip().rstrip(",")
    new = f"WITH {body} SELECT * FROM gaps ORDER BY ALL"
    assert con.execute(new).fetchall() == con.execute(SPEC_GAPS).fetchall()
    assert con.execute(f"SELECT count(*) FROM ({new}) WHERE kind = 'gap'").fetchone()[0] > 0


# -- the sweep in numpy (analyses/sweep.py), what bind makes activity_segments with -------------------

def _arrow(con, query: str):
    return con.sql(query).to_arrow_table()


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("pack_limit", [1 << 21, 0], ids=["packed", "three-sums"])
def test_numpy_sweep_same_rows_as_the_sql(seed, pack_limit):
    """sweep.sweep gives the SQL's rows and types, per step and per window, on the random intervals
    above (NULL steps, ties, zero-length and reversed intervals, two runs): with the three running
    counts packed in one int64 (no reversed intervals: they take the other path), and summed one by
    one (pack_limit 0)."""
    from traceanalyzer.analyses import sweep as S
    con = duckdb.connect()
    con.execute("CREATE TABLE activity_intervals (run VARCHAR, rank INTEGER, window_id INTEGER, step INTEGER, "
                "category VARCHAR, lo_ns BIGINT, hi_ns BIGINT)")
    rows = _intervals(random.Random(seed))
    if pack_limit:  # packed counts need none reversed (real intervals have dur_ns > 0); three sums take any
        rows = [r for r in rows if r[6] >= r[5]]
    con.executemany("INSERT INTO activity_intervals VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
    con.execute(SPEC_SWEEP)
    tbl = _arrow(con, "SELECT * FROM activity_intervals")
    for per_step in (True, False):
        out = S.sweep(tbl, per_step, pack_limit=pack_limit)
        name = f"np_rows_{per_step}"
        con.execute("SELECT 1").fetchall()   # _same's fetchone left a result open: register needs none
        con.register(name, out)
        assert _same(con, S._SELECT.format(src=name), f"SELECT * FROM spec_sweep({str(per_step).lower()})") == 0
        assert len(out) > 0


def test_numpy_sweep_leaves_keys_it_cannot_pack_to_the_sql():
    """Partition keys wider than 62 bits together (ranks 2^40 apart) are not packed: sweep says so
    (None), and bind then makes activity_segments with the SQL, the same rows."""
    from traceanalyzer.analyses import sweep as S
    con = duckdb.connect()
    con.execute("CREATE TABLE activity_intervals (run VARCHAR, rank BIGINT, window_id BIGINT, step BIGINT, "
                "category VARCHAR, lo_ns BIGINT, hi_ns BIGINT)")
    con.executemany("INSERT INTO activity_intervals VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [("a", 0, 0, 1, "compute", 0, 10), ("a", 1 << 40, 1 << 30, 1, "comm", 5, 20)])
    assert S.sweep(_arrow(con, "SELECT * FROM activity_intervals"), True) is None
    assert not S.activity_segments(con)


@pytest.mark.parametrize("seed", range(3))
def test_numpy_exposed_islands_same_rows_as_the_sql(seed):
    """sweep.islands (what bind makes _exposed_islands with) gives overlap.sql's rows and types on the
    exposed segments of the random intervals above: touching segments joined, apart ones not, per
    run, rank, window and step (NULL steps included)."""
    from traceanalyzer.analyses import sweep as S
    con = duckdb.connect()
    con.execute("CREATE TABLE activity_intervals (run VARCHAR, rank INTEGER, window_id INTEGER, step INTEGER, "
                "category VARCHAR, lo_ns BIGINT, hi_ns BIGINT)")
    rows = [r for r in _intervals(random.Random(seed)) if r[6] >= r[5]]
    con.executemany("INSERT INTO activity_intervals VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
    con.execute(SPEC_SWEEP)
    con.execute("CREATE TABLE activity_segments AS SELECT * FROM spec_sweep(true)")
    for statement in con.extract_statements(M.modules()["intervals"].text):
        con.execute(statement)
    view = [s.query for s in con.extract_statements(M.modules()["overlap"].text) if "VIEW _exposed_islands" in s.query]
    con.execute(view[0])
    comm = _arrow(con, "SELECT run, rank, window_id, step, lo_ns, hi_ns FROM activity_segments WHERE label = 'comm'")
    con.register("np_islands", S.islands(comm))
    got = ("SELECT CAST(run AS VARCHAR) AS run, CAST(rank AS INTEGER) AS rank, CAST(window_id AS INTEGER) AS window_id, "
           "CAST(step AS INTEGER) AS step, lo_ns, hi_ns, CAST(exposed_ns AS HUGEINT) AS exposed_ns FROM np_islands")
    assert _same(con, got, "SELECT * FROM _exposed_islands") == 0
    joined = con.execute("SELECT count(*) FROM _exposed_islands i WHERE exposed_ns < hi_ns - lo_ns OR "
                         "(SELECT count(*) FROM activity_segments s WHERE s.label = 'comm' AND s.run = i.run AND s.rank = i.rank "
                         " AND s.lo_ns >= i.lo_ns AND s.hi_ns <= i.hi_ns AND s.step IS NOT DISTINCT FROM i.step) > 1").fetchone()[0]
    assert joined > 0   # the data has touching exposed segments, joined into one island


def test_numpy_exposed_islands_leave_overlapping_segments_to_the_sql():
    """Segments of one partition that overlap (never the sweep's) need the SQL's running max: None."""
    from traceanalyzer.analyses import sweep as S
    tbl = duckdb.connect().sql("SELECT * FROM (VALUES ('a', 0, 0, 1, 0::BIGINT, 10::BIGINT), ('a', 0, 0, 1, 5, 20)) "
                               "t(run, rank, window_id, step, lo_ns, hi_ns)").to_arrow_table()
    assert S.islands(tbl) is None
    assert S.islands(tbl.slice(0, 1)).num_rows == 1


@pytest.mark.parametrize("run", ["ddp_gloo_4rank_slow2", "ddp_gloo_cuda_2rank", "pp_gpipe_2x2_dp_optimeline_slow1"])
def test_bind_makes_the_numpy_views_with_the_sqls_rows_on_real_runs(tmp_path, run):
    """On shipped recordings (gloo CPU, GPU kernels, an op timeline), the views bind made in numpy are
    the SQL's rows: activity_segments against _activity_sweep, _exposed_islands against its view."""
    ta.ingest([TRACES / run], tmp_path / "s", run=run, progress=False, workers=1)
    con = ta.open(str(tmp_path / "s"))
    M.bind(con, ["overlap"])
    con.execute("CREATE TEMP TABLE sql_segments AS SELECT * FROM _activity_sweep('activity_intervals', true)")
    view = [s.query for s in con.extract_statements(M.modules()["overlap"].text) if "VIEW _exposed_islands" in s.query][0]
    con.execute(view.replace("CREATE OR REPLACE TEMP VIEW _exposed_islands", "CREATE TEMP VIEW sql_islands"))
    assert con.execute("SELECT count(*) FROM activity_segments").fetchone()[0] > 500
    assert _same(con, "SELECT * FROM activity_segments", "SELECT * FROM sql_segments") == 0
    assert con.execute("SELECT count(*) FROM _exposed_islands").fetchone()[0] > 0
    assert _same(con, "SELECT * FROM _exposed_islands", "SELECT * FROM sql_islands") == 0
    M.bind(con, ["activity"])
    con.execute("CREATE TEMP TABLE sql_several AS SELECT * FROM _activity_sweep('_activity_several', true)")
    assert _same(con, "SELECT * FROM _activity_several_segments", "SELECT * FROM sql_several") == 0


def test_numpy_views_of_no_rows_are_empty_tables_of_the_sqls_types():
    """A connection with no intervals (a rank with no work in the window): both numpy views are made,
    empty, with the SQL's column types."""
    from traceanalyzer.analyses import sweep as S
    con = duckdb.connect()
    con.execute("CREATE TABLE activity_intervals (run VARCHAR, rank INTEGER, window_id INTEGER, step INTEGER, "
                "category VARCHAR, lo_ns BIGINT, hi_ns BIGINT)")
    assert S.activity_segments(con) and S.exposed_islands(con)
    for view, last in (("activity_segments", ("n_memory", "BIGINT")), ("_exposed_islands", ("exposed_ns", "HUGEINT"))):
        assert con.execute(f"SELECT count(*) FROM {view}").fetchone()[0] == 0
        assert con.execute(f"DESCRIBE {view}").fetchall()[-1][:2] == last


# -- pipeline_gaps.sql's _pipeline_p2p_islands in numpy (analyses/pipeline_sweep.py) -----------------

def _gaps_and_calls(rnd: random.Random) -> tuple[list[tuple], list[tuple]]:
    """Per run and rank: disjoint gaps in time order over a few steps (NULL among them), warmup and
    cooldown rows the view must skip, and sends, receives and collectives that start before, inside
    or across gaps, with and without a completion, some ending exactly where a gap does."""
    gaps, calls = [], []
    for run in ("a", "b"):
        for rank in range(rnd.randrange(1, 4)):
            t = rnd.randrange(0, 50)
            edges, spans = [], []
            for step in [None, *range(rnd.randrange(1, 4))]:
                gaps.append((run, rank, step, "warmup", t, t + 3))
                for _ in range(rnd.randrange(0, 5)):
                    t += rnd.randrange(1, 10)
                    hi = t + rnd.randrange(1, 20)
                    gaps.append((run, rank, step, "gap", t, hi))
                    edges.append(hi)
                    spans.append((t, hi))
                    t = hi
                gaps.append((run, rank, step, "cooldown", t, t + 2))
            for _ in range(rnd.randrange(0, 25)):
                op = rnd.choice(["send", "recv", "send", "recv", "all_reduce"])
                lo, dur = rnd.randrange(0, t + 10), rnd.randrange(0, 15)
                if spans and rnd.random() < 0.5:   # short calls inside one gap: islands apart
                    g_lo, g_hi = rnd.choice(spans)
                    lo, dur = rnd.randrange(g_lo, g_hi), rnd.randrange(0, 4)
                end = rnd.choice([None, lo + dur + rnd.randrange(0, 40), rnd.choice(edges or [lo]), lo - 1])
                peer = rnd.randrange(0, 4)
                calls.append((run, rank, op, peer if op == "recv" else None, peer if op == "send" else None, lo, dur, end))
    return gaps, calls


def _sql_islands(con) -> None:
    """The view's SQL (pipeline_gaps.sql) as ``sql_islands`` in ``con``, beside what bind made."""
    view = [s.query for s in con.extract_statements(M.modules()["pipeline_gaps"].text)
            if "VIEW _pipeline_p2p_islands" in s.query][0]
    con.execute(view.replace("CREATE OR REPLACE TEMP VIEW _pipeline_p2p_islands", "CREATE TEMP VIEW sql_islands"))


def _sql_gaps(con) -> None:
    """The view's SQL (pipeline_gaps.sql) as ``sql_gaps`` in ``con``, beside what bind made."""
    view = [s.query for s in con.extract_statements(M.modules()["pipeline_gaps"].text) if "VIEW _pipeline_gaps" in s.query][0]
    con.execute(view.replace("CREATE OR REPLACE TEMP VIEW _pipeline_gaps", "CREATE TEMP VIEW sql_gaps"))


def _p2p_con(gaps, calls, tail):
    con = duckdb.connect()
    con.execute("CREATE TABLE _pipeline_gaps (run VARCHAR, rank INTEGER, step INTEGER, kind VARCHAR, lo_ns BIGINT, hi_ns BIGINT)")
    con.execute("CREATE TABLE comms (run VARCHAR, rank INTEGER, op VARCHAR, src_rank INTEGER, dst_rank INTEGER, "
                "enqueue_ts_ns BIGINT, enqueue_dur_ns BIGINT, end_ts_ns BIGINT)")
    if gaps:
        con.executemany("INSERT INTO _pipeline_gaps VALUES (?, ?, ?, ?, ?, ?)", gaps)
    if calls:
        con.executemany("INSERT INTO comms VALUES (?, ?, ?, ?, ?, ?, ?, ?)", calls)
    if tail is not None:
        con.execute(f"SET VARIABLE p2p_wait_max_tail_ns = {tail}")
    for statement in con.extract_statements(M.modules()["intervals"].text):
        con.execute(statement)
    _sql_islands(con)
    return con


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("tail", [5, None], ids=["tail", "no-tail"])
def test_numpy_p2p_islands_same_rows_as_the_sql(seed, tail):
    """pipeline_sweep.p2p_islands gives the SQL's rows and types on random gaps and calls: sends held
    open past their call (with a next call soon after, or not, or none), receives completing inside or
    after a gap, parts overlapping, touching or apart, NULL steps, two runs, the tail variable set or
    not."""
    from traceanalyzer.analyses import pipeline_sweep as P
    con = _p2p_con(*_gaps_and_calls(random.Random(seed)), tail)
    assert P.pipeline_p2p_islands(con)
    assert con.execute("SELECT count(*) FROM sql_islands").fetchone()[0] > 5
    assert _same(con, "SELECT * FROM _pipeline_p2p_islands", "SELECT * FROM sql_islands") == 0
    several = con.execute("SELECT count(*) FROM (SELECT run, rank, lo_ns FROM sql_islands GROUP BY ALL HAVING count(*) > 1)")
    assert several.fetchone()[0] > 0   # gaps of several islands


def test_numpy_p2p_islands_leave_what_they_cannot_take_to_the_sql():
    """Overlapping gaps of one rank, and a pending call with no duration, are the SQL's: the numpy twin
    declines (False), and bind makes the view from its SQL. No gaps or no calls: an empty table of the
    SQL's types."""
    from traceanalyzer.analyses import pipeline_sweep as P
    call = ("a", 0, "recv", 1, None, 0, 5, 20)
    overlapping = [("a", 0, 1, "gap", 0, 10), ("a", 0, 2, "gap", 5, 15)]
    assert not P.pipeline_p2p_islands(_p2p_con(overlapping, [call], 5))
    assert not P.pipeline_p2p_islands(_p2p_con(overlapping[:1], [call[:6] + (None, 20)], 5))
    con = _p2p_con(overlapping[:1], [call], 5)
    assert P.pipeline_p2p_islands(con)
    assert con.execute("SELECT c_lo, c_hi, src_rank FROM _pipeline_p2p_islands").fetchall() == [(0, 5, 1)]
    for gaps, calls in (([], []), (overlapping[:1], []), ([], [call])):   # nothing to charge: no rows, the SQL's types
        con = _p2p_con(gaps, calls, 5)
        assert P.pipeline_p2p_islands(con)
        assert con.execute("SELECT count(*) FROM _pipeline_p2p_islands").fetchone()[0] == 0
        assert con.execute("DESCRIBE _pipeline_p2p_islands").fetchall() == con.execute("DESCRIBE sql_islands").fetchall()


@pytest.mark.parametrize("run", ["pp_1f1b_4rank_slow2", "pp_interleaved_4rank_slow5", "pp_gpipe_2x2_dp_optimeline_slow1"])
def test_bind_makes_p2p_islands_with_the_sqls_rows_on_real_pipelines(tmp_path, run):
    """On shipped pipeline recordings (1F1B, interleaved, a PP x DP op timeline) the view bind made in
    numpy is the SQL's rows."""
    from traceanalyzer.analyses import prepare
    ta.ingest([TRACES / run], tmp_path / "s", run=run, progress=False, workers=1)
    con = ta.open(str(tmp_path / "s"))
    prepare(con, views=["pipeline_bubbles"])
    _sql_islands(con)
    assert con.execute("SELECT count(*) FROM sql_islands").fetchone()[0] > 20
    assert _same(con, "SELECT * FROM _pipeline_p2p_islands", "SELECT * FROM sql_islands") == 0
    _sql_gaps(con)
    assert con.execute("SELECT count(*) FROM sql_gaps WHERE kind = 'gap'").fetchone()[0] > 20
    assert _same(con, "SELECT * FROM _pipeline_gaps", "SELECT * FROM sql_gaps") == 0   # (numpy too)
    _sql_stalls(con)   # over the SQL's islands: the numpy stalls of the numpy islands are the SQL's of the SQL's
    assert _same(con, "SELECT * FROM _pipeline_p2p_stalls", "SELECT * FROM sql_stalls") == 0
    _sql_idle_sums(con)   # over the views above, each the SQL's rows
    assert con.execute("SELECT count(*) FROM sql_sums WHERE kind IN ('stall', 'other')").fetchone()[0] > 5
    assert _same(con, "SELECT * FROM _pipeline_idle_sums", "SELECT * FROM sql_sums") == 0


# -- pipeline_gaps.sql's _pipeline_gaps in numpy (analyses/pipeline_sweep.py) -------------------------

def _busy(rnd: random.Random, two_spans: bool = False) -> list[tuple]:
    """Busy segments per run, rank and step: overlapping, nested, touching, apart, tied starts, equal
    rows; each step one span (s0, s1) around them, or two (two windows of one aligned step)."""
    rows = []
    for run in ("a", "b"):
        for rank in range(rnd.randrange(1, 4)):
            for step in range(rnd.randrange(1, 4)):
                s0 = rnd.randrange(0, 100) + 1000 * step
                t = s0 + rnd.randrange(0, 5)
                spans = [(s0, s0 + 900)] + ([(s0 - 1, s0 + 950)] if two_spans and step == 0 else [])
                for _ in range(rnd.randrange(1, 12)):
                    lo = t + rnd.choice([0, 0, 1, 5, -3, 20])
                    hi = lo + rnd.randrange(1, 30)
                    rows.append((run, rank, step, *rnd.choice(spans), lo, hi))
                    if rnd.random() < 0.1:
                        rows.append(rows[-1])
                    t = rnd.choice([lo, hi, hi + rnd.randrange(1, 10), hi + rnd.randrange(1, 10)])
    return rows


def _gaps_con(rows):
    con = duckdb.connect()
    con.execute("CREATE TABLE _pipeline_busy (run VARCHAR, rank INTEGER, step INTEGER, s0 BIGINT, s1 BIGINT, "
                "lo_ns BIGINT, hi_ns BIGINT)")
    if rows:
        con.executemany("INSERT INTO _pipeline_busy VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
    _sql_gaps(con)
    return con


@pytest.mark.parametrize("seed", range(6))
def test_numpy_pipeline_gaps_same_rows_as_the_sql(seed):
    """pipeline_sweep.gaps gives the SQL's rows and types: warmup, cooldown and the gaps between the
    merged busy segments of each (run, rank, step)."""
    from traceanalyzer.analyses import pipeline_sweep as P
    con = _gaps_con(_busy(random.Random(seed)))
    assert P.pipeline_gaps(con)
    assert con.execute("SELECT count(*) FROM sql_gaps WHERE kind = 'gap'").fetchone()[0] > 3
    assert _same(con, "SELECT * FROM _pipeline_gaps", "SELECT * FROM sql_gaps") == 0


def test_numpy_pipeline_gaps_leave_two_spans_of_a_step_to_the_sql():
    from traceanalyzer.analyses import pipeline_sweep as P
    assert not P.pipeline_gaps(_gaps_con(_busy(random.Random(1), two_spans=True)))
    con = _gaps_con([])
    assert P.pipeline_gaps(con)
    assert con.execute("SELECT count(*) FROM _pipeline_gaps").fetchone()[0] == 0
    assert con.execute("DESCRIBE _pipeline_gaps").fetchall() == con.execute("DESCRIBE sql_gaps").fetchall()


def test_codes_of_text_and_of_dictionaries_agree():
    """A partition column as text, or as dictionaries (one per chunk, different): equal values get
    equal codes either way (the sweep keeps the run as a dictionary)."""
    import pyarrow as pa

    from traceanalyzer.analyses import sweep as S
    text = pa.chunked_array([pa.array(["a", "b", None]), pa.array(["b", "c"])])
    dicts = pa.chunked_array([pa.array(["a", "b", None]).dictionary_encode(), pa.array(["b", "c"]).dictionary_encode()])
    for col in (text, dicts):
        codes, n = S._codes(col)
        assert n == 4 and codes[1] == codes[3] and len(set(codes.tolist())) == 4


# -- pipeline_gaps.sql's _pipeline_p2p_stalls in numpy (analyses/pipeline_sweep.py) ------------------

def _sql_stalls(con) -> None:
    """The view's SQL (pipeline_gaps.sql) as ``sql_stalls`` in ``con``, over ``sql_islands``."""
    view = [s.query for s in con.extract_statements(M.modules()["pipeline_gaps"].text)
            if "VIEW _pipeline_p2p_stalls" in s.query][0]
    con.execute(view.replace("CREATE OR REPLACE TEMP VIEW _pipeline_p2p_stalls", "CREATE TEMP VIEW sql_stalls")
                .replace("FROM _pipeline_p2p_islands", "FROM sql_islands"))


@pytest.mark.parametrize("seed", range(4))
def test_numpy_p2p_stalls_same_rows_as_the_sql(seed):
    """pipeline_sweep.p2p_stalls gives the SQL's rows and types on random islands (gaps of one island or
    several, ties of the longest island between peers, NULL steps, two runs), whatever their order."""
    from traceanalyzer.analyses import pipeline_sweep as P
    con = _p2p_con(*_gaps_and_calls(random.Random(seed)), 5)
    assert P.pipeline_p2p_islands(con)
    _sql_stalls(con)
    con.execute("CREATE TABLE shuffled AS SELECT * FROM sql_islands ORDER BY hash(c_lo, c_hi, src_rank)")
    con.execute("CREATE OR REPLACE VIEW _pipeline_p2p_islands AS SELECT * FROM shuffled")
    assert P.pipeline_p2p_stalls(con)
    assert con.execute("SELECT count(*) FROM sql_stalls").fetchone()[0] > 5
    assert _same(con, "SELECT * FROM _pipeline_p2p_stalls", "SELECT * FROM sql_stalls") == 0
    assert con.execute("DESCRIBE _pipeline_p2p_stalls").fetchall() == con.execute("DESCRIBE sql_stalls").fetchall()


def test_numpy_p2p_stalls_ties_and_no_rows():
    """Two islands of one gap equally long: the lower peer; no islands: an empty table of the SQL's types."""
    from traceanalyzer.analyses import pipeline_sweep as P
    con = duckdb.connect()
    con.execute("CREATE TABLE sql_islands (run VARCHAR, rank INTEGER, step INTEGER, lo_ns BIGINT, hi_ns BIGINT, "
                "c_lo BIGINT, c_hi BIGINT, src_rank INTEGER, part_ns BIGINT)")
    _sql_stalls(con)
    con.execute("CREATE VIEW _pipeline_p2p_islands AS SELECT * FROM sql_islands")
    assert P.pipeline_p2p_stalls(con)
    assert con.execute("SELECT count(*) FROM _pipeline_p2p_stalls").fetchone()[0] == 0
    assert con.execute("DESCRIBE _pipeline_p2p_stalls").fetchall() == con.execute("DESCRIBE sql_stalls").fetchall()
    con.execute("INSERT INTO sql_islands VALUES ('a', 0, 1, 0, 10, 0, 3, 7, 3), ('a', 0, 1, 0, 10, 5, 8, 2, 3), "
                "('a', 0, 1, 20, 30, 20, 40, 4, 20)")
    assert P.pipeline_p2p_stalls(con)
    got = con.execute("SELECT lo_ns, src_rank, stall_ns FROM _pipeline_p2p_stalls ORDER BY lo_ns").fetchall()
    assert got == con.execute("SELECT lo_ns, src_rank, stall_ns FROM sql_stalls ORDER BY lo_ns").fetchall() == [(0, 2, 6), (20, 4, 10)]
    # one span as the gap of two steps, their rows interleaved (the SQL's islands of overlapping gaps)
    con.execute("DELETE FROM sql_islands")
    con.execute("INSERT INTO sql_islands VALUES ('a', 0, 1, 0, 10, 0, 2, 7, 2), ('a', 0, 2, 0, 10, 0, 5, 3, 5), "
                "('a', 0, 1, 0, 10, 4, 6, 8, 2)")
    assert P.pipeline_p2p_stalls(con)
    got = con.execute("SELECT step, src_rank, stall_ns FROM _pipeline_p2p_stalls ORDER BY step").fetchall()
    assert got == con.execute("SELECT step, src_rank, stall_ns FROM sql_stalls ORDER BY step").fetchall() == [(1, 7, 4), (2, 3, 5)]


# -- pipeline_gaps.sql's _pipeline_idle_sums in numpy (analyses/pipeline_sweep.py) -------------------

def _sql_idle_sums(con) -> None:
    """The view's SQL (pipeline_gaps.sql) as ``sql_sums`` in ``con``."""
    view = [s.query for s in con.extract_statements(M.modules()["pipeline_gaps"].text)
            if "VIEW _pipeline_idle_sums" in s.query][0]
    con.execute(view.replace("CREATE OR REPLACE TEMP VIEW _pipeline_idle_sums", "CREATE TEMP VIEW sql_sums"))


@pytest.mark.parametrize("seed", range(4))
def test_numpy_idle_sums_same_rows_as_the_sql(seed):
    """pipeline_sweep.idle_sums gives the SQL's rows and types from random gaps and their stalls
    (warmup and cooldown of zero length, gaps with no stall, stalls of several peers, NULL steps whose
    gaps the SQL's join leaves whole, gaps of two steps with one span)."""
    from traceanalyzer.analyses import pipeline_sweep as P
    con = _p2p_con(*_gaps_and_calls(random.Random(seed)), 5)
    assert P.pipeline_p2p_islands(con) and P.pipeline_p2p_stalls(con)
    _sql_idle_sums(con)
    assert P.pipeline_idle_sums(con)
    kinds = dict(con.execute("SELECT kind, count(*) FROM sql_sums GROUP BY kind").fetchall())
    assert kinds.get("stall", 0) > 2 and kinds.get("other", 0) > 2 and kinds.get("warmup", 0) > 2
    assert _same(con, "SELECT * FROM _pipeline_idle_sums", "SELECT * FROM sql_sums") == 0


def test_numpy_idle_sums_null_steps_ties_and_no_rows():
    """A NULL step's gap keeps its whole length as 'other' (the SQL's join matches no stall); one span
    that is the gap of two steps is matched per step; no rows: an empty table of the SQL's types."""
    from traceanalyzer.analyses import pipeline_sweep as P
    con = duckdb.connect()
    con.execute("CREATE TABLE _pipeline_gaps (run VARCHAR, rank INTEGER, step INTEGER, kind VARCHAR, lo_ns BIGINT, hi_ns BIGINT)")
    con.execute("CREATE TABLE _pipeline_p2p_stalls (run VARCHAR, rank INTEGER, step INTEGER, lo_ns BIGINT, hi_ns BIGINT, "
                "src_rank INTEGER, stall_ns HUGEINT)")
    _sql_idle_sums(con)
    assert P.pipeline_idle_sums(con)
    assert con.execute("SELECT count(*) FROM _pipeline_idle_sums").fetchone()[0] == 0
    assert con.execute("DESCRIBE _pipeline_idle_sums").fetchall() == con.execute("DESCRIBE sql_sums").fetchall()
    con.execute("INSERT INTO _pipeline_gaps VALUES ('a', 0, NULL, 'gap', 0, 10), ('a', 0, 1, 'gap', 20, 30), "
                "('a', 0, 2, 'gap', 20, 30), ('a', 0, 1, 'warmup', 5, 5), ('a', 0, 2, 'cooldown', 40, 47)")
    con.execute("INSERT INTO _pipeline_p2p_stalls VALUES ('a', 0, NULL, 0, 10, 3, 4), ('a', 0, 1, 20, 30, 3, 10), "
                "('a', 0, 2, 20, 30, 5, 6)")
    assert P.pipeline_idle_sums(con)
    got = con.execute("SELECT step, kind, caused_by_rank, dur_ns FROM _pipeline_idle_sums ORDER BY ALL").fetchall()
    assert got == con.execute("SELECT step, kind, caused_by_rank, dur_ns FROM sql_sums ORDER BY ALL").fetchall()
    assert got == [(1, "stall", 3, 10), (2, "cooldown", None, 7), (2, "other", None, 4), (2, "stall", 5, 6),
                   (None, "other", None, 10), (None, "stall", 3, 4)]
