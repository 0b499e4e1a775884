"""Pipeline, MoE and FSDP reference workloads: real gloo torchrun jobs, what they declare in the
manifest, and how their communication joins across ranks once ingested. The same join checks
run on the traces shipped in traces/ (recorded by these workloads)."""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch (the 'collect' extra) is needed to run workloads")

from conftest import TRACES  # noqa: E402
from launch_util import launch  # noqa: E402

import traceanalyzer as ta  # noqa: E402

ACTIVE_STEPS = 3  # the collector's default window: steps 2-4 of 6 are profiled

PP_WORLD, PP_MICROBATCHES, SLOW_STAGE, SLOW_MS = 4, 4, 2, 5
SMALL_WORLD = 2  # interleaved / gpipe / fsdp runs
MOE_WORLD, SKEW, SKEW_RANK = 4, 4.0, 1  # not the default (last) rank, so the flag is exercised
#: The hot expert gets about SKEW/(SKEW + world - 1) of the tokens (4/7 here, vs 1/7 for each
#: other one); demand a clear margin over the next-busiest rank, not just the first place.
MIN_HOT_RATIO = 1.5
MOE_A2A_PER_STEP = 5  # token counts + dispatch + combine, and both again in backward


@dataclass
class Run:
    folder: Path  # the run folder: traces, FR dumps, manifests
    manifest: dict
    con: object  # DuckDB connection over the ingested store


def _json(path: Path):
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def _ingest(folder: Path, store: Path) -> Run:
    ta.ingest([folder], store, run=folder.name)
    return Run(folder, _json(folder / "manifest.json"), ta.open(store))


def _launch(factory, nproc: int, workload: str, name: str, *flags: str) -> Run:
    """Run `workload` as a real torchrun job (run `name`) and ingest what it wrote. No Parquet parts
    (``--no-parquet``: each rank's converter process costs ~1 s of a 2-core machine; tests/test_collect_parquet.py
    covers the parts): ingest parses the JSON."""
    tmp = factory.mktemp(name)
    result = launch(nproc, [workload, "--run-name", name, "--no-parquet", *flags], tmp)
    return _ingest(result.out_dir / name, tmp / "store")


@pytest.fixture(scope="module")
def pp_1f1b(tmp_path_factory):
    return _launch(tmp_path_factory, PP_WORLD, "pipeline", "pp-1f1b", "--schedule", "1f1b",
                   "--microbatches", str(PP_MICROBATCHES),
                   "--slow-stage", str(SLOW_STAGE), "--slow-ms", str(SLOW_MS))


@pytest.fixture(scope="module")
def pp_interleaved(tmp_path_factory):
    return _launch(tmp_path_factory, SMALL_WORLD, "pipeline", "pp-interleaved",
                   "--schedule", "interleaved1f1b", "--stages-per-rank", "2", "--microbatches", "4")


@pytest.fixture(scope="module")
def pp_gpipe_imbalanced(tmp_path_factory):
    return _launch(tmp_path_factory, SMALL_WORLD, "pipeline", "pp-gpipe", "--schedule", "gpipe",
                   "--imbalance-rank", "1", "--imbalance-factor", "3")


@pytest.fixture(scope="module")
def pp_dp(tmp_path_factory):
    return _launch(tmp_path_factory, PP_WORLD, "pipeline", "pp-dp", "--schedule", "1f1b", "--dp", "2",
                   "--microbatches", "4")


@pytest.fixture(scope="module")
def moe_skew(tmp_path_factory):
    return _launch(tmp_path_factory, MOE_WORLD, "moe", "moe-skew", "--skew", str(SKEW),
                   "--skew-rank", str(SKEW_RANK))


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    return _launch(tmp_path_factory, SMALL_WORLD, "fsdp", "fsdp", "--imbalance-rank", "1")


def _shipped(name: str, tmp_path) -> Run:
    folder = TRACES / name
    if not folder.is_dir():
        pytest.skip(f"{folder} not found")
    return _ingest(folder, tmp_path / "store")


# -- checks shared by the launched runs and the shipped traces -----------------------------------

