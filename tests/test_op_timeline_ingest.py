"""Issue 17: the op-timeline ingest builds a block of ranks with a fixed number of vectorised passes
(``ingest/op_timeline/tables.py``) and stages its tables with its own Parquet options
(``ingest/op_timeline/stage.py``). What it stores must equal, table for table and row for row,
what the old build made (kept as the reference, tests/reference/op_timeline_build.py): on the
recorded op timeline through a real ingest, and on variants of it that take the other paths (rows
out of order without a seq column and with ties, sparse step and seq values, one rank's times too
far apart for the merge's single key)."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import traceanalyzer as ta
from traceanalyzer import schema as S
from traceanalyzer.ingest.batch import unknown_comms
from traceanalyzer.ingest.op_timeline.tables import plain
from traceanalyzer.store.files import read_manifest

sys.path.insert(0, str(Path(__file__).resolve().parent / "reference"))
import op_timeline_build as ref  # noqa: E402

O = importlib.import_module("traceanalyzer.ingest.op_timeline")
FILE = Path(__file__).resolve().parent.parent / "traces" / "pp_gpipe_2x2_dp_optimeline_slow1" / "op_timeline.parquet"


def _reference(path, monkeypatch) -> dict:
    """rank -> RankTables of the old build (the whole file as one block, as it read it)."""
    with monkeypatch.context() as m:
        m.setattr(O, "_arrays", ref.arrays)
        m.setattr(O.tables, "build", ref.build)
        return {b.rank: b for b in O.load(path, block_rows=10 ** 9)}


def _assert_same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for r, w in want.items():
        g = got[r]
        assert (g.start_ts_ns, g.end_ts_ns, dict(g.skipped)) == (w.start_ts_ns, w.end_ts_ns, dict(w.skipped)), r
        assert sorted(g.tables) == sorted(w.tables)
        for name, t in w.tables.items():   # text columns built as dictionaries: their values compared
            assert plain(g.tables[name]).equals(t), (r, name)


def test_stored_tables_equal_the_old_build_on_the_recorded_timeline(tmp_path, monkeypatch):
    want = _reference(FILE, monkeypatch)
    store = tmp_path / "store"
    report = ta.ingest([FILE], store)
    entries = {t["rank"]: t for t in read_manifest(store).traces}
    assert sorted(entries) == sorted(want) == [0, 1, 2, 3]
    summaries = {s.rank: s for s in report.traces}
    for r, w in want.items():
        assert (entries[r]["start_ts_ns"], entries[r]["end_ts_ns"]) == (w.start_ts_ns, w.end_ts_ns)
        assert summaries[r].counts == {name: t.num_rows for name, t in w.tables.items()}
        assert summaries[r].unknown == unknown_comms(w.tables["comms"])   # sizes unknown: no bytes in an op timeline
        assert summaries[r].unknown["size"] > 0
        for name, t in w.tables.items():
            stored = pq.ParquetFile(store / entries[r]["files"][name]).read()
            assert stored.equals(t.select(S.TABLES[name].column_names)), (r, name)
    # and through the store's views (DuckDB reads the op timeline's encodings)
    con = ta.open(store)
    n_events = con.execute("SELECT count(*), count(DISTINCT args_json), sum(ts_ns % 1000) FROM events").fetchone()
    all_events = pa.concat_tables([w.tables["events"] for w in want.values()])
    assert n_events == (all_events.num_rows, len(set(all_events["args_json"].to_pylist())),
                        int(np.sum(all_events["ts_ns"].to_numpy() % 1000)))


def _variant(path: Path, t: pa.Table, **cols) -> Path:
    for name, values in cols.items():
        t = t.set_column(t.schema.get_field_index(name), name, pa.array(values, t.schema.field(name).type))
    pq.write_table(t, path, row_group_size=97)   # rank boundaries inside row groups
    return path


def test_every_path_of_the_build_equals_the_old_build(tmp_path, monkeypatch):
    t = pq.read_table(FILE).replace_schema_metadata(None)
    rank = t.column("rank").to_numpy()
    start = t.column("start_ns").to_numpy().astype(np.int64)
    rng = np.random.default_rng(7)
    # rows out of order, no seq column (numbered by start), ops starting together (ties with each
    # other and with their step's start)
    ties = start.copy()
    ties[1::5] = ties[0::5][:len(ties[1::5])]
    tt = t.set_column(t.schema.get_field_index("start_ns"), "start_ns", pa.array(ties, pa.int64())).drop_columns(["seq"])
    shuffled = tmp_path / "shuffled.parquet"
    pq.write_table(tt.take(pa.array(rng.permutation(tt.num_rows))), shuffled, row_group_size=97)
    # sparse step and seq values, microbatch -1 / -3 ("null"): the dense grids give way to sorting
    mb = t.column("microbatch").to_numpy().astype(np.int64)
    mb[::4] = -3
    sparse = _variant(tmp_path / "sparse.parquet", t, step=t.column("step").to_numpy().astype(np.int64) * 10 ** 8,
                      seq=t.column("seq").to_numpy().astype(np.int64) * 10 ** 7 + 5, microbatch=mb)
    # one rank's ops 8e18 ns apart: no single int64 (rank, start) key, the merge sorts instead
    far = start - start.min()
    one = np.flatnonzero(rank == 2)
    far[one] += np.where(np.arange(len(one)) < len(one) // 2, -4 * 10 ** 18, 4 * 10 ** 18)
    far_apart = _variant(tmp_path / "far.parquet", t, start_ns=far)
    assert O.tables._rank_time_key(np.zeros(2, np.int64), far[one[[0, -1]]], np.array([0, 2])) is None
    for path in (shuffled, sparse, far_apart):
        for block_rows in (150, 10 ** 9):
            _assert_same({b.rank: b for b in O.load(path, block_rows=block_rows)}, _reference(path, monkeypatch))


@pytest.mark.parametrize("steps", [1, 3])
def test_equal_on_a_generated_pipeline(tmp_path, monkeypatch, steps):
    """16 ranks (PP 4 x DP 4) of the benchmark's generator: collectives over DP groups, p2p both ways."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import op_timeline_gen as gen
    path = tmp_path / "op_timeline.parquet"
    gen.write(path, 16, 4, steps, ops_per_step=40, ranks_per_group=3)
    _assert_same({b.rank: b for b in O.load(path, block_rows=500)}, _reference(path, monkeypatch))
