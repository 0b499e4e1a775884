"""Every replay caller takes the per-rank graph pieces (replay/graph/pieces.py): ``Session.graph()``,
``Session.replay`` and the CLI ``replay`` build them on the first call and read them on the next
(no events read: with the run's events emptied they give the same graph and output), on a local
store and on an S3 store (a real moto server); the graph is the one-connection build's."""
from __future__ import annotations

import json
import logging
import socket

import pyarrow.parquet as pq
import pytest
from conftest import TRACES
from test_replay_pieces import assert_same_graph

import traceanalyzer as ta
from traceanalyzer.replay.graph import pieces
from traceanalyzer.store import files as st

RUN = "ddp_gloo_2rank"
PLAN = {"actions": [{"action": "idealize", "ranks": [1]}]}


def _one_connection(store, run):
    from traceanalyzer import replay
    from traceanalyzer.analyses import connect
    return replay.build_graph(connect(str(store)), run)


def _empty_events(store) -> None:
    """The run's events files emptied (same schema, no rows): a build from the events would see them gone."""
    for entry in st.read_manifest(store).traces:
        path = store / entry["files"]["events"]
        pq.write_table(pq.read_table(path).slice(0, 0), path)


def test_session_and_cli_replay_build_then_read_the_pieces(tmp_path, run_cli):
    store = tmp_path / "store"
    ta.ingest([TRACES / RUN], store, run=RUN, progress=False, workers=1)
    want = _one_connection(store, RUN)
    with ta.open(store) as s:
        first = s.graph()
        assert first.stats["pieces"] == "built" and RUN in st.read_manifest(store).extra[pieces.ENTRY]
        assert_same_graph(want, first)
        replayed = s.replay(PLAN)                                          # reads the pieces just saved
        assert replayed.graph.stats["pieces"] == "read"
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    code, out, err = run_cli("replay", str(store), "--plan", str(plan), "--straggler-metrics")
    assert code == 0 and "identity-replay error" in out, err
    _empty_events(store)
    assert _one_connection(store, RUN).n < want.n
    with ta.open(store) as s:
        blind = s.graph()
        assert blind.stats["pieces"] == "read"
        assert_same_graph(want, blind)
        assert s.replay(PLAN).job_step_ns() == replayed.job_step_ns()
    assert run_cli("replay", str(store), "--plan", str(plan), "--straggler-metrics") == (code, out, err)


# -- an object store --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A real S3 server on localhost (moto), this test's environment pointing at it."""
    pytest.importorskip("s3fs")
    server_mod = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    with pytest.MonkeyPatch.context() as mp:
        for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                     "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}.items():
            mp.setenv(k, v)
        mp.delenv("AWS_PROFILE", raising=False)
        boto3.client("s3").create_bucket(Bucket="graphs")
        yield "s3://graphs"
    server.stop()


def test_pieces_on_an_object_store(s3, monkeypatch):
    """Built per chunk of ranks, uploaded and listed like the summaries; read back by the next
    build (from local copies, and in place above LOCAL_COPY_MAX_BYTES); the store stays clean
    (check: every object listed)."""
    from traceanalyzer.store import remote
    from traceanalyzer.store.check import check_store
    url = f"{s3}/store"
    ta.ingest([TRACES / RUN], url, run=RUN, progress=False, workers=1)
    want = _one_connection(url, RUN)
    with ta.open(url) as s:
        first = s.graph()
        assert first.stats["pieces"] == "built"
        entry = st.read_manifest(st.location(url)).extra[pieces.ENTRY][RUN]
        assert all(f.startswith(f"{pieces.FOLDER}/") for c in entry["chunks"] for f in c["files"].values())
        second = s.graph()
        assert second.stats["pieces"] == "read"
        monkeypatch.setattr(remote, "LOCAL_COPY_MAX_BYTES", 0)
        in_place = s.graph()
        assert in_place.stats["pieces"] == "read"
    for g in (first, second, in_place):
        assert_same_graph(want, g)
    report = check_store(url)
    assert report.ok, report.text()
