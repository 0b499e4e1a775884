"""Bad input: one clear line naming the file and the problem, a non-zero exit, the store unchanged."""
from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import EXTERNAL, ROOT, TRACES, load_raw, need_external, snapshot

import traceanalyzer as ta

GOOD = TRACES / "ddp_gloo_2rank" / "rank0.window0.pt.trace.json.gz"



@pytest.fixture
def store(tmp_path):
    """A store that already holds one good run, so 'unchanged' means something."""
    s = tmp_path / "store"
    ta.ingest([TRACES / "ddp_gloo_2rank"], s, run="good")
    return s


def expect_error(run_cli, store: Path, args, *needles):
    before = snapshot(store)
    code, out, err = run_cli("ingest", *args, "--store", store, "--quiet")
    lines = [l for l in err.splitlines() if l.strip()]
    assert code != 0
    assert len(lines) == 1, err
    assert lines[0].startswith("traceanalyzer: error: ")
    for needle in needles:
        assert str(needle) in lines[0], lines[0]
    assert snapshot(store) == before
    return lines[0]


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_truncated_gz(run_cli, store, tmp_path):
    data = GOOD.read_bytes()
    bad = write(tmp_path / "rank0.json.gz", data[: len(data) // 2])
    expect_error(run_cli, store, [bad], bad, "truncated gzip")


def test_truncated_json(run_cli, store, tmp_path):
    raw = gzip.decompress(GOOD.read_bytes())
    bad = write(tmp_path / "rank0.json", raw[: len(raw) // 2])
    expect_error(run_cli, store, [bad], bad, "truncated JSON")


@pytest.mark.parametrize("doc,why", [({"hello": 1}, "no 'traceEvents'"), ([1, 2, 3], "not an object"),
                                     ({"traceEvents": {"a": 1}}, "not a list")])
def test_valid_json_that_is_not_a_trace(run_cli, store, tmp_path, doc, why):
    bad = write(tmp_path / "rank0.json", json.dumps(doc).encode())
    expect_error(run_cli, store, [bad], bad, "not a Kineto trace", why)


def test_empty_trace_events(run_cli, store, tmp_path):
    bad = write(tmp_path / "rank0.json", b'{"traceEvents": [], "distributedInfo": {"rank": 0}}')
    expect_error(run_cli, store, [bad], bad, "no events")


def test_no_rank_source_then_explicit_rank(run_cli, store, tmp_path):
    need_external()
    bad = tmp_path / "mi250.json.gz"
    shutil.copy(EXTERNAL / "hta" / "amd_mi250_rocm62.json.gz", bad)
    expect_error(run_cli, store, [bad], bad, "no rank", "--rank")
    code, out, err = run_cli("ingest", bad, "--store", store, "--run", "amd", "--rank", "0", "--quiet")
    assert code == 0, err
    assert ta.open(store).execute("SELECT rank, rank_source FROM ranks WHERE run = 'amd'").fetchall() == [(0, "argument")]


def test_rank_from_file_name(tmp_path):
    raw = load_raw(GOOD)
    del raw["distributedInfo"]
    f = tmp_path / "worker7.json"
    f.write_text(json.dumps(raw))
    report = ta.ingest([f], tmp_path / "s", run="byname")
    assert [(t.rank, t.rank_source) for t in report.traces] == [(7, "file_name")]


def test_duplicate_rank_overlapping_windows(run_cli, store, tmp_path):
    copy = tmp_path / "copy_of_rank0.json.gz"
    shutil.copy(GOOD, copy)
    # same rank, same time range, in one batch
    expect_error(run_cli, store, [GOOD, copy, "--run", "dup"], "duplicate rank 0", "overlaps")
    # and against what the store already holds
    expect_error(run_cli, store, [copy, "--run", "good"], copy, "duplicate rank 0")


def test_second_window_of_a_rank_is_kept(tmp_path):
    """A later, non-overlapping profiling window of the same rank is window 1 of that rank."""
    raw = load_raw(GOOD)
    span_us = max(e["ts"] + e.get("dur", 0) for e in raw["traceEvents"] if "ts" in e) - \
        min(e["ts"] for e in raw["traceEvents"] if "ts" in e)
    for e in raw["traceEvents"]:
        if "ts" in e:
            e["ts"] = round(e["ts"] + 2 * span_us, 3)
    later = tmp_path / "later" / "rank0.json"
    later.parent.mkdir()
    later.write_text(json.dumps(raw))
    ta.ingest([GOOD], tmp_path / "s", run="r")
    ta.ingest([later], tmp_path / "s", run="r")
    rows = ta.open(tmp_path / "s").execute("SELECT rank, window_id FROM ranks ORDER BY window_id").fetchall()
    assert rows == [(0, 0), (0, 1)]


def test_negative_and_absurd_durations_are_dropped_and_counted(tmp_path):
    raw = load_raw(GOOD)
    xs = [e for e in raw["traceEvents"] if e.get("ph") == "X"]
    xs[10]["dur"] = -5
    xs[11]["dur"] = -0.001
    xs[12]["dur"] = 9e12  # 104 days in microseconds
    f = tmp_path / "rank0.json"
    f.write_text(json.dumps(raw))
    report = ta.ingest([f], tmp_path / "s")
    assert report.skipped == {"negative_duration": 2, "absurd_duration": 1}
    expected = sum(1 for e in raw["traceEvents"] if e.get("ph") in ("X", "i")) - 3
    con = ta.open(tmp_path / "s")
    assert con.execute("SELECT count(*) FROM events").fetchone()[0] == expected
    n_skipped, skipped_json = con.execute("SELECT n_skipped, skipped_json FROM ranks").fetchone()
    assert n_skipped == 3 and json.loads(skipped_json) == report.skipped


def test_non_utf8_names_are_replaced_and_counted(tmp_path):
    raw = gzip.decompress(GOOD.read_bytes())
    assert raw.count(b'"aten::linear"') > 2
    bad = raw.replace(b'"aten::linear"', b'"aten::lin\xff\xfear"', 2)
    f = write(tmp_path / "rank0.json", bad)
    report = ta.ingest([f], tmp_path / "s")
    assert report.skipped == {"replaced_invalid_utf8_bytes": 4}
    con = ta.open(tmp_path / "s")
    assert con.execute("SELECT count(*) FROM events WHERE name = 'aten::lin\ufffd\ufffdar'").fetchone()[0] == 2
    assert con.execute("SELECT count(*) FROM events").fetchone()[0] == \
        sum(1 for e in load_raw(GOOD)["traceEvents"] if e.get("ph") in ("X", "i"))


def test_unwritable_store(run_cli, tmp_path):
    blocker = write(tmp_path / "a_file", b"x")
    code, out, err = run_cli("ingest", GOOD, "--store", blocker / "store", "--quiet")
    assert code != 0 and len(err.strip().splitlines()) == 1
    assert "cannot write the store" in err and str(blocker / "store") in err
    if os.path.isdir("/sys") and not os.access("/sys", os.W_OK | os.X_OK) is False:
        code, out, err = run_cli("ingest", GOOD, "--store", "/sys/traceanalyzer-store", "--quiet")
        assert code != 0 and "cannot write the store" in err


def test_incompatible_store_version(run_cli, store):
    manifest = store / "_store.json"
    doc = json.loads(manifest.read_text())
    doc["schema_version"] = "99.0"
    manifest.write_text(json.dumps(doc))
    code, out, err = run_cli("info", store)
    assert code != 0 and "schema 99.0" in err and "re-ingest" in err


def test_ingest_killed_midway_leaves_previous_store_intact(store, tmp_path):
    """SIGKILL a real ingest at several moments: the store is always the old or the new one, whole."""
    need_external()
    before = ta.info(store)
    inputs = [str(p) for p in sorted((EXTERNAL / "hta").glob("*.json.gz")) if "amd" not in p.name]
    outcomes = set()
    for delay in (0.3, 0.8, 1.5, 2.5, 4.0):
        proc = subprocess.Popen([sys.executable, "-m", "traceanalyzer", "ingest", *inputs, "--store", str(store),
                                 "--run", f"big{delay}", "--workers", "2", "--quiet"], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(delay)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the ingest and its workers
            outcomes.add("killed")
        else:
            outcomes.add("finished")
        proc.wait()
        after = ta.info(store)
        runs = set(after["run"])
        assert runs in ({"good"}, {"good"} | {r for r in runs if r.startswith("big")})
        good = after[after["run"] == "good"].reset_index(drop=True)
        assert good.equals(before)
        for run in runs - {"good"}:  # a committed run is complete
            assert after[after["run"] == run]["windows"].sum() == len(inputs)
    assert "killed" in outcomes
    # the next ingest cleans up what the killed ones left behind, and works
    ta.ingest([TRACES / "ddp_gloo_4rank"], store, run="after")
    leftovers = [p for p in store.rglob("*") if p.name.startswith((".staging", "_store.lock"))]
    assert leftovers == []
    con = ta.open(store)
    doc = json.loads((store / "_store.json").read_text())
    listed = {f for t in doc["traces"] + doc.get("sidecars", []) for f in t["files"].values()}
    on_disk = {p.relative_to(store).as_posix() for p in store.rglob("*.parquet")}
    assert on_disk == listed
    assert con.execute("SELECT count(DISTINCT rank) FROM ranks WHERE run = 'after'").fetchone()[0] == 4


def test_exact_int64_nanoseconds_round_trip(tmp_path):
    """Epoch-microsecond text with 3 decimals becomes int64 ns with no float drift."""
    need_external()
    path = EXTERNAL / "hta" / "ns_resolution_rank0.json.gz"
    text = gzip.decompress(path.read_bytes()).decode()
    import re
    from decimal import Decimal
    # the independent reading: every "ts" in the text, through Decimal
    want = sorted(int(Decimal(m) * 1000) for m in re.findall(r'"ts": ([0-9.]+)', text))
    ta.ingest([path], tmp_path / "s")
    con = ta.open(tmp_path / "s")
    got = sorted(v for (v,) in con.execute(
        "SELECT ts_ns FROM events UNION ALL SELECT ts_ns FROM flows").fetchall())
    meta = [e for e in load_raw(path)["traceEvents"] if e.get("ph") == "M"]
    assert len(want) - len(got) == len(meta)  # metadata events carry a ts but are not events
    assert set(got) <= set(want)
    assert 1712195495519689047 in got  # "ts": 1712195495519689.047 -> exactly ...689047 ns
    assert float(1712195495519689.047) * 1000 != 1712195495519689047  # float64 would have drifted