def check_files(run: Run) -> None:
    """Every rank wrote one trace window, an FR dump and its manifest, and they ingested."""
    world = run.manifest["world_size"]
    for r in range(world):
        m = _json(run.folder / f"rank{r}.manifest.json")
        assert m["exit"] == "ok"
        # recorded by today's collector: the window also converted to Parquet on its rank (shipped
        # runs were recorded before that, without the "parquet" entry)
        parts = {"parquet": [f"parquet/rank={r}/window=0"]} if "parquet" in m["files"] else {}
        assert m["files"] == {"traces": [f"rank{r}.window0.pt.trace.json.gz"],
                              "flight_recorder": f"rank{r}.fr.json", **parts}
        assert (run.folder / m["files"]["traces"][0]).is_file()
        assert (run.folder / m["files"]["flight_recorder"]).is_file()
    ranks = run.con.execute("SELECT DISTINCT rank FROM ranks ORDER BY rank").fetchall()
    assert [r for (r,) in ranks] == list(range(world))


def check_p2p_pairs(run: Run) -> None:
    """Each send (rank s -> d) has its recv on d: same p2p_seq, tag and bytes; and per window,
    each neighbouring pair of stages carries one activation and one gradient per micro-batch."""
    con = run.con
    p2p = con.execute("SELECT * FROM comms WHERE is_p2p").df()
    assert set(p2p["op"]) == {"send", "recv"}
    assert p2p[["src_rank", "dst_rank", "tag", "p2p_seq", "in_bytes"]].notna().all().all()
    unmatched = con.execute("""
        SELECT count(*) FROM comms s
        WHERE s.op = 'send' AND NOT EXISTS (
            SELECT 1 FROM comms r WHERE r.op = 'recv' AND r.run = s.run AND r.rank = s.dst_rank
              AND r.src_rank = s.src_rank AND r.dst_rank = s.dst_rank AND r.tag = s.tag
              AND r.p2p_seq = s.p2p_seq AND r.in_bytes = s.in_bytes)""").fetchone()[0]
    assert unmatched == 0
    sends = len(p2p[p2p["op"] == "send"])
    assert sends == len(p2p[p2p["op"] == "recv"])
    layout, gt = run.manifest["layout"], run.manifest["ground_truth"]
    # stage_to_rank holds pipeline ranks; with --dp, replica d's pipeline is layout["pipelines"][d]
    pipelines = layout.get("pipelines", [list(range(run.manifest["world_size"]))])
    boundaries = [(pipe[layout["stage_to_rank"][s]], pipe[layout["stage_to_rank"][s + 1]])
                  for pipe in pipelines for s in range(gt["n_stages"] - 1)]
    cross = [(a, b) for a, b in boundaries if a != b]  # stages on one rank don't use p2p
    # forward activations down the pipeline, gradients back up
    assert sends == 2 * len(cross) * gt["microbatches"] * ACTIVE_STEPS
    pairs = set(map(tuple, p2p[p2p["op"] == "send"][["src_rank", "dst_rank"]].to_numpy().tolist()))
    assert pairs == set(cross) | {(b, a) for a, b in cross}


def check_collectives_join(run: Run, ops: set[str]) -> None:
    """Every collective (pg_name, seq) is on every rank, with one op and one input size."""
    world = run.manifest["world_size"]
    joined = run.con.execute("""
        SELECT pg_name, seq, count(DISTINCT rank) AS ranks, count(DISTINCT op) AS n_ops,
               any_value(op) AS op, count(*) AS n_rows
        FROM comms WHERE NOT is_p2p GROUP BY pg_name, seq""").df()
    assert len(joined) and joined["seq"].notna().all() and joined["pg_name"].notna().all()
    assert (joined["ranks"] == world).all() and (joined["n_rows"] == world).all()
    assert (joined["n_ops"] == 1).all()
    assert set(joined["op"]) == ops


def received_bytes(run: Run) -> dict[int, int]:
    """Bytes each rank received through all_to_all. Taken from the enqueue op's output tensor
    (c10d::alltoall_base_'s first input, `Input Dims`[0]), because comms.out_bytes assumes
    out == in for all_to_all (see the report on uneven splits)."""
    rows = run.con.execute("""
        SELECT c.rank, c.elem_bytes, e.args_json FROM comms c JOIN events e
          ON e.run = c.run AND e.rank = c.rank AND e.window_id = c.window_id
         AND e.event_id = c.enqueue_event_id
        WHERE c.op = 'all_to_all'""").fetchall()
    assert rows
    out: dict[int, int] = {}
    for rank, elem_bytes, args_json in rows:
        dims = json.loads(args_json)["Input Dims"][0]
        out[rank] = out.get(rank, 0) + math.prod(dims) * elem_bytes
    return out


