"""The replay graph as per-rank pieces (map) stitched on the driver (reduce), saved in the store.

Why: the one-connection build (``_build`` in ``__init__``) reads every event of the run in one
process, on every ``report`` with replay. Here:

1. **comms** (driver, no events): the clock offsets and the run's communication with its keys,
   instances, last arrivals and lazily waited p2p (load.py's ``load_comms``: what a rank needs of
   the other ranks), written to the work folder;
2. **map** (one task per chunk of consecutive ranks, ``analyses.summaries.rank_chunks``, on the
   executor): the chunk's own events, its lanes, nodes, launch / stream-wait / runloop / enqueue /
   wait edges and its CPU-lane POST ranges and steps, numbered locally -- the same SQL as the
   one-connection build (load.py, lanes.py, edges.py) on a connection over the chunk's files only;
   instance ``i``'s SYNC node is numbered ``SYNC_BASE + i``;
3. **commit**: the pieces go to ``STORE/_summaries/replay_graph/<table>/run=R/rank=K[-L]/`` (an
   object store's uploaded first, under new names) and are listed in the manifest under
   ``replay_graph`` with a key (FORMAT, the package version, the source
   of the graph modules, the run's files, the applied clock offsets): a run re-ingested, other
   offsets or other code make the next build compute them again, never use them;
4. **stitch** (driver): the pieces renumbered (CPU nodes of every chunk, then queue nodes, then one
   SYNC node per instance: the one-connection build's order), then finish.py's array work: the
   edge CSR, the fitted lags, the topological order, the steps.

The graph equals the one-connection build's, array for array (tests/test_replay_pieces.py). A
second build of the same store reads ``comms`` and the saved pieces, not the events.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ... import __version__
from ...errors import StoreError
from ...store import files as st
from ...store import writers
from .._jit import warm_up
from .edges import make_edges
from .finish import _np, assemble, step_tables
from .lanes import make_lanes
from .load import Scratch, load_comms, load_ranks
from .model import PIPELINE_VIEWS, SYNC

#: bump when the layout of the saved pieces changes (part of the key)
FORMAT = 2
#: manifest key of the saved pieces (store/files.py lists their files with the summaries')
ENTRY = "replay_graph"
#: folder of the pieces in the store
FOLDER = "_summaries/replay_graph"
#: a piece numbers instance i's SYNC node SYNC_BASE + i (above any node of a piece)
SYNC_BASE = 1 << 40
#: the tables of a piece
TABLES = ("nodes", "edges", "waits", "posts", "lanes", "steps", "work")
_NODE_COLS = "node, lane, rank, ms, me, kind, label, category, inst, child"
_SOURCES = ("load.py", "lanes.py", "edges.py", "finish.py", "model.py", "pieces.py")


def key(manifest, run: str, off: list) -> str:
    """What a run's pieces were built from: its files, the applied clock offsets, the code (the
    graph's, and the SQL of the modules the pipeline stages come from)."""
    files = sorted(f for t in manifest.traces + manifest.sidecars if t.get("run") == run for f in t["files"].values())
    from ...analyses import modules as M
    here = Path(__file__).parent
    code = [(here / name).read_text() for name in _SOURCES] + [M.modules()[m].text for m in PIPELINE_VIEWS]
    doc = json.dumps([FORMAT, __version__, files, off, code], default=str)
    return hashlib.sha256(doc.encode()).hexdigest()[:32]


def comm_tables(con, run: str, params: dict) -> Scratch:
    """The run-wide tables (load_comms) on ``con``; the caller closes the Scratch."""
    s = Scratch(con, dict(params))
    load_comms(s)
    return s


def offsets(s: Scratch) -> list:
    return [list(r) for r in s.query("SELECT rank, off FROM {off} ORDER BY rank").fetchall()]


# -- the map --------------------------------------------------------------------------------------

