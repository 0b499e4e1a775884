"""The notebooks run top to bottom on the shipped traces (executed with nbclient), and are kept in
git without outputs."""
from __future__ import annotations

import json
import sys

import pytest
from conftest import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
KERNEL = "traceanalyzer-tests"


def test_the_notebooks_are_there_and_have_no_outputs():
    assert [p.stem for p in NOTEBOOKS] == ["01_quickstart", "02_stragglers_imbalance", "03_pipeline_bubbles",
                                          "04_whatif_replay"]
    for p in NOTEBOOKS:
        for cell in json.loads(p.read_text())["cells"]:
            if cell["cell_type"] == "code":
                assert cell.get("outputs") == [] and cell.get("execution_count") is None, f"{p.name}: clear its outputs"


@pytest.fixture(scope="module")
def kernel(tmp_path_factory, monkeypatch_module):
    """A kernelspec for *this* interpreter, found first through JUPYTER_PATH: a fresh CI venv has no
    registered kernel, and a machine-wide 'python3' may belong to another Python."""
    pytest.importorskip("nbclient", reason="pip install -e '.[test]' installs nbclient/ipykernel/nbformat")
    pytest.importorskip("ipykernel")
    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "traceanalyzer tests", "language": "python"}))
    monkeypatch_module.setenv("JUPYTER_PATH", str(root))
    monkeypatch_module.setenv("TRACEANALYZER_NOTEBOOK_DIR", str(tmp_path_factory.mktemp("notebook_work")))
    monkeypatch_module.setenv("MPLBACKEND", "Agg")
    return KERNEL


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.mark.slow
def test_notebooks_run_top_to_bottom(kernel):
    """All four at once, one kernel each (they use separate stores): their analyses are
    single-threaded, so this takes the time of the longest rather than the sum."""
    import asyncio

    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    books = {p.stem: nbformat.read(p, as_version=4) for p in NOTEBOOKS}

    async def run(name, nb):
        client = NotebookClient(nb, kernel_name=kernel, timeout=600, resources={"metadata": {"path": str(ROOT / "notebooks")}})
        try:
            await client.async_execute()
        except CellExecutionError as exc:
            return f"{name}: {str(exc)[-1500:]}"
        return None

    async def run_all():
        return await asyncio.gather(*(run(n, nb) for n, nb in books.items()))

    failures = [f for f in asyncio.run(run_all()) if f]
    assert failures == [], "\n\n".join(failures)
    for name, nb in books.items():
        outputs = [c.outputs for c in nb.cells if c.cell_type == "code"]
        assert all(outputs[1:]), f"{name}: a cell after the set-up printed nothing"


def test_executed_copies_are_current():
    """notebooks/executed/ holds each notebook run with its outputs (for readers; written by
    notebooks/execute.py): same cells as the source, and outputs after the set-up. After editing a
    notebook: python notebooks/execute.py NAME, and commit both."""
    for p in NOTEBOOKS:
        ex = ROOT / "notebooks" / "executed" / p.name
        assert ex.is_file(), f"{ex} is missing: run python notebooks/execute.py {p.stem}"
        src, done = json.loads(p.read_text())["cells"], json.loads(ex.read_text())["cells"]
        assert [(c["cell_type"], "".join(c["source"])) for c in src] == \
               [(c["cell_type"], "".join(c["source"])) for c in done], \
            f"{ex.name} is stale (its cells differ from {p.name}): run python notebooks/execute.py {p.stem}"
        code = [c for c in done if c["cell_type"] == "code"]
        assert all(c.get("outputs") for c in code[1:]), f"{ex.name}: a cell after the set-up has no output"
        assert not any(o.get("output_type") == "error" for c in code for o in c.get("outputs", [])), ex.name
