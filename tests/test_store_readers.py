"""Issue 18 part 2: a run removed and ingested again while a reader holds the old listing. The
reader (a notebook's ``ta.open``, an analyze) listed the run's files before; ``rm`` and the new
ingest run in other processes; the reader's queries still read the files it listed (retired for
RETIRED_KEEP_S, not deleted), a new reader sees the new run, and garbage collection removes the
old files once RETIRED_KEEP_S has passed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from conftest import TRACES

import traceanalyzer as ta
from traceanalyzer.analyses.results import analyze
from traceanalyzer.errors import StoreWarning
from traceanalyzer.report.build import build_report
from traceanalyzer.store import files as st
from traceanalyzer.store import writers
from traceanalyzer.store.check import check_store

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-m", "traceanalyzer", *map(str, args)], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def _events(session) -> tuple[int, int]:
    return session.execute("SELECT count(*), sum(dur_ns) FROM events WHERE run = 'r'").fetchone()


def test_a_reader_keeps_a_run_removed_and_ingested_again(tmp_path, monkeypatch):
    store = tmp_path / "store"
    ta.ingest([TRACES / "ddp_gloo_2rank"], store, run="r", progress=False, workers=1)
    old_files = {f for t in st.read_manifest(store).traces for f in t["files"].values()}
    reader = ta.open(store)
    try:
        before = _events(reader)
        _cli("rm", store, "--run", "r")                                       # another process
        _cli("ingest", TRACES / "ddp_gloo_2rank_imb1", "--store", store, "--run", "r")
        manifest = st.read_manifest(store)
        assert old_files <= set(manifest.extra["retired"]) and all((store / f).exists() for f in old_files)
        assert _events(reader) == before                                      # the files it listed
        with ta.open(store) as fresh:
            assert _events(fresh) != before                                   # the new run
    finally:
        reader.close()
    report = check_store(store)
    assert report.ok, report.text()                                            # retired files are no junk
    monkeypatch.setattr(writers, "RETIRED_KEEP_S", 0)                         # an hour later
    st.collect_garbage(store, st.read_manifest(store))
    assert not any((store / f).exists() for f in old_files)
    assert json.loads((store / st.MANIFEST).read_text())["traces"]            # the new run stays
    with ta.open(store) as fresh:
        assert _events(fresh)[0] > 0


def test_store_connections_draw_no_progress_bar_and_change_nothing_global(shipped_store):
    """DuckDB draws a progress bar on stdout for long queries, which would land in front of
    ``analyze --json > file``: the store's connections turn it off for themselves only. In a fresh
    interpreter (pytest's own turns DuckDB's default off), where a new connection has it on."""
    code = ("import sys, duckdb; from traceanalyzer.store import files as st\n"
            "q = \"SELECT current_setting('enable_progress_bar')\"\n"
            "con = st.open_store(sys.argv[1])\n"
            "print(duckdb.connect().execute(q).fetchone()[0], con.execute(q).fetchone()[0])")
    out = subprocess.run([sys.executable, "-c", code, str(shipped_store)], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(Path(ta.__file__).parents[1])})
    assert out.stdout.split() == ["True", "False"], out.stdout + out.stderr


def test_a_commit_collects_what_it_unlisted_and_reads_one_run(tmp_path, monkeypatch):
    """A short commit (analyze's results and summaries) removes the files it unlisted once their
    keep time is up, and nothing else: it walks no table folder, so its cost does not grow with the
    runs in the store (benchmarks/store_size.py). A file no manifest ever listed (left by a killed
    ingest) waits for the next ingest of its run, or ``check --repair``. A run's analyze and report
    read that run only: a damaged run beside it is neither read nor reported."""
    store = tmp_path / "store"
    for run in ("a", "b"):
        ta.ingest([TRACES / "ddp_gloo_2rank"], store, run=run, progress=False, workers=1)
    events = sorted((store / "events" / "run=a").rglob("*.parquet"))[0]
    stray = events.with_name("part-999.parquet")                 # a killed ingest's file: never listed
    stray.write_bytes(events.read_bytes())
    analyze(store, run="a", only=["stragglers"])
    first = {f for f in st.read_manifest(store).extra["results"]["stragglers"]["files"].values()}
    monkeypatch.setattr(writers, "RETIRED_KEEP_S", 0)
    analyze(store, run="a", only=["stragglers"], straggler_min_delay_pct=11.0)   # replaces (and unlists) them
    assert not any((store / f).exists() for f in first)        # unlisted, keep time over: removed
    assert stray.exists()                                        # not this commit's: left for the sweep
    b_events = sorted((store / "events" / "run=b").rglob("*.parquet"))[0]
    b_events.write_bytes(b"PAR1 truncated")                      # run b damaged
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rr = build_report(store, run="a", figures=False, replay=False).runs[0]
    assert rr.run == "a" and not [w for w in caught if "'b'" in str(w.message) or "run=b" in str(w.message)]
    with pytest.warns(StoreWarning, match="run 'b' is damaged"), ta.open(store):   # the whole store: said
        pass
    c_stray = store / "events" / "run=c" / "rank=0" / "window_id=0" / "part-998.parquet"   # an ingest of c, killed
    c_stray.parent.mkdir(parents=True)
    c_stray.write_bytes(events.read_bytes())
    ta.ingest([TRACES / "ddp_gloo_2rank"], store, run="c", progress=False, workers=1)
    assert not c_stray.exists() and stray.exists()              # an ingest sweeps its own run's folders
    swept = []
    monkeypatch.setattr(st, "_sweep", lambda store, folder, *a, **k: swept.append(folder))
    ta.ingest([TRACES / "ddp_gloo_2rank"], store, run="d", progress=False, workers=1)
    assert swept == []                                           # ... if it had any before (a new run: none)
    monkeypatch.undo()
    assert "leftover" in check_store(store).text()
    check_store(store, repair=True)                              # check --repair: the whole store
    assert not stray.exists()
