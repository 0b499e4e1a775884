"""``step_alignment`` finds each window's reference by label propagation and walks from the
references only (linear in the windows); the walk from every window it replaced (the spec here,
quadratic) gives each window the same reference and delta: renumbered windows, several windows per
rank, windows farther apart than ``step_alignment_max_hops`` links, collectives and point-to-point
links. (What follows, the shift by the most common delta of each reference's windows, is unchanged;
where two deltas are equally common either may win, in both versions.)"""
from __future__ import annotations

import random

import duckdb
import pytest

from traceanalyzer.analyses import modules as M

WALK_FROM_EVERY_WINDOW = """
WITH RECURSIVE coll AS (
    SELECT run, coalesce(pg_name, '?') AS pg, seq, rank, window_id, step FROM comms
    WHERE NOT is_p2p AND seq IS NOT NULL AND step IS NOT NULL
),
anchor AS (SELECT run, pg, seq, arg_min(rank::BIGINT * 1000000 + window_id, rank) AS node FROM coll GROUP BY ALL),
p2p AS (
    SELECT run, op, coalesce(pg_name, '?') AS pg, src_rank, dst_rank, tag, p2p_seq, rank, window_id, step FROM comms
    WHERE is_p2p AND op IN ('send', 'recv') AND step IS NOT NULL AND src_rank IS NOT NULL AND dst_rank IS NOT NULL
),
links AS (  -- (window a, window b, d = step on a - step on b) per shared synchronisation point
    SELECT c.run, c.rank AS a_rank, c.window_id AS a_win, b.rank AS b_rank, b.window_id AS b_win, c.step - b.step AS d
    FROM coll c JOIN anchor x USING (run, pg, seq)
    JOIN coll b ON b.run = c.run AND b.pg = c.pg AND b.seq = c.seq AND b.rank::BIGINT * 1000000 + b.window_id = x.node
    WHERE c.rank <> b.rank
    UNION ALL
    SELECT r.run, r.rank, r.window_id, s.rank, s.window_id, r.step - s.step
    FROM p2p r JOIN p2p s ON s.run = r.run AND s.op = 'send' AND s.rank = r.src_rank AND s.pg = r.pg
     AND s.src_rank = r.src_rank AND s.dst_rank = r.dst_rank AND s.tag IS NOT DISTINCT FROM r.tag AND s.p2p_seq = r.p2p_seq
    WHERE r.op = 'recv' AND r.rank = r.dst_rank
),
edges AS (
    SELECT run, a_rank, a_win, b_rank, b_win, mode(d) AS d FROM links GROUP BY ALL
),
both_ways AS (
    SELECT run, a_rank, a_win, b_rank, b_win, d FROM edges
    UNION ALL SELECT run, b_rank, b_win, a_rank, a_win, -d FROM edges
),
nodes AS (SELECT DISTINCT run, rank, window_id FROM steps),
reach(run, root_rank, root_win, rank, window_id, delta, hop) AS (
    SELECT run, rank, window_id, rank, window_id, 0, 0 FROM nodes
    UNION
    SELECT r.run, r.root_rank, r.root_win, e.b_rank, e.b_win, r.delta + e.d, r.hop + 1
    FROM reach r JOIN both_ways e ON e.run = r.run AND e.a_rank = r.rank AND e.a_win = r.window_id
    WHERE r.hop < getvariable('step_alignment_max_hops')
),
component AS (  -- each window's reference: the lowest (rank, window) reaching it, by the shortest walk
    SELECT run, rank, window_id,
           arg_min(delta, (root_rank::BIGINT * 1000000 + root_win) * 1000 + hop) AS delta,
           min(root_rank::BIGINT * 1000000 + root_win) AS root
    FROM reach GROUP BY ALL
),
shifted AS (SELECT *, delta - mode(delta) OVER (PARTITION BY run, root) AS shift FROM component)
SELECT s.run, s.rank, s.window_id, s.step, CAST(s.step + coalesce(x.shift, 0) AS INTEGER) AS aligned_step
FROM steps s LEFT JOIN shifted x USING (run, rank, window_id)"""


def _components(view_sql: str) -> str:
    """The view's SQL up to its per-window reference and delta (the CTE ``component``)."""
    body = view_sql[view_sql.index("WITH RECURSIVE"):view_sql.index("shifted AS (")].rstrip().rstrip(",")
    return body + " SELECT run, rank, window_id, delta, root FROM component ORDER BY ALL"


