"""Hang / desync diagnosis from all ranks' Flight Recorder dumps: on a real gloo hang
(traces/fr_desync_gloo_3rank: rank 1 skipped an all-reduce), on the NCCL fixture, and against
torchfrtrace's own answer."""
from __future__ import annotations

import json
import pickle
import re
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, TRACES

import traceanalyzer as ta
from traceanalyzer.analyses.desync import diagnose

DESYNC = TRACES / "fr_desync_gloo_3rank"
NCCL = ROOT / "tests" / "fixtures" / "nccl_fr"


def ground_truth():
    return json.loads((DESYNC / "manifest.json").read_text())["ground_truth"]


def last_seq(path) -> int:
    return max(e["collective_seq_id"] for e in json.loads(path.read_text())["entries"])


def test_real_gloo_hang_names_the_missing_rank_and_the_collective():
    gt = ground_truth()
    d = diagnose([DESYNC])
    assert d.ranks == [0, 1, 2] and d.backend == "gloo"
    assert len(d.findings) == 1
    f = d.findings.iloc[0]
    assert f["kind"] == "missing_ranks"
    assert f["missing_ranks"] == [gt["skip_rank"]] and f["joined_ranks"] == [0, 2]
    assert (f["pg_name"], f["op"], f["profiling_name"]) == (gt["process_group"], gt["skipped_op"], "gloo:all_reduce")
    # the collective: the one after the last the skipping rank issued, the last its peers issued
    skip = DESYNC / f"rank{gt['skip_rank']}.fr.json"
    assert f["seq"] == last_seq(skip) + 1 == last_seq(DESYNC / "rank0.fr.json") == last_seq(DESYNC / "rank2.fr.json")
    # where the others wait: the workload's gradient all-reduce
    assert f["stack"][0].startswith("all_reduce at ") and any("allreduce_grads at" in s and "desync.py" in s for s in f["stack"])
    assert d.groups.iloc[0]["membership_source"] == "rank_manifest"  # gloo's pg_config names no group


def test_cli_prints_one_screen(run_cli):
    code, out, err = run_cli("desync", DESYNC)
    assert code == 1, err  # a hang found: exit 1, so CI can gate on it
    lines = out.splitlines()
    assert len(lines) <= 40
    assert "HANG: not all ranks joined: group 0 (default_pg), collective #7: gloo:all_reduce" in out
    assert "missing ranks: 1   joined: 0,2" in out and "allreduce_grads at" in out
    code, out, err = run_cli("desync", DESYNC, "--json")
    assert code == 1 and json.loads(out)[0]["missing_ranks"] == [1]


def test_from_a_store_and_without_manifests(tmp_path):
    ta.ingest([DESYNC], tmp_path / "s")
    d = diagnose(tmp_path / "s")
    f = d.findings.iloc[0]
    assert (f["kind"], f["seq"], f["missing_ranks"]) == ("missing_ranks", 7, [1])
    assert d.groups.iloc[0]["membership_source"] == "trace_pg_config"
    bare = tmp_path / "bare"  # the dumps alone: the default group spans all dumped ranks
    bare.mkdir()
    for p in DESYNC.glob("rank*.fr.json"):
        shutil.copy(p, bare / p.name)
    d = diagnose([bare])
    assert d.groups.iloc[0]["membership_source"] == "default_pg_world"
    assert d.findings.iloc[0]["missing_ranks"] == [1]


def test_a_rank_without_dump_is_reported(tmp_path):
    """Rank 1 died without dumping: the others look consistent, but the group is not judged clean."""
    folder = tmp_path / "d"
    folder.mkdir()
    for p in DESYNC.iterdir():
        if p.name != "rank1.fr.json":
            shutil.copy(p, folder / p.name)
    d = diagnose([folder])
    f = d.findings.iloc[0]
    assert (len(d.findings), f["kind"], f["missing_ranks"], f["joined_ranks"], f["seq"]) == (1, "no_dump", [1], [0, 2], 7)
    assert "NO DUMP: group 0 (default_pg): no Flight Recorder dump from ranks 1" in d.text()


@pytest.mark.parametrize("run", ["ddp_gloo_4rank", "ddp_gloo_2rank", "pp_1f1b_4rank"])
def test_clean_runs_have_no_finding(run):
    if not (TRACES / run).exists():
        pytest.skip(f"traces/{run} not present")
    d = diagnose([TRACES / run])
    assert d.ok, d.text()
    assert "No desync" in d.text()


