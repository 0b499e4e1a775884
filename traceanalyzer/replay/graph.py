"""The replay dependency graph: traced operations with measured durations, and what each waits for.

Why this shape: a replay must (1) reproduce the recorded timeline when nothing changes and
(2) move work in a believable way when durations change. So every lane (a CPU thread, a GPU
stream, a gloo runloop thread) is a FIFO sequence of nodes in recorded order, and a node starts
when its lane predecessor and all its cross-lane predecessors are done:

    start[i] = max(rel[i], max over incoming edges e (end[src[e]] + lag[e])),  end = start + dur

The lane predecessor is an ordinary edge. ``lag`` holds what the graph cannot explain (launch
latency, gloo dispatch latency): it is fitted per node so that the recorded start is reproduced,
on the binding constraint only (a kernel queued behind a busy stream keeps no latency).

Nodes:
* CPU threads: the top-level work (merged intervals of the thread's events, ProfilerStep excluded)
  cut at every point where a dependency leaves or enters (launch ends, collective enqueues, sync
  calls); the gaps between are GAP nodes, so identity replay reproduces the host's own idle time.
  Where the thread visibly waits (a sync call, a gap that ends right after a collective completes,
  a gloo send/recv span waiting for its peer), the waiting part becomes a WAIT node of duration 0
  and the rest of the work depends on what it waited for.
* GPU streams: every kernel / memcpy / memset, with an edge from its launch (correlation id);
  ``cudaStreamWaitEvent`` adds an edge from the last op launched on another stream.
* Communication (collectives by (pg, seq), p2p by (pg, src, dst, tag, p2p_seq)): on each member
  the execution span is split into ARRIVE (0 ns, at its recorded start) and POST (from the last
  member's arrival to its own end); a virtual SYNC node joins the arrivals. So a collective starts
  when its last member arrives and lasts its transfer time (min end - max arrival, METRICS.md) plus
  the member's own tail.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..errors import TraceAnalyzerError
from ._jit import join_kernel, repair_kernel, warm_up

# node kinds
OP, GAP, WAIT, KERNEL, ARRIVE, POST, SYNC = range(7)
KIND_NAMES = ("op", "gap", "wait", "gpu", "arrive", "comm", "sync")
NO_REL = np.iinfo(np.int64).min // 4

_BLOCKING_SYNC = ("Synchronize",)           # cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize
_GAP_WAIT_MAX_TAIL_NS = 1_000_000           # a gap is a wait for a completion that ends it within 1 ms
_CROSS_THREAD_MIN_GAP_NS = 100_000          # shorter gaps are not taken as waits for another thread


@dataclass
class Graph:
    """Flat arrays (one entry per node) plus an incoming-edge CSR; see the module docstring."""
    run: str
    ms: np.ndarray          # recorded start (clock-aligned), ns
    me: np.ndarray          # recorded end, ns
    dur: np.ndarray         # modelled duration (identity), ns
    lane: np.ndarray        # lane id (-1: virtual)
    rank: np.ndarray
    kind: np.ndarray        # OP, GAP, WAIT, KERNEL, ARRIVE, POST, SYNC
    label: np.ndarray       # index into labels (op/kernel name)
    category: np.ndarray    # index into categories (events.kind, or 'gap', 'wait', op of comm)
    inst: np.ndarray        # communication instance index for ARRIVE/POST/SYNC, else -1
    rel: np.ndarray         # release time (lane-first nodes), NO_REL otherwise
    ptr: np.ndarray         # CSR: incoming edges of node i are ptr[i]:ptr[i+1]
    src: np.ndarray
    lag: np.ndarray
    is_lane_edge: np.ndarray
    order: np.ndarray       # a topological order
    labels: list
    categories: list
    lanes: pd.DataFrame     # lane, rank, tid, is_gpu, name
    steps: pd.DataFrame     # rank, step, measured_ns, start_node, end_node, end_uses_end
    instances: pd.DataFrame  # inst, key, op, bytes, is_p2p, transfer_ns
    stats: dict = field(default_factory=dict)
    stages: pd.DataFrame | None = None   # rank, stage (pipelines: the analyses' stage detection)
    source: object = None                # the DuckDB connection it was built from (alpha-beta fits)
    alphabeta: object = None             # the run's alpha-beta fit, once a plan asked for it
    cache: dict = field(default_factory=dict, repr=False)   # what plans derive from the graph alone (plans.py)

    @property
    def n(self) -> int:
        return len(self.dur)


#: the analysis modules that define pipeline_stages (and what they read): binding these alone takes
#: a fraction of a second where every analysis view takes seconds (deep view chains bind slowly)
PIPELINE_VIEWS = ("clock_offsets", "step_alignment", "pipelines")


def build_graph(store_or_con, run: str | None = None) -> Graph:
    """Build the replay graph of one run from a store (all ranks)."""
    from ..analyses import _sql, connect, prepare
    con = connect(store_or_con)
    # the graph needs the clock offsets (clock_offsets.sql: a query over comms and ranks, bound in
    # milliseconds) and, for a pipeline, its stages. Binding every analysis view costs seconds on a
    # big store, so a pipeline binds only PIPELINE_VIEWS, and a connection that has them is used as it is
    have = {v for (v,) in con.execute("SELECT view_name FROM duckdb_views() WHERE temporary").fetchall()}
    if not {"clock_offsets", "clock_alignment"} <= have:
        from ..analyses import PARAMETERS
        for key in ("align_clocks", "clock_offset_evident_ns"):  # defaults where no analysis set them
            if con.execute("SELECT getvariable(?)", [key]).fetchone()[0] is None:
                con.execute(f"SET VARIABLE {key} = ?", [PARAMETERS[key][0]])
        con.execute(_sql("clock_offsets"))
    run = resolve_run(con, run, "replay")
    g = _Builder(con, run).build()
    g.source = con
    g.stages = pd.DataFrame({"rank": np.zeros(0, np.int32), "stage": np.zeros(0, np.int64)})
    if "pipeline_stages" not in have:
        # pipeline_stages only has rows for runs with sends (the first send orders the stages)
        (sends,) = con.execute("SELECT count(*) FROM comms WHERE run = $run AND op = 'send'", {"run": run}).fetchone()
        if not sends:
            return g
        prepare(con, modules=PIPELINE_VIEWS)
    try:
        g.stages = con.execute("SELECT rank, stage FROM pipeline_stages WHERE run = $run ORDER BY stage, rank",
                               {"run": run}).df()
    except Exception:  # noqa: BLE001 - no pipeline views: not a pipeline
        g.stages = None
    return g


def resolve_run(con, run: str | None, who: str) -> str:
    """The run to replay: ``run`` if the store has steps for it, else the store's only run with
    steps; a one-line error naming ``who`` (the model) otherwise."""
    runs = [r for (r,) in con.execute("SELECT DISTINCT run FROM steps ORDER BY run").fetchall()]
    if run is None:
        if len(runs) != 1:
            raise TraceAnalyzerError(f"{who}: the store holds {len(runs)} runs with steps ({', '.join(runs)}); give --run")
        return runs[0]
    if run not in runs:
        raise TraceAnalyzerError(f"{who}: run '{run}' has no steps in the store (runs: {', '.join(runs) or 'none'})")
    return run


def merge_intervals(iv) -> np.ndarray:
    """Sorted, disjoint union of (start, end) intervals (an (n, 2) array; empty stays empty)."""
    iv = np.asarray(iv)
    if not len(iv):
        return iv.reshape(0, 2)
    iv = iv[np.argsort(iv[:, 0], kind="stable")]
    merged = [list(iv[0])]
    for a, e in iv[1:]:
        if a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([a, e])
    return np.asarray(merged, dtype=iv.dtype)


_EVENTS_WHERE = """FROM events WHERE run = $run AND ph = 'X' AND kind NOT IN ('instant', 'gpu_annotation')
                     AND NOT (kind = 'other' AND name LIKE 'PyTorch Profiler%')"""
# cpu_ops that ingest found nested (events.nested: wholly inside earlier work on their thread, the
# rule _make_cpu_lanes merges top-level work by) can neither start nor extend a top-level span, and
# nothing else here reads a cpu_op: they stay in the store (two thirds of a big run's events)
_NOT_NESTED = " AND NOT (kind = 'cpu_op' AND coalesce(nested, false))"
_SKIP_NESTED = True  # False: fetch them anyway (stores before schema 1.3 have no such column; the tests compare)
# names leave DuckDB as 64-bit hashes (cheaper than 13 M strings), kinds as their position in the
# run's list of kinds; the strings come from one DISTINCT query (a hash collision falls back to strings)
_EVENTS_SQL = ("SELECT rank, event_id, coalesce(list_position($kinds, kind), 0)::SMALLINT AS kind_pos, "
               "{name_hash} AS name_hash, ts_ns, dur_ns, tid, is_gpu, coalesce(correlation, 0) AS correlation, "
               "correlation IS NOT NULL AS has_corr ")
# better still, the hash modulo a number m under which the run's distinct names stay distinct: then
# a name's code is one lookup in a table of m entries (a binary search among the hashes costs 0.2 s
# at 5 M events); m is searched from n^2 (n names) up to _MAX_MODULUS, else the full hash is used
_MAX_MODULUS = 1 << 24
_HASH_NAMES = True   # False: always fetch the strings (what a collision does; the tests check both give one graph)
_EVENTS_SQL_STRINGS = ("SELECT rank, event_id, kind, name, ts_ns, dur_ns, tid, is_gpu, coalesce(correlation, 0) AS "
                       "correlation, correlation IS NOT NULL AS has_corr ")
# what a wait waits for: a member's POST, an instance's SYNC, a GPU op, another CPU thread of the rank
_POST_SRC, _SYNC_SRC, _GPU_SRC, _CPU_SRC = 0, 1, 2, 3


def _modulus(hashes) -> int:
    """The smallest m >= max(n^2, 1024) (n distinct hashes, counting up in odd numbers, 64 tries)
    under which the hashes stay distinct, or 0 where none is found below _MAX_MODULUS. From n^2 on
    a try fails with probability at most 1 - exp(-1/2) = 0.39, so all 64 fail about once in 10^26."""
    n = len(hashes)
    start = max(n * n, 1024) | 1
    if n == 0 or start + 128 > _MAX_MODULUS:
        return 0
    for m in range(start, start + 128, 2):
        if len(np.unique(hashes % np.uint64(m))) == n:
            return m
    return 0


def _dict_codes(col) -> tuple[np.ndarray, list]:
    """A string column of an Arrow table as (int32 codes, their strings), via one dictionary encoding."""
    import pyarrow.compute as pc
    col = pc.fill_null(col, "")
    if col.num_chunks == 0 or len(col) == 0:
        return np.zeros(0, np.int32), []
    d = pc.dictionary_encode(col).unify_dictionaries()
    codes = np.concatenate([c.indices.to_numpy(zero_copy_only=False) for c in d.chunks]).astype(np.int32)
    return codes, d.chunks[0].dictionary.to_pylist()


def _int_col(t, name, null=-1) -> np.ndarray:
    import pyarrow.compute as pc
    if not len(t):
        return np.zeros(0, np.int64)
    col = t.column(name)
    if col.null_count:
        col = pc.fill_null(col, null)
    return _np(col).astype(np.int64, copy=False)


def _bool_col(t, name) -> np.ndarray:
    return _np(t.column(name)).astype(bool, copy=False) if len(t) else np.zeros(0, bool)


def _np(col) -> np.ndarray:
    """A chunked Arrow column (no nulls) as one numpy array, concatenated by numpy from zero-copy
    views of the chunks: the array lives in the process heap, where
    ChunkedArray.to_numpy allocates from Arrow's pool and faults fresh pages in (0.1 s per column
    of 5 M events on the VM of benchmarks/RESULTS.md)."""
    chunks = [c.to_numpy(zero_copy_only=False) for c in col.chunks]
    if not chunks:
        return col.to_numpy()
    return chunks[0].copy() if len(chunks) == 1 else np.concatenate(chunks)


def _pack(pairs):
    """Int (a, b) column pairs as one int64 key per row, (a - a0) * width_b + (b - b0) with the
    minima and widths shared by all pairs: equal pairs get equal keys, and keys sort like (a, b).
    None where the ranges do not fit in 62 bits."""
    pairs = [(np.asarray(a, np.int64), np.asarray(b, np.int64)) for a, b in pairs]
    full = [(a, b) for a, b in pairs if len(a)]
    if not full:
        return [a.copy() for a, _ in pairs]
    a0, b0 = min(int(a.min()) for a, _ in full), min(int(b.min()) for _, b in full)
    wa, wb = max(int(a.max()) for a, _ in full) - a0 + 1, max(int(b.max()) for _, b in full) - b0 + 1
    if wa * wb >= 2 ** 62:
        return None
    keys = []
    for a, b in pairs:              # in place on one new array per pair
        k = a - a0
        k *= wb
        k += b
        k -= b0
        keys.append(k)
    return keys


def _pair_keys(a1, b1, a2, b2):
    """Two (int, int) key columns as int64 codes such that equal pairs get equal codes."""
    keys = _pack([(a1, b1), (a2, b2)])
    if keys is not None:            # one integer key, no hashing (nor concatenation)
        return keys[0], keys[1]
    a = np.concatenate([np.asarray(a1, np.int64), np.asarray(a2, np.int64)])
    b = np.concatenate([np.asarray(b1, np.int64), np.asarray(b2, np.int64)])
    ca, ua = pd.factorize(a)
    cb, ub = pd.factorize(b)
    k = ca.astype(np.int64) * max(len(ub), 1) + cb
    return k[:len(a1)], k[len(a1):]


def _sorted_codes(x):
    """(codes, sorted uniques) of an int array with few distinct values (thread ids): a table
    lookup when the values span a small range, else one hash pass (pd.factorize) and a remap."""
    x = np.asarray(x, np.int64)
    if not len(x):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    lo, hi = int(x.min()), int(x.max())
    if hi - lo < min(len(x) // 4, 1 << 22) + 1024:
        present = np.bincount(x - lo, minlength=hi - lo + 1) > 0
        table = np.cumsum(present) - 1
        return table[x - lo], np.flatnonzero(present) + lo
    codes, u = pd.factorize(x)
    o = np.argsort(u)
    remap = np.empty(len(u), dtype=np.int64)
    remap[o] = np.arange(len(u))
    return remap[codes], np.asarray(u)[o]


def _inner_join(lk, rk):
    """Row pairs (i, j) with lk[i] == rk[j], in left order, each left row's matches in right order."""
    o = np.argsort(rk, kind="stable")
    sk = rk[o]
    if not len(sk) or (sk[1:] != sk[:-1]).all():     # right keys unique (launch -> kernel): one search
        k = np.minimum(np.searchsorted(sk, lk), max(len(sk) - 1, 0))
        li = np.flatnonzero(sk[k] == lk) if len(sk) else np.zeros(0, np.int64)
        return li, o[k[li]]
    lo = np.searchsorted(sk, lk, side="left")
    cnt = np.searchsorted(sk, lk, side="right") - lo
    li = np.repeat(np.arange(len(lk)), cnt)
    gi = o[np.repeat(lo - np.cumsum(cnt) + cnt, cnt) + np.arange(cnt.sum())] if cnt.sum() else np.zeros(0, np.int64)
    return li, gi