def check_moe(run: Run) -> None:
    check_collectives_join(run, {"all_to_all", "all_reduce"})
    a2a = run.con.execute("SELECT count(DISTINCT seq) FROM comms WHERE op = 'all_to_all'").fetchone()[0]
    assert a2a == MOE_A2A_PER_STEP * run.manifest["ground_truth"]["moe_layers"] * ACTIVE_STEPS
    gt = run.manifest["ground_truth"]
    got = received_bytes(run)
    hot = max(got, key=got.get)
    assert hot == gt["skew_rank"]
    assert got[hot] >= MIN_HOT_RATIO * max(v for r, v in got.items() if r != hot)


# -- launched runs ---------------------------------------------------------------------------------

@pytest.mark.launch
def test_pipeline_1f1b_manifest(pp_1f1b):
    m = pp_1f1b.manifest
    assert m["world_size"] == PP_WORLD
    assert m["layout"] == {"dp": 1, "tp": 1, "pp": PP_WORLD, "ep": 1, "cp": 1, "stages": PP_WORLD,
                           "stage_to_rank": list(range(PP_WORLD)),
                           "rank_to_stages": [[r] for r in range(PP_WORLD)]}
    gt = m["ground_truth"]
    assert gt["workload"] == "pipeline" and gt["schedule"] == "1f1b"
    assert gt["schedule_class"] == "Schedule1F1B" and gt["schedule_annotations"] is None
    assert gt["microbatches"] == PP_MICROBATCHES and gt["n_stages"] == PP_WORLD
    assert gt["slow_stage"] == SLOW_STAGE and gt["slow_stages"] == [SLOW_STAGE]
    assert gt["slow_ms"] == SLOW_MS and gt["slow_rank"] is None


@pytest.mark.launch
def test_pipeline_pp_x_dp_groups_and_gradient_all_reduce(pp_dp):
    """--dp 2 on 4 ranks: pipelines [0, 1] and [2, 3], each over its own group; one gradient
    all_reduce per stage and step across the replicas, over the DP groups [0, 2] and [1, 3]."""
    layout = pp_dp.manifest["layout"]
    assert (layout["dp"], layout["pp"], layout["stages"]) == (2, 2, 2)
    assert layout["pipelines"] == [[0, 1], [2, 3]] and layout["dp_groups"] == [[0, 2], [1, 3]]
    check_files(pp_dp)
    check_p2p_pairs(pp_dp)
    ar = pp_dp.con.execute("""SELECT pg_ranks, count(*) AS n FROM comms WHERE op = 'all_reduce' AND step IS NOT NULL
                              GROUP BY ALL ORDER BY pg_ranks""").fetchall()
    assert [(list(r), n) for r, n in ar] == [([0, 2], 2 * ACTIVE_STEPS), ([1, 3], 2 * ACTIVE_STEPS)]


@pytest.mark.launch
def test_pipeline_1f1b_files_and_p2p(pp_1f1b):
    check_files(pp_1f1b)
    check_p2p_pairs(pp_1f1b)
    # Schedule1F1B annotates nothing: no "Forward i" / "PP:..." ranges
    names = pp_1f1b.con.execute("SELECT DISTINCT name FROM events").fetchall()
    assert not [n for (n,) in names if n.startswith(("PP:", "Forward ", "Backward "))]


@pytest.mark.launch
def test_pipeline_interleaved_stage_map_and_annotations(pp_interleaved):
    layout, gt = pp_interleaved.manifest["layout"], pp_interleaved.manifest["ground_truth"]
    assert layout["stage_to_rank"] == [0, 1, 0, 1] and layout["rank_to_stages"] == [[0, 2], [1, 3]]
    assert gt["schedule"] == "interleaved1f1b" and gt["n_stages"] == 4 and gt["stages_per_rank"] == 2
    check_files(pp_interleaved)
    check_p2p_pairs(pp_interleaved)  # includes the wrap-around rank 1 (stage 1) -> rank 0 (stage 2)
    names = dict(pp_interleaved.con.execute(
        "SELECT rank, list(DISTINCT name) FROM events WHERE name LIKE 'PP:%' GROUP BY rank").fetchall())
    assert {"PP:0F0", "PP:2F3", "PP:2B0", "PP:0SEND_F0", "PP:2RECV_F0", "PP:0REDUCE_GRAD"} <= set(names[0])
    assert {"PP:1F0", "PP:3F3", "PP:3B3", "PP:1SEND_F0", "PP:3RECV_F0"} <= set(names[1])
    assert not [n for n in names[1] if n.startswith("PP:3SEND_F")]  # the last stage sends no activations