def test_nccl_fixture_circular_wait():
    d = diagnose([NCCL])
    got = {(f["kind"], f["pg_name"], f["seq"], tuple(f["missing_ranks"])) for f in d.findings.to_dict("records")}
    assert got == {("missing_ranks", "0", 5, (3,)), ("missing_ranks", "2", 3, (2,))}
    f = d.findings[d.findings["pg_name"] == "0"].iloc[0]
    assert f["state"] == "started" and f["stack"][2] == "train_step at /job/train.py:57"
    assert "nccl:_all_gather_base (group 2, #3)" in f["missing_last"][3]
    assert set(d.groups["membership_source"]) == {"fr_pg_config"}


def _nccl_docs(tmp_path):
    out = tmp_path / "dumps"
    out.mkdir()
    return out, {r: json.loads((NCCL / f"rank{r}.fr.json").read_text()) for r in range(4)}


def _write(folder, docs):
    for r, doc in docs.items():
        (folder / f"rank{r}.fr.json").write_text(json.dumps(doc))


def test_mismatch_p2p_and_not_completed(tmp_path):
    folder, docs = _nccl_docs(tmp_path)
    # rank 1 calls all_reduce #3 of group 0 with another size: a mismatch at #3
    e = next(e for e in docs[1]["entries"] if e["process_group"][0] == "0" and e["collective_seq_id"] == 3 and not e["is_p2p"])
    e["input_sizes"] = [[2048]]
    # rank 1's receive is gone: rank 0's send has no partner
    docs[1]["entries"] = [e for e in docs[1]["entries"] if not e["is_p2p"]]
    # rank 3 also enters all_reduce #5 (and nobody calls the tp all_gather): #5 is joined by all, never completes
    docs[3]["entries"] = [e for e in docs[3]["entries"] if e["process_group"][0] != "2" or e["collective_seq_id"] < 3]
    extra = dict(next(e for e in docs[0]["entries"] if e["collective_seq_id"] == 5 and not e["is_p2p"]))
    docs[3]["entries"].append(extra)
    _write(folder, docs)
    d = diagnose([folder])
    kinds = {(f["kind"], f["pg_name"], f["seq"]) for f in d.findings.to_dict("records")}
    assert kinds == {("mismatch", "0", 3), ("p2p_unmatched", "0", None), ("not_completed", "0", 5)}
    mm = d.findings[d.findings["kind"] == "mismatch"].iloc[0]
    assert "ranks 1: nccl:all_reduce [[2048]]" in mm["detail"]
    p2p = d.findings[d.findings["kind"] == "p2p_unmatched"].iloc[0]
    assert p2p["detail"] == "rank 0 posted 1 send(s) to rank 1, which posted 0 receive(s) from it"
    nc = d.findings[d.findings["kind"] == "not_completed"].iloc[0]
    assert "started on ranks 0-3" in nc["detail"]


def test_bad_inputs(run_cli, tmp_path):
    code, out, err = run_cli("desync", tmp_path)
    assert code == 2 and "no Flight Recorder dumps" in err and len(err.strip().splitlines()) == 1
    folder = tmp_path / "d"
    folder.mkdir()
    data = (DESYNC / "rank0.fr.json").read_bytes()
    (folder / "rank0.fr.json").write_bytes(data[:100])
    code, out, err = run_cli("desync", folder)
    assert code == 2 and "truncated Flight Recorder JSON dump" in err and str(folder / "rank0.fr.json") in err
    (folder / "rank0.fr.json").write_bytes(data)
    (folder / "nccl_trace_rank_0").write_bytes(data)
    code, out, err = run_cli("desync", folder)
    assert code == 2 and "second Flight Recorder dump for rank 0" in err


# -- the same answer as torchfrtrace ------------------------------------------------------------

def _torchfrtrace(folder) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(folder)],
                          capture_output=True, text=True, timeout=120)


