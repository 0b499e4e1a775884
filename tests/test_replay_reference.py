"""'Idealise a rank' in a PP x DP job takes its reference from the ranks holding the same stage in
the other replicas (its data-parallel peers), not from every other rank: the other stages do other
work (shipped PP 2 x DP 2 run, stages 0 = ranks 0, 2 and 1 = ranks 1, 3). A reference doing the
same work (its DP peers; every rank of a DDP run) is taken as it is, op by op, even where the
idealised rank was faster: the per-op minimum of two noisy series is below both (a clean PP x DP
run's rank 1 went from 8.6 to 4.9 ms of compute per step against its peer's 9.0, a 4 % "saving" on
a run with nothing to fix). Only a reference of other stages is capped at the rank's own durations
(what another stage's role costs is not something idealising a rank would add)."""
from __future__ import annotations

import numpy as np
from conftest import TRACES

import traceanalyzer as ta
from traceanalyzer import replay
from traceanalyzer.replay.graph import OP
from traceanalyzer.replay.plans import apply_plan, typical_durations

RUN = "pp_1f1b_2x2_dp"


def test_a_stage_is_idealised_against_its_dp_peers(tmp_path):
    ta.ingest([TRACES / RUN], tmp_path / "s", run=RUN, progress=False, workers=1)
    g = replay.build_graph(tmp_path / "s", run=RUN)
    assert dict(zip(g.stages["rank"], g.stages["stage"])) == {0: 0, 1: 1, 2: 0, 3: 1}
    got = apply_plan(g, {"actions": [{"action": "idealize", "ranks": [1]}]})
    peer = np.array([False, False, False, True])
    want = typical_durations(g, reference=peer)
    others = np.minimum(typical_durations(g, reference=np.array([True, False, True, True])), g.dur)
    ops = (g.rank == 1) & (g.kind == OP)
    np.testing.assert_array_equal(got[ops], want[ops])
    assert (got[ops] != others[ops]).any()           # the other stages would have given another answer
    assert (got[g.rank != 1] == g.dur[g.rank != 1]).all()


def test_a_same_work_reference_is_taken_as_it_is(tmp_path):
    """DDP: the idealised rank's ops get the other ranks' mean as it is, longer ones included; its
    gaps and communication are never made longer than they were."""
    from traceanalyzer.replay.graph import GAP, POST
    run = "ddp_gloo_4rank"
    ta.ingest([TRACES / run], tmp_path / "s", run=run, progress=False, workers=1)
    g = replay.build_graph(tmp_path / "s", run=run)
    got = apply_plan(g, {"actions": [{"action": "idealize", "ranks": [1]}]})
    typ = typical_durations(g, reference=np.array([True, False, True, True]))
    ops, rest = (g.rank == 1) & (g.kind == OP), (g.rank == 1) & np.isin(g.kind, [GAP, POST])
    np.testing.assert_array_equal(got[ops], typ[ops])
    assert (got[ops] > g.dur[ops]).any() and (got[ops] < g.dur[ops]).any()
    assert (got[rest] <= g.dur[rest]).all()
