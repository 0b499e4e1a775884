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
    """docs/analyses.md holds the analyses table and the settings the code makes (regenerate them
    with registry.update_docs)."""
    text = (ROOT / "docs" / "analyses.md").read_text()
    assert R.docs_table() in text and R.update_docs(text) == text


#: numbers an SQL module may spell: arithmetic (halves, percent), unit conversions (µs, ms), keys
#: that pack (rank, window, hop) into one number, the p95 column, and HTA's fixed rules in
#: hta_compat.sql (bit masks of its kernel types, rounding digits). A threshold is a setting.
_STRUCTURAL = {"0", "1", "2", "1.0", "2.0", "100", "100.0", "1000", "1000.0", "1e6", "1e-6", "1000000", "0.95"}
_HTA_RULES = {"3", "4", "7", "8"}


def test_sql_spells_no_threshold():
    import re
    found = {}
    for name, mod in M.modules().items():
        text = re.sub(r"--[^\n]*", "", mod.text)
        text = re.sub(r"'(?:[^']|'')*'", "''", text)      # string literals (regexes, formats)
        nums = set(re.findall(r"(?<![\w.])(\d+(?:\.\d+)?(?:e-?\d+)?)(?![\w.])", text))
        allowed = _STRUCTURAL | (_HTA_RULES if name == "hta_compat" else set())
        if nums - allowed:
            found[name] = sorted(nums - allowed)
    assert not found, f"numbers in SQL that should be settings (analyses/params.py): {found}"


def test_every_sql_parameter_is_a_documented_setting():
    import re

    from traceanalyzer.analyses import PARAMETERS
    from traceanalyzer.analyses.params import SETTINGS
    used = {p for m in M.modules().values() for p in re.findall(r"getvariable\('(\w+)'\)", m.text)}
    used |= {p for a in R.analyses() for p in re.findall(r"getvariable\('(\w+)'\)", a.where)}
    internal = {"hta_disable_ns_rounding"}   # set by the hta_* wrappers from their ns_rounding argument
    assert used - internal <= set(PARAMETERS), used - internal - set(PARAMETERS)
    assert set(PARAMETERS) - used == set(), "settings no SQL reads"
    for s in SETTINGS.values():
        assert s.help and s.scope in ("sql", "nccl_join", "diff", "report") and s.default is not None, s


def test_join_and_report_thresholds_come_from_the_settings(run_cli):
    from traceanalyzer.analyses.nccl_join import JoinParams
    from traceanalyzer.analyses.params import SETTINGS
    from traceanalyzer.report import findings, whatif
    assert JoinParams().min_score == SETTINGS["nccl_join_min_score"].default
    assert findings.EXPOSED_COMM_MIN_PCT == SETTINGS["exposed_comm_min_pct"].default
    assert whatif.REPLAY_MIN_PCT == SETTINGS["replay_min_pct"].default
    code, out, _ = run_cli("schema")
    assert code == 0 and all(f"| {name} |" in out for name in SETTINGS)


def test_views_are_public_or_private():
    """Every view or macro of the SQL modules is a result view, a listed building block, or private
    (a leading underscore); every public one exists."""
    defined = {v for m in M.modules().values() for v in m.defines}
    public = set(R.public_views())
    assert public <= defined, public - defined
    assert {v for v in defined - public if not v.startswith("_")} == set()


def test_one_interval_union_in_sql_and_python():
    """intervals.sql's macro and replay's merge_intervals give the same union on random intervals
    (overlapping, touching, nested, equal), per group."""
    import duckdb
    import numpy as np

    from traceanalyzer.replay.graph import merge_intervals
    rng = np.random.default_rng(7)
    lo = rng.integers(0, 3000, 400)
    iv = np.column_stack([lo, lo + rng.integers(0, 15, 400)])
    grp = rng.integers(0, 3, 400)
    con = duckdb.connect()
    for statement in con.extract_statements(M.modules()["intervals"].text):
        con.execute(statement)
    con.execute("CREATE TABLE t (grp INTEGER, lo_ns BIGINT, hi_ns BIGINT)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?)", [(int(g), int(a), int(b)) for g, (a, b) in zip(grp, iv)])
    for g in range(3):
        sql = con.execute("SELECT lo_ns, hi_ns FROM _union_intervals(t) WHERE grp = ? ORDER BY lo_ns", [g]).fetchall()
        py = merge_intervals(iv[grp == g])
        assert sql == [tuple(map(int, r)) for r in py] and len(py) > 5
    # touching intervals join, a gap of 1 ns does not
    assert merge_intervals(np.array([[0, 5], [5, 7], [8, 9]])).tolist() == [[0, 7], [8, 9]]