def map_task(store: str, run: str, ranks: list[int], params: dict, comm_dir: str, out: str) -> dict:
    """Build the piece of ``ranks`` (consecutive) from their own files and the run's communication
    (``comm_dir``: off.parquet, cm.parquet); returns {"files": {table: path}, "counts": {...}}."""
    from ...analyses.summaries import chunk_label, open_run, sql_quote
    con = open_run(store, run, ranks)
    s = Scratch(con, dict(params))
    mine = ", ".join(str(int(r)) for r in ranks)
    try:
        s.make("off", f"SELECT * FROM read_parquet('{sql_quote(comm_dir)}/off.parquet')")
        s.make("cm", f"SELECT * FROM read_parquet('{sql_quote(comm_dir)}/cm.parquet') WHERE rank IN ({mine})")
        load_ranks(s)
        make_lanes(s, sync_base=SYNC_BASE)
        edges, waits, posts = make_edges(s)
        steps, work = step_tables(s)
        tables = {"nodes": s.arrow(f"SELECT {_NODE_COLS} FROM {{nd}} ORDER BY node"), "edges": edges, "waits": waits,
                  "posts": posts, "lanes": s.arrow("SELECT lane, rank, tid, is_gpu, type FROM {lanes} ORDER BY lane"),
                  "steps": pa.Table.from_pandas(steps, preserve_index=False),
                  "work": pa.Table.from_pandas(work, preserve_index=False)}
        counts = {"cpu_lanes": s.scalar("SELECT count(*) FROM {cpu_lanes}"),
                  "lanes": tables["lanes"].num_rows, "cpu_nodes": s.params["n_cpu_nodes"],
                  "nodes": tables["nodes"].num_rows}
    finally:
        s.close()
        con.close()
    folder = Path(out) / f"rank={chunk_label(ranks)}"
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, t in tables.items():
        files[name] = str(folder / f"{name}.parquet")
        pq.write_table(_int64(t), files[name], compression="zstd")
    return {"ranks": list(ranks), "files": files, "counts": {k: int(v) for k, v in counts.items()}}


def _int64(t: pa.Table) -> pa.Table:
    """``t`` with its DECIMAL columns (DuckDB's HUGEINT sums: node numbers) as int64 (their values
    are node numbers and times: no change), which numpy reads without a Python object per value."""
    fields = [pa.field(f.name, pa.int64()) if pa.types.is_decimal(f.type) else f for f in t.schema]
    return t.cast(pa.schema(fields))


# -- the stitch -----------------------------------------------------------------------------------

def stitch(run: str, chunks: list[dict], read, s: Scratch):
    """The Graph from the pieces (``chunks`` of consecutive ranks, in rank order: {"files", "counts"}; ``read(path,
    dictionary=False)`` -> an Arrow table) and the run-wide tables on ``s`` (instances)."""
    cnt = [c["counts"] for c in chunks]
    n_cpu = sum(c["cpu_nodes"] for c in cnt)
    n_lane_nodes = sum(c["nodes"] for c in cnt)
    n_cpu_lanes = sum(c["cpu_lanes"] for c in cnt)
    cpu_off = np.cumsum([0] + [c["cpu_nodes"] for c in cnt])
    q_off = np.cumsum([0] + [c["nodes"] - c["cpu_nodes"] for c in cnt])
    cl_off = np.cumsum([0] + [c["cpu_lanes"] for c in cnt])
    ql_off = np.cumsum([0] + [c["lanes"] - c["cpu_lanes"] for c in cnt])

    def nodes_of(i, v):
        v = np.asarray(v, dtype=np.int64)
        nc = cnt[i]["cpu_nodes"]
        out = np.where(v < nc, v + cpu_off[i], v - nc + n_cpu + q_off[i])
        out = np.where(v >= SYNC_BASE, v - SYNC_BASE + n_lane_nodes, out)
        return np.where(v < 0, v, out)

    def lanes_of(i, v):
        v = np.asarray(v, dtype=np.int64)
        nc = cnt[i]["cpu_lanes"]
        return np.where(v < 0, v, np.where(v < nc, v + cl_off[i], v - nc + n_cpu_lanes + ql_off[i]))

    cpu_parts, q_parts, ex, wt, ps, lanes, steps, work = [], [], [[], []], [[], [], []], [[], [], []], [], [], []
    for i, c in enumerate(chunks):
        f = c["files"]
        nd = read(f["nodes"], dictionary=True)       # in local node order: the chunk's CPU nodes, then its queue nodes
        if not np.array_equal(_np(nd["node"]), np.arange(nd.num_rows)):
            raise StoreError(f"replay graph piece {f['nodes']}: its nodes are not numbered 0..{nd.num_rows - 1}")
        nd = nd.drop_columns(["node"]).set_column(0, "lane", pa.array(lanes_of(i, _np(nd["lane"]))))
        nc = cnt[i]["cpu_nodes"]
        cpu_parts.append(nd.slice(0, nc))
        q_parts.append(nd.slice(nc))
        e = read(f["edges"])
        ex[0].append(nodes_of(i, _np(e["src"])))
        ex[1].append(nodes_of(i, _np(e["dst"])))
        w = read(f["waits"])
        for j, col in enumerate(("first", "tgt", "src")):
            wt[j].append(nodes_of(i, _np(w[col])))
        p = read(f["posts"])
        ps[0].append(nodes_of(i, _np(p["lo"])))
        ps[1].append(nodes_of(i, _np(p["hi"])))
        ps[2].append(_np(p["inst"]))
        ln = read(f["lanes"]).to_pandas()
        ln["lane"] = lanes_of(i, ln["lane"].to_numpy())
        lanes.append(ln)
        sp = read(f["steps"]).to_pandas()
        sp["base"] = sp["base"].to_numpy(np.int64) + cpu_off[i]
        steps.append(sp)
        wk = read(f["work"]).to_pandas()
        wk["nodes"] = [nodes_of(i, x) for x in wk["nodes"]]
        work.append(wk)
    sync = s.arrow(f"SELECT -1 AS lane, -1 AS rank, last_arrival AS ms, last_arrival AS me, {SYNC} AS kind, op AS label, "
                   f"'sync' AS category, inst, 0 AS child FROM {{inst}} ORDER BY inst")
    parts = cpu_parts + q_parts
    if parts:   # the one-connection build's node order: every CPU node, every queue node, the SYNC nodes
        schema = parts[0].schema
        sync = pa.table([sync[name].cast(schema.field(name).type) for name in schema.names], schema=schema)
    nd = pa.concat_tables(parts + [sync])
    nd = nd.add_column(0, "node", pa.array(np.arange(nd.num_rows, dtype=np.int64)))
    instances = s.query("SELECT inst, key, op, bytes, is_p2p, n_ranks, transfer_ns FROM {inst} ORDER BY inst").df()
    cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int64))
    lanes_df = pd.concat(lanes, ignore_index=True).sort_values("lane", kind="stable").reset_index(drop=True)
    return assemble(run, nd, (cat(ex[0]), cat(ex[1])), tuple(cat(x) for x in wt), tuple(cat(x) for x in ps),
                    lanes_df, pd.concat(steps, ignore_index=True), pd.concat(work, ignore_index=True), instances)


