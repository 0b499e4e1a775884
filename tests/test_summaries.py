"""Per-rank summaries (analyses/summaries.py): the scopes the SQL views declare hold, the map/reduce
path gives the one-connection path's results on shipped runs, a second ``analyze`` does not read
events, and the summaries are computed again when the parameters change."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from conftest import ROOT, ingest_runs

sys.path.insert(0, str(ROOT / "benchmarks"))

#: a straggler (gloo DDP), a GPU run, a pipeline with a slow stage, MoE all_to_all skew
PARITY_RUNS = ("ddp_gloo_4rank_slow2", "ddp_gloo_cuda_2rank_slow1", "pp_1f1b_4rank_slow1", "moe_a2a_4rank_skew")


def test_declared_scopes_hold():
    """A rank view reads canonical tables and rank or align views only; an align view never reads
    events; every view of the package is known to the check."""
    from traceanalyzer import schema as S
    from traceanalyzer.analyses import modules as M
    from traceanalyzer.analyses import summaries as sm
    scope = {v: sc for m in M.modules().values() for v, sc in m.scopes}
    macros = {v for m in M.modules().values() for v in m.defines if v not in m.views}
    reads = sm.reads()
    assert M.scoped("rank") and M.scoped("align")
    for view, sc in scope.items():
        others = reads[view] - macros
        if sc in ("rank", "peers"):  # peers: other ranks' rows of a rank view (empty over a whole run)
            assert all(scope.get(v) in ("rank", "align", "peers") for v in others), (view, others)
        else:
            assert all(scope.get(v) == "align" for v in others), (view, others)
            assert "events" not in sm.names_read(view), view
    # cross-rank views that still read events themselves (the reduce reads them from the store)
    cross_events = {v for v in reads if v not in scope and v not in macros and "events" in sm.names_read(v)}
    assert cross_events == {"_hta_files", "_hta_rows"}, cross_events
    assert set(S.TABLES) >= {"events", "comms", "steps"}
    with pytest.raises(ValueError, match="unknown scope"):
        M._module("x", "-- scope: ranks\nCREATE OR REPLACE TEMP VIEW x AS SELECT 1;")


@pytest.fixture(scope="module")
def parity_store(tmp_path_factory) -> Path:
    return ingest_runs(tmp_path_factory, "summaries_parity", PARITY_RUNS, workers=1)


@pytest.mark.parametrize("one_rank_tasks", [False, True])
def test_map_reduce_gives_the_same_results(parity_store, monkeypatch, one_rank_tasks):
    """Every saved analysis and every wrapper (benchmarks/registry_parity.py's list), row for row:
    integers and names identical, floats within summaries_parity.FLOAT_RTOL (the sums meet the rows
    in another order). Also with every rank a map task of its own: the sends of a receiver's peers
    come from their files (``_p2p_peer_sends``), every cross-rank view meets its per-rank parts from
    several tasks."""
    from summaries_parity import both, differences

    from traceanalyzer.analyses import summaries as sm
    sm.forget(parity_store)
    if one_rank_tasks:
        monkeypatch.setattr(sm, "MAP_TASK_EVENTS_BYTES", 1)
    one, two, _ = both(parity_store)
    if one_rank_tasks:
        doc = json.loads((parity_store / "_store.json").read_text())
        ranks = {r: len({t["rank"] for t in doc["traces"] if t["run"] == r}) for r in PARITY_RUNS}
        assert all(len(doc["summaries"][r]["files"]["step_phases"]) == n > 1 for r, n in ranks.items()), ranks
    bad, close = differences(one, two)
    assert not bad, bad
    assert len(close) <= 3, close  # std / cv / correlation only
    assert sum(len(d) for d in one.values()) > 1000
    manifest = json.loads((parity_store / "_store.json").read_text())
    assert set(manifest["summaries"]) == set(PARITY_RUNS)


def test_second_analyze_reads_no_events(tmp_path_factory):
    """After the first analyze, every events file is replaced by an empty one: the second analyze
    gives the same results (it reads the summaries), while the one-connection path does not."""
    from traceanalyzer import analyses
    from traceanalyzer.analyses import modules as M
    from traceanalyzer.analyses import summaries as sm
    from traceanalyzer.analyses.results import analyze, compute, effective_params
    store = ingest_runs(tmp_path_factory, "summaries_events", ("ddp_gloo_4rank_slow2",), workers=1)
    first = analyze(store)
    manifest = json.loads((store / "_store.json").read_text())
    for t in manifest["traces"]:
        f = store / t["files"]["events"]
        pq.write_table(pq.read_schema(f).empty_table(), f)
    second = analyze(store)
    assert [k for k in first if not first[k].equals(second[k])] == []
    # what the reduce computed itself (temporary tables; the summaries are views over their files):
    # none of the views naming events
    con = analyses.connect(store)
    assert sm.attach(con, store, ["ddp_gloo_4rank_slow2"], effective_params({}))
    compute(con)
    made = {t for (t,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE temporary").fetchall()}
    assert "overlap_ranks" not in made and "collective_ranks" in made
    assert {v for v in made & set(M.owner()) if "events" in sm.names_read(v)} == set()
    con.close()
    con = analyses.connect(store)
    without = compute(con)
    con.close()
    changed = [k for k in first if not first[k].equals(without[k])]
    assert {"stragglers", "phases", "overlap", "imbalance"} <= set(changed)


def test_summaries_follow_the_parameters(tmp_path_factory, monkeypatch):
    """Other parameters, another key: computed again, the old files retired (kept for a reader
    that listed them, then collected); the same ones: reused."""
    from traceanalyzer.analyses import summaries as sm
    from traceanalyzer.analyses.results import analyze, effective_params
    from traceanalyzer.store import files as st
    from traceanalyzer.store import writers
    store = ingest_runs(tmp_path_factory, "summaries_params", ("ddp_gloo_2rank",), workers=1)
    analyze(store)
    files = sorted(p.relative_to(store) for p in (store / sm.FOLDER).rglob("*.parquet"))
    assert files and any("rank=0-1" in str(f) for f in files)   # both (small) ranks in one map task
    assert sm.ensure(store, ["ddp_gloo_2rank"], effective_params({})) == []  # current: nothing to do
    analyze(store, exposed_top=3)
    listed = st.summary_files(st.read_manifest(store))
    assert len(listed) == len(files) and not listed & {str(f) for f in files}
    assert set(json.loads((store / "_store.json").read_text())["retired"]) >= {str(f) for f in files}
    assert all((store / f).exists() for f in files)        # retired, not deleted: a reader may hold them
    assert sm.current(store, ["ddp_gloo_2rank"], effective_params({"exposed_top": 3})) == ["ddp_gloo_2rank"]
    assert sm.current(store, ["ddp_gloo_2rank"], effective_params({})) == []
    monkeypatch.setattr(writers, "RETIRED_KEEP_S", 0)          # the keep time is over
    sm.forget(store)
    assert not list((store / sm.FOLDER).rglob("*.parquet"))
    assert "ddp_gloo_2rank" not in json.loads((store / "_store.json").read_text()).get("summaries", {})


def test_map_on_a_process_pool(tmp_path_factory):
    """The map runs its tasks on the executor (here two worker processes, one chunk of ranks each)."""
    from traceanalyzer.analyses import summaries as sm
    from traceanalyzer.analyses.results import effective_params
    store = ingest_runs(tmp_path_factory, "summaries_pool", ("ddp_gloo_4rank",), workers=1)
    assert sm.ensure(store, ["ddp_gloo_4rank"], effective_params({}), n_workers=2) == ["ddp_gloo_4rank"]
    entry = json.loads((store / "_store.json").read_text())["summaries"]["ddp_gloo_4rank"]
    assert len(entry["files"]["step_phases"]) == 2 and len(entry["files"]["step_alignment"]) == 1
    rows = sum(pq.read_metadata(store / f).num_rows for f in entry["files"]["step_phases"])
    assert rows > 0


def test_map_tasks_share_the_cpus(tmp_path_factory):
    """A local pool's tasks run at once: each task's DuckDB gets its share of the CPUs (one thread at
    least), set on the task's own connection; one process or a Dask cluster keeps DuckDB's default."""
    import os

    from traceanalyzer.analyses import summaries as sm
    from traceanalyzer.analyses.results import effective_params
    cpus = os.cpu_count() or 1
    assert sm.map_threads(2, None) == max(1, cpus // 2)
    assert sm.map_threads(4 * cpus, None) == 1
    assert sm.map_threads(1, None) is None and sm.map_threads(2, "local") is None
    store = ingest_runs(tmp_path_factory, "summaries_threads", ("ddp_gloo_2rank",), workers=1)
    align = sm.align_task(str(store), "ddp_gloo_2rank", effective_params({}), str(tmp_path_factory.mktemp("align")))
    con = sm._task_connection(str(store), "ddp_gloo_2rank", [0], effective_params({}), align, threads=1)
    try:
        assert con.execute("SELECT current_setting('threads')").fetchone()[0] == 1
    finally:
        con.close()


@pytest.mark.skipif(importlib.util.find_spec("distributed") is None, reason="dask[distributed] not installed")
def test_analyze_cli_on_a_dask_local_cluster(tmp_path_factory, run_cli):
    """``analyze --dask local:2``: the per-rank map runs as Dask tasks; the results are the ones
    of the one-connection path (``--no-summaries``)."""
    store = ingest_runs(tmp_path_factory, "summaries_dask", ("ddp_gloo_4rank_slow2",), workers=1)
    code, out, err = run_cli("analyze", store, "--dask", "local:2", "--json")
    assert code == 0, err
    assert "ddp_gloo_4rank_slow2" in json.loads((store / "_store.json").read_text())["summaries"]
    code, plain, err = run_cli("analyze", store, "--no-summaries", "--json")
    assert code == 0, err
    ours, theirs = json.loads(out)["results"], json.loads(plain)["results"]
    assert ours["stragglers"] == theirs["stragglers"] and ours["stragglers"]
    assert ours["phases"] == theirs["phases"] and ours["overlap"] == theirs["overlap"]


def test_a_damaged_summary_is_computed_again(tmp_path_factory):
    """A summary file cut short is not read: the next analyze computes the run's summaries again."""
    from traceanalyzer.analyses import summaries as sm
    from traceanalyzer.analyses.results import analyze, effective_params
    store = ingest_runs(tmp_path_factory, "summaries_damaged", ("ddp_gloo_2rank",), workers=1)
    first = analyze(store)
    assert sm.current(store, ["ddp_gloo_2rank"], effective_params({})) == ["ddp_gloo_2rank"]
    entry = json.loads((store / "_store.json").read_text())["summaries"]["ddp_gloo_2rank"]
    victim = store / entry["files"]["step_phases"][0]
    victim.write_bytes(victim.read_bytes()[:20])
    assert sm.current(store, ["ddp_gloo_2rank"], effective_params({})) == []
    second = analyze(store)
    # equal, floats to 1e-9 relative: DuckDB's parallel float aggregates (seqlen_signal's corr) meet
    # the rows in another order from one analyze to the next
    for k in first:
        pd.testing.assert_frame_equal(first[k], second[k], check_exact=False, rtol=1e-9, obj=k)
    rel = entry["files"]["step_phases"][0]   # replaced by a new generation's file, the old one retired
    manifest = json.loads((store / "_store.json").read_text())
    assert rel not in manifest["summaries"]["ddp_gloo_2rank"]["files"]["step_phases"] and rel in manifest["retired"]


def test_map_tasks_take_chunks_of_ranks(tmp_path_factory, monkeypatch):
    """The map cuts a run into tasks of consecutive ranks by the size of their events (one task per
    rank when each is over the budget; one worker's even share at most): the same results either way."""
    from traceanalyzer.analyses import summaries as sm
    from traceanalyzer.analyses.results import analyze
    from traceanalyzer.store import files as st
    store = ingest_runs(tmp_path_factory, "summaries_chunks", ("ddp_gloo_4rank_slow2",), workers=1)
    loc, manifest = st.location(store), st.read_manifest(st.location(store))
    assert sm.rank_chunks(loc, manifest, "ddp_gloo_4rank_slow2") == [[0, 1, 2, 3]]
    assert sm.rank_chunks(loc, manifest, "ddp_gloo_4rank_slow2", n_workers=2) == [[0, 1], [2, 3]]
    together = analyze(store)
    # the default plan: a run within one task's budget is mapped in this process (no pool to start)
    assert sm.map_plan(loc, manifest, "ddp_gloo_4rank_slow2", None) == ([[0, 1, 2, 3]], 1)
    assert sm.map_plan(loc, manifest, "ddp_gloo_4rank_slow2", 2) == ([[0, 1], [2, 3]], 2)
    monkeypatch.setattr(sm, "MAP_TASK_EVENTS_BYTES", 1)
    assert sm.rank_chunks(loc, manifest, "ddp_gloo_4rank_slow2") == [[0], [1], [2], [3]]
    # ... a larger one on a pool of one process per CPU, at most one per task
    monkeypatch.setattr(sm.os, "cpu_count", lambda: 3)
    assert sm.map_plan(loc, manifest, "ddp_gloo_4rank_slow2", None) == ([[0], [1], [2], [3]], 3)
    monkeypatch.setattr(sm.os, "cpu_count", lambda: 8)
    assert sm.map_plan(loc, manifest, "ddp_gloo_4rank_slow2", None) == ([[0], [1], [2], [3]], 4)
    monkeypatch.undo()
    monkeypatch.setattr(sm, "MAP_TASK_EVENTS_BYTES", 1)
    sm.forget(store)
    apart = analyze(store)
    assert any("rank=3" in str(p) for p in (store / sm.FOLDER).rglob("*.parquet"))
    for k in together:
        pd.testing.assert_frame_equal(together[k], apart[k], check_exact=False, rtol=1e-9, obj=k)


def test_saved_sums_keep_their_values(tmp_path):
    """A view's HUGEINT sums are saved as BIGINT, or DECIMAL(38,0) when one does not fit, and read
    back as HUGEINT with the same values."""
    import duckdb

    from traceanalyzer.analyses import summaries as sm
    con = duckdb.connect()
    con.execute("CREATE TABLE small AS SELECT 'r' AS run, sum(x)::HUGEINT AS n FROM range(10) t(x)")
    con.execute("CREATE TABLE big AS SELECT 'r' AS run, (1::HUGEINT << 100) + 7 AS n")
    for name, want in (("small", 45), ("big", (1 << 100) + 7)):
        types = sm._write(con, name, tmp_path / f"{name}.parquet")
        assert types == [["run", "VARCHAR"], ["n", "HUGEINT"]]
        stored = con.execute(f"SELECT typeof(n) FROM read_parquet('{tmp_path / name}.parquet')").fetchone()[0]
        assert stored == ("BIGINT" if name == "small" else "DECIMAL(38,0)")
        got = con.execute(sm.select([str(tmp_path / f"{name}.parquet")], types)).fetchall()
        assert got == [("r", want)]


def test_transfers_made_per_receiver_with_its_senders_files(tmp_path_factory, monkeypatch):
    """One map task per rank: each receiver's ``p2p_transfers`` rows are made in its own task with
    the sends read from its senders' files (``_p2p_peer_sends``); they equal the one-connection
    path's rows, and the critical path (which follows them) is the same."""
    from traceanalyzer import analyses
    from traceanalyzer.analyses import summaries as sm
    from traceanalyzer.analyses.results import analyze, effective_params
    runs = ("pp_1f1b_4rank_slow1", "pp_1f1b_2x2_dp", "pp_gpipe_2x2_dp_optimeline_slow1")
    store = ingest_runs(tmp_path_factory, "summaries_p2p", runs, workers=1)
    monkeypatch.setattr(sm, "MAP_TASK_EVENTS_BYTES", 1)  # every rank a task of its own
    mapped = analyze(store, only=["critical_path", "critical_path_summary"])
    entry = json.loads((store / "_store.json").read_text())["summaries"]
    assert all(len(entry[r]["files"]["p2p_transfers"]) >= 4 for r in runs)  # one file per rank
    order = "ORDER BY ALL"
    con = analyses.connect(store)
    assert sm.attach(con, store, list(runs), effective_params({}))
    analyses.prepare(con, views=["p2p_transfers"])
    reduced = con.execute(f"SELECT * FROM p2p_transfers {order}").df()
    con.close()
    con = analyses.connect(store)
    analyses.prepare(con, views=["p2p_transfers"])
    whole = con.execute(f"SELECT * FROM p2p_transfers {order}").df()
    one = analyze(store, only=["critical_path", "critical_path_summary"], summaries=False, save_results=False)
    con.close()
    assert len(whole) > 100 and set(whole["run"]) == set(runs)
    pd.testing.assert_frame_equal(reduced, whole, check_dtype=False)
    for name in one:
        pd.testing.assert_frame_equal(mapped[name], one[name])
