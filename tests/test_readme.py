"""The README's command examples run as written.

Every ```bash block preceded by a ``<!-- test -->`` line is executed, one command per line, in
README order, in one working folder where ``traces/`` is the repository's and ``store`` is a store
holding shipped runs under the names ingest gives them (their folder names) -- the README's own
``ingest`` lines add ``ddp_gloo_4rank_slow2`` and ``ddp_gloo_4rank``. ``<!-- test: exit 1 -->`` or ``<!-- test: exit 0 or 1 -->``
declares the exit codes a block's commands may return (default 0): ``desync`` exits 1 on the hang
it is shown on, ``report --fail-on`` exits 1 when a threshold is crossed.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest
from conftest import ROOT, TRACES

import traceanalyzer as ta

README = ROOT / "README.md"
MARKER = re.compile(r"^<!-- test(?::\s*exit ([0-9]+(?: or [0-9]+)*))? -->\s*$")
#: Shipped runs the README's examples read besides those its own `ingest` lines add, ingested under
#: their default names (the folder's).
RUNS = ("pp_1f1b_4rank_slow2", "ddp_gloo_2rank")

pytestmark = pytest.mark.slow


def readme_blocks(text: str) -> list[tuple[int, list[str], set[int]]]:
    """(line number, commands, allowed exit codes) of every marked ```bash block."""
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        m = MARKER.match(line)
        if not m:
            continue
        assert i + 1 < len(lines) and lines[i + 1].strip() == "```bash", f"README line {i + 1}: the marker must precede a ```bash block"
        codes = {int(c) for c in m.group(1).split(" or ")} if m.group(1) else {0}
        cmds, j = [], i + 2
        while lines[j].strip() != "```":
            if lines[j].strip() and not lines[j].lstrip().startswith("#"):
                cmds.append(lines[j])
            j += 1
        out.append((i + 2, cmds, codes))
    return out


BLOCKS = readme_blocks(README.read_text())


def test_readme_has_runnable_blocks():
    assert len(BLOCKS) >= 5 and all(cmds for _, cmds, _ in BLOCKS)


def test_readme_run_names_are_ones_ingest_creates():
    """Every --run / --run-a / --run-b / run="..." in the README names a shipped trace folder (ingest's
    default run name), a folder the README's own example creates (``runs/my_job``), or a placeholder in
    capitals."""
    text = README.read_text()
    names = set(re.findall(r"--run(?:-a|-b)?[ =]([A-Za-z0-9_]+)", text)) | set(re.findall(r'\brun="([^"]+)"', text))
    folders = {p.name for p in TRACES.iterdir() if p.is_dir()}
    created = set(re.findall(r"\bruns/([A-Za-z0-9_]+)", text))
    wrong = sorted(n for n in names if n not in folders | created and not n.isupper())
    assert not wrong, f"README uses run names no shipped folder gets: {wrong}"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A folder with traces/ (the repository's), a store of RUNS ingested with their default names,
    and a `traceanalyzer` on PATH that runs this checkout."""
    d = tmp_path_factory.mktemp("readme")
    (d / "traces").symlink_to(TRACES)
    for run in RUNS:
        ta.ingest([TRACES / run], d / "store", progress=False, workers=1)   # run name: the folder's
    bin_dir = d / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "traceanalyzer"
    shim.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m traceanalyzer \"$@\"\n")
    shim.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", PYTHONPATH=str(ROOT))
    return d, env


@pytest.mark.parametrize("line,cmds,codes", BLOCKS, ids=[f"README:{b[0]}" for b in BLOCKS])
def test_readme_block_runs(workdir, line, cmds, codes):
    d, env = workdir
    for cmd in cmds:
        r = subprocess.run(["bash", "-c", cmd], cwd=d, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode in codes, f"README line {line}: `{cmd}` exited {r.returncode}:\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}"
        if r.returncode != 0:  # a documented non-zero exit still says why, in one line
            assert r.stdout.strip() or r.stderr.strip(), cmd
        assert "Traceback" not in r.stderr, r.stderr