def _frtrace_findings(text: str) -> set[tuple]:
    """(group, seq, missing ranks) of torchfrtrace's 'Not all ranks joining collective' blocks,
    leaving out p2p ops (it checks a lone send/recv against the whole group)."""
    out = set()
    for block in text.split("Not all ranks joining collective, sequence number: ")[1:]:
        seq = int(block.split("\n", 1)[0])
        group = re.search(r"group info: ([^:\n]+):", block).group(1)
        coll = re.search(r"collective: (\S+)", block).group(1)
        missing = tuple(sorted(int(x) for x in re.search(r"missing ranks: \{([^}]*)\}", block).group(1).split(",")))
        if ":send" not in coll and ":recv" not in coll:
            out.add((group, seq, missing))
    return out


def _as_torch_pickles(src_docs: dict, folder, fix_pg_config=None):
    folder.mkdir()
    for r, doc in src_docs.items():
        doc = json.loads(json.dumps(doc))
        for e in doc["entries"]:
            e["process_group"] = tuple(e["process_group"])
        if fix_pg_config:
            doc["pg_config"] = fix_pg_config
        (folder / f"nccl_trace_rank_{r}").write_bytes(pickle.dumps(doc))  # our own data: torchfrtrace pickle.loads it


def test_same_answer_as_torchfrtrace_on_nccl_dumps(tmp_path):
    pytest.importorskip("torch")
    docs = {r: json.loads((NCCL / f"rank{r}.fr.json").read_text()) for r in range(4)}
    _as_torch_pickles(docs, tmp_path / "p")
    theirs = _torchfrtrace(tmp_path / "p")
    assert theirs.returncode == 0, theirs.stderr[-2000:]
    ours = {(f["pg_name"], f["seq"], tuple(f["missing_ranks"])) for f in diagnose([tmp_path / "p"]).findings.to_dict("records")
            if f["kind"] == "missing_ranks"}
    assert ours == _frtrace_findings(theirs.stdout + theirs.stderr) == {("0", 5, (3,)), ("2", 3, (2,))}


def test_same_answer_as_torchfrtrace_on_the_real_gloo_hang(tmp_path):
    """torchfrtrace cannot read gloo's pg_config ({"": ...}); with it repaired, it agrees with us,
    and we need no repair."""
    pytest.importorskip("torch")
    docs = {r: json.loads((DESYNC / f"rank{r}.fr.json").read_text()) for r in range(3)}
    _as_torch_pickles(docs, tmp_path / "raw")
    raw = _torchfrtrace(tmp_path / "raw")
    ours = {(f["pg_name"], f["seq"], tuple(f["missing_ranks"])) for f in diagnose([tmp_path / "raw"]).findings.to_dict("records")}
    assert ours == {("0", 7, (1,))}
    if raw.returncode == 0:  # a later torch may read it: then it must agree
        assert _frtrace_findings(raw.stdout + raw.stderr) == ours
    else:
        assert "KeyError" in raw.stderr
    _as_torch_pickles(docs, tmp_path / "fixed", {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"}})
    fixed = _torchfrtrace(tmp_path / "fixed")
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    assert _frtrace_findings(fixed.stdout + fixed.stderr) == ours


# -- a real hang, recorded now -------------------------------------------------------------------

@pytest.mark.launch
def test_desync_workload_hangs_and_every_rank_dumps(tmp_path):
    pytest.importorskip("torch")
    from launch_util import launch
    result = launch(2, ["desync", "--run-name", "hang", "--skip-rank", "1", "--skip-step", "3", "--timeout-s", "3"],
                    tmp_path, timeout=120)
    folder = result.out_dir / "hang"
    for r in range(2):
        m = json.loads((folder / f"rank{r}.manifest.json").read_text())
        assert m["exit"].startswith("error: ") and m["files"]["flight_recorder"] == f"rank{r}.fr.json"
    d = diagnose([folder])
    f = d.findings.iloc[0]
    assert (f["kind"], f["missing_ranks"], f["joined_ranks"], f["op"]) == ("missing_ranks", [1], [0], "all_reduce")
    assert f["seq"] == last_seq(folder / "rank1.fr.json") + 1


def test_cli_exit_code_gates_on_a_hang(run_cli):
    """Exit 1 with a hang (documented in `traceanalyzer --help`), 0 on a clean run: CI can gate on it."""
    assert run_cli("desync", DESYNC)[0] == 1
    code, out, err = run_cli("desync", TRACES / "ddp_gloo_2rank")
    assert code == 0 and "No desync" in out, err
