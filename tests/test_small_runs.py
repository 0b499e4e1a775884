"""Small runs pay no fixed cost the data does not ask for (issue 18 part 5), on the shipped 4-rank
straggler run: the JSON report decides which figures apply without drawing one (matplotlib is never
imported), a small run's replay runs without loading numba, and the HTML report draws each figure
(still without pyplot) when it embeds it -- a figure that cannot be drawn is named, not fatal.
The timings themselves live in benchmarks/small_runs.py (ratios, not assertions)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT, TRACES

import traceanalyzer as ta
from traceanalyzer import report

RUN = "ddp_gloo_4rank_slow2"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("small") / "store"
    ta.ingest([TRACES / RUN], d, run=RUN, progress=False, workers=1)
    with ta.open(d) as s:
        s.analyze()
    return d


def _modules_after(code: str, tmp_path) -> dict:
    """Run ``code`` in a fresh interpreter (this tree first on the path); it prints one JSON line."""
    out = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r})\n" + code],
                         capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


LOADED = "{m: m in sys.modules for m in ('matplotlib', 'matplotlib.pyplot', 'numba')}"


def test_json_report_draws_nothing_and_html_draws_without_pyplot(store, tmp_path):
    """CLI ``report -o r.json`` (with the replay what-ifs): figures listed, matplotlib and numba
    never imported; then, in the same process, the HTML report: matplotlib drawn, pyplot not."""
    got = _modules_after(f"""
import json
from traceanalyzer.cli.main import main
assert main(['report', {str(store)!r}, '--run', {RUN!r}, '-o', 'r.json']) == 0
after_json = {LOADED}
assert main(['report', {str(store)!r}, '--run', {RUN!r}, '-o', 'r.html']) == 0
print(json.dumps({{'json': after_json, 'html': {LOADED}}}))""", tmp_path)
    assert got["json"] == {"matplotlib": False, "matplotlib.pyplot": False, "numba": False}
    assert got["html"] == {"matplotlib": True, "matplotlib.pyplot": False, "numba": False}
    doc = json.loads((tmp_path / "r.json").read_text())["runs"][0]
    assert [f["name"] for f in doc["figures"]] == ["step_heatmap", "arrival_skew", "overlap_bars", "imbalance", "top_ops"]
    assert doc["figure_errors"] == [] and doc["replay"]["status"] == "ok"    # the replay did run (in Python)
    assert doc["findings"][0]["replay"]["status"] == "ok"
    page = (tmp_path / "r.html").read_text()
    assert page.count('src="data:image/png;base64,') == len(doc["figures"])


def test_undrawn_figures_are_drawn_when_written(store, tmp_path):
    """``render=False`` plans the figures (names, titles, captions) without drawing one; writing
    HTML draws them, and one whose drawing fails leaves the page with a line saying so."""
    lazy = report.build_report(store, run=RUN, replay=False, render=False)
    rr = lazy.runs[0]
    names = [f.name for f in rr.figures]
    assert names == ["step_heatmap", "arrival_skew", "overlap_bars", "imbalance", "top_ops"]
    assert all(f.drawn is None and f.title and f.caption for f in rr.figures)

    def broken(fig, **_):
        raise ValueError("cannot draw this")
    rr.figures[1].draw = broken
    report.write_report(lazy, tmp_path / "r.html")
    assert [f.name for f in rr.figures] == [n for n in names if n != "arrival_skew"]
    assert rr.figure_errors == ["arrival_skew: ValueError: cannot draw this"]
    assert all(f.drawn.startswith(b"\x89PNG") for f in rr.figures)
    page = (tmp_path / "r.html").read_text()
    assert page.count('src="data:image/png;base64,') == 4 and "cannot draw this" in page


def test_listed_pipeline_figures_need_no_idle_intervals(tmp_path_factory):
    """A report that only lists its figures (the JSON report) does not compute the pipeline's idle
    intervals -- most of the analyses' SQL chain -- yet lists the same figures, titles and captions:
    pipeline_bubbles tells whether the stages sat idle. Written as HTML anyway, the timeline is the
    one figure it cannot draw, and the page says why."""
    from traceanalyzer.report.figures import plan_figures
    from traceanalyzer.report.load import load_run, open_runs
    run = "pp_1f1b_4rank_slow1"
    d = tmp_path_factory.mktemp("small_pp") / "store"
    ta.ingest([TRACES / run], d, run=run, progress=False, workers=1)
    con, _ = open_runs(d, run)          # analyses the run (results saved) first
    loaded, listed = load_run(con, d, run), load_run(con, d, run, with_intervals=False)
    con.close()
    assert len(loaded.pipeline_idle) > 100 and listed.pipeline_idle is None
    key = [(f.name, f.title, f.caption) for f in plan_figures(loaded)[0]]
    assert key == [(f.name, f.title, f.caption) for f in plan_figures(listed)[0]]
    assert "pipeline_timeline" in [k[0] for k in key]
    rep = report.build_report(d, run=run, replay=False, figures="listed")
    assert [f.name for f in rep.runs[0].figures] == [k[0] for k in key]
    report.write_report(rep, tmp_path_factory.mktemp("small_pp_out") / "r.html")
    assert [e.split(":")[0] for e in rep.runs[0].figure_errors] == ["pipeline_timeline"]
    assert "not loaded" in rep.runs[0].figure_errors[0]
