"""Shared fixtures: where the real traces live, and a helper to run the CLI in-process."""
from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "traces"
EXTERNAL = ROOT.parent / "shared" / "traces" / "external"


def external_files() -> list[Path]:
    return sorted(EXTERNAL.glob("*/*.json.gz"))


def load_raw(path: Path) -> dict:
    """The trace as plain JSON (the independent reading the tests compare against)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as fh:
        return json.load(fh)


@pytest.fixture
def run_cli(capsys):
    """Run ``traceanalyzer ARGS`` in-process; returns (exit code, stdout, stderr)."""
    from traceanalyzer.cli.main import main

    def run(*args):
        code = main([str(a) for a in args])
        out = capsys.readouterr()
        return code, out.out, out.err
    return run


def ingest_runs(tmp_path_factory, name: str, runs, dlrm: bool = False, workers: int = 2) -> Path:
    """A new store with the shipped ``runs`` (one ingest per run, named after its folder) and, with
    ``dlrm``, the external 8-rank DLRM trace as run 'dlrm' where ../shared has it."""
    import traceanalyzer as ta
    d = tmp_path_factory.mktemp(name) / "store"
    for run in runs:
        ta.ingest([str(TRACES / run)], str(d), run=run, progress=False, workers=workers)
    if dlrm and (EXTERNAL / "param_dlrm_8rank").exists():
        ta.ingest([str(EXTERNAL / "param_dlrm_8rank")], str(d), run="dlrm", progress=False, workers=workers)
    return d


def need_external():
    if not EXTERNAL.exists():
        pytest.skip(f"external traces not found at {EXTERNAL} (they live in ../shared/traces/external)")


def snapshot(store: Path) -> dict[str, str]:
    """Every file of a store with its content hash: equal snapshots = store unchanged."""
    if not store.exists():
        return {}
    return {p.relative_to(store).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(store.rglob("*")) if p.is_file()}
