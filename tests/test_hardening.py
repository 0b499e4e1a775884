"""Issue 15: every bad input gets a specific one-line refusal and leaves the store as it was; a
damaged run does not take the others down; a read-only store can be read; clocks off by seconds
or hours are aligned (the straggler survives); parameters and plans are checked."""
from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import hardening_cases as hc
import pytest
from conftest import ROOT, TRACES, snapshot

import traceanalyzer as ta

#: what each named case must give: a refusal whose line holds the words, or acceptance
EXPECT = {
    "rank_2pow31": "distributedInfo.rank 2147483648 is outside", "rank_minus1": "distributedInfo.rank -1 is outside",
    "rank_7_of_2": "rank 7 is not in [0, world_size 2)", "ts_times_1000_overflow": "out of the int64 nanosecond range",
    "ts_plus_base_overflow": "baseTimeNanoseconds + ts overflows int64", "negative_ts": "negative timestamp",
    "base_time_2pow63": "baseTimeNanoseconds 9223372036854775808 is outside", "base_time_text": "baseTimeNanoseconds is a str",
    "nested_10000": "nested too deeply", "nested_args_5000": "nested too deeply", "invalid_utf8_in_args": None,
    "event_without_tid": None, "pid_2pow64": "pid 18446744073709551616 is outside",
    "tid_2pow64": "tid 18446744073709551616 is outside", "pid_float_1e300": "pid 1e+300 is outside",
    "correlation_1e400": None, "flow_id_2pow64": "flow id 18446744073709551616 is outside",
    "world_size_2pow64": "world_size 18446744073709551616 is outside", "pg_size_2pow64": "pg_size 18446744073709551616",
    "backend_list": "backend is a list", "pg_desc_dict": "pg_desc is a dict", "group_ranks_strings": "holds 'a'",
    "group_ranks_huge": "ranks member 1099511627776", "device_properties_number": "deviceProperties is a int",
    "profiler_step_huge": "ProfilerStep#99999999999", "dur_2pow64": "out of the int64 nanosecond range",
    "duplicate_trace_events": "duplicate JSON key 'traceEvents'", "duplicate_rank": "duplicate JSON key 'rank'",
    "distributed_info_list": "distributedInfo is a list", "fr_collective_seq_2pow64": "collective_seq_id 18446744073709551616",
    "fr_time_created_2pow64": "time_created_ns 18446744073709551616", "fr_input_sizes_2pow64": "input_sizes",
    "fr_record_id_text": None, "fr_duration_ms_2pow64": "duration_ms 18446744073709551616",
    "fr_timeout_ms_huge": "timeout_ms in nanoseconds 4611686018427387904 is outside", "fr_entries_dict": "'entries' is not a list",
    "fr_nested_3000": "nested too deeply", "mixed_world_sizes": "world size 4 differs from 2",
    "other_job_backend": "backend 'nccl' differs from 'gloo'",
    "other_job_run_id": "collector run id 'ddp_gloo_2rank_imb1' differs from 'ddp_gloo_2rank'", "other_job_pg_layout": "holds rank 2, not in [0, world_size 2)",
    "same_rank_other_process": "two traces of one rank must be profiling windows of one process",
    "fifo": "FIFO",
}


@pytest.fixture(scope="module")
def good_store(tmp_path_factory):
    s = tmp_path_factory.mktemp("good") / "store"
    ta.ingest([TRACES / "ddp_gloo_2rank"], s, run="good", progress=False)
    return s


@pytest.fixture
def store(good_store, tmp_path):
    s = tmp_path / "store"
    shutil.copytree(good_store, s)
    return s


def test_every_named_case_is_covered():
    assert set(EXPECT) == set(hc.CASES)


@pytest.mark.parametrize("name", sorted(hc.CASES))
def test_named_bad_input(name, store, tmp_path):
    (tmp_path / "in").mkdir()
    paths = hc.CASES[name](tmp_path / "in")
    before = snapshot(store)
    kind, msg = hc.outcome(paths, store)
    want = EXPECT[name]
    if want is None:
        assert kind == "accepted", msg
        return
    assert kind == "clean", msg
    assert want in msg, msg
    assert any(str(p) in msg for p in paths), msg  # names the file
    assert snapshot(store) == before


