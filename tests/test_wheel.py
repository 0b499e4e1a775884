"""The wheel is what users install: build it, install it (not editable) into a fresh virtual
environment, and run the main job from there, far from the checkout.

The fresh environment gets the wheel alone (``--no-deps``); its third-party dependencies come from
the test environment's site-packages through a ``.pth`` path line (a plain path: the editable
install's finder there is not loaded), so the test needs no network and still proves that every
resource the package reads at run time (SQL, sample runs) is inside the wheel.
"""
from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(ROOT),
                    "-w", str(out)], check=True, capture_output=True, text=True)
    (whl,) = out.glob("traceanalyzer-*.whl")
    return whl


def test_wheel_carries_every_resource(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tree = subprocess.run(["git", "ls-files", "traceanalyzer"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.split()
    resources = [p for p in tree if not p.endswith(".py")]
    assert resources, "the package has non-Python files (SQL, samples)"
    missing = [p for p in resources if p not in names]
    assert not missing, f"files of traceanalyzer/ missing from the wheel: {missing[:5]}"
    assert sum(n.endswith(".sql") for n in names) >= 10


def test_installed_wheel_runs_the_main_job(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    deps = [p for p in site.getsitepackages() + [sysconfig.get_paths()["purelib"]] if Path(p).is_dir()]
    Path(purelib, "_test_deps.pth").write_text("\n".join(dict.fromkeys(deps)) + "\n")
    # a PYTHONPATH (a developer's checkout) would be on the new venv's path too: pip would find
    # traceanalyzer there and install nothing
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", str(wheel)],
                   check=True, capture_output=True, text=True, env=env)
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()

    def run(*args):
        r = subprocess.run([str(venv / "bin" / "traceanalyzer"), *args], cwd=cwd, env=env, capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, f"traceanalyzer {' '.join(args)} failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
        return r.stdout
    where = subprocess.run([str(py), "-c", "import traceanalyzer; print(traceanalyzer.__file__)"], cwd=cwd, env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert where.startswith(purelib), f"imported from {where}, not from the installed wheel"
    out = run("demo", "--store", "store")                         # the shipped sample runs, from the wheel
    assert "straggler" in out
    run("report", "store", "-o", "report.json")
    doc = json.loads((cwd / "report.json").read_text())
    assert doc["runs"] and any(f["kind"] == "straggler" for r in doc["runs"] for f in r["findings"])
