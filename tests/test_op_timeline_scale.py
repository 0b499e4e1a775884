"""Issue 17: op timelines of huge jobs. The benchmark's generator (benchmarks/op_timeline_gen.py:
the recorded PP 2 x DP 2 op timeline grown in PP and DP, one injected slow worker) at a small size,
through ingest and analyze; and the block-wise reading (ingest/op_timeline/read.py) gives the
same tables whatever the blocks and the row order of the file."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import traceanalyzer as ta
from traceanalyzer.errors import TraceInputError
from traceanalyzer.ingest.op_timeline import load
from traceanalyzer.ingest.op_timeline.tables import plain

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import op_timeline_gen as gen  # noqa: E402


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """16 ranks (PP 4 x DP 4) x 2 steps, ~60 ops a rank-step, rank 2 x 4 + 3 = 11 slow."""
    folder = tmp_path_factory.mktemp("optl_small")
    truth = gen.write(folder / "op_timeline.parquet", 16, 4, 2, ops_per_step=60, ranks_per_group=3)
    return folder / "op_timeline.parquet", truth


def _tables(path, **kw) -> dict[int, dict[str, pa.Table]]:
    # text columns are built as dictionaries, whose values depend on the block: compared as values
    return {b.rank: {name: plain(t) for name, t in b.tables.items()} for b in load(path, **kw)}


def test_generated_64_ranks_analysis_names_the_slow_worker(tmp_path, run_cli):
    truth = gen.write(tmp_path / "in" / "op_timeline.parquet", 64, 2, 3)
    assert truth["rows"] == 64 * 3 * 299 and truth["slow_rank"] == 33   # PP 2 x DP 32: replica 16's last stage
    report = ta.ingest([tmp_path / "in"], tmp_path / "store")
    assert len(report.traces) == 64
    code, out, err = run_cli("analyze", tmp_path / "store", "--no-save")
    assert code == 0, err
    assert "imbalance #1: rank 33 " in out
    assert "slow stage #1: stage 1 (rank 33)" in out
    # the rest of its pipeline and every other replica only waited: no other rank is named a slow stage
    assert "slow stage #2" not in out


def test_blocks_give_the_same_tables(small):
    path, truth = small
    whole = _tables(path, block_rows=10 ** 9)
    assert sorted(whole) == list(range(16))
    # 3 ranks a row group, 500-row blocks: ranks cut at row-group and block boundaries
    for block_rows in (500, 1_700):
        parts = _tables(path, block_rows=block_rows)
        assert sorted(parts) == sorted(whole)
        for r in whole:
            for name, t in whole[r].items():
                assert parts[r][name].equals(t), (block_rows, r, name)


def test_unsorted_and_split_ranks_read_the_same(small, tmp_path):
    """Rows out of rank order (one table in memory) and a rank's rows in two row groups (carried
    into the next block) give the same tables as the sorted file."""
    path, _ = small
    t = pq.read_table(path)
    want = _tables(path)
    shuffled = tmp_path / "shuffled.parquet"
    pq.write_table(t.take(pa.array(np.random.default_rng(1).permutation(t.num_rows))), shuffled, row_group_size=4000)
    split = tmp_path / "split.parquet"
    pq.write_table(t, split, row_group_size=777)   # every rank-boundary is somewhere in a row group
    for f in (shuffled, split):
        got = _tables(f, block_rows=900)
        assert sorted(got) == sorted(want)
        for r in want:
            assert got[r]["events"].equals(want[r]["events"]), (f.name, r)
            assert got[r]["comms"].equals(want[r]["comms"]), (f.name, r)


def test_two_coordinate_sets_of_a_rank_in_different_blocks_is_one_error(small, tmp_path):
    path, _ = small
    t = pq.read_table(path)
    dp = t.column("dp").to_numpy().copy()
    dp[np.flatnonzero(t.column("rank").to_numpy() == 5)[-1]] = 3   # rank 5's last row says replica 3
    bad = tmp_path / "bad.parquet"
    pq.write_table(t.set_column(t.schema.get_field_index("dp"), "dp", pa.array(dp, pa.int32())), bad,
                   row_group_size=1000)
    with pytest.raises(TraceInputError, match=r"rank 5 has two sets of parallel coordinates"):
        list(load(bad, block_rows=500))


def test_parts_are_whole_ranks_and_convert_to_the_same_tables(small, tmp_path):
    """A large op timeline is converted in parts by several workers (ingest/batch.py
    _op_timeline_parts): the parts hold whole ranks, and their conversions together are the whole's."""
    from traceanalyzer.ingest.op_timeline import parts, plan
    path, _ = small
    split = tmp_path / "split.parquet"
    t = pq.read_table(path)
    ends = np.flatnonzero(np.diff(t.column("rank").to_numpy())) + 1   # where a rank starts
    with pq.ParquetWriter(split, t.schema) as w:   # row groups: ranks 0-4 cut in two, then ranks 5-15 in one
        for lo, hi in ((0, int(ends[2]) + 7), (int(ends[2]) + 7, int(ends[4])), (int(ends[4]), t.num_rows)):
            w.write_table(t.slice(lo, hi - lo))
    for f, most in ((path, 5), (split, 2)):
        p, want = plan(f), _tables(f)
        for n in (2, 3, 5):
            cut = parts(p, n)
            assert 2 <= len(cut) <= min(n, most), (f.name, n)
            assert [x for part in cut for x in part] == p.sc.pieces
            for a, b in zip(cut, cut[1:]):
                assert a[-1].hi < b[0].lo, (f.name, n)    # no rank in two parts
            got = {}
            for part in cut:
                for b in load(f, plan_=p, pieces=part, block_rows=900):
                    assert b.rank not in got
                    got[b.rank] = {name: plain(t) for name, t in b.tables.items()}
            assert sorted(got) == sorted(want)
            for r in want:
                for name, t in want[r].items():
                    assert got[r][name].equals(t), (f.name, n, r, name)
    assert parts(plan(path), 1) == [plan(path).sc.pieces]


def test_a_large_op_timeline_ingests_in_parts_into_the_same_store(small, tmp_path, monkeypatch):
    from traceanalyzer.ingest import batch
    path, _ = small
    monkeypatch.setattr(batch, "SMALL_INPUT_BYTES", 0)   # this small file counts as large
    assert len(batch._op_timeline_parts(str(path), {}, 2)) == 2
    one = ta.ingest([path], tmp_path / "one", run="r", workers=1)
    two = ta.ingest([path], tmp_path / "two", run="r", workers=2)
    assert len(one.traces) == len(two.traces) == 16
    c1, c2 = ta.open(tmp_path / "one"), ta.open(tmp_path / "two")
    for table in ("events", "comms", "steps", "threads", "ranks", "process_groups"):
        q = f"SELECT * EXCLUDE (run) FROM {table} ORDER BY ALL" if table != "ranks" else \
            "SELECT * EXCLUDE (run, trace_file) FROM ranks ORDER BY ALL"
        assert c1.execute(q).df().equals(c2.execute(q).df()), table
