"""Nsight Systems SQLite exports: the shared real 2-GPU before/after pair through ingest, the
analyses, report, diff and export; every number checked against plain sqlite3 queries of the
same file. Bad input: truncated, not nsys, a missing column -> one line, no store left behind."""
from __future__ import annotations

import json
import shutil
import sqlite3

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from conftest import EXTERNAL, snapshot

import traceanalyzer as ta
from traceanalyzer.analyses.diff import diff_runs
from traceanalyzer.store import open_store

NSYS = EXTERNAL / "nsys"
FILES = {"before": NSYS / "mfu_2gpu_before.sqlite", "after": NSYS / "mfu_2gpu_after.sqlite"}

pytestmark = pytest.mark.skipif(not NSYS.exists(), reason=f"shared nsys exports not found at {NSYS}")


def q(path, sql, *args):
    """One independent query of the export (read-only)."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return con.execute(sql, args).fetchall()
    finally:
        con.close()


def expected(path) -> dict:
    """What the export holds per CUDA device (= per process here), by plain SQL."""
    out = {}
    utc, clock = q(path, "SELECT utcEpochNs, systemClockNs FROM TARGET_INFO_SESSION_START_TIME")[0]
    for dev, gpid, n in q(path, "SELECT deviceId, globalPid, count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY 1, 2"):
        nccl = q(path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
                       "WHERE k.deviceId = ? AND s.value LIKE 'nccl%'", dev)[0][0]
        flash = q(path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
                        "WHERE k.deviceId = ? AND s.value = 'flash_fwd_kernel'", dev)[0][0]
        memcpy = q(path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE deviceId = ?", dev)[0][0]
        # NVTX and runtime rows carry a globalTid: its process is globalTid >> 24 (the tid is the low 24 bits)
        nvtx = q(path, "SELECT count(*) FROM NVTX_EVENTS WHERE globalTid >> 24 = ? >> 24 AND end IS NOT NULL", gpid)[0][0]
        a2a = q(path, "SELECT count(*) FROM NVTX_EVENTS WHERE globalTid >> 24 = ? >> 24 AND text LIKE 'nccl:all_to_all,%'",
                gpid)[0][0]
        lo = min(r[0] for t in ("KERNEL", "MEMCPY", "MEMSET") for r in
                 q(path, f"SELECT min(start) FROM CUPTI_ACTIVITY_KIND_{t} WHERE globalPid = ?", gpid))
        lo = min(lo, q(path, "SELECT min(start) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE globalTid >> 24 = ? >> 24", gpid)[0][0],
                 q(path, "SELECT min(start) FROM NVTX_EVENTS WHERE globalTid >> 24 = ? >> 24", gpid)[0][0])
        out[dev] = {"kernels": n, "nccl": nccl, "flash": flash, "memcpy": memcpy, "nvtx": nvtx, "all_to_all": a2a,
                    "start_ns": lo + utc - clock}
    return out


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = tmp_path_factory.mktemp("nsys") / "store"
    for run, path in FILES.items():
        ta.ingest([path], s, run=run)
    return s


def test_ingest_matches_the_export(store):
    con = open_store(store)
    try:
        for run, path in FILES.items():
            want = expected(path)
            assert sorted(want) == [0, 1]
            for rank, dev in ((0, 0), (1, 1)):  # ranks by lowest CUDA device id
                w = want[dev]
                kinds = dict(con.execute("SELECT kind, count(*) FROM events WHERE run = ? AND rank = ? GROUP BY 1",
                                         [run, rank]).fetchall())
                assert kinds["compute_kernel"] + kinds["comm_kernel"] == w["kernels"]
                assert kinds["comm_kernel"] == w["nccl"] > 0
                assert kinds["memcpy"] == w["memcpy"]
                nvtx = con.execute("SELECT count(*) FROM events WHERE run = ? AND rank = ? AND cat IN "
                                   "('cpu_op', 'user_annotation', 'nvtx')", [run, rank]).fetchone()[0]
                assert nvtx == w["nvtx"]
                devices = con.execute("SELECT DISTINCT device FROM events WHERE run = ? AND rank = ? AND is_gpu",
                                      [run, rank]).fetchall()
                assert devices == [(dev,)]
                start, meta = con.execute("SELECT start_ts_ns, trace_meta_json FROM ranks WHERE run = ? AND rank = ?",
                                          [run, rank]).fetchone()
                assert start == w["start_ns"]  # epoch ns: ts + utcEpochNs - systemClockNs
                assert json.loads(meta)["step_source"] == "window"
                # every all_to_all NVTX range is one all_to_all row of comms (NCCL kernel or not)
                n_a2a = con.execute("SELECT count(*) FROM comms WHERE run = ? AND rank = ? AND op = 'all_to_all' "
                                    "AND pg_name = 'nsys:all_to_all'", [run, rank]).fetchone()[0]
                assert n_a2a == w["all_to_all"]
            # the time span of the file: a 300 ms window (derived fixture)
            lo, hi = con.execute("SELECT min(start_ts_ns), max(end_ts_ns) FROM ranks WHERE run = ?", [run]).fetchone()
            assert 0.29e9 < hi - lo < 0.31e9
        # collectives join across the two processes: the kernels of both ranks at one seq
        both = con.execute("""SELECT count(*) FROM (SELECT seq FROM comms WHERE run = 'before' AND on_gpu
                              AND pg_name = 'nsys:all_to_all' GROUP BY seq HAVING count(DISTINCT rank) = 2)""").fetchone()[0]
        assert both == 32
    finally:
        con.close()


def test_launch_to_kernel_links(store):
    """Each kernel's correlation id reaches its launch call (a flow and the same external id)."""
    con = open_store(store)
    try:
        n_kernels, linked = con.execute("""
            SELECT count(*), count(r.event_id) FROM events k LEFT JOIN events r
              ON r.run = k.run AND r.rank = k.rank AND r.correlation = k.correlation AND NOT r.is_gpu
             AND r.kind IN ('runtime', 'sync')
            WHERE k.run = 'before' AND k.kind IN ('compute_kernel', 'comm_kernel')""").fetchone()
        launches = q(FILES["before"], """SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
                                         ON r.correlationId = k.correlationId AND r.globalTid >> 24 = k.globalPid >> 24""")[0][0]
        assert linked == launches and n_kernels == 4010
        flows = con.execute("SELECT count(*) FROM flows WHERE run = 'before' AND cat = 'ac2g' AND ph = 'f'").fetchone()[0]
        assert flows >= launches
    finally:
        con.close()


