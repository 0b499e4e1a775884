"""Two ``analyze`` runs on one store at once (docs/concurrency.md), for real: separate processes on
a shipped 4-rank pipeline run, on a local store and on an S3 store (moto's server on localhost).
Both give a lone analyze's results and leave the store healthy; a reader whose summaries another
process replaces (other parameters) keeps reading them; an analyze killed mid-map (SIGKILL) leaves
the store readable and the next analyze correct."""
from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT, TRACES

import traceanalyzer as ta
from traceanalyzer.analyses import summaries as sm
from traceanalyzer.analyses.results import analyze, compute, effective_params
from traceanalyzer.store import files as st
from traceanalyzer.store import writers
from traceanalyzer.store.check import check_store

RUN = "pp_1f1b_4rank"
OTHER = "ddp_gloo_4rank"
#: a child process: import, say it is ready, wait for the go, analyze, save its results
_CHILD = r"""
import json, pickle, sys, time
from pathlib import Path
from traceanalyzer.analyses.results import analyze
store, out, go, params = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), json.loads(sys.argv[4])
out.with_suffix(".ready").touch()
while not go.exists():
    time.sleep(0.002)
pickle.dump(analyze(store, **params), open(out, "wb"))
"""


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _start(store, out: Path, go: Path, params: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _CHILD, str(store), str(out), str(go), json.dumps(params or {})],
                            env=_env(), stderr=subprocess.PIPE, text=True)


def _together(store, tmp_path: Path, params: list[dict]) -> list[dict]:
    """Analyze ``store`` in one process per entry of ``params``, all let go at the same instant."""
    go = tmp_path / "go"
    outs = [tmp_path / f"out{i}.pkl" for i in range(len(params))]
    procs = [_start(store, o, go, p) for o, p in zip(outs, params)]
    deadline = time.monotonic() + 120
    while not all(o.with_suffix(".ready").exists() for o in outs) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    return [pickle.loads(o.read_bytes()) for o in outs]


def _same(a: dict[str, pd.DataFrame], b: dict[str, pd.DataFrame]) -> None:
    """Same tables, rows and values (floats to 1e-9: parallel float aggregates such as corr may
    differ in their last bits between runs)."""
    assert list(a) == list(b)
    for name in a:
        if a[name].empty and b[name].empty:   # no rows: the columns (an empty column's dtype means nothing)
            assert list(a[name].columns) == list(b[name].columns), name
            continue
        pd.testing.assert_frame_equal(a[name].reset_index(drop=True), b[name].reset_index(drop=True),
                                      check_exact=False, rtol=1e-9, obj=name)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A store holding the pipeline run, never analysed (copied by each test)."""
    store = tmp_path_factory.mktemp("concur") / "store"
    ta.ingest([TRACES / RUN], store, progress=False, workers=1)
    return store


@pytest.fixture(scope="module")
def lone(pristine, tmp_path_factory) -> dict[str, pd.DataFrame]:
    """A lone analyze's results (on a copy of the store)."""
    copy = tmp_path_factory.mktemp("lone") / "store"
    shutil.copytree(pristine, copy)
    return analyze(copy)


def _copy(pristine: Path, tmp_path: Path) -> Path:
    store = tmp_path / "store"
    shutil.copytree(pristine, store)
    return store


def test_two_analyze_processes_at_once(pristine, lone, tmp_path):
    """Both give the lone results; the summaries are listed once (the second commit keeps the
    first's: same key), and the store checks healthy, with no work folder left."""
    store = _copy(pristine, tmp_path)
    for got in _together(store, tmp_path, [{}, {}]):
        _same(got, lone)
    assert check_store(store).ok, check_store(store).text()
    assert not list(store.glob(f"{writers.WORK}*"))
    manifest = st.read_manifest(store)
    assert set(manifest.extra["summaries"]) == {RUN}
    assert sm.ensure(store, [RUN], effective_params({})) == []           # current: reused
    _same(analyze(store), lone)


def test_a_reader_keeps_the_summaries_another_process_replaces(pristine, lone, tmp_path):
    """This process attaches the saved summaries; another process analyses with other parameters
    (another key: it replaces the run's summaries and collects garbage); this process's queries,
    run afterwards, still read the files it listed and give the lone results."""
    from traceanalyzer.analyses import connect
    store = _copy(pristine, tmp_path)
    params = effective_params({})
    sm.ensure(store, [RUN], params)
    mine = set(st.summary_files(st.read_manifest(store)))
    con = connect(store)
    try:
        assert sm.attach(con, store, [RUN], params)
        _together(store, tmp_path, [{"exposed_top": 3}])                 # commits other summaries
        manifest = st.read_manifest(store)
        assert not mine & st.summary_files(manifest) and mine <= set(manifest.extra["retired"])
        _same(compute(con), lone)
    finally:
        con.close()
    assert check_store(store).ok, check_store(store).text()