def _connection(rnd: random.Random, hops: int):
    con = duckdb.connect()
    con.execute(f"SET VARIABLE step_alignment_max_hops = {hops}")
    con.execute("CREATE TABLE steps (run VARCHAR, rank INTEGER, window_id INTEGER, step INTEGER)")
    con.execute("CREATE TABLE comms (run VARCHAR, is_p2p BOOLEAN, op VARCHAR, pg_name VARCHAR, seq BIGINT, "
                "src_rank INTEGER, dst_rank INTEGER, tag BIGINT, p2p_seq BIGINT, rank INTEGER, window_id INTEGER, step INTEGER)")
    steps, comms = [], []
    for run in ("a", "b"):
        n = rnd.randrange(2, 10)
        windows = [(r, w) for r in range(n) for w in range(rnd.choice([1, 1, 2]))]
        # most windows number the iterations as the job does; a few start elsewhere (renumbered)
        offset = {x: (0 if rnd.random() < 0.7 else rnd.choice([3, 100, -2])) for x in windows}
        first = {x: 10 * x[1] for x in windows}  # window w holds iterations 10w .. 10w+3
        for (r, w) in windows:
            steps += [(run, r, w, first[r, w] + i + offset[r, w]) for i in range(4)]
        for it in range(0, 4 if len(windows) > 1 else 0):
            for g in range(rnd.randrange(1, 3)):  # collectives among a random subset (one window per rank)
                members = rnd.sample(windows, rnd.randrange(2, len(windows) + 1))
                members = list({r: (r, w) for r, w in members}.values())
                for (r, w) in members:
                    comms.append((run, False, "all_reduce", f"pg{g}", 100 * it + g, None, None, None, None, r, w,
                                  first[r, w] + it + offset[r, w]))
            if rnd.random() < 0.7:  # a pipeline chain: r -> r+1 point-to-point
                for r in range(n - 1):
                    (a, wa), (b, wb) = (r, 0), (r + 1, 0)
                    s_step, r_step = first[a, wa] + it + offset[a, wa], first[b, wb] + it + offset[b, wb]
                    comms.append((run, True, "send", "pp", None, a, b, 0, it, a, wa, s_step))
                    comms.append((run, True, "recv", "pp", None, a, b, 0, it, b, wb, r_step))
    con.executemany("INSERT INTO steps VALUES (?, ?, ?, ?)", steps)
    con.execute("CREATE TABLE ranks AS SELECT DISTINCT run, rank, NULL::VARCHAR AS trace_meta_json FROM steps")  # Kineto's
    if comms:
        con.executemany("INSERT INTO comms VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", comms)
    return con


#: random stores per setting (each compared row for row with the walk from every window)
TRIALS = 12


@pytest.mark.parametrize("hops", [1, 2, 32])
def test_same_rows_as_walking_from_every_window(hops):
    rnd = random.Random(hops)
    renumbered = 0
    for _ in range(TRIALS):
        con = _connection(rnd, hops)
        got = con.execute(_components(M.modules()["step_alignment"].text)).fetchall()
        assert got == con.execute(_components(WALK_FROM_EVERY_WINDOW)).fetchall()
        M.bind(con, ["step_alignment"])  # and the view itself: one shift per window
        rows = con.execute("SELECT * FROM step_alignment").fetchall()
        shifts = {}
        for run, rank, window, step, aligned in rows:
            shifts.setdefault((run, rank, window), set()).add(aligned - step)
        assert all(len(v) == 1 for v in shifts.values())
        renumbered += sum(step != aligned for _, _, _, step, aligned in rows)
        con.close()
    assert renumbered > 0


#: the links of point-to-point transfers before session 25: every receive joined to its send
LINKS_BY_TRANSFER = """
WITH p2p AS (
    SELECT run, op, coalesce(pg_name, '?') AS pg, src_rank, dst_rank, tag, p2p_seq, rank, window_id, step FROM comms
    WHERE is_p2p AND op IN ('send', 'recv') AND step IS NOT NULL AND src_rank IS NOT NULL AND dst_rank IS NOT NULL
),
links AS (
    SELECT r.run, r.rank AS a_rank, r.window_id AS a_win, s.rank AS b_rank, s.window_id AS b_win, r.step - s.step AS d
    FROM p2p r JOIN p2p s ON s.run = r.run AND s.op = 'send' AND s.rank = r.src_rank AND s.pg = r.pg
     AND s.src_rank = r.src_rank AND s.dst_rank = r.dst_rank AND s.tag IS NOT DISTINCT FROM r.tag AND s.p2p_seq = r.p2p_seq
    WHERE r.op = 'recv' AND r.rank = r.dst_rank
)
SELECT run, a_rank, a_win, b_rank, b_win, d, count(*) AS n FROM links GROUP BY ALL ORDER BY ALL
"""