def test_analyze_report_diff_export(store, run_cli, tmp_path):
    code, out, err = run_cli("analyze", store, "--run", "before")
    assert code == 0, err
    # 32 all_to_all seen on both ranks + 2 whose kernel ran after the window's end (rank 1 only)
    assert "collectives: 34 joined across ranks (2 incomplete)" in out, out
    assert "of all_to_all (pg nsys:all_to_all" in out  # the largest exposed communication, named
    code, out, err = run_cli("report", store, "--run", "after", "-o", tmp_path / "r.md")
    assert code == 0, err
    report = (tmp_path / "r.md").read_text()
    assert "2 ranks, backend nccl, 1 steps, median step 299.27 ms" in report
    d = diff_runs(store, run_a="before", run_b="after")
    flash = d.changes[d.changes["what"].str.contains("flash_fwd_kernel")].iloc[0]
    # per rank and window: 68 -> 60 flash-attention kernels over 2 ranks (sqlite counts)
    assert expected(FILES["before"])[0]["flash"] + expected(FILES["before"])[1]["flash"] == 68
    assert "34.0 -> 30.0 calls" in flash["detail"]
    assert d.changes.index[d.changes["what"] == flash["what"]][0] < 3  # among the top causes
    idle = d.effects[d.effects["what"].str.startswith("idle")].iloc[0]
    assert idle["delta_ns"] > 10e6  # the GPUs sat idle longer in the 'after' window
    out_json = tmp_path / "t.json"
    code, out, err = run_cli("export", store, "--run", "after", "--all-ranks", "-o", out_json)
    assert code == 0, err
    events = json.loads(out_json.read_text())["traceEvents"]
    assert sum(1 for e in events if e.get("cat") == "kernel") == 3587


def test_folder_by_content_and_rank_argument(tmp_path):
    folder = tmp_path / "captures"
    folder.mkdir()
    shutil.copy(FILES["after"], folder / "capture.data")  # no .sqlite suffix: recognised by content
    sqlite3.connect(folder / "other.sqlite").execute("CREATE TABLE t (x)").connection.close()  # not nsys: ignored
    rep = ta.ingest([folder], tmp_path / "s", run="a", rank=4)
    assert sorted(t.rank for t in rep.traces) == [4, 5] and {t.rank_source for t in rep.traces} == {"argument"}


def _expect_one_line(run_cli, bad, store, *needles):
    code, _out, err = run_cli("ingest", bad, "--store", store, "--quiet")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0 and len(lines) == 1, err
    assert str(bad) in lines[0], lines[0]
    for n in needles:
        assert n in lines[0], lines[0]


def _copy_without_column(src, dst, table, column):
    shutil.copy(src, dst)
    con = sqlite3.connect(dst)
    con.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    con.commit()
    con.close()
    return dst