def test_an_analyze_waits_for_the_lock_another_writer_holds(pristine, lone, tmp_path):
    """Another writer (this process) holds the store lock while an analyze maps: its commits wait
    for the lock (they used to fail at once: 'another ingest is writing this store') and then
    give the lone results."""
    store = _copy(pristine, tmp_path)
    go = tmp_path / "go"
    go.touch()
    with st.locked(store):
        proc = _start(store, tmp_path / "waited.pkl", go)
        deadline = time.monotonic() + 120
        while not any(store.glob(f"{writers.WORK}*/run-*/*.parquet")) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            time.sleep(0.01)
        time.sleep(1.0)                       # its map is done by now: it waits for the lock
        assert proc.poll() is None and st.read_manifest(store).extra.get("summaries") is None
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    _same(pickle.loads((tmp_path / "waited.pkl").read_bytes()), lone)
    assert check_store(store).ok


def test_an_analyze_killed_mid_map_leaves_the_store_readable(pristine, lone, tmp_path):
    """SIGKILL while the map stages its files: nothing is listed, the store opens and answers, check
    names only the dead process's work folder, and the next analyze is correct and cleans it up."""
    store = _copy(pristine, tmp_path)
    ta.ingest([TRACES / OTHER], store, progress=False, workers=1)       # two runs: the map takes longer
    before = (store / st.MANIFEST).read_text()
    go = tmp_path / "go"
    go.touch()
    proc = _start(store, tmp_path / "killed.pkl", go)
    deadline = time.monotonic() + 120
    while not any(store.glob(f"{writers.WORK}*/run-*/*.parquet")) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (store / st.MANIFEST).read_text() == before                  # nothing committed
    with ta.open(store) as s:
        assert sorted(s.runs["run"]) == sorted([RUN, OTHER])
        assert s.execute("SELECT count(*) FROM events").fetchone()[0] > 0
    report = check_store(store)
    assert not report.damaged and report.junk and all(j.startswith(writers.WORK) for j in report.junk), report.text()
    got = analyze(store)
    _same({k: v[v["run"] == RUN] for k, v in got.items()}, {k: v[v["run"] == RUN] for k, v in lone.items()})
    assert check_store(store).ok and not list(store.glob(f"{writers.WORK}*"))


# -- an S3 store ----------------------------------------------------------------------------------

BUCKET = "concur"


@pytest.fixture(scope="module")
def endpoint():
    """A real S3 server on localhost (moto) and its environment, started by tests/test_s3_store.py's
    own fixture function (skipped, as there, without s3fs or moto)."""
    import test_s3_store as s3
    gen = s3.endpoint.__wrapped__()
    url = next(gen)
    s3.boto3.client("s3").create_bucket(Bucket=BUCKET)
    yield url
    next(gen, None)


def test_two_analyze_processes_on_an_s3_store(endpoint, pristine, lone, tmp_path):
    """The same on s3://: no lock; the commit that finds its generation taken is done again on
    the newer manifest. Both results are the lone ones and the store checks OK."""
    url = f"s3://{BUCKET}/concur"
    ta.ingest([TRACES / RUN], url, progress=False, workers=1)
    for got in _together(url, tmp_path, [{}, {}]):
        _same(got, lone)
    report = check_store(url)
    assert report.ok, report.text()
    assert set(st.read_manifest(st.location(url)).extra["summaries"]) == {RUN}


def test_a_remote_commit_beaten_by_another_writer_is_done_again(endpoint):
    """Another writer commits between this update's read and its commit: this one is done again on
    the newer manifest, and both changes are listed."""
    url = f"s3://{BUCKET}/race"
    ta.ingest([TRACES / "ddp_gloo_2rank"], url, progress=False, workers=1)
    loc = st.location(url)
    start = st.read_manifest(loc).generation
    calls = []

    def mine(manifest):
        calls.append(manifest.generation)
        if len(calls) == 1:   # the other writer, between our read and our commit
            writers.update(st.location(url), lambda m: m.extra.__setitem__("other", 1))
        manifest.extra["mine"] = 1
    writers.update(loc, mine)
    after = st.read_manifest(loc)
    assert calls == [start + 1, start + 2] and after.generation == start + 2
    assert after.extra["other"] == 1 and after.extra["mine"] == 1

