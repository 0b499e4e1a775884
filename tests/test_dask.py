"""Ingest on a Dask cluster (issue 18 part 2): a real LocalCluster of 2 worker processes, started
once for the module by the same code as ``ingest --dask local:2``.

- the cluster path stores the same rows as the default one-machine path, table for table, and the
  analyses over both stores are equal;
- a worker killed while it parses leaves the store byte for byte as it was, with one error line;
- without dask installed, ``--dask`` says so in one line.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT, TRACES

needs_dask = pytest.mark.skipif(importlib.util.find_spec("distributed") is None,
                                reason="dask[distributed] not installed (pip install 'traceanalyzer[dask]')")

#: A data-parallel run with Flight Recorder dumps, and a PP x DP run whose p2p groups the client
#: resolves across ranks after the workers are done.
RUNS = ("ddp_gloo_4rank_slow2", "pp_1f1b_2x2_dp")


@pytest.fixture(scope="module")
def client():
    from traceanalyzer.ingest.executor import open_executor
    with open_executor("local:2") as ex:
        yield ex.client


@pytest.fixture(scope="module")
def stores(client, tmp_path_factory):
    """The same runs ingested the default way (one machine) and by the cluster."""
    import traceanalyzer as ta
    base = tmp_path_factory.mktemp("dask")
    for run in RUNS:
        ta.ingest([TRACES / run], base / "local", run=run)  # the default: parsed in this process
        ta.ingest([TRACES / run], base / "cluster", run=run, dask=client)
    return base / "local", base / "cluster"


def _differences(a: Path, b: Path) -> dict[str, tuple[int, int, int]]:
    """Per canonical table: (rows, rows only in a, rows only in b), multiset difference."""
    import duckdb

    import traceanalyzer.schema as S
    from traceanalyzer.store.files import open_store
    con_a, con_b, con = open_store(a), open_store(b), duckdb.connect()
    out = {}
    for name in S.TABLES:
        ta_, tb_ = (c.sql(f"SELECT * FROM {name}").to_arrow_table() for c in (con_a, con_b))
        con.register("ta_", ta_)
        con.register("tb_", tb_)
        only_a = con.execute("SELECT count(*) FROM (SELECT * FROM ta_ EXCEPT ALL SELECT * FROM tb_)").fetchall()[0][0]
        only_b = con.execute("SELECT count(*) FROM (SELECT * FROM tb_ EXCEPT ALL SELECT * FROM ta_)").fetchall()[0][0]
        out[name] = (ta_.num_rows, only_a, only_b)
    return out


@needs_dask
def test_cluster_ingest_stores_the_same_rows(stores):
    diff = _differences(*stores)
    assert {k: v for k, v in diff.items() if v[1] or v[2]} == {}
    assert diff["events"][0] > 10_000 and diff["comms"][0] > 100 and diff["fr_entries"][0] > 100
    assert diff["ranks"][0] == 8  # 4 + 4 trace files


#: Columns that may differ between two analyses of the *same* store: none (imbalance_ops.max_rank
#: was mode(), which picks any of equally frequent ranks; ties now go to the lowest rank).
TIES: dict[str, tuple] = {}


@needs_dask
def test_analyses_equal_on_both_stores(stores):
    from traceanalyzer.analyses.results import analyze
    local, cluster = analyze(stores[0], save_results=False), analyze(stores[1])  # saved: the report test reads them
    assert local.keys() == cluster.keys()
    assert sum(len(df) for df in local.values()) > 50
    for name, df in local.items():
        a, b = (d.drop(columns=list(TIES.get(name, ()))) for d in (df, cluster[name]))
        key = list(a.columns)
        pd.testing.assert_frame_equal(a.sort_values(key, ignore_index=True), b.sort_values(key, ignore_index=True), obj=name)


@needs_dask
def test_cli_scheduler_connects_to_a_running_cluster(client, run_cli, tmp_path):
    code, out, err = run_cli("ingest", TRACES / "ddp_gloo_2rank", "--store", tmp_path / "s", "--quiet",
                             "--scheduler", client.scheduler.address)
    assert code == 0, err
    assert "ingested 2 trace(s) of run 'ddp_gloo_2rank' (ranks 0-1)" in out
    code, out, err = run_cli("ingest", TRACES / "ddp_gloo_2rank", "--store", tmp_path / "t", "--dask", "local:two")
    assert code == 2 and err.count("\n") == 1 and "--dask 'local:two': expected local or local:N" in err
    assert not (tmp_path / "t").exists()


@needs_dask
def test_report_builds_one_task_per_run_on_the_cluster(stores, client, tmp_path):
    """``report`` fans out one task per run (findings; replay and figures when asked for: left out
    here, they cost seconds a run); the document is the one built in this process."""
    import shutil

    from traceanalyzer.report.build import build_report
    from traceanalyzer.report.jsondoc import report_dict
    store = tmp_path / "s"
    shutil.copytree(stores[1], store)
    here = report_dict(build_report(store, figures=False, replay=False))
    there = report_dict(build_report(store, figures=False, replay=False, dask=client))
    assert [r["run"] for r in there["runs"]] == list(RUNS)
    assert sum(len(r["findings"]) for r in there["runs"]) >= 1  # the slow rank of ddp_gloo_4rank_slow2
    assert {**here, "created": None} == {**there, "created": None}


def _snapshot(store: Path) -> tuple[bytes, list[str]]:
    return (store / "_store.json").read_bytes(), sorted(str(p.relative_to(store)) for p in store.rglob("*"))


@needs_dask
def test_worker_killed_mid_ingest_leaves_the_store_as_it_was(client, run_cli, tmp_path):
    """A Dask worker plugin SIGKILLs the worker process as it starts parsing a file: the worker
    really dies (its nanny starts a new one), and the scheduler does not retry the task."""
    import signal

    from distributed.diagnostics.plugin import WorkerPlugin

    import traceanalyzer as ta

    class KillOnParse(WorkerPlugin):  # defined here: pickled by value, the workers need not import this module
        def transition(self, key, start, finish, **kwargs):
            if finish == "executing" and str(key).startswith("traceanalyzer-parse-"):
                os.kill(os.getpid(), signal.SIGKILL)

    store = tmp_path / "s"
    ta.ingest([TRACES / "ddp_gloo_2rank"], store)
    before = _snapshot(store)
    client.register_plugin(KillOnParse(), name="kill-on-parse")
    try:
        code, out, err = run_cli("ingest", TRACES / "ddp_gloo_4rank_slow2", "--store", store, "--quiet",
                                 "--scheduler", client.scheduler.address)
    finally:
        client.wait_for_workers(2, timeout=120)  # the nannies restart the killed workers
        client.unregister_worker_plugin("kill-on-parse")
    assert code == 2 and out == ""
    assert err.count("\n") == 1, err
    assert err.startswith("traceanalyzer: error: ") and "ddp_gloo_4rank_slow2/rank" in err
    assert "the Dask worker running it died" in err
    assert _snapshot(store) == before  # manifest bytes and every file: no staging folder left either


def test_dask_option_without_dask_installed_says_so_in_one_line(tmp_path):
    """``distributed`` blocked in a fresh interpreter (None in sys.modules makes its import fail)."""
    code = ("import sys; sys.modules['distributed'] = None; sys.modules['dask'] = None\n"
            "from traceanalyzer.cli.main import main\n"
            f"sys.exit(main(['ingest', {str(TRACES / 'ddp_gloo_2rank')!r}, '--store', {str(tmp_path / 's')!r}, "
            "'--dask', 'local:2']))")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr == ("traceanalyzer: error: ingest on a Dask cluster needs dask[distributed]: "
                          "pip install 'traceanalyzer[dask]'\n")
    assert not (tmp_path / "s").exists()


def test_local_process_pool_reports_a_dead_worker():
    """The local path behind the same interface: a worker process that exits mid-task is that
    task's failure (what ingest turns into one line naming the file), not an exception."""
    from contextlib import closing

    from traceanalyzer.ingest.executor import ProcessPool
    with closing(ProcessPool(2).map_unordered(os._exit, [(3,)], ["exit"])) as outcomes:
        got = list(outcomes)
    assert [(i, result) for i, result, _ in got] == [(0, None)]
    assert got[0][2].startswith("worker process died (BrokenProcessPool")