@pytest.mark.parametrize("case", ["truncated", "not_nsys", "missing_column"])
def test_bad_exports(run_cli, tmp_path, case):
    if case == "truncated":
        bad = tmp_path / "cut.sqlite"
        data = FILES["before"].read_bytes()
        bad.write_bytes(data[: len(data) // 3])
        needles = ("SQLite",)
    elif case == "not_nsys":
        bad = tmp_path / "app.sqlite"
        con = sqlite3.connect(bad)
        con.execute("CREATE TABLE users (id INTEGER, name TEXT)")
        con.commit()
        con.close()
        needles = ("not an Nsight Systems export",)
    else:
        bad = _copy_without_column(FILES["before"], tmp_path / "nocorr.sqlite", "CUPTI_ACTIVITY_KIND_RUNTIME",
                                   "correlationId")
        needles = ("CUPTI_ACTIVITY_KIND_RUNTIME", "correlationId")
    fresh = tmp_path / "new" / "store"
    _expect_one_line(run_cli, bad, fresh, *needles)
    assert not (tmp_path / "new").exists()  # a failed first ingest leaves no folder it made behind
    kept = tmp_path / "kept"
    ta.ingest([FILES["after"]], kept, run="after")
    before = snapshot(kept)
    _expect_one_line(run_cli, bad, kept, *needles)
    assert snapshot(kept) == before


def test_steps_from_nvtx_ranges(tmp_path):
    """A training loop's own NVTX ranges ('step 1', 'step 2' on the main thread, added to a copy of
    the real export) become steps; a kernel belongs to the step during which it was launched."""
    from traceanalyzer.ingest import nsys
    path = tmp_path / "steps.sqlite"
    shutil.copy(FILES["before"], path)
    con = sqlite3.connect(path)
    mains = [r[0] for r in con.execute("SELECT globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME GROUP BY 1 "
                                       "ORDER BY count(*) DESC LIMIT 2")]
    lo, hi = con.execute("SELECT min(start), max(end) FROM NVTX_EVENTS").fetchone()
    mid = (lo + hi) // 2
    for tid in mains:
        for text, a, b in (("step 1", lo, mid), ("step 2", mid, hi)):
            con.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) "
                        "VALUES (?, ?, 59, ?, ?, 0)", (a, b, text, tid))
    con.commit()
    # kernels of each process whose launch call started in step 1 (independent join)
    want = dict(con.execute("""SELECT k.deviceId, count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k
                               JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
                                AND r.globalTid >> 24 = k.globalPid >> 24
                               WHERE r.start >= ? AND r.start < ? GROUP BY 1""", (lo, mid)).fetchall())
    con.close()
    built = nsys.load(path)
    for b in built:
        steps = b.tables["steps"].to_pydict()
        assert steps["step"] == [1, 2]
        assert steps["dur_ns"] == [mid - lo, hi - mid]
        events = b.tables["events"]
        ev = events.filter(pc.is_in(events["kind"], pa.array(["compute_kernel", "comm_kernel"]))).to_pydict()
        dev = ev["device"][0]
        assert sum(1 for s in ev["step"] if s == 1) == want[dev]
        meta = json.loads(b.tables["ranks"]["trace_meta_json"][0].as_py())
        assert meta["step_source"] == "nvtx"



def test_rank_mapping_beside_the_export(tmp_path):
    """X.ranks.json ({pid: rank}) beside X.sqlite overrides the device order; a bad one is one line."""
    shutil.copy(FILES["before"], tmp_path / "cap.sqlite")
    pids = dict(q(FILES["before"], "SELECT DISTINCT k.deviceId, p.pid FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                                   "JOIN PROCESSES p ON p.globalPid = k.globalPid"))
    (tmp_path / "cap.ranks.json").write_text(json.dumps({str(pids[0]): 7, str(pids[1]): 3}))
    rep = ta.ingest([tmp_path], tmp_path / "s", run="m")  # the folder: the mapping is no trace
    assert sorted((t.rank, t.rank_source) for t in rep.traces) == [(3, "rank_map"), (7, "rank_map")]
    con = open_store(tmp_path / "s")
    try:
        assert con.execute("SELECT DISTINCT device FROM events WHERE rank = 7 AND is_gpu").fetchall() == [(0,)]
    finally:
        con.close()
    (tmp_path / "cap.ranks.json").write_text("[1, 2]")
    with pytest.raises(ta.TraceInputError, match="cap.ranks.json: unreadable rank mapping"):
        ta.ingest([tmp_path / "cap.sqlite"], tmp_path / "s2", run="m")
    assert not (tmp_path / "s2").exists()
