"""Diff of two real runs: against the clean run, the top change is the injected fault."""
from __future__ import annotations

import json

import pytest

from traceanalyzer.analyses.diff import diff_runs


@pytest.fixture(scope="module")
def store(shipped_store):
    return shipped_store


def test_straggler_is_the_top_change(store, run_cli):
    """ddp_gloo_4rank vs ddp_gloo_4rank_slow2 (rank 2 sleeps 20 ms in every forward): the top cause
    is rank 2's own time, about +20 ms per step; the others' longer waits are effects, not causes."""
    code, out, err = run_cli("diff", store, "--run-a", "ddp_gloo_4rank", "--run-b", "ddp_gloo_4rank_slow2", "--json")
    assert code == 0, err
    d = json.loads(out)
    top = d["changes"][0]
    assert (top["kind"], top["rank"]) == ("rank_own_time", 2), d["changes"][:3]
    assert 10e6 < top["delta_ns"] < 25e6
    assert d["step_delta_ms"] > 5
    others = [c for c in d["changes"] if c["kind"] == "rank_own_time" and c["rank"] != 2]
    assert all(abs(c["delta_ns"]) < top["delta_ns"] / 3 for c in others)
    # the op that holds the sleep: DistributedDataParallel.forward grew on rank 2
    fwd = next(c for c in d["changes"] if c["what"] == "annotation DistributedDataParallel.forward")
    assert fwd["rank"] == 2 and fwd["delta_ns"] > 0
    eff = {c["what"]: c for c in d["effects"]}
    assert eff["step time (median)"]["delta_ns"] == pytest.approx(d["step_delta_ms"] * 1e6)


def test_slow_stage_is_the_top_change(store):
    """pp_1f1b_4rank vs pp_1f1b_4rank_slow2 (stage 2 sleeps 10 ms per micro-batch forward, 8
    micro-batches): rank 2's own time grows by about 80 ms per step, and is the top change."""
    d = diff_runs(store, run_a="pp_1f1b_4rank", run_b="pp_1f1b_4rank_slow2")
    top = d.changes.iloc[0]
    assert (top["kind"], top["rank"]) == ("rank_own_time", 2)
    assert 50e6 < top["delta_ns"] < 100e6
    assert list(d.changes["delta_ns"].abs()) == sorted(d.changes["delta_ns"].abs(), reverse=True)
    # same p2p traffic on both sides: no p2p op added or removed
    assert not d.changes["kind"].str.startswith("p2p_").any()
    text = d.text(top=3)
    assert "1. rank 2 own time" in text and "step time:" in text


def test_collectives_added_and_removed(store):
    """DDP (three all_reduce bucket sizes) against the pipeline (16 KiB activations and gradients
    sent between neighbour stages): the buckets are removed, the send/recv added, by op and size."""
    d = diff_runs(store, run_a="ddp_gloo_2rank", run_b="pp_1f1b_4rank", min_impact_ns=0)
    removed = d.changes[d.changes["kind"] == "collective_removed"]
    assert sorted(removed["what"]) == ["all_reduce pg 0 1050624 B", "all_reduce pg 0 1071144 B", "all_reduce pg 0 133120 B"]
    assert (removed["b"] == 0).all() and (removed["delta_ns"] < 0).all()
    added = d.changes[d.changes["kind"] == "p2p_added"]
    assert set(added["what"].str.split().str[0]) == {"send", "recv"} and added["what"].str.endswith(" 16384 B").all()
    assert not d.changes["kind"].isin(["collective_added", "p2p_removed"]).any()


def test_diff_needs_two_runs(store, run_cli):
    code, _, err = run_cli("diff", store, "--run-a", "ddp_gloo_2rank", "--run-b", "ddp_gloo_2rank")
    assert code == 2 and "same run" in err
    code, _, err = run_cli("diff", store)
    assert code == 2 and "--run-a" in err
