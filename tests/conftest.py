"""Shared fixtures: where the real traces live, and a helper to run the CLI in-process."""
from __future__ import annotations

import gzip
import hashlib
import json
import shutil
from collections import Counter
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


def ingest_runs(tmp_path_factory, name: str, runs, dlrm: bool = False, workers: int = 1) -> Path:
    """A new store with the shipped ``runs`` (one ingest per run, named after its folder) and, with
    ``dlrm``, the external 8-rank DLRM trace as run 'dlrm' where ../shared has it. Parsed in this
    process (``workers=1``): a worker pool costs a second or more to start per ingest (several on the
    loaded 2-core CI machine) for traces that parse in a fraction of that; the pool's path has its own
    tests (test_replay_ddp's bucket inference ingests with ``workers=2``, test_bad_input's killed ingest
    with ``--workers 2``)."""
    import traceanalyzer as ta
    d = tmp_path_factory.mktemp(name) / "store"
    for run in runs:
        ta.ingest([str(TRACES / run)], str(d), run=run, progress=False, workers=workers)
    if dlrm and (EXTERNAL / "param_dlrm_8rank").exists():
        ta.ingest([str(EXTERNAL / "param_dlrm_8rank")], str(d), run="dlrm", progress=False, workers=workers)
    return d


#: The shipped runs of the session's shared store (:func:`shipped_store`): the four with an injected
#: fault and three clean ones, each under its folder name (ingest's default run name).
SHIPPED_RUNS = ("ddp_gloo_4rank_slow2", "pp_1f1b_4rank_slow2", "ddp_gloo_2rank_imb1", "ddp_gloo_2rank_nooverlap",
                "ddp_gloo_2rank_noisy0", "ddp_gloo_2rank_slow1_sampled",
                "ddp_gloo_2rank", "ddp_gloo_4rank", "pp_1f1b_4rank")
CLEAN = ("ddp_gloo_2rank", "ddp_gloo_4rank", "pp_1f1b_4rank")
#: A copy of ddp_gloo_2rank whose costliest operator is renamed to a script tag (escaping tests).
XSS = "<script>alert(1)</script>"
XSS_RUN = "ddp_gloo_2rank_xss"


def _xss_copy(dest: Path) -> tuple[Path, str]:
    """traces/ddp_gloo_2rank with its costliest CPU operator renamed to a script tag (every rank)."""
    shutil.copytree(TRACES / "ddp_gloo_2rank", dest)
    files = sorted(dest.glob("*.pt.trace.json.gz"))
    raws = [json.loads(gzip.open(f, "rt").read()) for f in files]
    total = Counter()
    for raw in raws:
        for e in raw["traceEvents"]:
            if e.get("cat") == "cpu_op" and e.get("ph") == "X":
                total[e["name"]] += e.get("dur", 0)
    victim = total.most_common(1)[0][0]
    for f, raw in zip(files, raws):
        for e in raw["traceEvents"]:
            if e.get("name") == victim:
                e["name"] = XSS
        with gzip.open(f, "wt") as fh:
            json.dump(raw, fh)
    return dest, victim


def _shipped_store(tmp_path_factory) -> Path:
    """One store with the shipped runs the report, diff, export and output tests need (and the XSS
    copy), ingested once per test session."""
    import traceanalyzer as ta
    root = tmp_path_factory.mktemp("shipped_runs")
    store = root / "store"
    for run in SHIPPED_RUNS:
        ta.ingest([TRACES / run], store, run=run, progress=False, workers=1)  # small traces: no pool
    xss, _ = _xss_copy(root / "traces" / XSS_RUN)
    ta.ingest([xss], store, run=XSS_RUN, progress=False, workers=1)
    return store


@pytest.fixture(scope="session")
def shipped_store(tmp_path_factory) -> Path:
    """The session's shared store of SHIPPED_RUNS and the XSS copy, ingested once for every test
    module that reads them (report, diff, export, output). Tests may add saved results to it (the
    same ones whoever computes them); they must not ingest into it or delete from it."""
    return _shipped_store(tmp_path_factory)


def need_external():
    if not EXTERNAL.exists():
        pytest.skip(f"external traces not found at {EXTERNAL} (they live in ../shared/traces/external)")


#: The trace sets of ../shared/traces/external as HTA loaded them (tests/reference/hta_reference.json):
#: each hta/ and tracelens/ file alone, the 8 DLRM ranks together.
HTA_REFERENCE = ROOT / "tests" / "reference" / "hta_reference.json"


def external_run_name(trace_set: str) -> str:
    """The run a trace set of HTA_REFERENCE is in :func:`external_store` ('hta__ddp_2rank_rank1')."""
    return trace_set.replace(".json.gz", "").strip("/").replace("/", "__")


@pytest.fixture(scope="session")
def external_store(tmp_path_factory) -> tuple[Path, dict]:
    """(store, {run: its ingest report}): every external trace set ingested once for the session, one
    run per set (:func:`external_run_name`); a file without distributedInfo gets the rank HTA gave it
    (0 for the AMD trace, as ``--rank 0`` would). Read only: the HTA parity, the external-trace
    counts and every analysis on every external trace read it rather than each ingesting the
    same files again."""
    import traceanalyzer as ta
    need_external()
    store = tmp_path_factory.mktemp("external") / "store"
    reports = {}
    for key, ts in json.loads(HTA_REFERENCE.read_text())["trace_sets"].items():
        rank = None
        if len(ts["ranks"]) == 1:
            (r, rr), = ts["ranks"].items()
            rank = int(r) if rr["distributedInfo_rank"] is None else None
        reports[external_run_name(key)] = ta.ingest([EXTERNAL / f for f in ts["files"]], store,
                                                    run=external_run_name(key), rank=rank, progress=False, workers=1)
    return store, reports


def snapshot(store: Path) -> dict[str, str]:
    """Every file of a store with its content hash: equal snapshots = store unchanged."""
    if not store.exists():
        return {}
    return {p.relative_to(store).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(store.rglob("*")) if p.is_file()}


#: Environment planted in the shared 2-rank DDP run: one variable on the collector's allow-list's
#: pattern, one outside it (test_workloads checks which reach the manifest).
PLANTED_ENV = {"TORCH_FAKE_TOKEN": "abc", "TA_TEST_NOT_ALLOWED": "1"}


@pytest.fixture(scope="session")
def ddp2_recorded(tmp_path_factory) -> Path:
    """One real clean 2-rank gloo DDP run (the collector's default outputs: JSON traces, Parquet parts,
    FR dumps, manifests, CPU samples), shared by every test that only reads it: its run folder. The
    job also ingests itself at exit (``--store``: rank 0, once every rank has written; the store is
    :func:`ddp2_collector_store`), so that one launch serves the tests of that path too."""
    pytest.importorskip("torch", reason="torch (the 'collect' extra) is needed to run workloads")
    from launch_util import launch  # retries a failed launch once; its error carries each rank's stderr
    # the store inside the attempt's folder: a retry (a rare rank abort at exit, after rank 0
    # ingested) must not meet the failed attempt's ingest
    result = launch(2, ["ddp", "--run-name", "ddp2", "--store", "{attempt}/store"],
                    tmp_path_factory.mktemp("ddp2_recorded"), env=PLANTED_ENV)
    return result.out_dir / "ddp2"


@pytest.fixture(scope="session")
def ddp2_collector_store(ddp2_recorded) -> Path:
    """The store the ddp2_recorded job's collector ingested itself into (run 'ddp2'; read only)."""
    return ddp2_recorded.parent.parent / "store"