def test_cli_refusal_is_one_line_and_exit_2(run_cli, store, tmp_path):
    (tmp_path / "in").mkdir()
    bad = hc.CASES["rank_2pow31"](tmp_path / "in")[0]
    code, out, err = run_cli("ingest", bad, "--store", store, "--quiet")
    assert code == 2 and err.count("\n") == 1 and str(bad) in err


def test_same_job_checked_against_the_store(store, tmp_path):
    """rank 1 of another world size, ingested later into a run of the store, is refused."""
    doc = hc.load(hc.TRACE1)
    doc["distributedInfo"]["world_size"] = 4
    bad = hc.dump(doc, tmp_path / "rank1.json")
    with pytest.raises(ta.TraceInputError, match="world size 4 differs from 2"):
        ta.ingest([bad], store, run="good", progress=False)


def test_gzip_bomb_refused_beyond_the_limit(store, tmp_path, monkeypatch):
    """The limit is an environment variable read at each call; the refusal comes while inflating."""
    monkeypatch.setenv("TRACEANALYZER_MAX_UNCOMPRESSED_BYTES", str(8 * 1024**2))
    bomb = tmp_path / "rank0.json.gz"
    with gzip.open(bomb, "wb") as fh:
        for _ in range(4):
            fh.write(b" " * (16 * 1024**2))
        fh.write(json.dumps(hc.load()).encode())
    assert bomb.stat().st_size < 200_000
    with pytest.raises(ta.TraceInputError, match="larger than 8,388,608 bytes uncompressed") as exc:
        ta.ingest([bomb], store, run="bomb", progress=False)
    assert str(bomb) in str(exc.value)


def test_gzip_streams_multi_member_and_detects_truncation(tmp_path):
    from traceanalyzer.ingest.kineto.gunzip import read_bounded
    two = tmp_path / "two.gz"
    two.write_bytes(gzip.compress(b"abc" * 1000) + gzip.compress(b"def"))
    assert bytes(read_bounded(two)) == b"abc" * 1000 + b"def"
    cut = tmp_path / "cut.gz"
    cut.write_bytes(gzip.compress(b"x" * 100_000)[:50])
    with pytest.raises(ta.TraceInputError, match="truncated gzip"):
        read_bounded(cut)


# -- a store that isolates damage ------------------------------------------------------------

def _damage(store: Path, run: str) -> Path:
    f = sorted((store / "events" / f"run={run}").rglob("*.parquet"))[0]
    f.write_bytes(f.read_bytes()[:1000])
    return f


def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("traceanalyzer: warning:")]


def test_damaged_run_left_out_by_every_read_command(run_cli, store, tmp_path):
    ta.ingest([TRACES / "ddp_gloo_2rank_slow1_annotated"], store, run="other", progress=False)
    _damage(store, "other")
    code, out, err = run_cli("info", store)
    assert code == 0 and "run 'good'" in out and "run 'other'" not in out
    assert len(_warnings(err)) == 1 and "run 'other' is damaged" in err
    code, out, err = run_cli("analyze", store, "--run", "good", "--only", "stragglers,collectives", "--no-save")
    assert code == 0 and "collectives: 32 joined" in out, err
    code, out, err = run_cli("sql", store, "SELECT count(DISTINCT run) AS n FROM events", "--csv")
    assert code == 0 and out.split() == ["n", "1"]
    code, out, err = run_cli("export", store, "--run", "good", "--rank", "0", "-o", tmp_path / "t.json")
    assert code == 0, err
    code, out, err = run_cli("check", store)
    assert code == 1 and "damaged run 'other'" in out and "--repair" in out
    code, out, err = run_cli("check", store, "--repair")
    assert code == 0 and "listing removed" in out
    code, out, err = run_cli("check", store)
    assert code == 0 and "store OK" in out
    code, out, err = run_cli("info", store)
    assert code == 0 and not _warnings(err)


def test_rm_removes_a_run_atomically(run_cli, store):
    ta.ingest([TRACES / "ddp_gloo_2rank_slow1_annotated"], store, run="other", progress=False)
    code, out, err = run_cli("rm", store, "--run", "other")
    assert code == 0 and "removed run 'other'" in out
    manifest = json.loads((store / "_store.json").read_text())
    assert {t["run"] for t in manifest["traces"] + manifest["sidecars"]} == {"good"}
    gone = {p.relative_to(store).as_posix() for p in store.rglob("run=other/**/*.parquet")}
    assert gone and gone <= set(manifest["retired"])  # retired: a reader may hold them (test_store_readers.py)
    code, out, err = run_cli("rm", store, "--run", "nope")
    assert code == 2 and "no run 'nope'" in err and err.count("\n") == 1