def _transfers(rnd: random.Random) -> list[tuple]:
    """Sends and receives per channel, window and step, mostly the regular case (each step's
    transfers a contiguous range of p2p_seq, on both sides) and, at random: a send duplicated, one
    side's transfer dropped or numbered as the one before, a NULL p2p_seq, a NULL tag, a second window numbering from 0 again,
    receives recorded on a rank that is not their destination, steps shifted between the sides."""
    rows = []
    for run in ("a", "b"):
        for src, dst in ((0, 1), (1, 2), (2, 1), (1, 0), (3, 0)):
            tag = rnd.choice([0, 0, None])
            for win in range(rnd.randrange(1, 3)):
                seq, shift = 0, rnd.choice([0, 0, 1, -1])
                for step in range(rnd.randrange(1, 5)):
                    for _ in range(rnd.randrange(1, 6)):
                        s_seq = None if rnd.random() < 0.04 else seq - 1 if seq and rnd.random() < 0.05 else seq
                        r_seq = None if rnd.random() < 0.04 else seq
                        send = (run, True, "send", "pp", None, src, dst, tag, s_seq, src, win, step)
                        recv = (run, True, "recv", "pp", None, src, dst, tag, r_seq, dst, win, step + shift)
                        if rnd.random() > 0.04:
                            rows.append(send)
                        if rnd.random() < 0.05:
                            rows.append(send)
                        if rnd.random() > 0.04:
                            rows.append(recv)
                        if rnd.random() < 0.03:
                            rows.append(recv[:9] + (src,) + recv[10:])
                        seq += 1
                    if rnd.random() < 0.1:
                        shift = rnd.choice([0, 1, 2])
    return rows


@pytest.mark.parametrize("seed", range(6))
def test_links_by_group_are_the_links_by_transfer(seed):
    """step_alignment matches a receive group (one window, step and channel) with the send group of the
    same p2p_seq range in one row, and joins the rest transfer by transfer: the links between windows
    (how many of each step difference) and their most common step difference are those of joining
    every receive to its send."""
    con = duckdb.connect()
    con.execute("CREATE TABLE comms (run VARCHAR, is_p2p BOOLEAN, op VARCHAR, pg_name VARCHAR, seq BIGINT, src_rank INTEGER, "
                "dst_rank INTEGER, tag BIGINT, p2p_seq BIGINT, rank INTEGER, window_id INTEGER, step INTEGER)")
    con.executemany("INSERT INTO comms VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", _transfers(random.Random(seed)))
    con.execute("CREATE TABLE ranks AS SELECT DISTINCT run, rank, NULL::VARCHAR AS trace_meta_json FROM comms")
    text = M.modules()["step_alignment"].text
    view = [s.query for s in con.extract_statements(text) if "VIEW step_alignment" in s.query][0]
    body = view[view.index("WITH RECURSIVE"):view.index("\nboth_ways AS")].rstrip().rstrip(",")
    got = con.execute(body + "\nSELECT run, a_rank, a_win, b_rank, b_win, d, sum(n) FROM links GROUP BY ALL ORDER BY ALL").fetchall()
    want = con.execute(LINKS_BY_TRANSFER).fetchall()
    assert got == want and len(want) > 10
    modes = con.execute(f"SELECT run, a_rank, a_win, b_rank, b_win, mode(d ORDER BY d) FROM ({LINKS_BY_TRANSFER}), "
                        "range(n) GROUP BY ALL ORDER BY ALL").fetchall()
    assert con.execute(body + "\nSELECT * FROM edges ORDER BY ALL").fetchall() == modes
    fast = con.execute(body + "\nSELECT count(*) FILTER (WHERE s_rank IS NOT NULL), count(*) FILTER (WHERE s_rank IS NULL) FROM recv_groups")
    matched, other = fast.fetchone()
    assert matched > 0 and other > 0   # both paths taken
