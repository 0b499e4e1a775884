"""The replay graph of lazily waited gloo p2p (torch's pipeline schedules: isend/irecv whose spans
stay open on the caller thread until the work is waited for, while the thread does other work).

On the shipped Interleaved1F1B run: such spans run on lanes of their own, the thread keeps its own
work as its own nodes, and a change of one rank's compute moves the predicted step -- before, the
spans swallowed every rank's timeline and no what-if moved it."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import TRACES

import traceanalyzer as ta
from traceanalyzer import replay
from traceanalyzer.replay.graph import OP, POST

RUN = "pp_interleaved_4rank"


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    store = tmp_path_factory.mktemp("lazy") / "store"
    ta.ingest([TRACES / RUN], store, run=RUN, progress=False, workers=1)
    return replay.build_graph(store, run=RUN)


def test_lazy_spans_leave_the_thread_its_work(graph):
    g = graph
    cpu_lanes = set(g.lanes.loc[g.lanes["type"] == "cpu", "lane"])
    on_cpu = np.isin(g.lane, list(cpu_lanes))
    own = g.lanes[g.lanes["type"] == "runloop"]
    # the sends (open until the end of the step) and the irecvs posted ahead run on lanes of their own
    assert len(own) > 0.5 * g.instances["is_p2p"].sum(), (len(own), int(g.instances["is_p2p"].sum()))
    # their transfer is the instance's, not the span: no p2p POST lasts a tenth of a step
    step = float(g.steps["measured_ns"].median())
    p2p = g.instances.set_index("inst")["is_p2p"]
    post = (g.kind == POST) & p2p.reindex(g.inst).fillna(False).to_numpy(bool)
    assert post.any() and g.dur[post].max() < 0.1 * step, (g.dur[post].max(), step)
    # the caller threads keep their compute: OP nodes hold most of the work the CPU lanes did
    assert g.dur[on_cpu & (g.kind == OP)].sum() > 5 * g.dur[on_cpu & post].sum()


def test_a_slower_rank_moves_the_predicted_step(graph):
    w = replay.what_if(graph, {"actions": [{"action": "scale", "factor": 3.0, "ranks": [1]}]})
    ident, pred = w.job_step_ns("identity_ns"), w.job_step_ns()
    assert w.identity_error["max"] < 1e-9
    assert pred > 1.1 * ident, (ident, pred)
