"""What a person reads is true, consistent and short (issue 16): findings say where and how much,
with one denominator; captions match the data; no NaN/<NA> in text; errors name the path and the
problem; documented exit codes; the demo fits on a screen and ends with the next commands."""
from __future__ import annotations

import html
import io
import json
import re

import pandas as pd
import pytest
from conftest import TRACES

from traceanalyzer import report
from traceanalyzer.analyses.results import analyze, format_text

SLOW2 = "ddp_gloo_4rank_slow2"
NA = re.compile(r"\bnan\b|<NA>|\bNaN\b|\bNone\b")


@pytest.fixture(scope="module")
def store(shipped_store):
    return shipped_store


@pytest.fixture(scope="module")
def results(store):
    return analyze(store, save_results=False)


def test_analyze_text_says_where_and_states_the_denominator_once(results):
    text = format_text(results, {})
    assert not NA.search(text), NA.search(text)
    runs = text.split("== run '")[1:]
    assert len(runs) == len({r for df in results.values() if "run" in df for r in df["run"].unique()})
    for block in runs:
        assert block.count("median step ") == 1 and "every '% of the step' below is of it" in block
    slow2 = next(b for b in runs if b.startswith(SLOW2))
    ann = results["stragglers"].query("run == @SLOW2 and rank == 2")["annotation"].iloc[0]
    assert ann == "DistributedDataParallel.forward"   # rank 2 sleeps inside DDP's forward (no named range of its own)
    line = next(ln for ln in slow2.splitlines() if ln.startswith("straggler #1"))
    assert "rank 2" in line and "forward phase" in line and f"in the range {ann}" in line
    imb1 = next(b for b in runs if b.startswith("ddp_gloo_2rank_imb1"))
    assert "named range unknown (no record_function range recorded in that phase)" in imb1
    pp = next(b for b in runs if b.startswith("pp_1f1b_4rank_slow2"))
    assert "seq unknown: p2p ops have none" in pp   # was '<NA>'


@pytest.fixture(scope="module")
def slow2_report(store):
    return report.build_report(store, run=SLOW2, replay=False)