def _among(x, values) -> np.ndarray:
    """np.isin(x, values) for a few values (node or event kinds): one comparison each, where
    np.isin first builds a lookup table over x's whole range (10x slower on 5 M events)."""
    out = np.zeros(len(x), dtype=bool)
    for v in values:
        out |= x == v
    return out


def _member(keys, of) -> np.ndarray:
    """np.isin(keys, of) for many keys and a smaller set: a binary search in the sorted set."""
    u = np.unique(np.asarray(of))
    if not len(u) or not len(keys):
        return np.zeros(len(keys), dtype=bool)
    k = np.minimum(np.searchsorted(u, keys), len(u) - 1)
    return u[k] == keys


def _lexsort2(minor, major) -> np.ndarray:
    """np.lexsort((minor, major)) for int arrays: one stable argsort of the packed key where the
    two ranges fit in 62 bits (10x faster than lexsort's two merge sorts)."""
    keys = _pack([(major, minor)])
    return np.lexsort((minor, major)) if keys is None else np.argsort(keys[0], kind="stable")


def _launch_join(rt, gp, rank, corr):
    """_inner_join of rows rt and gp on (rank, corr): one compiled merge pass where both sides are
    sorted (as a store gives them), else keys, a sort and binary searches."""
    kernel = join_kernel()
    if kernel is not None:
        li, gi = np.empty(len(rt), np.int64), np.empty(len(rt), np.int64)
        n = kernel(np.ascontiguousarray(rt, np.int64), np.ascontiguousarray(gp, np.int64),
                   np.ascontiguousarray(rank, np.int64), np.ascontiguousarray(corr, np.int64), li, gi)
        if n >= 0:
            return li[:n], gi[:n]
    return _inner_join(*_pair_keys(rank[rt], corr[rt], rank[gp], corr[gp]))


def _lookup(keys, values, query, keep="first", order=None) -> np.ndarray:
    """values[i] of the first (keep='first') or last row i whose key equals each query key; -1 when none.
    ``order``: the rows to look among, in np.argsort(keys, kind="stable") order (one sort, several lookups)."""
    out = np.full(len(query), -1, dtype=np.int64)
    o = np.argsort(keys, kind="stable") if order is None else order
    if not len(o) or not len(query):
        return out
    sk = keys[o]
    if keep == "first":
        k = np.searchsorted(sk, query, side="left")
        hit = k < len(sk)
        hit[hit] = sk[k[hit]] == query[hit]
        out[hit] = values[o[k[hit]]]
    else:
        k = np.searchsorted(sk, query, side="right") - 1
        hit = k >= 0
        hit[hit] = sk[k[hit]] == query[hit]
        out[hit] = values[o[k[hit]]]
    return out


def _groups(codes, n):
    """Row indices grouped by an int code in [0, n): (order, ptr), rows of code c are order[ptr[c]:ptr[c+1]]
    in their original order."""
    codes = np.asarray(codes)
    small = codes.astype(np.int16) if n < 32_000 else codes   # 16-bit codes sort by radix
    order = np.argsort(small, kind="stable")
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(codes, minlength=n), out=ptr[1:])
    return order, ptr