@pytest.mark.launch
def test_pipeline_gpipe_annotations_and_imbalance(pp_gpipe_imbalanced):
    gt = pp_gpipe_imbalanced.manifest["ground_truth"]
    assert gt["schedule"] == "gpipe" and gt["imbalance_rank"] == 1 and gt["imbalance_factor"] == 3
    assert gt["layers_per_stage"] == [1, 3]  # rank 1's stage got 3x the layers
    check_p2p_pairs(pp_gpipe_imbalanced)
    counts = dict(pp_gpipe_imbalanced.con.execute(
        "SELECT name, count(*) FROM events WHERE regexp_matches(name, '^(Forward|Backward) \\d+$') "
        "GROUP BY name").fetchall())
    mbs = gt["microbatches"]
    expected = {f"{kind} {i}" for kind in ("Forward", "Backward") for i in range(mbs)}
    assert set(counts) == expected and set(counts.values()) == {SMALL_WORLD * ACTIVE_STEPS}


@pytest.mark.launch
def test_moe_manifest(moe_skew):
    m = moe_skew.manifest
    assert m["layout"] == {"dp": MOE_WORLD, "tp": 1, "pp": 1, "ep": MOE_WORLD, "cp": 1,
                           "expert_to_rank": list(range(MOE_WORLD))}
    gt = m["ground_truth"]
    assert gt["workload"] == "moe" and gt["skew"] == SKEW and gt["skew_rank"] == SKEW_RANK
    assert gt["experts"] == MOE_WORLD and gt["expected_hot_share"] == SKEW / (SKEW + MOE_WORLD - 1)


@pytest.mark.launch
def test_moe_all_to_all_joins_and_skew(moe_skew):
    check_files(moe_skew)
    check_moe(moe_skew)
    # skewed routing: the dispatch splits differ between rank pairs (not one even split)
    splits = moe_skew.con.execute("""
        SELECT DISTINCT json_extract_string(e.args_json, '$."Concrete Inputs"[4]') FROM comms c
        JOIN events e ON e.run = c.run AND e.rank = c.rank AND e.window_id = c.window_id
         AND e.event_id = c.enqueue_event_id WHERE c.op = 'all_to_all'""").fetchall()
    assert len({s for (s,) in splits if s != "[]"}) > MOE_WORLD


@pytest.mark.launch
def test_fsdp(fsdp_run):
    m = fsdp_run.manifest
    assert m["layout"] == {"dp": SMALL_WORLD, "dp_shard": SMALL_WORLD, "tp": 1, "pp": 1, "ep": 1, "cp": 1}
    gt = m["ground_truth"]
    assert gt["workload"] == "fsdp" and gt["fsdp_version"] == 2 and gt["reshard_after_forward"]
    assert gt["imbalance_rank"] == 1 and gt["imbalance_factor"] == 2.0
    check_files(fsdp_run)
    check_collectives_join(fsdp_run, {"all_gather", "reduce_scatter"})


# -- shipped traces (traces/README.md gives the commands) --------------------------------------------

@pytest.mark.parametrize("name", ["pp_1f1b_4rank", "pp_1f1b_4rank_slow2", "pp_1f1b_2x2_dp"])
def test_shipped_pipeline_traces(name, tmp_path):
    run = _shipped(name, tmp_path)
    check_files(run)
    check_p2p_pairs(run)


def test_shipped_moe_trace(tmp_path):
    run = _shipped("moe_a2a_4rank_skew", tmp_path)
    check_files(run)
    check_moe(run)


def test_shipped_fsdp_trace(tmp_path):
    run = _shipped("fsdp_gloo_2rank", tmp_path)
    check_files(run)
    check_collectives_join(run, {"all_gather", "reduce_scatter"})
