"""The report's pipeline idle intervals (the timeline figure) come from the run's saved per-rank
summaries once ``analyze`` saved them: the same rows, with every events file emptied."""
from __future__ import annotations

import pyarrow.parquet as pq
from conftest import ingest_runs

RUN = "pp_1f1b_4rank_slow1"


def test_pipeline_idle_read_from_the_saved_summaries(tmp_path_factory):
    from traceanalyzer.analyses import connect
    from traceanalyzer.analyses.results import analyze
    from traceanalyzer.report.load import pipeline_idle
    from traceanalyzer.store import files as st
    store = ingest_runs(tmp_path_factory, "report_intervals", (RUN,), workers=1)
    analyze(store)
    manifest = st.read_manifest(store)
    params = manifest.extra["results"]["stragglers"]["params"]
    con = connect(store)
    from_events = pipeline_idle(con, RUN, params)
    con.close()
    assert len(from_events) > 100 and set(from_events["kind"]) >= {"warmup", "cooldown", "stall"}
    for t in manifest.traces:   # every events file emptied: what reads events now finds none
        f = store / t["files"]["events"]
        pq.write_table(pq.read_schema(f).empty_table(), f)
    con = connect(store)
    try:
        assert pipeline_idle(con, RUN, params, store).equals(from_events)
        assert pipeline_idle(con, RUN, params).empty        # the events path: nothing left to read
    finally:
        con.close()
