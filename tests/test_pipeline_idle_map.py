"""pipeline_idle's per-rank part made by the map (issue 17): each rank's gaps, the islands of its own
sends and receives and their sums per step come from the saved rank views (pipeline_gaps.sql); the
reduce adds the collectives' waits to the gaps they fall in. pipeline_idle, pipeline_bubbles and
pipeline_stall_causes give, row for row and type for type, what the old SQL
(tests/reference/pipeline_idle.sql) gives over every rank's rows in one connection."""
from __future__ import annotations

from conftest import ROOT, ingest_runs

#: PP x DP (GPipe 2 x 2) as an op timeline: stalls on sends, receives and the replicas' all-reduces, some in one gap
RUNS = ("pp_gpipe_2x2_dp_optimeline_slow1",)
VIEWS = {"pipeline_idle": "_ref_pipeline_idle", "pipeline_bubbles": "_ref_pipeline_bubbles",
         "pipeline_stall_causes": "_ref_pipeline_stall_causes"}
PARTS = {"_pipeline_gaps", "_pipeline_gap_spans", "_pipeline_p2p_islands", "_pipeline_idle_sums"}


def _rows(con, view: str) -> tuple:
    types = [t for _, t, *_ in con.execute(f"DESCRIBE {view}").fetchall()]
    return types, sorted(con.execute(f"SELECT * FROM {view}").fetchall(), key=repr)


def test_map_parts_give_the_old_pipeline_views(tmp_path_factory, monkeypatch):
    from traceanalyzer.analyses import connect, prepare
    from traceanalyzer.analyses import modules as M
    from traceanalyzer.analyses import summaries as sm
    from traceanalyzer.analyses.results import effective_params
    store = ingest_runs(tmp_path_factory, "pipeline_idle_map", RUNS, workers=1)
    runs, params = sorted(RUNS), effective_params({})
    monkeypatch.setattr(sm, "MAP_TASK_EVENTS_BYTES", 1)        # one map task a rank
    assert PARTS <= set(sm.saved_views())
    assert sm.ensure(store, runs, params) == runs

    con = connect(store)                                     # the reduce: the saved parts, no events
    assert PARTS <= set(sm.attach(con, store, runs, params))
    M.bind(con, M.modules_for(["pipeline_bubbles", "pipeline_stall_causes"]))
    bound = {t for (t,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE temporary").fetchall()}
    assert "pipeline_idle" not in bound                      # the analyses read the sums, not every gap
    M.bind(con, M.modules_for(list(VIEWS)))
    made = {t for (t,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE temporary").fetchall()}
    assert not made & (PARTS | {"activity_segments"})
    new = {v: _rows(con, v) for v in VIEWS}
    # the gaps where a collective wait and a send or receive both fall, merged again in the reduce
    merged = con.execute("SELECT count(*) FROM _pipeline_touched WHERE p2p_stall_ns > 0").fetchone()[0]
    con.close()

    ref = connect(store)                                     # the old SQL over every rank's rows
    prepare(ref, modules=[], **params)
    M.bind(ref, M.modules_for(["activity_segments", "_aligned_steps", "pipeline_stages", "pipeline_shape",
                               "collective_instances", "clock_offsets", "_interval_islands"]))
    for statement in ref.extract_statements((ROOT / "tests" / "reference" / "pipeline_idle.sql").read_text()):
        ref.execute(statement)
    old = {v: _rows(ref, r) for v, r in VIEWS.items()}
    ref.close()

    assert new == old
    idle = new["pipeline_idle"][1]
    assert {r[0] for r in idle} == set(runs) and merged > 0
    assert {r[4] for r in idle} == {"stall", "other"}         # an op timeline's steps start and end computing
    assert any(r[10] > 0 for r in new["pipeline_bubbles"][1])  # stall_ns
