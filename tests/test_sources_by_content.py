"""Issue 17 part 3: inputs recognised by what they hold, not by their names (real shipped data)."""
from __future__ import annotations

import shutil
from pathlib import Path

import traceanalyzer as ta
from traceanalyzer.analyses import desync
from traceanalyzer.ingest.sniff import rank_of, sniff

TRACES = Path(__file__).resolve().parent.parent / "traces"
DESYNC = TRACES / "fr_desync_gloo_3rank"


def _launcher_names(tmp_path: Path) -> Path:
    folder = tmp_path / "dumps"
    folder.mkdir()
    for r in range(3):
        shutil.copy(DESYNC / f"rank{r}.fr.json", folder / f"fr_rank_{r}")
    return folder


def test_fr_dumps_under_launcher_names_desync_and_ingest(run_cli, tmp_path):
    folder = _launcher_names(tmp_path)
    assert [sniff(folder / f"fr_rank_{r}")[0] for r in range(3)] == ["flight_recorder"] * 3
    assert rank_of(folder / "fr_rank_2") == (2, "file_name")
    expected = desync.diagnose([DESYNC]).text()
    for given in ([folder], [folder / f"fr_rank_{r}" for r in range(3)]):  # a folder, and explicit paths
        d = desync.diagnose(given)
        assert "HANG: not all ranks joined: group 0 (default_pg), collective #7" in d.text()
        assert d.text().replace(str(folder), "").splitlines()[2:4] == expected.replace(str(DESYNC), "").splitlines()[2:4]
    store = tmp_path / "store"
    code, out, err = run_cli("ingest", *(folder / f"fr_rank_{r}" for r in range(3)), "--store", store, "--run", "fr", "--quiet")
    assert code == 0, err
    assert "3 Flight Recorder dump(s) (20 entries)" in out
    con = ta.open(store)
    assert con.execute("SELECT rank, count(*) FROM fr_entries GROUP BY rank ORDER BY rank").fetchall() == [(0, 7), (1, 6), (2, 7)]
    code, out, err = run_cli("ingest", folder, "--store", tmp_path / "store2", "--quiet")
    assert code == 0 and "3 Flight Recorder dump(s)" in out, err
    code, out, err = run_cli("desync", folder)
    assert code == 1 or "HANG" in out, (code, out, err)


def test_kineto_trace_under_any_name(run_cli, tmp_path):
    odd = tmp_path / "something.txt"
    shutil.copy(DESYNC / "rank1.window0.pt.trace.json.gz", odd)
    assert sniff(odd)[0] == "kineto"
    code, out, err = run_cli("ingest", odd, "--store", tmp_path / "s", "--run", "k", "--quiet")
    assert code == 0, err
    assert "(ranks 1)" in out  # the rank from the trace's content (distributedInfo)
    assert ta.open(tmp_path / "s").execute("SELECT rank_source FROM ranks").fetchall() == [("distributedInfo",)]


def test_unrecognised_file_one_line_no_store_left(run_cli, tmp_path):
    for name, data, seen in (("notes.csv", b"hello,world\n1,2\n", "text starting 'hello,world'"),
                             ("blob.bin", bytes(range(256)) * 8, "binary data"),
                             ("conf.json.x", b'{"lr": 0.1, "epochs": 3}', "a JSON object with keys lr")):
        bad = tmp_path / name
        bad.write_bytes(data)
        store = tmp_path / f"new-{name}"
        code, out, err = run_cli("ingest", bad, "--store", store, "--quiet")
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert code == 2 and len(lines) == 1, err
        assert str(bad) in lines[0] and "not a recognised input" in lines[0] and seen in lines[0], lines[0]
        assert "expected a Kineto trace" in lines[0] and "op timeline" in lines[0]
        assert not store.exists()  # a failed ingest leaves no new folder


def test_pickled_fr_dumps_under_launcher_names_in_a_folder(run_cli, tmp_path):
    """torch's own FR dumps are pickles; a launcher names them fr_rank_{R}. Another pickle in the
    folder is not ours and is left alone (checked through the restricted unpickler only)."""
    import json
    import pickle
    folder = tmp_path / "dumps"
    folder.mkdir()
    for r in range(3):
        doc = json.loads((DESYNC / f"rank{r}.fr.json").read_text())
        (folder / f"fr_rank_{r}").write_bytes(pickle.dumps(doc, protocol=4))
    (folder / "optimizer_state.pkl").write_bytes(pickle.dumps({"lr": 0.1, "step": 7}, protocol=4))
    assert sniff(folder / "fr_rank_1")[0] == "flight_recorder"
    d = desync.diagnose([folder])
    assert "HANG: not all ranks joined: group 0 (default_pg), collective #7" in d.text()
    code, out, err = run_cli("ingest", folder, "--store", tmp_path / "s", "--quiet")
    assert code == 0, err
    assert "3 Flight Recorder dump(s) (20 entries)" in out
    formats = ta.open(tmp_path / "s").execute("SELECT DISTINCT source_format FROM fr_dumps").fetchall()
    assert formats == [("pickle",)]
