"""Issue 18 (driver memory): the reduce of ``analyze`` caps its DuckDB memory
(summaries.REDUCE_MEMORY_BYTES) and spills to a work folder of the store; the cap is a setting of
the reduce's own connection (nothing process-global), the folder goes with the connection, and the
results under a cap are the results without one. (That a capped reduce spills instead of growing is
measured at 128-1,024 ranks by benchmarks/reduce_memory.py: a run small enough for a test needs
less than DuckDB's floor of ~32 MB, below which it fails rather than spills.)"""
from __future__ import annotations

import gc

import duckdb
import pytest
from conftest import ingest_runs

RUN = "ddp_gloo_4rank_slow2"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return ingest_runs(tmp_path_factory, "reduce_memory", (RUN,), workers=1)


def test_the_reduce_spills_under_its_cap_with_the_same_results(store, monkeypatch):
    from traceanalyzer.analyses import connect
    from traceanalyzer.analyses import summaries as sm
    from traceanalyzer.analyses.results import analyze, compute, effective_params
    first = analyze(store)                     # the map, then the reduce under the default cap
    assert sum(len(d) for d in first.values()) > 100

    con = connect(store)
    assert sm.attach(con, store, [RUN], effective_params({}))
    cap = 64 << 20
    folder = sm.limit_memory(con, store, cap)
    assert folder.parent == store.resolve() and folder.is_dir()
    assert con.execute("SELECT current_setting('memory_limit'), current_setting('temp_directory')").fetchone() \
        == ("64.0 MiB", str(folder))
    other = duckdb.connect()                   # another connection of the process keeps DuckDB's default
    assert other.execute("SELECT current_setting('memory_limit')").fetchone()[0] != "64.0 MiB"
    other.close()
    capped = compute(con)
    con.close()
    del con
    gc.collect()
    assert not folder.exists()                 # the spill folder goes with the connection
    assert [k for k in first if not first[k].equals(capped[k])] == []

    monkeypatch.setattr(sm, "REDUCE_MEMORY_BYTES", 0)   # 0: no cap (DuckDB's default)
    con = connect(store)
    assert sm.limit_memory(con, store) is None
    con.close()


def test_a_cap_too_small_is_raised_not_fatal(store, monkeypatch):
    """Below what DuckDB needs for operators that cannot spill (~16 MB here) the reduce runs out of
    memory: the cap doubles (one warning line each time) and the analyses go on to the same results."""
    from traceanalyzer.analyses import summaries as sm
    from traceanalyzer.analyses.results import analyze
    from traceanalyzer.errors import StoreWarning
    first = analyze(store)
    monkeypatch.setattr(sm, "REDUCE_MEMORY_BYTES", 8 << 20)
    with pytest.warns(StoreWarning, match="ran out of memory under its cap of (8|16) MiB"):
        again = analyze(store)
    assert [k for k in first if not first[k].equals(again[k])] == []


def test_annotation_excess_is_the_median_of_the_other_ranks(store):
    """_user_annotation_excess reads only the middle values of each (step, phase, name) (linear in
    the ranks, where the sorted list joined to every row was quadratic and could not spill): each
    row's others_ns is DuckDB's own median over the other ranks' rows (a self-join, fine at 4 ranks)."""
    from traceanalyzer.analyses import connect, prepare
    con = prepare(connect(store), views=["_user_annotation_excess"])
    try:
        n, wrong = con.execute("""
            WITH ref AS (
                SELECT a.run, a.rank, a.step, a.phase, a.name, median(b.ns) AS others_ns
                FROM _user_annotation_excess a JOIN _user_annotation_excess b
                  ON b.run = a.run AND b.step = a.step AND b.phase = a.phase AND b.name = a.name AND b.rank <> a.rank
                GROUP BY ALL)
            SELECT count(*), count(*) FILTER (WHERE x.others_ns IS DISTINCT FROM r.others_ns
                                              OR x.excess_ns IS DISTINCT FROM x.ns - r.others_ns)
            FROM _user_annotation_excess x JOIN ref r USING (run, rank, step, phase, name)""").fetchone()
        total = con.execute("SELECT count(*) FROM _user_annotation_excess").fetchone()[0]
    finally:
        con.close()
    assert n == total > 50 and wrong == 0
