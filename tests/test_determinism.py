"""Issue 18 part 1: the same data analysed twice gives the same results, row for row, whatever the
order its rows and files come in, the map's chunks of ranks, DuckDB's threads, and with no summaries
at all (every view in one connection). The store: 16 ranks generated from the real 8-rank DLRM
traces (benchmarks/analyses_bench.py), so ranks r and r + 8 record the same times: ties everywhere,
as in the 32/128-rank stores whose first analyze saved a different number of rows run to run."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import EXTERNAL, need_external

import traceanalyzer as ta
from traceanalyzer.analyses import connect, prepare, summaries
from traceanalyzer.analyses.results import analyze
from traceanalyzer.store import files as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import analyses_bench as ab  # noqa: E402  (the N-rank job generator)

RANKS = 16
EVENTS_PER_RANK = 8000   # 4 steps a rank


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    need_external()
    root = tmp_path_factory.mktemp("determ")
    ab.generate(str(EXTERNAL / "param_dlrm_8rank"), root / "in", RANKS, EVENTS_PER_RANK)
    ta.ingest([root / "in"], root / "store", run="job", progress=False, workers=1)
    return root / "store"


@pytest.fixture(scope="module")
def reordered(store, tmp_path_factory) -> Path:
    return _reordered(store, tmp_path_factory.mktemp("determ_reordered") / "store")


def _reordered(store: Path, dest: Path) -> Path:
    """The same store with every table file's rows in reverse order and the manifest's traces
    listed in reverse: the same tables (sets of rows), read in another order."""
    shutil.copytree(store, dest)
    manifest = json.loads((dest / st.MANIFEST).read_text())
    for entry in manifest["traces"] + manifest.get("sidecars", []):
        for rel in entry["files"].values():
            table = pq.read_table(dest / rel)
            if table.num_rows > 1:
                pq.write_table(table.take(pa.array(range(table.num_rows - 1, -1, -1), pa.int64())), dest / rel)
    manifest["traces"].reverse()
    (dest / st.MANIFEST).write_text(json.dumps(manifest, indent=1))
    return dest


def _analyze(store: Path, dest: Path, **kw) -> dict[str, pd.DataFrame]:
    """A fresh copy of the store analysed (its first analyze: the summaries computed and saved)."""
    shutil.copytree(store, dest)
    return analyze(dest, **kw)


def _same(a: dict[str, pd.DataFrame], b: dict[str, pd.DataFrame], what: str) -> None:
    """Same tables, rows in the same order, every value equal: exactly, except DOUBLE columns to a
    relative 1e-12 (a parallel float aggregate such as stddev or corr may differ in its last bits;
    nothing here is decided by those)."""
    assert sorted(a) == sorted(b)
    for name in a:
        x, y = a[name].reset_index(drop=True), b[name].reset_index(drop=True)
        assert list(x.columns) == list(y.columns) and len(x) == len(y), f"{name} ({what}): {len(x)} vs {len(y)} rows"
        for col in x.columns:
            floats = pd.api.types.is_float_dtype(x[col]) and pd.api.types.is_float_dtype(y[col])
            pd.testing.assert_series_equal(x[col], y[col], check_exact=not floats, rtol=1e-12,
                                           obj=f"{name}.{col} ({what})")


def test_same_results_whatever_the_order_chunks_threads(store, reordered, tmp_path, monkeypatch):
    first = _analyze(store, tmp_path / "a")
    assert sum(len(d) for d in first.values()) > 500
    assert len(first["critical_path"]) > 0 and len(first["collectives"]) > 0
    _same(first, _analyze(reordered, tmp_path / "b"), "rows and files in reverse order")
    # chunks of ~4 ranks (the default: one), and DuckDB's own threads (a store this small: one)
    events_bytes = sum(f.stat().st_size for f in (store / "events").rglob("*.parquet"))
    monkeypatch.setattr(summaries, "MAP_TASK_EVENTS_BYTES", events_bytes // 3)
    monkeypatch.setattr(st, "ONE_THREAD_MAX_BYTES", 0)
    chunked = _analyze(store, tmp_path / "c")
    assert len(summaries.rank_chunks(tmp_path / "c", st.read_manifest(tmp_path / "c"), "job")) > 2
    _same(first, chunked, "chunks of ranks, DuckDB's threads")
    _same(first, analyze(tmp_path / "c", summaries=False, save_results=False), "one connection")


def test_a_pipeline_run_gives_the_same_results_in_another_row_order(tmp_path):
    """A real PP 2 x DP 2 recording: the pipeline and p2p analyses, which the DLRM job has not."""
    from conftest import TRACES
    run = "pp_1f1b_2x2_dp"
    ta.ingest([TRACES / run], tmp_path / "store", run=run, progress=False, workers=1)
    first = analyze(tmp_path / "store", save_results=False, summaries=False)
    assert sum(len(d) for d in first.values()) > 0
    again = analyze(_reordered(tmp_path / "store", tmp_path / "reordered"), save_results=False, summaries=False)
    _same(first, again, "rows and files in reverse order")


@pytest.mark.parametrize("which", ["store", "reordered"])
def test_last_arriver_is_the_lowest_rank_of_the_latest_arrival(which, request):
    """Exact (not on a DOUBLE: at epoch nanoseconds its step is 256 ns, which made ties and near-ties
    fall to whichever row came first), and the documented tie-break, whatever the row order."""
    con = prepare(connect(request.getfixturevalue(which)), views=["collective_instances"])
    try:
        last = con.execute("""
            SELECT count(*) FILTER (WHERE i.last_arriver IS DISTINCT FROM r.lowest), count(*) FILTER (WHERE r.n_last > 1)
            FROM collective_instances i
            JOIN (SELECT run, pg, seq, min(rank) FILTER (WHERE arrival_ns = last_arrival_ns) AS lowest,
                         count(*) FILTER (WHERE arrival_ns = last_arrival_ns) AS n_last
                  FROM collective_ranks GROUP BY ALL) r USING (run, pg, seq)""").fetchone()
    finally:
        con.close()
    wrong, ties = last
    assert ties > 0          # the generated ranks r and r + 8 arrive together
    assert wrong == 0