class _Builder:
    """Builds the graph with whole-array numpy work: events are loaded once as arrays (names and
    kinds as codes into one string table), grouped by thread with one radix sort, and every
    per-lane step works on slices of those arrays; pandas only for the small comms/steps tables."""

    def __init__(self, con, run):
        self.con, self.run = con, run
        self.strs: list = []
        self.str_code: dict = {}

    def q(self, sql):
        return self.con.execute(sql, {"run": self.run}).df()

    def code(self, s) -> int:
        """Code of a string in the builder's string table (labels and categories share it)."""
        c = self.str_code.get(s)
        if c is None:
            c = self.str_code[s] = len(self.strs)
            self.strs.append(s)
        return c

    def codes(self, values) -> np.ndarray:
        return np.fromiter((self.code(str(v)) for v in values), dtype=np.int64, count=len(values))

    # -- loading ------------------------------------------------------------------------------
    def load(self):
        self.offset = {}
        # the offsets only where they are applied (clock_offsets.sql: runs over several hosts)
        if self.con.execute("SELECT count(*) FROM clock_alignment WHERE run = $run AND applied",
                            {"run": self.run}).fetchone()[0]:
            off = self.q("SELECT rank, offset_ns FROM clock_offsets WHERE run = $run")
            self.offset = dict(zip(off["rank"], off["offset_ns"]))
        where = _EVENTS_WHERE
        nested = "false"
        if _SKIP_NESTED and "nested" in {d[0] for d in self.con.execute("SELECT * FROM events LIMIT 0").description}:
            where += _NOT_NESTED
            nested = "coalesce(nested, false)"
        # the run's kinds and names (all its events': one cheap scan of two dictionary-encoded columns,
        # where the distinct values of just the fetched events take a second filtered scan)
        rows = self.con.execute("SELECT 'k', kind, NULL::UBIGINT FROM (SELECT DISTINCT kind FROM events WHERE run = $run) "
                                "UNION ALL SELECT 'n', name, hash(name) FROM (SELECT DISTINCT name FROM events "
                                "WHERE run = $run)", {"run": self.run}).fetchall()
        kinds = sorted({v for w, v, _ in rows if w == "k" and v is not None})
        by_hash = {}
        for w, name, h in rows:
            if w == "n":
                by_hash.setdefault(h, set()).add(name)
        hashed = _HASH_NAMES and all(len(v) == 1 for v in by_hash.values())
        if hashed:
            uh = np.unique(np.fromiter(by_hash, dtype=np.uint64, count=len(by_hash)))
            m = _modulus(uh)
            params = {"run": self.run, "kinds": kinds}
            if m:
                params["m"] = m
            sql = _EVENTS_SQL.format(name_hash="(hash(name) % $m::UBIGINT)::UINTEGER" if m else "hash(name)")
            t = self.con.sql(sql + f", {nested} AS nested " + where, params=params).to_arrow_table()
        else:
            t = self.con.sql(_EVENTS_SQL_STRINGS + f", {nested} AS nested " + where, params={"run": self.run}).to_arrow_table()
        rank = _int_col(t, "rank")
        o = np.zeros(int(rank.max()) + 1 if len(rank) else 1, dtype=np.int64)
        for r, v in self.offset.items():
            if 0 <= r < len(o) and v == v:
                o[int(r)] = int(v)
        self.e_rank = rank
        self.e_id = _int_col(t, "event_id")
        self.e_ts = _int_col(t, "ts_ns", 0)
        if o.any():                      # clock offsets (only applied across hosts)
            self.e_ts = self.e_ts + o[rank]
        self.e_dur = _int_col(t, "dur_ns", 0)
        self.e_te = self.e_ts + self.e_dur
        self.e_tid = _int_col(t, "tid", 0)
        self.e_gpu = _bool_col(t, "is_gpu")
        self.e_has_corr = _bool_col(t, "has_corr")
        self.e_corr = _int_col(t, "correlation", 0)
        # the other events that ingest found nested (runtime calls inside their op: a fifth of a big
        # run's events) are fetched for their launches, but cannot shape a thread's top-level work
        self.e_nested = _bool_col(t, "nested")
        # names and kinds as codes into the builder's string table
        if not len(t):
            (nc, nstr), (kc, kstr) = (np.zeros(0, np.int32), []), (np.zeros(0, np.int32), [])
        elif hashed:
            if m:       # codes by one lookup in a table of m entries
                table = np.zeros(m, dtype=np.int32)
                table[(uh % np.uint64(m)).astype(np.int64)] = np.arange(len(uh), dtype=np.int32)
                nc = table[_np(t.column("name_hash"))]
            else:       # by one binary search among the run's distinct hashes
                nc = np.searchsorted(uh, _np(t.column("name_hash")))
            nstr = ["nan" if n is None else n for n in (next(iter(by_hash[int(h)])) for h in uh)]
            kc, kstr = _np(t.column("kind_pos")).astype(np.int64), ["nan"] + kinds
        else:
            nc, nstr = _dict_codes(t.column("name"))
            kc, kstr = _dict_codes(t.column("kind"))
        del t
        self.name_str = nstr
        self.e_name = self.codes(nstr)[nc] if len(nstr) else np.zeros(len(nc), np.int64)
        self.e_kind = self.codes(kstr)[kc] if len(kstr) else np.zeros(len(kc), np.int64)
        self.e_name_local = nc
        # threads: (rank, tid, is_gpu) as codes sorted by (rank, tid), events grouped by thread
        tmin = int(self.e_tid.min()) if len(rank) else 0
        if len(rank) and int(rank.min()) >= 0 and int(rank.max()) < 2 ** 20 and int(self.e_tid.max()) - tmin < 2 ** 41:
            key = self.e_tid - tmin                 # one int64 key (rank, tid, is_gpu), built in place
            key <<= 1
            key |= self.e_gpu
            key |= rank << 42
            self.e_thr, pu = _sorted_codes(key)
            del key
            self.t_gpu = (pu & 1).astype(bool)
            self.t_rank = pu >> 42
            self.t_tid = ((pu >> 1) & (2 ** 41 - 1)) + tmin
        else:
            tcode, tu = _sorted_codes(self.e_tid)
            nt = max(len(tu), 1)
            self.e_thr, pu = _sorted_codes((rank * nt + tcode) * 2 + self.e_gpu)
            self.t_gpu = (pu % 2).astype(bool)
            self.t_rank = (pu // 2) // nt
            self.t_tid = np.asarray(tu, np.int64)[(pu // 2) % nt] if len(pu) else np.zeros(0, np.int64)
        self.n_thr = len(pu)
        self.thr_order, self.thr_ptr = _groups(self.e_thr, self.n_thr)
        self.thr_of = {(int(r), int(d), bool(g)): i for i, (r, d, g) in enumerate(zip(self.t_rank, self.t_tid, self.t_gpu))}
        cm = self.q("""SELECT rank, comm_id, op, is_p2p, coalesce(pg_name, '?') AS pg, seq, p2p_seq, src_rank, dst_rank,
                              tag, coalesce(CASE WHEN op = 'all_gather' THEN out_bytes ELSE in_bytes END, 0) AS bytes,
                              enqueue_ts_ns, enqueue_dur_ns, enqueue_tid, exec_event_id, start_ts_ns, end_ts_ns,
                              exec_tid, on_gpu
                       FROM comms WHERE run = $run AND start_ts_ns IS NOT NULL
                        AND (seq IS NOT NULL OR (is_p2p AND p2p_seq IS NOT NULL))""")
        o = cm["rank"].map(self.offset).fillna(0).astype("int64")
        for c in ("enqueue_ts_ns", "start_ts_ns", "end_ts_ns"):
            cm[c] = cm[c] + o
        self.cm = cm
        st = self.q("SELECT rank, step, start_ts_ns, end_ts_ns, dur_ns FROM steps WHERE run = $run")
        o = st["rank"].map(self.offset).fillna(0).astype("int64")
        st["start_ts_ns"] += o
        st["end_ts_ns"] += o
        self.st = st
        # the thread that records ProfilerStep is each rank's main thread
        step_code = self.str_code.get("step", -1)
        s = np.flatnonzero(self.e_kind == step_code)
        ranks, first = np.unique(self.e_rank[s], return_index=True)
        self.step_tid = dict(zip(ranks.tolist(), self.e_tid[s[first]].tolist()))

    def thr_codes(self, rank, tid, gpu=False) -> np.ndarray:
        """Thread codes of (rank, tid) pairs (-1: a thread without events)."""
        get = self.thr_of.get
        return np.fromiter((get((int(r), int(t), gpu), -1) if t == t else -1 for r, t in zip(rank, tid)),
                           dtype=np.int64, count=len(rank))

    def build(self) -> Graph:
        import time
        t0 = time.perf_counter()
        warm_up()
        self.load()
        t1 = time.perf_counter()
        phases = {}
        self._drop("load")
        for step in (self._plan_comm, self._cpu_cut_points, self._make_cpu_lanes, self._make_queue_lanes,
                     self._make_edges, self._finish):
            t = time.perf_counter()
            g = step()                  # the last one, _finish, returns the Graph
            self._drop(step.__name__)
            name = step.__name__.strip("_")
            phases[name] = round(time.perf_counter() - t, 3)
        g.stats.update(load_s=t1 - t0, build_s=time.perf_counter() - t1, phases_s=phases)
        return g

    #: the arrays each step uses last: freed right after it, so that the build's peak memory stays
    #: below the sum of all its arrays
    _LAST_USE = {"load": ("e_tid",), "_cpu_cut_points": ("e_name_local",),
                 "_make_cpu_lanes": ("e_dur", "e_nested", "cut_t", "cut_thr"),
                 "_make_queue_lanes": ("thr_order", "cpu_cols"),
                 "_make_edges": ("e_rank", "e_id", "e_ts", "e_te", "e_gpu", "e_has_corr", "e_corr", "e_name",
                                 "e_kind", "e_thr", "nd.event_id", "nd.comm_id")}

    def _drop(self, step):
        for a in self._LAST_USE.get(step, ()):
            if a.startswith("nd."):
                self.nd.pop(a[3:], None)
            else:
                self.__dict__.pop(a, None)

    # -- communication instances ---------------------------------------------------------------
    def _plan_comm(self):
        cm = self.cm
        key = np.where(cm["is_p2p"],
                       "p2p|" + cm["pg"] + "|" + cm["src_rank"].astype("string").fillna("") + ">" +
                       cm["dst_rank"].astype("string").fillna("") + "|" + cm["tag"].astype("string").fillna("") +
                       "|" + cm["p2p_seq"].astype("string").fillna(""),
                       "coll|" + cm["pg"] + "|" + cm["seq"].astype("string").fillna(""))
        cm["key"] = key
        cm["inst"] = pd.factorize(cm["key"])[0]
        grp = cm.groupby("inst")
        cm["c"] = grp["start_ts_ns"].transform("max")          # last arrival
        first_end = grp["end_ts_ns"].transform("min")
        cm["c"] = np.minimum(cm["c"], np.maximum(cm["end_ts_ns"], cm["start_ts_ns"]))  # never past own end
        inst = grp.agg(key=("key", "first"), op=("op", "first"), bytes=("bytes", "max"), is_p2p=("is_p2p", "first"),
                       n_ranks=("rank", "nunique"), last_arrival=("start_ts_ns", "max"), first_end=("end_ts_ns", "min"))
        inst["transfer_ns"] = (inst["first_end"] - inst["last_arrival"]).clip(lower=0)
        self.instances = inst.reset_index()
        cm["tail"] = (cm["end_ts_ns"] - first_end).clip(lower=0)
        # where the execution runs: on the issuing CPU thread (gloo p2p), else a runloop thread / GPU stream
        cm["on_gpu"] = cm["on_gpu"].fillna(False).astype(bool)
        cm["exec_on_cpu_lane"] = ~cm["on_gpu"] & (cm["exec_tid"] == cm["enqueue_tid"])

    # -- CPU lanes -----------------------------------------------------------------------------
    def _cpu_cut_points(self):
        cm = self.cm
        is_q = (~cm["exec_on_cpu_lane"] & ~cm["on_gpu"]).to_numpy(bool)
        self.runloop = set(map(tuple, cm.loc[is_q, ["rank", "exec_tid"]].drop_duplicates().to_numpy()))
        rl_thr = self.thr_codes([r for r, _ in self.runloop], [t for _, t in self.runloop])
        self.rl_thr = rl_thr[rl_thr >= 0]
        self.t_cpu = ~self.t_gpu.copy()
        self.t_cpu[rl_thr[rl_thr >= 0]] = False
        cpu_ev = self.t_cpu[self.e_thr]
        cuts_thr, cuts_t = [], []          # (thread code, time) where a CPU lane is cut
        waits = []                         # (thread, lo, hi, src_kind, src_ref): [lo, hi) becomes WAIT, hi gets the edge
        # launches: runtime events whose correlation matches a GPU op (of the same rank)
        kind = self.e_kind
        rt_kinds = [self.str_code.get(k, -1) for k in ("runtime", "sync")]
        rt = np.flatnonzero(cpu_ev & _among(kind, rt_kinds) & self.e_has_corr)
        gp = np.flatnonzero(self.e_gpu & self.e_has_corr)
        li, gi = _launch_join(rt, gp, self.e_rank, self.e_corr)
        self.L_ev, self.L_gpu = rt[li], gp[gi]
        cuts_thr.append(self.e_thr[self.L_ev]); cuts_t.append(self.e_te[self.L_ev])
        # gloo/collective enqueue -> execution on a runloop thread: cut where the span starts (clipped to the op)
        q = cm[is_q].copy()
        q["cut"] = np.clip(q["start_ts_ns"], q["enqueue_ts_ns"], q["enqueue_ts_ns"] + q["enqueue_dur_ns"].fillna(0))
        q["thr"] = self.thr_codes(q["rank"].to_numpy(), q["enqueue_tid"].to_numpy())
        q["xthr"] = self.thr_codes(q["rank"].to_numpy(), q["exec_tid"].to_numpy())
        self.enq = q
        cuts_thr.append(q["thr"].to_numpy()); cuts_t.append(q["cut"].to_numpy(np.int64))
        # execution on the CPU lane itself (gloo send/recv): arrival, last arrival
        x = cm[cm["exec_on_cpu_lane"]].copy()
        x["thr"] = self.thr_codes(x["rank"].to_numpy(), x["exec_tid"].to_numpy())
        self.cpu_exec = x
        xt = x["thr"].to_numpy()
        cuts_thr += [xt, xt]; cuts_t += [x["start_ts_ns"].to_numpy(np.int64), x["c"].to_numpy(np.int64)]
        waits.append((xt, x["start_ts_ns"].to_numpy(np.int64), x["c"].to_numpy(np.int64),
                      np.full(len(x), _SYNC_SRC), x["inst"].to_numpy(np.int64)))
        # blocking sync calls: wait for the latest GPU op (launched before the call) that ended inside it
        is_block = np.array([any(b in s for b in _BLOCKING_SYNC) for s in self.name_str], dtype=bool)
        sy = np.flatnonzero(cpu_ev & (kind == self.str_code.get("sync", -1)) & is_block[self.e_name_local]) \
            if len(is_block) else np.zeros(0, np.int64)
        if len(sy) and len(self.L_ev):
            k_rank, k_ts, k_te, k_id = (self.e_rank[self.L_ev], self.e_ts[self.L_ev], self.e_te[self.L_gpu],
                                        self.e_id[self.L_gpu])
            ko = _lexsort2(k_te, k_rank)
            k_rank, k_ts, k_te, k_id = k_rank[ko], k_ts[ko], k_te[ko], k_id[ko]
            s_rank, s_ts, s_te = self.e_rank[sy], self.e_ts[sy], self.e_te[sy]
            j = np.full(len(sy), -1, dtype=np.int64)
            for r in np.unique(s_rank):
                a, b = np.searchsorted(k_rank, r, "left"), np.searchsorted(k_rank, r, "right")
                m = s_rank == r
                if b > a:
                    j[m] = a + np.searchsorted(k_te[a:b], s_te[m], side="right") - 1
                    j[m & (j < a)] = -1
            lo_rank = np.searchsorted(k_rank, s_rank, "left")
            act = np.flatnonzero(j >= 0)
            act = act[k_ts[j[act]] > s_ts[act]]
            while len(act):                        # step back past ops launched after the call started
                j[act] -= 1
                act = act[j[act] >= lo_rank[act]]
                act = act[k_ts[j[act]] > s_ts[act]]
            j[(j >= 0) & (j < lo_rank)] = -1
            ok = j >= 0
            ok[ok] = k_te[j[ok]] > s_ts[ok]
            if ok.any():
                w = (self.e_thr[sy[ok]], s_ts[ok], k_te[j[ok]], np.full(int(ok.sum()), _GPU_SRC), k_id[j[ok]])
                waits.append(w)
                cuts_thr += [w[0], w[0]]; cuts_t += [w[1], w[2]]
        ct = np.concatenate(cuts_thr).astype(np.int64)
        tt = np.concatenate(cuts_t).astype(np.int64)
        keep = ct >= 0
        self.cut_thr, self.cut_t = ct[keep], tt[keep]
        self.waits = waits

    def _make_cpu_lanes(self):
        self.lane_rows, self.lane_points = [], {}
        cols = {k: [] for k in ("ms", "me", "lane", "rank", "kind", "label", "category")}
        lane_id = 0
        st_rank = self.st["rank"].to_numpy()
        st_s, st_e = self.st["start_ts_ns"].to_numpy(np.int64), self.st["end_ts_ns"].to_numpy(np.int64)
        c_order, c_ptr = _groups(self.cut_thr, self.n_thr)
        enq = self.enq
        e_groups = enq.groupby("thr", sort=False).indices if len(enq) else {}
        e_end, e_cut, e_cid = (enq["end_ts_ns"].to_numpy(np.int64), enq["cut"].to_numpy(np.int64),
                               enq["comm_id"].to_numpy(np.int64))
        step_code, gap_label, gap_cat = self.str_code.get("step", -1), self.code("(gap)"), self.code("gap")
        imin, imax = np.iinfo(np.int64).min, np.iinfo(np.int64).max
        gapwait = []
        ts_all, te_all, dur_all = self.e_ts, self.e_te, self.e_dur
        tops = {}    # (rank, tid) -> top-level work of the thread: starts, ends, names, kinds (codes), thread code
        for thr in np.flatnonzero(self.t_cpu):
            rank, tid = int(self.t_rank[thr]), int(self.t_tid[thr])
            w = self.thr_order[self.thr_ptr[thr]:self.thr_ptr[thr + 1]]
            w = w[(self.e_kind[w] != step_code) & ~self.e_nested[w]]
            if not len(w):
                continue
            w = w[np.lexsort((self.e_id[w], -dur_all[w], ts_all[w]))]   # events.nested sorts the same way
            ts, te = ts_all[w], te_all[w]
            prev_max = np.empty_like(te)
            prev_max[0] = imin
            np.maximum.accumulate(te[:-1], out=prev_max[1:])
            top = np.flatnonzero(ts >= prev_max)
            tops[(rank, tid)] = (ts[top], np.maximum.reduceat(te, top), self.e_name[w[top]], self.e_kind[w[top]], thr)
        cross = _cross_thread_waits(tops)
        cross_pts = {}
        if len(cross):
            c_thr = np.array([tops[(r, t)][4] for r, t in zip(cross["rank"], cross["tid"])], dtype=np.int64)
            gapwait.append((c_thr, cross["lo"].to_numpy(np.int64), cross["hi"].to_numpy(np.int64),
                            np.full(len(cross), _CPU_SRC), cross["src_ref"].to_numpy(np.int64)))
            cross_pts = {k: g["hi"].to_numpy(np.int64) for k, g in cross.groupby(["rank", "tid"])}
        for (rank, tid), (starts, ends, names, kinds, thr) in tops.items():
            pts = [starts, ends]
            if (rank, tid) in cross_pts:
                pts.append(cross_pts[(rank, tid)])
            if self.step_tid.get(rank) == tid:
                m = st_rank == rank
                pts += [st_s[m], st_e[m]]
            # completions of this thread's runloop collectives that end inside one of its gaps
            ei = e_groups.get(thr)
            if ei is not None and len(ei):
                ce, cut, cid = e_end[ei], e_cut[ei], e_cid[ei]
                gi = np.searchsorted(starts, ce, side="right") - 1
                ok = gi >= 0
                gi_ = np.where(ok, gi, 0)
                gap_lo = np.where(ok, ends[gi_], imin)
                gap_hi = np.where(gi + 1 < len(starts), starts[np.minimum(gi + 1, len(starts) - 1)], imax)
                inside = ok & (ce > gap_lo) & (ce < gap_hi) & (gap_hi - ce <= _GAP_WAIT_MAX_TAIL_NS)
                if inside.any():
                    gapwait.append((np.full(int(inside.sum()), thr), gap_lo[inside], ce[inside],
                                    np.full(int(inside.sum()), _POST_SRC), cid[inside]))
                    pts.append(ce[inside])
                # a synchronous collective: the op that enqueued it is still running when it completes
                # and ends right after (gloo's all_to_all_single, a blocking all_reduce): the op waits
                # from the execution's start (the enqueue cut) to the completion
                busy_op = ok & (ce < np.where(ok, ends[gi_], 0)) & (ends[gi_] - ce <= _GAP_WAIT_MAX_TAIL_NS)
                same_op = busy_op & (cut >= starts[gi_]) & (cut < ce)
                if same_op.any():
                    gapwait.append((np.full(int(same_op.sum()), thr), cut[same_op], ce[same_op],
                                    np.full(int(same_op.sum()), _POST_SRC), cid[same_op]))
                    pts.append(ce[same_op])
            pts.append(self.cut_t[c_order[c_ptr[thr]:c_ptr[thr + 1]]])
            p = np.sort(np.concatenate(pts).astype(np.int64), kind="stable")   # runs of sorted points: timsort
            p = p[np.r_[True, p[1:] != p[:-1]]] if len(p) else p
            lo, hi = p[:-1], p[1:]
            j = np.maximum(np.searchsorted(starts, lo, side="right") - 1, 0)
            busy = (np.searchsorted(starts, lo, side="right") >= 1) & (lo < ends[j])
            cols["ms"].append(lo); cols["me"].append(hi)
            cols["lane"].append(np.full(len(lo), lane_id)); cols["rank"].append(np.full(len(lo), rank))
            cols["kind"].append(np.where(busy, OP, GAP))
            cols["label"].append(np.where(busy, names[j], gap_label))
            cols["category"].append(np.where(busy, kinds[j], gap_cat))
            self.lane_points[thr] = (lane_id, p)
            self.lane_rows.append((lane_id, rank, tid, False, "cpu"))
            lane_id += 1
        self.waits += gapwait
        self.cpu_cols = {k: np.concatenate(v) if v else np.zeros(0, np.int64) for k, v in cols.items()}
        self.next_lane = lane_id

    # -- GPU streams and runloop threads ------------------------------------------------------
    def _make_queue_lanes(self):
        cm = self.cm
        lane_id = self.next_lane
        comm_exec = cm[~cm["exec_on_cpu_lane"]]
        ce_on_gpu = comm_exec["on_gpu"].to_numpy(bool)
        # GPU ops that are collectives become ARRIVE/POST below, not kernels
        gpu_ev = np.flatnonzero(self.e_gpu)
        ek, ck = _pair_keys(self.e_rank[gpu_ev], self.e_id[gpu_ev], comm_exec.loc[ce_on_gpu, "rank"].to_numpy(),
                            comm_exec.loc[ce_on_gpu, "exec_event_id"].fillna(-1).to_numpy())
        is_comm_kernel = np.zeros(len(self.e_gpu), bool)
        is_comm_kernel[gpu_ev[_member(ek, ck)]] = True
        gpu_lanes = {(int(self.t_rank[t]), int(self.t_tid[t])): t for t in np.flatnonzero(self.t_gpu)}
        lanes = sorted(set(gpu_lanes) | {(r, t) for r, t in self.runloop})
        ce_groups = comm_exec.groupby(["rank", "exec_tid"], sort=False).indices
        c_start, c_c, c_end = (comm_exec["start_ts_ns"].to_numpy(np.int64), comm_exec["c"].to_numpy(np.int64),
                               comm_exec["end_ts_ns"].to_numpy(np.int64))
        c_op = self.codes(comm_exec["op"].to_numpy())
        c_inst, c_cid = comm_exec["inst"].to_numpy(np.int64), comm_exec["comm_id"].to_numpy(np.int64)
        c_eid = comm_exec["exec_event_id"].fillna(-1).to_numpy(np.int64)
        comm_cat = self.code("comm")
        names = ("ms", "me", "kind", "label", "category", "inst", "event_id", "comm_id", "lane", "rank")
        cols = {k: [] for k in names}
        for rank, tid in lanes:
            thr = gpu_lanes.get((rank, tid))
            parts = []
            if thr is not None:
                g = self.thr_order[self.thr_ptr[thr]:self.thr_ptr[thr + 1]]
                g = g[~is_comm_kernel[g]]
                parts.append((self.e_ts[g], self.e_te[g], np.full(len(g), KERNEL), self.e_name[g], self.e_kind[g],
                              np.full(len(g), -1), self.e_id[g], np.full(len(g), -1), np.zeros(len(g), np.int8)))
            ci = ce_groups.get((rank, tid), np.zeros(0, np.int64))
            ci = ci[ce_on_gpu[ci] == (thr is not None)]
            if len(ci):
                k = len(ci)
                parts.append((c_start[ci], c_c[ci], np.full(k, ARRIVE), c_op[ci], np.full(k, comm_cat), c_inst[ci],
                              c_eid[ci], c_cid[ci], np.zeros(k, np.int8)))
                parts.append((c_c[ci], c_end[ci], np.full(k, POST), c_op[ci], np.full(k, comm_cat), c_inst[ci],
                              c_eid[ci], c_cid[ci], np.ones(k, np.int8)))
            if not parts:
                continue
            f = [np.concatenate(c) for c in zip(*parts)]
            o = _lexsort2(f[8], f[0])
            for name, c in zip(names, f[:8]):
                cols[name].append(c[o])
            cols["lane"].append(np.full(len(o), lane_id)); cols["rank"].append(np.full(len(o), rank))
            self.lane_rows.append((lane_id, rank, tid, thr is not None, "gpu" if thr is not None else "runloop"))
            lane_id += 1
        # communication executed on the CPU lane: its POST segment is found by time later; SYNC nodes here
        inst = self.instances
        k = len(inst)
        la = inst["last_arrival"].to_numpy(np.int64)
        for name, c in zip(names, (la, la, np.full(k, SYNC), self.codes(inst["op"].to_numpy()),
                                   np.full(k, self.code("sync")), inst["inst"].to_numpy(np.int64), np.full(k, -1),
                                   np.full(k, -1), np.full(k, -1), np.full(k, -1))):
            cols[name].append(c)
        c0 = self.cpu_cols
        n0 = len(c0["ms"])
        first = {"kind": c0["kind"], "label": c0["label"], "category": c0["category"], "ms": c0["ms"], "me": c0["me"],
                 "lane": c0["lane"], "rank": c0["rank"], "inst": np.full(n0, -1), "event_id": np.full(n0, -1),
                 "comm_id": np.full(n0, -1)}
        narrow = {"kind": np.int8, "label": np.int32, "category": np.int32, "lane": np.int32, "rank": np.int32}
        nd = {k: np.concatenate([first[k]] + cols[k], dtype=narrow.get(k, np.int64)) for k in names}
        nd["me"] = np.maximum(nd["me"], nd["ms"])
        self.nd = nd

    # -- edges ---------------------------------------------------------------------------------
    def _by_point(self, thr, t, ending: bool) -> np.ndarray:
        """Node on the CPU lane of each thread code ending at t (ending=True) or starting at t; -1 when none."""
        thr = np.asarray(thr, np.int64)
        t = np.asarray(t).astype(np.int64)
        out = np.full(len(thr), -1, dtype=np.int64)
        if not len(thr):
            return out
        o = np.argsort(thr, kind="stable")
        u, first = np.unique(thr[o], return_index=True)
        bounds = np.append(first, len(o))
        for i, code in enumerate(u):
            lp = self.lane_points.get(int(code))
            if lp is None:
                continue
            idx = o[bounds[i]:bounds[i + 1]]
            lane_id, p = lp
            base = self.lane_base[lane_id]
            tq = t[idx]
            k = np.searchsorted(p, tq)
            found = (k < len(p)) & (p[np.minimum(k, len(p) - 1)] == tq)
            j = k - 1 if ending else k
            ok = found & (j >= 0) & (j < len(p) - 1)
            out[idx] = np.where(ok, base + j, -1)
        return out

    def _make_edges(self):
        nd = self.nd
        n = len(nd["ms"])
        lanes, kind0, rank, eid = nd["lane"], nd["kind"], nd["rank"], nd["event_id"]
        # nodes are laid out lane after lane: each lane's first node
        ul, first = np.unique(lanes, return_index=True)
        self.lane_base = dict(zip(ul[ul >= 0].tolist(), first[ul >= 0].tolist()))
        src, dst = [], []
        # lane order
        same = (lanes[1:] == lanes[:-1]) & (lanes[1:] >= 0)
        lane_prev = np.full(n, -1)
        lane_prev[1:][same] = np.flatnonzero(same)
        i = np.flatnonzero(lane_prev >= 0)
        lane_src, lane_dst = lane_prev[i], i
        # launch -> GPU op (kernels and ARRIVE of comm kernels); a GPU op's last node (a collective
        # kernel is ARRIVE then POST) is what a wait on it waits for
        gm = np.flatnonzero(_among(kind0, [KERNEL, ARRIVE, POST]) & (eid >= 0))   # GPU ops' nodes
        fm = _among(kind0[gm], [KERNEL, ARRIVE])
        lg_rank, lg_eid = self.e_rank[self.L_gpu], self.e_id[self.L_gpu]
        nk, qk = _pair_keys(rank[gm], eid[gm], lg_rank, lg_eid)
        by_key = np.argsort(nk, kind="stable")
        first_node = _lookup(nk, gm, qk, "first", order=by_key[fm[by_key]])   # among the first nodes only
        ok = first_node >= 0
        L_ev, L_node = self.L_ev[ok], first_node[ok]
        L_last = _lookup(nk, gm, qk[ok], "last", order=by_key)
        s = self._by_point(self.e_thr[L_ev], self.e_te[L_ev], ending=True)
        m = s >= 0
        src.append(s[m]); dst.append(L_node[m])
        # cudaStreamWaitEvent: next op launched by the thread waits for the last one launched on another stream
        self._stream_wait_edges(L_ev, L_node, L_last, lanes, src, dst)
        # GPU ops launched by a collective's own thread (gloo with CUDA tensors stages them through
        # host memory: a device-to-host copy before the transfer, host-to-device after it)
        self._runloop_launch_edges(gm, fm, src, dst)
        # runloop enqueue -> ARRIVE
        arr = np.flatnonzero(kind0 == ARRIVE)
        e = self.enq
        if len(e) and len(arr):
            ak, ek = _pair_keys(rank[arr], nd["comm_id"][arr], e["rank"].to_numpy(), e["comm_id"].to_numpy())
            o = np.argsort(ak, kind="stable")
            lo_, hi_ = np.searchsorted(ak[o], ek, "left"), np.searchsorted(ak[o], ek, "right")
            cnt = hi_ - lo_
            ei = np.repeat(np.arange(len(e)), cnt)
            ai = arr[o[np.repeat(lo_ - np.cumsum(cnt) + cnt, cnt) + np.arange(cnt.sum())]]
            s = self._by_point(e["thr"].to_numpy()[ei], e["cut"].to_numpy(np.int64)[ei], ending=True)
            m = s >= 0
            src.append(s[m]); dst.append(ai[m])
        # ARRIVE -> SYNC -> POST (queue lanes)
        n_inst = len(self.instances)
        sync_node = np.full(n_inst + 1, -1, dtype=np.int64)
        sy = np.flatnonzero(kind0 == SYNC)
        sync_node[nd["inst"][sy]] = sy
        src.append(arr); dst.append(sync_node[nd["inst"][arr]])
        post = np.flatnonzero(kind0 == POST)
        src.append(sync_node[nd["inst"][post]]); dst.append(post)
        # communication on the CPU lane: the node ending at the arrival feeds SYNC; the one at c waits for it
        x = self.cpu_exec
        x_thr, x_inst = x["thr"].to_numpy(), x["inst"].to_numpy(np.int64)
        s = self._by_point(x_thr, x["start_ts_ns"].to_numpy(np.int64), ending=True)
        m = s >= 0
        src.append(s[m]); dst.append(sync_node[x_inst[m]])
        # waits: segments in [lo, hi) get duration 0; the segment starting at hi depends on the source
        kind = kind0.copy()
        if self.waits:
            w_thr, w_lo, w_hi, w_kind, w_ref = (np.concatenate(c).astype(np.int64) for c in zip(*self.waits))
            tgt = self._by_point(w_thr, w_hi, ending=False)
            first = self._by_point(w_thr, w_lo, ending=False)
            wsrc = np.full(len(w_thr), -1, dtype=np.int64)
            m = w_kind == _SYNC_SRC
            ref = w_ref[m]
            wsrc[m] = np.where((ref >= 0) & (ref < n_inst), sync_node[np.clip(ref, 0, n_inst)], -1)
            w_rank = np.where(w_thr >= 0, self.t_rank[np.maximum(w_thr, 0)], -1) if self.n_thr else w_thr
            m = w_kind == _POST_SRC
            if m.any():
                pk, qk2 = _pair_keys(rank[post], nd["comm_id"][post], w_rank[m], w_ref[m])
                wsrc[m] = _lookup(pk, post, qk2, "last")
            m = w_kind == _CPU_SRC
            if m.any():   # the other thread's node that ends at hi
                wsrc[m] = self._by_point(self.thr_codes(w_rank[m], w_ref[m]), w_hi[m], ending=True)
            m = w_kind == _GPU_SRC
            if m.any():
                nk2, qk2 = _pair_keys(rank[gm], eid[gm], w_rank[m], w_ref[m])
                wsrc[m] = _lookup(nk2, gm, qk2, "last")
            ok = (tgt >= 0) & (first >= 0) & (wsrc >= 0)
            f, t = first[ok], tgt[ok]
            r = f < t
            cover = np.zeros(n + 1, dtype=np.int64)   # [f, t) of every wait: contiguous on the lane
            np.add.at(cover, f[r], 1)
            np.add.at(cover, t[r], -1)
            kind[np.cumsum(cover[:-1]) > 0] = WAIT
            src.append(wsrc[ok]); dst.append(tgt[ok])
        # communication executed on the CPU lane: its part after the last arrival is a POST node
        inst = nd["inst"].copy()
        if len(x):
            lo = self._by_point(x_thr, x["c"].to_numpy(np.int64), ending=False)
            hi = self._by_point(x_thr, x["end_ts_ns"].to_numpy(np.int64), ending=True)
            for a, b, k in zip(lo, hi, x_inst):
                if a >= 0 and b >= a:
                    kind[a:b + 1] = POST
                    inst[a:b + 1] = k
        nd["inst"] = inst
        self.kind = kind
        self.lane_src, self.lane_dst = lane_src, lane_dst
        self.x_src = np.concatenate(src).astype(np.int64)
        self.x_dst = np.concatenate(dst).astype(np.int64)

    def _runloop_launch_edges(self, gm, fm, src, dst):
        """A GPU op launched from a runloop thread inside a collective's execution span depends on
        that collective: on its arrival if launched before the last member arrived (the staging copy
        out), else on its completion (the copy back in). Without the edge the copy keeps its
        recorded distance to the previous op on its stream, whatever the collective does."""
        if not len(self.rl_thr) or not len(gm):
            return
        is_rl = np.zeros(self.n_thr, bool)
        is_rl[self.rl_thr] = True
        rt_kinds = [self.str_code.get(k, -1) for k in ("runtime", "sync")]
        rt = np.flatnonzero(is_rl[self.e_thr] & self.e_has_corr & _among(self.e_kind, rt_kinds))
        if not len(rt):
            return
        gp = np.flatnonzero(self.e_gpu & self.e_has_corr)
        li, gi = _launch_join(rt, gp, self.e_rank, self.e_corr)
        rt, gp = rt[li], gp[gi]
        nk, qk = _pair_keys(self.nd["rank"][gm], self.nd["event_id"][gm], self.e_rank[gp], self.e_id[gp])
        node = _lookup(nk[fm], gm[fm], qk, "first")
        ok = node >= 0
        rt, node = rt[ok], node[ok]
        if not len(rt):
            return
        # the collective whose execution (on this runloop thread) started last before the launch
        e = self.enq
        x_thr, x_start, x_end = e["xthr"].to_numpy(), e["start_ts_ns"].to_numpy(np.int64), e["end_ts_ns"].to_numpy(np.int64)
        x_c, x_cid = e["c"].to_numpy(np.int64), e["comm_id"].to_numpy(np.int64)
        l_thr, l_ts = self.e_thr[rt], self.e_ts[rt]
        hit = np.full(len(rt), -1, dtype=np.int64)
        for thr in np.unique(l_thr):
            rows = np.flatnonzero(x_thr == thr)
            if not len(rows):
                continue
            rows = rows[np.argsort(x_start[rows], kind="stable")]
            m = l_thr == thr
            k = np.searchsorted(x_start[rows], l_ts[m], side="right") - 1
            hit[np.flatnonzero(m)] = np.where(k >= 0, rows[np.maximum(k, 0)], -1)
        ok = hit >= 0
        ok[ok] = l_ts[ok] <= x_end[hit[ok]]
        if not ok.any():
            return
        h, node, ts = hit[ok], node[ok], l_ts[ok]
        is_post = ts >= x_c[h]
        nd = self.nd
        cn = np.flatnonzero(_among(nd["kind"], [ARRIVE, POST]) & (nd["comm_id"] >= 0))
        ck, qk = _pair_keys(nd["rank"][cn], nd["comm_id"][cn] * 2 + (nd["kind"][cn] == POST),
                            self.e_rank[rt[ok]], x_cid[h] * 2 + is_post)
        s = _lookup(ck, cn, qk, "first")
        m = s >= 0
        src.append(s[m]); dst.append(node[m])

    def _stream_wait_edges(self, L_ev, L_node, L_last, lanes, src, dst):
        sw_code = self.str_code.get("cudaStreamWaitEvent", -1)
        sw = np.flatnonzero((self.e_name == sw_code) & self.t_cpu[self.e_thr])
        if not len(sw) or not len(L_ev):
            return
        l_thr = self.e_thr[L_ev]
        lo_, lp = _groups(l_thr, self.n_thr)
        so, sp = _groups(self.e_thr[sw], self.n_thr)
        for thr in np.unique(self.e_thr[sw]):
            li = lo_[lp[thr]:lp[thr + 1]]
            if not len(li):
                continue
            li = li[np.argsort(self.e_ts[L_ev[li]], kind="stable")]
            lts, lnode, llast = self.e_ts[L_ev[li]], L_node[li], L_last[li]
            ll = lanes[lnode]
            # the walk back over launches onto the same stream ends before the run of equal lanes
            run_start = np.maximum.accumulate(np.where(np.r_[True, ll[1:] != ll[:-1]], np.arange(len(ll)), 0))
            k = np.searchsorted(lts, self.e_ts[sw[so[sp[thr]:sp[thr + 1]]]])
            k = k[k < len(lts)]
            j = run_start[k] - 1
            m = j >= 0
            src.append(llast[j[m]]); dst.append(lnode[k[m]])

    # -- fitting lags, order, steps ------------------------------------------------------------
    def _finish(self) -> Graph:
        nd = self.nd
        n = len(nd["ms"])
        kind = self.kind
        ms, me = nd["ms"], nd["me"]
        dur = me - ms
        dur[_among(kind, [WAIT, ARRIVE, SYNC])] = 0
        e_model = ms + dur
        # edges: drop self loops and duplicates (a cross edge that repeats its node's lane edge too);
        # CSR by destination: the lane edge first, then the cross edges by source
        xs, xd = self.x_src, self.x_dst
        keep = xs != xd
        xs, xd = xs[keep], xd[keep]
        o = np.argsort(xd * np.int64(n) + xs, kind="stable")
        xs, xd = xs[o], xd[o]
        keep = np.r_[True, (xs[1:] != xs[:-1]) | (xd[1:] != xd[:-1])] if len(xs) else np.zeros(0, bool)
        lane_prev = np.full(n, -1, dtype=np.int64)
        lane_prev[self.lane_dst] = self.lane_src
        keep &= lane_prev[xd] != xs
        xs, xd = xs[keep], xd[keep]
        has_lane = lane_prev >= 0
        cnt = np.bincount(xd, minlength=n) + has_lane
        ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(cnt, out=ptr[1:])
        E = len(xs) + int(has_lane.sum())
        src = np.empty(E, dtype=np.int64)
        is_lane = np.zeros(E, dtype=bool)
        lane_pos = ptr[:-1][has_lane]
        src[lane_pos] = lane_prev[has_lane]
        is_lane[lane_pos] = True
        xfirst = np.searchsorted(xd, xd, side="left")   # rank of each cross edge among its node's
        src[ptr[xd] + has_lane[xd] + (np.arange(len(xd)) - xfirst)] = xs
        # fit lags so the recorded start is reproduced (see module docstring)
        E_ = e_model[src]
        del e_model
        # slack = recorded start - latest predecessor end: a latency after whatever binds (>= 0, on
        # every edge, so it follows the binding constraint in a what-if), or, when a predecessor
        # recorded ends after the node started (a kernel starting inside its cudaLaunchKernel), the
        # overlap only on the edges that overran it (arrays per edge made in place: fewer fresh pages)
        has_in = cnt > 0
        max_e = np.full(n, np.iinfo(np.int64).min)
        if E:
            max_e[has_in] = np.maximum.reduceat(E_, ptr[:-1][has_in])
        lag = np.repeat(ms, cnt)                    # each edge's destination's recorded start ...
        lag -= np.repeat(max_e, cnt)                # ... less its latest predecessor end: the slack
        over = np.flatnonzero(lag < 0)
        if len(over):
            lag[over] = np.minimum(np.repeat(ms, cnt)[over] - E_[over], 0)
        del E_, max_e
        # nodes with no incoming edge start at their recorded time
        rel = np.where(has_in, NO_REL, ms)
        order = _topo_order(ms, kind, src, None, n, is_lane, ptr)
        label_codes, lu = _first_codes(nd["label"], len(self.strs))
        labels = [self.strs[c] for c in lu]
        cat = np.where(kind == WAIT, self.code("wait"), nd["category"])
        cat_codes, cu = _first_codes(cat, len(self.strs))
        categories = [self.strs[c] for c in cu]
        lanes = pd.DataFrame(self.lane_rows, columns=["lane", "rank", "tid", "is_gpu", "type"])
        steps = self._steps()
        steps = self._gpu_tails(steps, me, kind, nd["lane"], nd["rank"], ms,
                                lanes.loc[lanes["type"] == "gpu", "lane"].to_numpy())
        return Graph(run=self.run, ms=ms, me=me, dur=dur, lane=nd["lane"].astype(np.int32),
                     rank=nd["rank"].astype(np.int32), kind=kind.astype(np.int8), label=label_codes.astype(np.int32),
                     category=cat_codes.astype(np.int32), inst=nd["inst"], rel=rel, ptr=ptr, src=src, lag=lag,
                     is_lane_edge=is_lane, order=order, labels=labels, categories=categories, lanes=lanes, steps=steps,
                     instances=self.instances[["inst", "key", "op", "bytes", "is_p2p", "n_ranks", "transfer_ns"]])

    def _steps(self):
        st = self.st
        main = {r: self.thr_of.get((int(r), int(t), False)) for r, t in self.step_tid.items()}
        s_rank = st["rank"].to_numpy()
        s_start, s_end = st["start_ts_ns"].to_numpy(np.int64), st["end_ts_ns"].to_numpy(np.int64)
        n = len(st)
        keep = np.zeros(n, bool)
        start_node, end_node = np.zeros(n, np.int64), np.zeros(n, np.int64)
        start_uses_end, end_uses_end = np.zeros(n, bool), np.zeros(n, bool)
        for r in np.unique(s_rank):              # the steps of one rank: on its main thread's lane
            lp = self.lane_points.get(main.get(r))
            if lp is None:
                continue
            m = np.flatnonzero(s_rank == r)
            lane_id, p = lp
            base, last = self.lane_base[lane_id], len(p) - 1
            ks, ke = np.searchsorted(p, s_start[m]), np.searchsorted(p, s_end[m])
            keep[m] = True
            start_uses_end[m] = ks >= last
            start_node[m] = base + np.where(ks < last, ks, ks - 1)
            end_uses_end[m] = ke >= last
            end_node[m] = base + np.where(ke >= last, ke - 1, ke)
        k = np.flatnonzero(keep)
        return pd.DataFrame({"rank": s_rank[k].astype(np.int64), "step": st["step"].to_numpy()[k].astype(np.int64),
                             "measured_ns": st["dur_ns"].to_numpy()[k].astype(np.int64),
                             "start_node": start_node[k], "start_uses_end": start_uses_end[k],
                             "end_node": end_node[k], "end_uses_end": end_uses_end[k]})

    def _gpu_tails(self, steps, me, kind, lane, rank, ms, gpu_lanes):
        """GPU work of each step: the GPU nodes (kernels, GPU collectives) that start between the
        step's recorded CPU start and the next step's. Why: the CPU leaves a step as soon as it
        has launched the work, so a step's time is from its CPU start to the later of its CPU end
        and the end of that GPU work (``gpu_nodes``; the measured time likewise), else a what-if
        that slows the GPU down changes nothing in a trace of one step."""
        is_gpu_lane = np.zeros(max(int(lane.max()) + 2, 1) if len(lane) else 1, dtype=bool)   # lane -1 at 0
        is_gpu_lane[np.asarray(gpu_lanes, np.int64) + 1] = True
        on_gpu = is_gpu_lane[lane + 1] & _among(kind, [KERNEL, POST])
        empty = np.zeros(0, np.int64)
        gpu_nodes = [empty] * len(steps)
        measured = steps["measured_ns"].to_numpy().astype(np.int64)
        if on_gpu.any() and not steps.empty:
            cpu = self.st.set_index(["rank", "step"])["start_ts_ns"]
            start = cpu.reindex(pd.MultiIndex.from_arrays([steps["rank"], steps["step"]])).to_numpy(np.int64)
            g_idx = np.flatnonzero(on_gpu)
            g_rank = rank[g_idx].astype(np.int64)     # searchsorted below: one dtype, no conversions per call
            by_rank = np.argsort(g_rank, kind="stable")          # GPU nodes grouped by rank, in node order
            g_sorted = g_rank[by_rank]
            s_rank = steps["rank"].to_numpy().astype(np.int64)
            for r in np.unique(s_rank):
                rows = np.flatnonzero(s_rank == r)
                idx = g_idx[by_rank[np.searchsorted(g_sorted, r, "left"):np.searchsorted(g_sorted, r, "right")]]
                if not len(idx):
                    continue
                order = np.argsort(start[rows])
                starts = start[rows][order]
                k = np.searchsorted(starts, ms[idx], side="right") - 1
                o = np.argsort(k, kind="stable")
                bounds = np.searchsorted(k[o], np.arange(len(rows) + 1))
                nodes = idx[o]
                pieces = np.split(nodes, bounds)          # pieces[pos + 1]: the GPU nodes of step pos
                for pos, row in enumerate(rows[order]):
                    gpu_nodes[row] = pieces[pos + 1]
                full = np.flatnonzero(bounds[1:] > bounds[:-1])
                if len(full):
                    tail = np.maximum.reduceat(me[nodes], bounds[full]) - starts[full]
                    r_full = rows[order][full]
                    measured[r_full] = np.maximum(measured[r_full], tail)
        steps["gpu_nodes"] = gpu_nodes
        steps["measured_ns"] = measured
        return steps


def _cross_thread_waits(tops: dict) -> pd.DataFrame:
    """Waits between the CPU threads of one rank: a gap on one thread that ends at most
    _GAP_WAIT_MAX_TAIL_NS after another thread of the rank finished something inside that gap is a
    wait for it. The two cases this is for (GPU jobs): the main thread calls backward and blocks
    while autograd's device thread (pt_autograd_N) runs the backward pass -- its gap ends when the
    last backward op ends; and that device thread sits idle through the forward pass until the main
    thread hands it the loss -- its gap ends right after the main thread's last forward op. Without
    these edges both gaps are fixed CPU time, and a faster forward/backward moves nothing.
    Gaps shorter than _CROSS_THREAD_MIN_GAP_NS are left alone; per gap the latest such end counts.
    Returns rows (rank, tid, lo, hi, src_kind="cpu", src_ref=source tid) like the other waits."""
    rows = []
    by_rank: dict = {}
    for (rank, tid), v in tops.items():
        by_rank.setdefault(rank, []).append((tid, v))
    for rank, lanes in by_rank.items():
        if len(lanes) < 2:
            continue
        for tid, (starts, ends, *_) in lanes:
            if len(starts) < 2:
                continue
            gap_lo, gap_hi = ends[:-1], starts[1:]
            keep = gap_hi - gap_lo >= _CROSS_THREAD_MIN_GAP_NS
            if not keep.any():
                continue
            gap_lo, gap_hi = gap_lo[keep], gap_hi[keep]
            best = np.full(len(gap_lo), np.iinfo(np.int64).min)
            best_tid = np.zeros(len(gap_lo), dtype=np.int64)
            for other, (_, o_ends, *_) in lanes:
                if other == tid or not len(o_ends):
                    continue
                k = np.searchsorted(o_ends, gap_hi, side="right") - 1   # o_ends is sorted (top level)
                e = np.where(k >= 0, o_ends[np.maximum(k, 0)], np.iinfo(np.int64).min)
                ok = (e > gap_lo) & (gap_hi - e <= _GAP_WAIT_MAX_TAIL_NS) & (e > best)
                best = np.where(ok, e, best)
                best_tid = np.where(ok, other, best_tid)
            m = best > np.iinfo(np.int64).min
            if m.any():
                rows.append(pd.DataFrame({"rank": rank, "tid": tid, "lo": gap_lo[m], "hi": best[m],
                                          "src_kind": "cpu", "src_ref": best_tid[m]}))
    if not rows:
        return pd.DataFrame(columns=["rank", "tid", "lo", "hi", "src_kind", "src_ref"])
    return pd.concat(rows, ignore_index=True)


def _first_codes(x, k):
    """Like pd.factorize for codes in [0, k): (new codes numbered by first appearance, the old code
    of each), with one unbuffered minimum per code instead of hashing or sorting."""
    if not len(x):
        return np.zeros(0, np.int32), np.zeros(0, np.int64)
    first = np.full(k, len(x), dtype=np.int64)
    np.minimum.at(first, x, np.arange(len(x)))    # first position of every code (len(x): absent)
    uniq = np.flatnonzero(first < len(x))
    first = first[uniq]
    by_first = np.argsort(first, kind="stable")
    remap = np.empty(k, dtype=np.int32)
    remap[uniq[by_first]] = np.arange(len(uniq), dtype=np.int32)
    return remap[x], uniq[by_first]


def _topo_order(ms, kind, src, dst, n, is_lane=None, ptr=None) -> np.ndarray:
    """A topological order: by recorded start (ties: arrivals, then SYNC, then the rest).

    Why a repair pass: a few edges run backwards in recorded time (a kernel that starts inside its
    own cudaLaunchKernel, clock noise between ranks), so the recorded order alone is not always
    topological. Each node gets a key (rank in recorded order); while some edge has key[src] >=
    key[dst], the destination's key is raised just above its source's (vectorised, one hop per
    pass; violations are local, so few passes). Kahn's algorithm is the fallback."""
    prio = np.select([kind == ARRIVE, kind == WAIT, kind == SYNC], [0, 1, 2], 3).astype(np.int8)
    span = int(ms.max()) - int(ms.min()) if n else 0
    if span < 2 ** 60:                      # one stable sort of (ms, prio); ties keep the node order
        order = np.argsort((ms - ms.min()) * 4 + prio, kind="stable")
    else:
        order = np.lexsort((prio, ms))
    if len(src) == 0:
        return order
    key = np.empty(n, dtype=np.float64)
    key[order] = np.arange(n, dtype=np.float64)
    repair = repair_kernel() if ptr is not None else None
    if repair is not None:          # the same keys by one compiled sweep per pass (_jit._repair_keys)
        passes = repair(key, order, ptr, src, 200)
        if passes >= 0:
            return order if passes == 0 else np.argsort(key, kind="stable")
        key[order] = np.arange(n, dtype=np.float64)   # a cycle: start again, the passes below end in Kahn
    if dst is None:                         # each edge's destination, from the CSR
        dst = np.repeat(np.arange(n), np.diff(ptr))
    cand = None            # edges that can be violated: all, then the out-edges of nodes just raised
    for it in range(200):
        s, d = (src, dst) if cand is None else (src[cand], dst[cand])
        bad = key[s] >= key[d]
        if not bad.any():
            return order if it == 0 else np.argsort(key, kind="stable")
        # just above the source: between it and the next key, so the rest of the order is kept
        raised = d[bad]
        np.maximum.at(key, raised, key[s[bad]] + 0.5 ** 8)
        if cand is None:
            # out-edges: a node's lane successor (at most one) apart, the cross edges by source
            lane = np.asarray(is_lane, bool) if is_lane is not None else np.zeros(len(src), bool)
            lane_e = np.flatnonzero(lane)
            if len(lane_e) and np.bincount(src[lane_e], minlength=n).max() > 1:
                lane, lane_e = np.zeros(len(src), bool), lane_e[:0]   # not one successor per node
            lane_out = np.full(n, -1, dtype=np.int64)
            lane_out[src[lane_e]] = lane_e
            cross = np.flatnonzero(~lane)
            by_src = cross[np.argsort(src[cross], kind="stable")]
            out_ptr = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(np.bincount(src[cross], minlength=n), out=out_ptr[1:])
        # keys only grow, so only an edge whose source was raised can be violated in the next pass
        raised = np.unique(raised)
        cnt = out_ptr[raised + 1] - out_ptr[raised]
        nxt = lane_out[raised]
        cand = np.concatenate([by_src[np.repeat(out_ptr[raised] - np.cumsum(cnt) + cnt, cnt) + np.arange(cnt.sum())],
                               nxt[nxt >= 0]])
    return _kahn(key, src, dst, n)


def _kahn(key, src, dst, n) -> np.ndarray:
    import heapq
    indeg = np.bincount(dst, minlength=n)
    o = np.argsort(src, kind="stable")
    out_ptr = np.searchsorted(src[o], np.arange(n + 1)).tolist()
    out_dst = dst[o].tolist()
    keyl = key.tolist()
    deg = indeg.tolist()
    heap = [(keyl[i], i) for i in np.flatnonzero(indeg == 0).tolist()]
    heapq.heapify(heap)
    out = []
    while heap:
        _, i = heapq.heappop(heap)
        out.append(i)
        for j in out_dst[out_ptr[i]:out_ptr[i + 1]]:
            deg[j] -= 1
            if deg[j] == 0:
                heapq.heappush(heap, (keyl[j], j))
    if len(out) != n:
        raise TraceAnalyzerError(f"replay: the dependency graph has a cycle ({n - len(out)} nodes unreachable)")
    return np.asarray(out, dtype=np.int64)
