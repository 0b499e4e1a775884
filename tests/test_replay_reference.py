"""'Idealise a rank' in a PP x DP job takes its reference from the ranks holding the same stage in
the other replicas (its data-parallel peers), not from every other rank: the other stages do other
work (shipped PP 2 x DP 2 run, stages 0 = ranks 0, 2 and 1 = ranks 1, 3)."""
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
    want = np.minimum(typical_durations(g, reference=peer), g.dur)
    others = np.minimum(typical_durations(g, reference=np.array([True, False, True, True])), g.dur)
    ops = (g.rank == 1) & (g.kind == OP)
    np.testing.assert_array_equal(got[ops], want[ops])
    assert (got[ops] != others[ops]).any()           # the other stages would have given another answer
    assert (got[g.rank != 1] == g.dur[g.rank != 1]).all()