def test_check_finds_and_removes_leftovers(run_cli, store):
    (store / "._store.json.deadbeef.tmp").write_text("{}")
    (store / ".staging-0123").mkdir()
    stray = store / "events" / "run=good" / "rank=0" / "window_id=0" / "part-999.parquet"
    shutil.copy(next((store / "events" / "run=good" / "rank=0" / "window_id=0").glob("*.parquet")), stray)
    code, out, err = run_cli("check", store)
    assert code == 1 and "3 leftover file(s)" in out, out
    code, out, err = run_cli("check", store, "--repair")
    assert code == 0 and not stray.exists() and not (store / "._store.json.deadbeef.tmp").exists()
    assert not (store / ".staging-0123").exists()


def _read_only_shell(store: Path, command: str) -> subprocess.CompletedProcess:
    """Run ``command`` with ``store`` bind-mounted read-only over itself, in a private mount
    namespace (root in a container may not lose write access otherwise)."""
    script = f"mount --bind {store} {store} && mount -o remount,bind,ro {store} && {command}"
    return subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_read_only_store_can_be_read(store, tmp_path):
    if shutil.which("unshare") is None or _read_only_shell(store, "true").returncode != 0:
        pytest.skip("cannot make a read-only mount here (needs unshare and mount)")
    probe = _read_only_shell(store, f"touch {store}/x")
    assert probe.returncode != 0  # really read-only
    cli = f"{sys.executable} -m traceanalyzer"
    r = _read_only_shell(store, f"{cli} analyze {store} --only stragglers,collectives")
    assert r.returncode == 0, r.stderr
    assert _warnings(r.stderr) == [f"traceanalyzer: warning: {store}: the store is read-only: results not saved in it"]
    assert "collectives: 32 joined" in r.stdout
    out = tmp_path / "r.md"
    r = _read_only_shell(store, f"{cli} report {store} -o {out} --no-replay")
    assert r.returncode == 0, r.stderr
    assert len(_warnings(r.stderr)) == 1 and "Run good" in out.read_text()
    assert not (store / "_store.lock").exists()


# -- clocks -------------------------------------------------------------------------------------

def _shifted(tmp_path: Path, shift_ns: int, two_hosts: bool) -> Path:
    """The shipped straggler run with rank 1's clock off by ``shift_ns`` (its trace and its FR dump)."""
    src = TRACES / "ddp_gloo_2rank_slow1_annotated"
    d = tmp_path / "in"
    shutil.copytree(src, d)
    p = d / "rank1.window0.pt.trace.json.gz"
    doc = hc.load(p)
    doc["baseTimeNanoseconds"] += shift_ns
    if two_hosts:
        doc["host_name"] = "other-host"
    p.write_bytes(gzip.compress(json.dumps(doc).encode()))
    fr = json.loads((d / "rank1.fr.json").read_text())
    for e in fr["entries"]:
        for k in ("time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns"):
            if e.get(k):
                e[k] += shift_ns
    (d / "rank1.fr.json").write_text(json.dumps(fr))
    return d


@pytest.fixture(scope="module")
def unshifted(tmp_path_factory):
    from traceanalyzer.analyses.results import analyze
    s = tmp_path_factory.mktemp("clk") / "store"
    ta.ingest([TRACES / "ddp_gloo_2rank_slow1_annotated"], s, run="r", progress=False)
    return analyze(s, only=["stragglers", "collectives", "critical_path_summary"], save_results=False)


@pytest.mark.parametrize("shift_ns,two_hosts", [(10_000_000_000, False), (-3_600_000_000_000, False),
                                                (10_000_000_000, True), (-3_600_000_000_000, True)])