def _read(path, dictionary: bool = False):
    """A piece's table; the node labels and categories dictionary-encoded (their strings are
    decoded only once per distinct value: finish._codes)."""
    return pq.read_table(path, read_dictionary=["label", "category"] if dictionary else None)


# -- the driver -----------------------------------------------------------------------------------

def saved(loc, manifest, run: str, run_key: str) -> dict | None:
    """The run's saved pieces when they are current (same key) and whole (a local store: their
    footers; an object store: listed, one listing), else None."""
    from ...store.check import file_problem
    entry = manifest.extra.get(ENTRY, {}).get(run)
    if not entry or entry.get("key") != run_key or entry.get("format") != FORMAT:
        return None
    rels = [f for c in entry["chunks"] for f in c["files"].values()]
    if not isinstance(loc, Path):
        from ...store.remote import problems
        return None if problems(loc, rels) else entry
    if any(file_problem(loc / f) for f in rels):
        return None
    return entry


@contextmanager
def _reader(loc, entry: dict):
    """``read(rel, dictionary=False)`` of the saved pieces in ``entry``: the files of a local store;
    an object store's downloaded first (``store.remote.readable``: a local copy, or read in place
    through its file system when too big), the copies removed afterwards."""
    if isinstance(loc, Path):
        yield lambda rel, dictionary=False: _read(loc / rel, dictionary)
        return
    from ...store.remote import readable
    where, folder = readable(loc, [f for c in entry["chunks"] for f in c["files"].values()])
    try:
        if folder is not None:
            yield lambda rel, dictionary=False: _read(where[rel], dictionary)
        else:
            def read(rel, dictionary=False):
                with loc.fs.open(where[rel], "rb") as fh:
                    return _read(fh, dictionary)
            yield read
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def build(store, con, run: str, params: dict, dask=None, n_workers: int = 1, chunks: list[list[int]] | None = None,
          save: bool = True, stages=None):
    """The run's Graph from its saved pieces, or from pieces built now (and saved, with ``save``),
    of ``store`` (a folder, or an object store's URL: the pieces uploaded like the per-rank
    summaries). ``con`` is a store connection with clock_offsets / clock_alignment bound; ``chunks`` the ranks of each map
    task (default: ``analyses.summaries.rank_chunks``); ``stages()`` the run's pipeline stages,
    saved with the pieces (the first chunk's ``stages`` file; without it the graph's are None)."""
    from ...analyses.summaries import chunk_label, place_file, rank_chunks
    from ...errors import TraceAnalyzerError
    from ...ingest.executor import open_executor
    loc = st.location(store)
    t0 = time.perf_counter()
    s = comm_tables(con, run, params)
    try:
        manifest = st.read_manifest(loc)
        run_key = key(manifest, run, offsets(s))
        entry = saved(loc, manifest, run, run_key)
        t_comm = time.perf_counter() - t0
        if entry is not None:
            warm_up(sum(c["counts"]["nodes"] for c in entry["chunks"]))
            with _reader(loc, entry) as read:
                g = stitch(run, entry["chunks"], read, s)
                rel = entry["chunks"][0]["files"].get("stages") if entry["chunks"] else None
                g.stages = read(rel).to_pandas() if rel else None
            g.stats.update(pieces="read", load_s=t_comm, build_s=time.perf_counter() - t0 - t_comm)
            return g
        where = str(loc.resolve()) if isinstance(loc, Path) else str(loc)  # a cluster's workers: absolute paths
        try:
            staging = Path(writers.new_work_folder(loc)).resolve()
        except OSError:  # a store this process may not write: built in a folder of its own, not saved
            staging, save = Path(tempfile.mkdtemp(prefix="traceanalyzer-graph-")), False
        try:
            comm_dir = staging / "comm"
            comm_dir.mkdir()
            s.query(f"COPY (SELECT * FROM {{off}}) TO '{comm_dir}/off.parquet' (FORMAT parquet)").fetchall()
            s.query(f"COPY (SELECT * FROM {{cm}}) TO '{comm_dir}/cm.parquet' (FORMAT parquet)").fetchall()
            # the stitch numbers the nodes chunk after chunk: chunks of consecutive ranks, in rank order
            chunks = sorted((sorted(c) for c in chunks), key=lambda c: c[0]) if chunks else \
                rank_chunks(loc, manifest, run, n_workers)
            calls = [(where, run, c, dict(s.params), str(comm_dir), str(staging / "pieces")) for c in chunks]
            done = [None] * len(calls)
            with open_executor(dask, n_workers=n_workers, n_tasks=len(calls)) as ex:
                for i, result, failure in ex.map_unordered(map_task, calls,
                                                           [f"graph-{run}-{chunk_label(c)}" for c in chunks]):
                    if failure:
                        raise TraceAnalyzerError(f"replay graph of run {run}, ranks {chunk_label(chunks[i])}: {failure}")
                    done[i] = result
            t_map = time.perf_counter() - t0
            warm_up(sum(c["counts"]["nodes"] for c in done))
            g = stitch(run, done, _read, s)
            g.stats.update(pieces="built", load_s=t_map, build_s=time.perf_counter() - t0 - t_map)
            g.stages = stages() if stages is not None else None
            if g.stages is not None and done:
                done[0]["files"]["stages"] = str(staging / "stages.parquet")
                pq.write_table(pa.Table.from_pandas(g.stages, preserve_index=False), done[0]["files"]["stages"])
            if save:
                try:
                    _commit(loc, run, run_key, done, place_file, chunk_label)
                except (StoreError, OSError):  # busy or read-only: the graph stands, the next build makes it again
                    g.stats["pieces"] = "built, not saved"
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return g
    finally:
        s.close()


