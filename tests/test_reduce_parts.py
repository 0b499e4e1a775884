"""The per-rank parts the map makes for the reduce (issue 18 part 4, issue 17): imbalance_ops and
work.sql's _work_ops from the saved ``_activity_ops``, imbalance_steps and imbalance_ranks from the
saved ``_activity_steps``, give, row for row, what the reduce's old SQL
(tests/reference/reduce_parts.sql; for the last three, the view with its old first CTE) gives over every
rank's intervals and segments in one connection."""
from __future__ import annotations

from conftest import ROOT, ingest_runs

#: FSDP on gloo (CPU operators), a GPU run with a slow rank (kernels)
RUNS = ("fsdp_gloo_2rank", "ddp_gloo_cuda_2rank_slow1")
VIEWS = {"imbalance_ops": "_ref_imbalance_ops", "imbalance_steps": "_ref_imbalance_steps",
         "imbalance_ranks": "_ref_imbalance_ranks", "_work_ops": "_ref_work_ops"}
#: the first CTE of these views before it read the map's sums (session 26; analyses/sql at 2b39893):
#: every rank's segments or intervals. The reference view is the view with this CTE in place of its own.
OLD_CTES = {
    "imbalance_steps": """per_rank AS (
    SELECT run, rank, step, sum(dur_ns) FILTER (WHERE n_compute > 0) AS compute_ns
    FROM activity_segments GROUP BY ALL
)""",
    "imbalance_ranks": """per_rank AS (
    SELECT a.run, a.rank, a.step, any_value(p.peers) AS peers,
           sum(a.dur_ns) FILTER (WHERE a.n_compute > 0) AS compute_ns
    FROM activity_segments a JOIN _imbalance_peers p USING (run, rank)
    GROUP BY a.run, a.rank, a.step
)""",
    "_work_ops": """per_step AS (
    SELECT run, step, name, sum(hi_ns - lo_ns) AS ns
    FROM activity_intervals WHERE category = 'compute' AND step IS NOT NULL GROUP BY ALL
)""",
}


def _with_old_cte(view: str) -> str:
    """``view``'s SQL with its first CTE replaced by the old one."""
    from traceanalyzer.analyses import modules as M
    sql = M.select_of(view)
    name = OLD_CTES[view].split(" AS (")[0]
    start = sql.index(f"{name} AS (")
    end = sql.index("\n)", start) + 2
    return sql[:start] + OLD_CTES[view] + sql[end:]


def _rows(con, view: str) -> list[tuple]:
    return sorted(con.execute(f"SELECT * FROM {view}").fetchall(), key=repr)


def test_map_parts_give_the_old_reduce_results(tmp_path_factory, monkeypatch):
    from traceanalyzer.analyses import connect, prepare
    from traceanalyzer.analyses import modules as M
    from traceanalyzer.analyses import summaries as sm
    from traceanalyzer.analyses.results import effective_params
    store = ingest_runs(tmp_path_factory, "reduce_parts", RUNS, workers=1)
    runs, params = sorted(RUNS), effective_params({})
    monkeypatch.setattr(sm, "MAP_TASK_EVENTS_BYTES", 1)        # one map task a rank
    assert {"_activity_ops", "_activity_steps"} <= set(sm.saved_views())
    assert sm.ensure(store, runs, params) == runs

    con = connect(store)                                     # the reduce: the saved parts, no events
    assert {"_activity_ops", "_activity_steps"} <= set(sm.attach(con, store, runs, params))
    M.bind(con, M.modules_for(list(VIEWS)))
    made = {t for (t,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE temporary").fetchall()}
    assert not made & {"_activity_ops", "_activity_steps", "activity_intervals", "activity_segments"}
    new = {v: _rows(con, v) for v in VIEWS}
    # not saved (no view of the reduce reads it), yet still there to query: a view over the events
    assert "activity_intervals" not in sm.saved_views()
    assert not list((store / sm.FOLDER).glob("activity_intervals"))
    intervals = _rows(con, "activity_intervals")
    con.close()

    ref = connect(store)                                     # the old SQL over every rank's events
    prepare(ref, modules=[], **params)
    M.bind(ref, M.modules_for(["activity_segments", "_same_work", "step_phases"]))
    for statement in ref.extract_statements((ROOT / "tests" / "reference" / "reduce_parts.sql").read_text()):
        ref.execute(statement)
    for view in OLD_CTES:
        ref.execute(f"CREATE TEMP VIEW {VIEWS[view]} AS {_with_old_cte(view)}")
    old = {v: _rows(ref, r) for v, r in VIEWS.items()}
    assert intervals == _rows(ref, "activity_intervals") and intervals
    ref.close()

    for v in VIEWS:
        assert new[v] == old[v], v
    ops = new["imbalance_ops"]
    assert {r[0] for r in ops} == set(runs) and {r[1] for r in ops} == {"compute", "comm", "memory"}
    assert any(r[8] > 0 for r in ops)                        # some op unevenly spent (excess_ns_per_step)