def test_findings_carry_where_and_how_much(slow2_report, store, tmp_path):
    rr = slow2_report.runs[0]
    top = rr.findings[0]
    assert top.where["rank"] == 2 and top.where["phase"] == "forward"
    assert top.where["annotation"] == "DistributedDataParallel.forward"
    assert top.where_text == "rank 2, forward phase, in the range DistributedDataParallel.forward"
    step_ms = rr.metrics["step_ms"]
    assert top.how_much == f"{top.recoverable_ns_per_step / 1e6:.2f} ms per step " \
                           f"({100 * top.recoverable_ns_per_step / (step_ms * 1e6):.1f}% of the median step)"
    assert top.recoverable_pct == pytest.approx(100 * top.recoverable_ns_per_step / (step_ms * 1e6))
    paths = {fmt: report.write_report(slow2_report, tmp_path / f"r.{fmt}") for fmt in ("html", "md", "json")}
    for fmt, p in paths.items():
        text = p.read_text()
        assert "DistributedDataParallel.forward" in text, fmt
        if fmt != "json":
            assert "every '% of the step' below is of this time" in html.unescape(text), fmt
            assert not NA.search(re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", text)), fmt
    doc = json.loads(paths["json"].read_text())
    assert doc["runs"][0]["findings"][0]["where"]["annotation"] == "DistributedDataParallel.forward"


def test_captions_are_true_for_the_data(slow2_report, store):
    figs = {f.name: f for f in slow2_report.runs[0].figures}
    heat = figs["step_heatmap"]
    assert heat.title.startswith("Wait each rank imposed")   # synchronous DDP: step times are equal
    assert "one hot row is a slow rank" not in heat.caption.lower()
    imb = figs["imbalance"]
    assert not any(f.kind == "imbalance" for f in slow2_report.runs[0].findings)
    assert "No rank is imbalanced" in imb.caption     # and no rank is labelled with a ratio
    imb1 = report.build_report(store, run="ddp_gloo_2rank_imb1", replay=False).runs[0]
    cap = next(f.caption for f in imb1.figures if f.name == "imbalance")
    assert "labelled rank(s)" in cap and "No rank" not in cap
    pp = report.build_report(store, run="pp_1f1b_4rank_slow2", replay=False).runs[0]
    assert next(f.title for f in pp.figures if f.name == "step_heatmap").startswith("Step time")


def test_report_formats_are_real_or_refused(run_cli, store, tmp_path):
    code, out, err = run_cli("report", store, "--run", SLOW2, "-o", tmp_path / "r.txt")
    assert code == 2 and ".txt" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r.txt").exists()
    code, out, err = run_cli("report", store, "--run", SLOW2, "--no-replay", "-o", tmp_path / "r.pdf")
    assert code == 0, err
    data = (tmp_path / "r.pdf").read_bytes()
    assert data.startswith(b"%PDF-") and data.rstrip().endswith(b"%%EOF")
    assert len(re.findall(rb"/Type\s*/Page\b", data)) >= 1 + 4   # the findings, then one page per figure


def test_sql_whole_message_and_row_count(run_cli, store):
    code, out, err = run_cli("sql", store, "SELECT * FROM comm")
    assert code == 2 and 'Did you mean "comms"' in err and len(err.strip().splitlines()) == 1
    code, out, err = run_cli("sql", store, f"SELECT rank, name FROM events WHERE run = '{SLOW2}'", "--max-rows", "5")
    assert code == 0
    n = int(out.strip().splitlines()[-1].split()[0].strip("(").replace(",", ""))
    assert n > 5 and f"({n:,} rows, 5 shown" in out


def test_path_advice_names_what_the_path_is(run_cli, tmp_path):
    code, _, err = run_cli("info", TRACES / "ddp_gloo_2rank")
    assert code == 2 and "this is a trace folder" in err and "traceanalyzer ingest" in err
    trace = next((TRACES / "ddp_gloo_2rank").glob("*.pt.trace.json.gz"))
    code, _, err = run_cli("info", trace)
    assert code == 2 and "this is a trace file" in err
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    code, _, err = run_cli("ingest", TRACES / "ddp_gloo_2rank", "--store", blocker, "--quiet")
    assert code == 2 and "this is a file, not a folder" in err and "File exists" not in err


def test_replay_plan_targets_must_exist_and_breakdown_adds_up(run_cli, store, tmp_path):
    bad = tmp_path / "rank7.json"
    bad.write_text(json.dumps({"actions": [{"action": "idealize", "ranks": [7]}]}))
    code, out, err = run_cli("replay", store, "--run", SLOW2, "--plan", bad)
    assert code == 2 and "rank(s) 7 not in run" in err and str(bad) in err
    bad.write_text(json.dumps({"actions": [{"action": "scale", "factor": 0.5, "ops": "no_such_op*"}]}))
    code, out, err = run_cli("replay", store, "--run", SLOW2, "--plan", bad)
    assert code == 2 and "matches no operation" in err
    good = tmp_path / "rank2.json"
    good.write_text(json.dumps({"actions": [{"action": "idealize", "ranks": [2]}]}))
    code, out, err = run_cli("replay", store, "--run", SLOW2, "--plan", good, "--straggler-metrics")
    assert code == 0, err
    table = out.split("waiting_other = waiting for peers and work on parallel lanes):\n")[1].split("straggler what-if")[0]
    bd = pd.read_csv(io.StringIO(table), sep=r"\s+", skiprows=[1], index_col=0)
    parts = bd.drop(columns="step_time").sum(axis=1)
    assert (parts - bd["step_time"]).abs().max() < 0.01   # the columns add up to the step's change
    assert (bd["step_time"] < -5).all()                   # every rank's step drops ...
    assert bd.loc[0, "waiting_other"] < -5                # ... a peer's through less waiting
    share = re.search(r"recovers (all|[0-9]+%)", out).group(1)   # never more than all of it
    assert share == "all" or int(share.rstrip("%")) <= 100


@pytest.mark.slow
def test_demo_is_one_screen_ending_with_the_next_commands(tmp_path, capsys):
    """The demo (shipped sample runs) prints at most 60 lines, says where the injected straggler
    and slow stage are (the report's findings, confirmed by replay), and ends with the commands to run next on that store (its memory: benchmarks/demo_bench.py)."""
    from traceanalyzer.cli.demo import MAX_LINES, demo
    store = tmp_path / "store"
    assert demo(str(store)) == 0
    out = capsys.readouterr().out.rstrip("\n").splitlines()
    assert len(out) <= MAX_LINES == 60
    assert any("1. Straggler: rank 2" in ln and "(replay)" in ln and "in the range DistributedDataParallel.forward" in ln
               for ln in out)   # the report's confirmed finding, not an analysis' candidate
    assert any("1. Slow pipeline stage: stage 2 (rank 2)" in ln for ln in out)
    tail = out[out.index("next:"):]
    assert tail[1].split("#")[0].split() == ["traceanalyzer", "report", str(store), "-o", "report.html"]
    assert all(ln.strip().startswith("traceanalyzer ") for ln in tail[1:])
    assert not NA.search("\n".join(out))
