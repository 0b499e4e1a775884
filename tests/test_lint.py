"""ruff (pyflakes' unused and undefined names, syntax errors, import order; configured in
pyproject.toml) over the package, the tests, the benchmarks and the notebooks."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed (it comes with the 'test' extra)")
    r = subprocess.run([ruff, "check", "--no-cache", "traceanalyzer", "tests", "benchmarks", "notebooks"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_no_import_cycles_between_stages():
    """The packages form layers and a package imports only the layers below it, so there is no
    import cycle between them: the store (files and views) at the bottom, ingest writing into it,
    collect (which can ingest when the job ends), the analyses reading it, the replay, the report
    (which replays), the export (which replays), the session (ta.open) over all of them, the reference
    workloads, the CLI on top."""
    order = ["schema", "errors", "store", "ingest", "collect", "analyses", "replay", "report", "export",
             "session", "workloads", "cli"]
    rank = {name: i for i, name in enumerate(order)}
    problems = []
    for path in sorted((ROOT / "traceanalyzer").rglob("*.py")):
        parts = path.relative_to(ROOT / "traceanalyzer").parts
        stage = parts[0].removesuffix(".py")
        if stage not in rank:
            continue
        text = path.read_text()
        for other in order:
            if other == stage:
                continue
            depth = len(parts) - 1
            rel = "." * (depth + 1) + other
            if (f"from {rel} import" in text or f"from {rel}." in text or f"traceanalyzer.{other}" in text.replace(
                    "\n", " ").split('"""')[0]) and rank[other] > rank[stage]:
                problems.append(f"{path.relative_to(ROOT)} imports {other}")
    assert not problems, problems


def test_sql_modules_declare_what_they_read():
    """Each SQL module's ``-- requires:`` line names exactly the modules whose views or macros it
    reads (the binder trusts it: a missing one fails at bind time, an extra one costs time)."""
    import re

    from traceanalyzer.analyses import modules as M
    owner = M.owner()
    wrong = {}
    for name, mod in M.modules().items():
        body = re.sub(r"--[^\n]*", "", mod.text)
        reads = {owner[v] for v in owner if owner[v] != name and re.search(rf"\b{v}\b", body)}
        if reads != set(mod.requires):
            wrong[name] = {"declared": sorted(mod.requires), "reads": sorted(reads)}
    assert not wrong, wrong
    assert M.closure(sorted(M.modules()))       # and no module requires itself through others