def test_shifted_clock_is_aligned(shift_ns, two_hosts, tmp_path, unshifted, run_cli):
    from traceanalyzer.analyses.results import analyze
    store = tmp_path / "store"
    ta.ingest([_shifted(tmp_path, shift_ns, two_hosts)], store, run="r", progress=False)
    res = analyze(store, only=["stragglers", "collectives", "critical_path_summary", "clock_offsets"], save_results=False)
    st, base = res["stragglers"], unshifted["stragglers"]
    assert list(st["rank"]) == list(base["rank"]) == [1]  # the straggler survives
    assert st["delay_ns_per_step"].iloc[0] == pytest.approx(base["delay_ns_per_step"].iloc[0], rel=1e-3)  # the estimate is within µs
    skew = res["collectives"]["arrival_skew_ns"].median()
    assert skew == pytest.approx(unshifted["collectives"]["arrival_skew_ns"].median(), rel=1e-3)  # the real skew
    cp = res["critical_path_summary"].groupby(["rank", "label"])["path_ns"].sum().idxmax()
    assert cp == unshifted["critical_path_summary"].groupby(["rank", "label"])["path_ns"].sum().idxmax()
    off = res["clock_offsets"].set_index("rank")["offset_ns"]
    assert off[0] - off[1] == pytest.approx(shift_ns, abs=1e6)  # rank 1's clock moved back by the shift
    code, out, err = run_cli("info", store)
    assert "clock offsets applied" in out and "more than a step" in out


def test_clean_single_host_run_applies_no_offset(unshifted, run_cli, good_store):
    code, out, err = run_cli("info", good_store)
    assert "clock offsets: not applied (one host" in out


# -- parameters and plans ------------------------------------------------------------------

@pytest.mark.parametrize("item,needle", [("straggler_min_delay_pct=nan", "not NaN or infinity"),
                                         ("straggler_min_delay_pct=inf", "not NaN or infinity"),
                                         ("imbalance_min_ratio=-1", ">= 0"),
                                         ("align_clocks=junk", "takes one of auto, always, never")])
def test_bad_parameter_refused(run_cli, good_store, item, needle):
    code, out, err = run_cli("analyze", good_store, "--no-save", "--set", item)
    assert code == 2 and needle in err and err.count("\n") == 1


@pytest.mark.parametrize("action,needle", [({"action": "idealize", "ranks": [7]}, "rank(s) 7 not in run 'good'"),
                                           ({"action": "scale", "factor": 0.5, "ops": "no_such_op*"},
                                            "'no_such_op*' matches no operation")])
def test_plan_action_matching_nothing_is_an_error(run_cli, good_store, tmp_path, action, needle):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"actions": [action]}))
    code, out, err = run_cli("replay", good_store, "--plan", plan)
    assert code == 2 and needle in err and err.count("\n") == 1


_DISK_FULL = """
import shutil, sys
from pathlib import Path
import traceanalyzer as ta
from traceanalyzer.cli.main import main
disk, good, other = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
store = disk / "store"
ta.ingest([good], store, run="good", progress=False)
before = sorted(p.relative_to(store).as_posix() for p in store.rglob("*") if p.is_file())
filler = disk / "filler"
try:
    with open(filler, "wb") as fh:
        while True:
            fh.write(b"x" * 65536)
except OSError:
    pass
code = main(["ingest", other, "--store", str(store), "--run", "other", "--quiet"])
filler.unlink()
after = sorted(p.relative_to(store).as_posix() for p in store.rglob("*") if p.is_file())
main(["check", str(store)])
print("RESULT", code, before == after)
"""


def test_disk_full_loses_nothing(tmp_path):
    """An ingest into a full disk (a small tmpfs in a private mount namespace) fails with one line
    and leaves the store exactly as it was."""
    disk = tmp_path / "disk"
    disk.mkdir()
    script = tmp_path / "full.py"
    script.write_text(_DISK_FULL)
    cmd = (f"mount -t tmpfs -o size=6m tmpfs {disk} && {sys.executable} {script} {disk} "
           f"{TRACES / 'ddp_gloo_2rank'} {TRACES / 'ddp_gloo_2rank_slow1_annotated'}")
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"]).returncode != 0:
        pytest.skip("cannot mount a small file system here (needs unshare and mount)")
    r = subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert "RESULT 2 True" in r.stdout, r.stdout + r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("traceanalyzer: error:")]
    assert len(errors) == 1 and "No space left on device" in errors[0], r.stderr
    assert "store OK" in r.stdout