def _commit(loc, run: str, run_key: str, done: list[dict], place, chunk_label) -> None:
    """List the run's pieces under ENTRY in one manifest commit: moved into place under the lock (a
    local store), or uploaded first under new names (an object store: no lock, and the commit may be
    done again on a newer manifest), as ``analyses.summaries`` does with its files."""
    def entry(part: str) -> dict:
        chunks = []
        for c in done:
            label = chunk_label(c["ranks"])
            files = {name: place(loc, path, f"{FOLDER}/{name}/run={run}/rank={label}", part)
                     for name, path in c["files"].items()}
            chunks.append({"ranks": [c["ranks"][0], c["ranks"][-1]], "files": files, "counts": c["counts"]})
        return {"key": run_key, "format": FORMAT, "chunks": chunks}

    uploaded = None if isinstance(loc, Path) else entry(uuid.uuid4().hex[:8])

    def change(manifest):
        if saved(loc, manifest, run, run_key) is not None:
            return  # another build was first with the same pieces (an upload of this one is garbage)
        manifest.extra.setdefault(ENTRY, {})[run] = uploaded or entry(str(manifest.generation))
    writers.update(loc, change)


def forget(store, runs: list[str] | None = None) -> None:
    """Drop the saved pieces of ``runs`` (default: all) from the store (their files are retired)."""
    def drop(manifest):
        entry = manifest.extra.get(ENTRY, {})
        for run in list(entry) if runs is None else runs:
            entry.pop(run, None)
    writers.update(st.location(store), drop)
