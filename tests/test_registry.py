"""The analyses registry (traceanalyzer/analyses/registry.py): one record per analysis, read by
analyze, save, the CLI's --only and schema, Session.analyses, schema.RESULTS and the docs."""
from __future__ import annotations

import json

import pytest
from conftest import ROOT, ingest_runs

import traceanalyzer as ta
from traceanalyzer import schema as S
from traceanalyzer.analyses import modules as M
from traceanalyzer.analyses import registry as R
from traceanalyzer.analyses import results


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return ingest_runs(tmp_path_factory, "registry", ["ddp_gloo_2rank"])


#: a tiny analysis of its own: one SQL file (reading a package module and a parameter) + one record
_SQL = """-- Test analysis: events per rank, and how many of its collectives it arrived last at.
--
-- requires: collectives
CREATE OR REPLACE TEMP VIEW _my_events AS
SELECT run, rank, count(*)::BIGINT AS n_events FROM events GROUP BY ALL;

CREATE OR REPLACE TEMP VIEW my_rank_events AS
SELECT e.run, e.rank, e.n_events,
       (SELECT count(*) FROM collective_instances c WHERE c.run = e.run AND c.last_arriver = e.rank
        AND c.arrival_skew_ns >= getvariable('straggler_min_delay_ns'))::BIGINT AS n_last
FROM _my_events e;
"""


def test_one_sql_file_and_one_record_make_an_analysis(small, tmp_path, run_cli):
    sql = tmp_path / "my_module.sql"
    sql.write_text(_SQL)
    record = R.Analysis("my_rank_events", "my_rank_events", "run, rank", "events per rank (a test analysis)",
                        R.columns([("run", R.STR, "", "run name"), ("rank", R.I32, "", "global rank"),
                                   ("n_events", R.I64, "", "events"), ("n_last", R.I64, "", "collectives last at")]),
                        sql_file=sql)
    R.register(record)
    try:
        assert record.module == "my_module" and "straggler_min_delay_ns" in record.params
        assert "my_rank_events" in ta.open(small).analyses() and "my_rank_events" in S.RESULTS
        assert "my_rank_events" in results.QUERIES
        # analyze (the CLI's --only) computes and saves it; the store shows it as a result view
        code, out, err = run_cli("analyze", small, "--only", "my_rank_events,stragglers", "--json")
        assert code == 0, err
        rows = json.loads(out)["results"]["my_rank_events"]
        assert [r["rank"] for r in rows] == [0, 1] and all(r["n_events"] > 1000 for r in rows)
        assert list(rows[0]) == ["run", "rank", "n_events", "n_last"]
        saved = ta.open(small).execute("SELECT rank, n_events FROM result_my_rank_events ORDER BY rank").fetchall()
        assert [(r["rank"], r["n_events"]) for r in rows] == saved
        # the schema listing and the docs table list it
        code, out, _ = run_cli("schema")
        assert "## my_rank_events" in out and "| n_last | int64 |  | collectives last at |" in out
        assert "`my_rank_events` | `my_rank_events` (my_module.sql)" in R.docs_table()
        # a record whose columns disagree with its view is an error, not a wrong table
        R.unregister("my_rank_events")
        R.register(R.Analysis("my_rank_events", "my_rank_events", "run, rank", "wrong columns",
                              R.columns([("run", R.STR, "", "run name")]), sql_file=sql))
        with pytest.raises(ta.TraceAnalyzerError, match="returned columns"):
            results.analyze(small, only=["my_rank_events"], save_results=False)
    finally:
        R.unregister("my_rank_events")
    assert "my_rank_events" not in S.RESULTS and "my_module" not in M.modules()
    assert "my_rank_events" not in ta.open(small).analyses()


def test_a_name_is_registered_once():
    with pytest.raises(ta.TraceAnalyzerError, match="registered already"):
        R.register(R.get("stragglers"))


def test_every_record_names_a_view_its_columns_and_help():
    for a in R.analyses():
        assert a.help and a.columns and (a.view is None) == (a.producer is not None), a.name
        if a.view:
            assert a.module in M.modules(), a.name
        assert [c.name for c in a.columns] == S.RESULTS[a.name].column_names


def test_the_docs_table_is_the_registry():
    """docs/analyses.md holds the table the registry makes (regenerate: R.docs_table())."""
    text = (ROOT / "docs" / "analyses.md").read_text()
    assert R.docs_table() in text
