"""Reference workloads + collector: real gloo torchrun jobs and what they write."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch (the 'collect' extra) is needed to run workloads")

from conftest import PLANTED_ENV  # noqa: E402
from launch_util import REPO_ROOT, LaunchError, launch  # noqa: E402

from traceanalyzer.collect import allowed_env  # noqa: E402

RUN = "ddp2"
WORLD = 2
PLANTED_SECRET = {"TORCH_FAKE_TOKEN": "abc"}
PLANTED_OTHER = {"TA_TEST_NOT_ALLOWED": "1"}  # outside the env allow-list
assert {**PLANTED_SECRET, **PLANTED_OTHER} == PLANTED_ENV   # what conftest.ddp2_recorded planted
SLOW_MS = 20


def _json(path):
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def _event_names(trace):
    return {e.get("name") for e in trace["traceEvents"]}


@pytest.fixture(scope="module")
def clean_run(ddp2_recorded):
    """One clean 2-rank DDP run (conftest.ddp2_recorded, planted with PLANTED_SECRET and PLANTED_OTHER)."""
    return ddp2_recorded


@pytest.mark.launch
def test_run_manifest(clean_run):
    m = _json(clean_run / "manifest.json")
    assert m["run_id"] == RUN
    assert m["world_size"] == WORLD
    assert m["backend"] == "gloo"
    assert m["torch_version"] == torch.__version__
    assert m["layout"] == {"dp": WORLD, "tp": 1, "pp": 1, "ep": 1, "cp": 1}
    gt = m["ground_truth"]
    assert gt["workload"] == "ddp" and gt["model"] == "mlp" and gt["overlap"] is True
    assert gt["slow_rank"] is None and gt["slow_ms"] == 0
    assert gt["imbalance_rank"] is None and gt["imbalance_factor"] == 1.0
    assert {"steps", "bucket_mb"} <= gt.keys()
    assert [pg["ranks"] for pg in m["process_groups"]] == [list(range(WORLD))]
    assert m["rank_manifests"] == [f"rank{r}.manifest.json" for r in range(WORLD)]


@pytest.mark.launch
@pytest.mark.parametrize("rank", range(WORLD))
def test_rank_manifest(clean_run, rank):
    m = _json(clean_run / f"rank{rank}.manifest.json")
    assert m["rank"] == rank and m["local_rank"] == rank and m["exit"] == "ok"
    assert m["device"] == "cpu" and m["host"] and m["pid"] > 0
    assert isinstance(m["clock"]["wall_ns"], int) and isinstance(m["clock"]["monotonic_ns"], int)
    env = m["env"]
    assert env["TORCH_FAKE_TOKEN"] == "<redacted>"
    assert env["TORCH_FR_BUFFER_SIZE"] == "2000"  # the workload turned the FR on
    assert all(k.startswith(("NCCL_", "TORCH_", "CUDA_", "OMP_")) for k in env)
    assert "TA_TEST_NOT_ALLOWED" not in env
    assert m["files"] == {"traces": [f"rank{rank}.window0.pt.trace.json.gz"],
                          "flight_recorder": f"rank{rank}.fr.json",
                          "parquet": [f"parquet/rank={rank}/window=0"]}  # the window converted on its rank


@pytest.mark.launch
@pytest.mark.parametrize("rank", range(WORLD))
def test_rank_trace_and_fr(clean_run, rank):
    traces = sorted(clean_run.glob(f"rank{rank}.window*.pt.trace.json.gz"))
    assert [t.name for t in traces] == [f"rank{rank}.window0.pt.trace.json.gz"]  # one window
    trace = _json(traces[0])
    assert trace["distributedInfo"]["rank"] == rank
    assert trace["distributedInfo"]["world_size"] == WORLD
    names = _event_names(trace)
    assert {"c10d::allreduce_", "gloo:all_reduce"} <= names
    steps = [n for n in names if n and n.startswith("ProfilerStep#")]
    assert len(steps) == 3  # active=3
    # record_shapes is on: the allreduce carries its message shape
    allreduce = next(e for e in trace["traceEvents"] if e.get("name") == "c10d::allreduce_")
    assert allreduce["args"]["Input Dims"][0]
    fr = _json(clean_run / f"rank{rank}.fr.json")
    assert "gloo:all_reduce" in {e["profiling_name"] for e in fr["entries"]}


@pytest.mark.launch
def test_straggler_without_overlap(tmp_path):
    run = "slow"
    result = launch(WORLD, ["ddp", "--run-name", run, "--no-overlap", "--no-parquet",   # reads the JSON only
                            "--slow-rank", "1", "--slow-ms", str(SLOW_MS)], tmp_path)
    folder = result.out_dir / run
    gt = _json(folder / "manifest.json")["ground_truth"]
    assert gt["overlap"] is False and gt["slow_rank"] == 1 and gt["slow_ms"] == SLOW_MS
    trace = _json(folder / "rank1.window0.pt.trace.json.gz")
    assert {"c10d::allreduce_", "gloo:all_reduce"} <= _event_names(trace)
    # The sleep is inside every step of rank 1, so no profiled step can be shorter.
    step_us = [e["dur"] for e in trace["traceEvents"]
               if e.get("name", "").startswith("ProfilerStep#")]
    assert step_us and min(step_us) >= SLOW_MS * 1000


@pytest.mark.launch
def test_failed_launch_reports_rank_stderr(tmp_path):
    with pytest.raises(LaunchError) as err:
        launch(WORLD, ["ddp", "--model", "no-such-model"], tmp_path, timeout=60)
    message = str(err.value)
    assert "attempt 1" in message  # it retried once
    assert "rank 0 stderr" in message and "invalid choice: 'no-such-model'" in message


def test_transformer_model_shapes():
    from traceanalyzer.workloads import models

    gen = torch.Generator().manual_seed(0)
    x, y = models.batch("transformer", gen)
    assert models.build("transformer")(x).shape == (models.BATCH, models.CLASSES)
    assert y.shape == (models.BATCH,)


def test_allowed_env_redacts_and_filters():
    env = {"TORCH_FAKE_TOKEN": "abc", "NCCL_IB_HCA": "mlx5", "CUDA_API_KEY": "k",
           "OMP_NUM_THREADS": "1", "HOME": "/root", "MY_PASSWORD": "x"}
    assert allowed_env(env) == {"CUDA_API_KEY": "<redacted>", "NCCL_IB_HCA": "mlx5",
                                "OMP_NUM_THREADS": "1", "TORCH_FAKE_TOKEN": "<redacted>"}


def test_packages_import_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"  # makes `import torch` fail
            "import traceanalyzer, traceanalyzer.collect, traceanalyzer.workloads\n")
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)


@pytest.mark.launch
def test_collector_ingests_straight_into_a_store(ddp2_collector_store):
    """`profile(..., store=...)`: rank 0 ingests the whole run once every rank has written it (the
    session's ddp2 job was launched with ``--store {attempt}/store``: conftest.ddp2_recorded)."""
    import traceanalyzer as ta
    con = ta.open(ddp2_collector_store)
    assert con.execute("SELECT count(DISTINCT rank) FROM ranks WHERE run = ?", [RUN]).fetchone()[0] == 2
    joined = con.execute("""SELECT count(*) FROM (SELECT seq FROM comms WHERE run = ? AND NOT is_p2p
                            GROUP BY pg_name, seq HAVING count(DISTINCT rank) = 2)""", [RUN]).fetchone()[0]
    assert joined > 0
    assert con.execute("SELECT count(*) FROM fr_entries WHERE run = ?", [RUN]).fetchone()[0] > 0


def test_a_busy_waiting_straggler_keeps_its_core_busy():
    """``--slow-spin``: the delay of a slow rank runs on its thread's CPU (its own code), a sleep
    does not (both last the delay)."""
    import time

    from traceanalyzer.workloads.common import Straggler
    x = torch.zeros(1, 4)
    for spin, busy in ((True, True), (False, False)):
        m = Straggler(torch.nn.Identity(), 0.05, spin=spin)
        w0, c0 = time.perf_counter(), time.thread_time()
        m(x)
        wall, cpu = time.perf_counter() - w0, time.thread_time() - c0
        # (a busy-wait on a loaded machine gets its share of the core, a sleep next to none)
        assert wall >= 0.05 and (cpu >= 0.25 * wall if busy else cpu < 0.1 * wall), (spin, wall, cpu)
