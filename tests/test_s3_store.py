"""A store on an S3-compatible object store (``s3://bucket/prefix``), against a real S3 server
(moto's server mode, started here on localhost): the same tables and results as a local store of
the same run, a second ingest, the conditional commit (one of two writers wins), a failed ingest
that leaves the store as it was, and one clear line for a wrong endpoint or a missing bucket."""
from __future__ import annotations

import gzip
import logging
import os
import shutil
import socket
import subprocess
import sys

import pytest
from conftest import ROOT, TRACES

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")

import traceanalyzer as ta  # noqa: E402
from traceanalyzer import schema as S  # noqa: E402
from traceanalyzer.analyses.results import analyze  # noqa: E402
from traceanalyzer.errors import StoreError, TraceInputError  # noqa: E402
from traceanalyzer.store import files as st  # noqa: E402
from traceanalyzer.store import remote  # noqa: E402

RUN = "ddp_gloo_4rank_slow2"
OTHER = "ddp_gloo_2rank"
BUCKET = "traces"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def endpoint():
    """A real S3 server on localhost, and the environment a user would set for it (this test's
    process only, restored after)."""
    from moto.server import ThreadedMotoServer
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    with pytest.MonkeyPatch.context() as mp:
        for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                     "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": url}.items():
            mp.setenv(k, v)
        mp.delenv("AWS_PROFILE", raising=False)
        boto3.client("s3").create_bucket(Bucket=BUCKET)
        yield url
    server.stop()


@pytest.fixture(scope="module")
def stores(endpoint, tmp_path_factory):
    """The same run in a local store and in s3://traces/store, both analysed."""
    local = tmp_path_factory.mktemp("s3") / "local"
    url = f"s3://{BUCKET}/store"
    for store in (local, url):
        ta.ingest([TRACES / RUN], store, progress=False)
        analyze(store, run=RUN)
    return local, url


def _objects(prefix: str) -> dict[str, str]:
    """key -> ETag of every object under ``prefix``: what a writer changed, byte for byte."""
    pages = boto3.client("s3").get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return {o["Key"]: o["ETag"] for page in pages for o in page.get("Contents", [])}


#: Columns an analysis fills non-deterministically: none (imbalance_ops.max_rank, once mode() over
#: two equally frequent ranks, breaks the tie by the lowest rank).
UNSTABLE: dict[str, str] = {}


def _rows(con, view: str, run: str):
    cols = f"* EXCLUDE ({UNSTABLE[view]})" if view in UNSTABLE else "*"
    return con.execute(f"SELECT {cols} FROM {view} WHERE run = $run ORDER BY ALL", {"run": run}).df()


def test_remote_store_holds_what_a_local_store_holds(stores):
    import pandas as pd
    local, url = stores
    with ta.open(local) as a, ta.open(url) as b:
        assert isinstance(b.path, st.Remote) and str(b.path) == url
        for view in [*S.TABLES, *(f"result_{name}" for name in S.RESULTS)]:
            want, got = _rows(a, view, RUN), _rows(b, view, RUN)
            assert len(want) == len(got), view
            pd.testing.assert_frame_equal(got, want, check_exact=False, rtol=1e-12, obj=view)
        assert a.execute("SELECT count(*) FROM events").fetchone()[0] > 10_000    # not two empty stores
        assert list(b.analysis("stragglers", run=RUN)["rank"]) == [2]            # the injected straggler
    # the objects: one manifest per commit (ingest, then analyze), tables under never-reused names
    keys = _objects("store/")
    assert {k for k in keys if k.startswith("store/_store/")} >= {
        "store/_store/manifest-000000000001.json", "store/_store/manifest-000000000002.json"}
    assert any(k.startswith(f"store/events/run={RUN}/rank=2/window_id=0/part-1-") for k in keys)


def test_a_big_remote_store_is_read_in_place(stores, monkeypatch):
    """Above LOCAL_COPY_MAX_BYTES, DuckDB reads the s3:// objects through fsspec: same rows."""
    local, url = stores
    monkeypatch.setattr(remote, "LOCAL_COPY_MAX_BYTES", 0)
    with ta.open(local) as a, ta.open(url) as b:
        for view in ("comms", "result_stragglers"):
            assert a.execute(f"SELECT count(*) FROM {view} WHERE run = $r", {"r": RUN}).fetchone() == \
                b.execute(f"SELECT count(*) FROM {view} WHERE run = $r", {"r": RUN}).fetchone()
        assert b.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = 'events' "
                         "AND sql LIKE '%s3://traces/store/events/%'").fetchone()[0] == 1


def test_cli_info_analyze_report_check_on_a_remote_store(stores, run_cli, tmp_path):
    _, url = stores
    code, out, err = run_cli("info", url)
    assert code == 0 and RUN in out and not err
    code, out, err = run_cli("analyze", url, "--run", RUN, "--only", "stragglers")
    assert code == 0 and "straggler #1: rank 2" in out, err
    code, out, err = run_cli("report", url, "--run", RUN, "--no-replay", "-o", tmp_path / "r.md")
    assert code == 0, err
    assert "rank 2" in (tmp_path / "r.md").read_text()
    code, out, err = run_cli("check", url)
    assert code == 0 and out.strip() == f"{url}: store OK"


