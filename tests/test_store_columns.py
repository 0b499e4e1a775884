"""Every file an ingest writes holds its table's columns exactly (names and types of the schema):
the manifest's entries say so (``schema``), and the store's views then read only the first file's
footer (:func:`traceanalyzer.store.files.same_columns`). An entry without the key (an older
ingest, perhaps of fewer columns) makes its tables read by column name.

Each source is checked on real data: Kineto JSON with Flight Recorder dumps (the shipped store),
other people's Kineto traces (the external store), the collector's Parquet parts and CPU samples,
an op timeline, an Nsight Systems export, NCCL logs and the NCCL plugins' output."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import EXTERNAL, ROOT, TRACES

import traceanalyzer as ta
from traceanalyzer import schema as S
from traceanalyzer.store import files as st

FIX = ROOT / "tests" / "fixtures"
NSYS = EXTERNAL / "nsys" / "mfu_2gpu_before.sqlite"


def columns_exact(store: Path) -> int:
    """Assert every listed table file holds its table's columns exactly; returns how many files."""
    manifest = st.read_manifest(store)
    n = 0
    for entry in manifest.traces + manifest.sidecars:
        assert entry.get("schema") == S.SCHEMA_VERSION, entry
        for table, rel in entry["files"].items():
            want = pa.schema([f for f in S.TABLES[table].arrow_schema if f.name not in S.TABLES[table].partition])
            got = pq.read_schema(store / rel)
            assert got.names == want.names and got.types == want.types, (rel, got, want)
            n += 1
    assert st.same_columns(manifest, "events")
    return n


def test_shipped_and_external_stores(shipped_store, external_store):
    assert columns_exact(shipped_store) > 0
    assert columns_exact(external_store[0]) > 0


def test_collector_parts_and_cpu_samples(ddp2_collector_store):
    assert columns_exact(ddp2_collector_store) > 0


def test_op_timeline_nsys_and_nccl_side(tmp_path):
    store = tmp_path / "s"
    ta.ingest([TRACES / "pp_gpipe_2x2_dp_optimeline_slow1"], store, run="optl", progress=False, workers=1)
    ta.ingest([FIX / "nccl_logs"], store, run="logs", progress=False, workers=1)
    ta.ingest([FIX / "nccl_plugins"], store, run="plugins", progress=False, workers=1)
    ta.ingest([FIX / "nccl_fr"], store, run="nccl", progress=False, workers=1)
    if NSYS.exists():
        ta.ingest([NSYS], store, run="nsys", progress=False, workers=1)
    assert columns_exact(store) > 0


def test_an_older_entry_is_read_by_column_name(tmp_path):
    """An entry without ``schema`` (an ingest before the key) whose file lacks a column: the other
    files' values are kept and its own show as unknown (NULL), whichever file comes first."""
    store = tmp_path / "s"
    ta.ingest([TRACES / "ddp_gloo_2rank"], store, run="r", progress=False, workers=1)
    manifest = st.read_manifest(store)
    rank0 = next(t for t in manifest.traces if t["rank"] == 0)
    path = store / rank0["files"]["events"]
    pq.write_table(pq.read_table(path).drop_columns(["args_json"]), path)
    doc = json.loads((store / st.MANIFEST).read_text())
    for t in doc["traces"]:
        if t["rank"] == 0:
            del t["schema"]
    (store / st.MANIFEST).write_text(json.dumps(doc))
    assert not st.same_columns(st.read_manifest(store), "events")
    con = ta.open(store)
    known = dict(con.execute("SELECT rank, count(args_json) FROM events GROUP BY rank").fetchall())
    assert known[0] == 0 and known[1] > 0


@pytest.mark.parametrize("drop", [True, False])
def test_same_columns_needs_every_entry(drop):
    m = st.Manifest(traces=[{"files": {"events": "a"}, "schema": S.SCHEMA_VERSION},
                            {"files": {"events": "b"}, **({} if drop else {"schema": S.SCHEMA_VERSION})}],
                    sidecars=[{"files": {"fr_dumps": "c"}, "schema": "1.2"}])
    assert st.same_columns(m, "events") is not drop
    assert not st.same_columns(m, "fr_dumps")


def test_a_file_changed_by_hand_is_one_line(tmp_path, run_cli):
    """A file of a marked entry replaced by one without a column (by hand): the query names the file
    in one error line, exit 2 (not a traceback)."""
    store = tmp_path / "s"
    ta.ingest([TRACES / "ddp_gloo_2rank"], store, run="r", progress=False, workers=1)
    rank1 = next(t for t in st.read_manifest(store).traces if t["rank"] == 1)
    path = store / rank1["files"]["events"]
    pq.write_table(pq.read_table(path).drop_columns(["args_json"]), path)
    code, out, err = run_cli("analyze", store)
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 2 and len(lines) == 1 and str(path) in lines[0] and "args_json" in lines[0], err


def test_check_finds_a_file_changed_by_hand(tmp_path, run_cli):
    """``check`` reads the footers of the files marked exact: a file changed by hand (a column
    dropped) damages its run, named with the file and the column; ``--repair`` drops that run's
    listing and the other run stays readable. An unchanged store says OK."""
    store = tmp_path / "s"
    ta.ingest([TRACES / "ddp_gloo_2rank"], store, run="r", progress=False, workers=1)
    ta.ingest([TRACES / "ddp_gloo_2rank"], store, run="kept", progress=False, workers=1)
    code, out, _ = run_cli("check", store)
    assert code == 0 and "store OK" in out, out
    rank1 = next(t for t in st.read_manifest(store).traces if t["rank"] == 1 and t["run"] == "r")
    path = store / rank1["files"]["events"]
    pq.write_table(pq.read_table(path).drop_columns(["args_json"]), path)
    code, out, _ = run_cli("check", store)
    lines = [x for x in out.splitlines() if "damaged run '" in x]
    assert code == 1 and len(lines) == 1 and "'r'" in lines[0] and rank1["files"]["events"] in lines[0] \
        and "missing args_json" in lines[0], out
    code, out, _ = run_cli("check", store, "--repair")
    assert code == 0 and "its listing removed" in out, out
    assert {t["run"] for t in st.read_manifest(store).traces} == {"kept"}
    assert ta.open(store).execute("SELECT count(*) FROM events").fetchone()[0] > 0
    code, out, _ = run_cli("check", store)
    assert code == 0 and "store OK" in out, out


def test_column_problem_names_each_difference(tmp_path):
    from traceanalyzer.store.check import column_problem
    spec = S.TABLES["steps"]
    want = pa.schema([f for f in spec.arrow_schema if f.name not in spec.partition])
    path = tmp_path / "steps.parquet"
    pq.write_table(want.empty_table(), path)
    assert column_problem(path, "steps") is None
    first = want.field(0)
    changed = want.set(0, pa.field(first.name, pa.string())).append(pa.field("mine", pa.int8()))
    pq.write_table(changed.empty_table(), path)
    problem = column_problem(path, "steps")
    assert f"retyped {first.name} (string, not {first.type})" in problem and "extra mine" in problem, problem
    pq.write_table(pa.schema(list(reversed(want))).empty_table(), path)
    assert "in another order" in column_problem(path, "steps")
