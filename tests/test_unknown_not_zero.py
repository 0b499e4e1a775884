"""Unknown is shown as unknown: a real run recorded without record_shapes (traces/ddp_gloo_2rank_noshapes)
stores NULL sizes, and ingest, ``info`` and the report say the sizes are unknown instead of 0 bytes;
the same run recorded with shapes (traces/ddp_gloo_2rank) raises none of it."""
from __future__ import annotations

import pytest
from conftest import TRACES

import traceanalyzer as ta
from traceanalyzer.analyses.summary import format_info, info
from traceanalyzer.report import build_report
from traceanalyzer.report.markdown import render_markdown

NOSHAPES = TRACES / "ddp_gloo_2rank_noshapes"
SHAPES = TRACES / "ddp_gloo_2rank"


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    store = tmp_path_factory.mktemp("unknown") / "s"  # both runs in one store: one report analyses both
    return {name: (store, ta.ingest([path], store, run=name)) for name, path in (("noshapes", NOSHAPES), ("shapes", SHAPES))}


def test_ingest_warns_and_counts_unknown_sizes(stores):
    store, report = stores["noshapes"]
    assert [t.unknown.get("size") for t in report.traces] == [12, 12]
    warning = [line for line in report.summary().splitlines() if "warning" in line]
    assert len(warning) == 1 and "24 of 24 communication ops" in warning[0] and "unknown message size" in warning[0]
    con = ta.open(store)
    sizes = con.sql("""SELECT count(*) AS n, count(in_bytes) AS known, count(out_bytes) AS known_out FROM comms
                       WHERE run = 'noshapes'""").df().iloc[0]
    assert sizes["n"] == 24 and sizes["known"] == 0 and sizes["known_out"] == 0  # NULL, never 0
    # the groups are known (Flight Recorder dumps): no group warning
    assert "process group" not in report.summary()


def test_no_warning_when_sizes_were_recorded(stores):
    _, report = stores["shapes"]
    assert all(not t.unknown for t in report.traces) and "warning" not in report.summary()


def test_info_shows_na_not_zero(stores, run_cli):
    store, _ = stores["noshapes"]
    df = info(store)
    df = df[df["run"] == "noshapes"]
    assert df["comm_bytes"].isna().all() and (df["size_unknown"] == 12).all()
    text = format_info(df, str(store))
    table = text.splitlines()[3:5]
    assert all(line.split()[-2] == "n/a" for line in table), table
    assert "unknown message size" in text
    code, out, _ = run_cli("info", store)
    assert code == 0 and "n/a" in out and "note: 24 communication op(s) with unknown message size" in out
    known = info(store)
    known = known[known["run"] == "shapes"]
    assert (known["comm_bytes"] > 0).all() and "n/a" not in format_info(known, "s")


def test_report_says_sizes_are_unknown(stores):
    store, _ = stores["noshapes"]
    report = build_report(store, figures=False, replay=False)
    runs = {rr.run: rr for rr in report.runs}
    caveats = runs["noshapes"].caveats
    assert len(caveats) == 1 and "Message sizes unknown for 24 of 24" in caveats[0] and "record_shapes" in caveats[0]
    assert runs["shapes"].caveats == []
    text = render_markdown(report)
    assert text.count("Caveats") == 1 and "Message sizes unknown" in text


def test_fr_dump_gives_the_dtype_the_trace_lacks(tmp_path):
    """gloo on CUDA tensors: some gloo:all_reduce spans record no shapes and the enqueue's tensor
    list no dtype; the Flight Recorder entry has it, so no size stays unknown (no false warning)."""
    report = ta.ingest([TRACES / "ddp_gloo_cuda_2rank"], tmp_path / "s")
    assert "warning" not in report.summary() and all(not t.unknown for t in report.traces)
    con = ta.open(tmp_path / "s")
    n = con.sql("SELECT count(*) AS n FROM comms WHERE in_bytes IS NULL OR in_bytes = 0").df()["n"][0]
    assert n == 0