def test_second_ingest_and_the_conditional_commit(stores):
    _, url = stores
    before = st.read_manifest(st.location(url))           # generation N, as a second writer read it
    ta.ingest([TRACES / OTHER], url, progress=False)      # commits N+1
    with ta.open(url) as s:
        assert sorted(s.runs["run"]) == sorted([RUN, OTHER])
        assert s.execute("SELECT count(DISTINCT rank) FROM ranks WHERE run = $r", {"r": OTHER}).fetchone()[0] == 2
    after = _objects("store/")
    before.generation += 1                                 # the second writer's commit: N+1 is taken
    with pytest.raises(StoreError, match="another writer committed generation"):
        st.write_manifest(st.location(url), before)
    assert _objects("store/") == after                     # it changed nothing
    assert st.read_manifest(st.location(url)).generation == before.generation   # the winner's stands


def test_failed_ingest_leaves_the_remote_store_as_it_was(stores, tmp_path):
    _, url = stores
    bad = tmp_path / "bad"
    shutil.copytree(TRACES / "ddp_gloo_4rank", bad)
    with gzip.open(bad / "rank3.window0.pt.trace.json.gz", "rb") as fh:
        data = fh.read()
    (bad / "rank3.window0.pt.trace.json.gz").write_bytes(gzip.compress(data)[:5000])   # cut short
    before = _objects("store/")
    with pytest.raises(TraceInputError, match="rank3.window0.pt.trace.json.gz"):
        ta.ingest([bad], url, run="bad", progress=False)
    assert _objects("store/") == before                    # manifest and every listed object unchanged
    with ta.open(url) as s:
        assert "bad" not in set(s.runs["run"])


def test_killed_writer_leftovers_are_unlisted_then_collected(stores, tmp_path, monkeypatch, run_cli):
    """Objects a killed ingest uploaded are never read, shown by `check` once older than the grace
    period, and removed by the next writer."""
    _, url = stores
    store = st.location(url)
    part = _some_parquet(tmp_path)
    leftover = st.place(store, {"events": str(part)}, "killed", 0, "99", 0)["events"]   # uploaded, never committed
    with ta.open(url) as s:
        assert "killed" not in set(s.execute("SELECT DISTINCT run FROM events").df()["run"])
    assert st.has_manifest(store) and leftover not in remote.unlisted(store, set())   # young: maybe in flight
    monkeypatch.setattr(remote, "GC_GRACE_S", 0)
    from traceanalyzer.store.check import check_store
    report = check_store(url)
    assert leftover in report.junk and "leftover" in report.text()    # (and results replaced since)
    code, out, err = run_cli("check", url, "--repair")     # the next writer collects it
    assert code == 0 and "-> removed" in out, err
    assert f"store/{leftover}" not in _objects("store/")
    assert check_store(url).ok


def _some_parquet(tmp_path):
    import pyarrow as pa
    out = tmp_path / "some.parquet"
    st.write_table(pa.table({"x": [1]}), out)
    return out


def test_missing_bucket_wrong_endpoint_no_credentials_are_one_line(endpoint, run_cli):
    code, out, err = run_cli("info", "s3://no-such-bucket/store")
    assert code != 0 and err.count("\n") == 1
    assert "s3://no-such-bucket/store" in err and "no such bucket 'no-such-bucket'" in err
    code, out, err = run_cli("info", f"s3://{BUCKET}/nothing-here")
    assert code != 0 and "no traceanalyzer store here" in err and err.count("\n") == 1
    env = dict(os.environ, AWS_ENDPOINT_URL=f"http://127.0.0.1:{_free_port()}", AWS_MAX_ATTEMPTS="1",
               PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "traceanalyzer", "ingest", str(TRACES / OTHER), "--store",
                           f"s3://{BUCKET}/store2"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"s3://{BUCKET}/store2" in proc.stderr and "does not answer" in proc.stderr
    env = {k: v for k, v in env.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    env.update(AWS_ENDPOINT_URL=endpoint, AWS_SHARED_CREDENTIALS_FILE=os.devnull, AWS_CONFIG_FILE=os.devnull,
               AWS_EC2_METADATA_DISABLED="true")
    proc = subprocess.run([sys.executable, "-m", "traceanalyzer", "info", f"s3://{BUCKET}/store"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"s3://{BUCKET}/store" in proc.stderr and "no credentials" in proc.stderr


def test_a_local_store_keeps_its_code_path(stores):
    """A folder or file:// URL is a Path (today's code, no fsspec import); only a URL is Remote."""
    local, _ = stores
    assert st.location(f"file://{local}") == local and st.location(str(local)) == local
    code = (f"import sys, traceanalyzer as ta; s = ta.open({str(local)!r}); assert len(s.runs) == 1; "
            "sys.exit(int('fsspec' in sys.modules))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    assert subprocess.run([sys.executable, "-c", code], env=dict(env, PYTHONPATH=str(ROOT)), timeout=120).returncode == 0
