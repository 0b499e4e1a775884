"""Reference copy of the replay graph builder as it was before the numpy rewrite (main at d49234d,
traceanalyzer/replay/graph.py), kept ONLY so tests/test_replay_build_equiv.py can check that the
product builder still builds the same graph. Not used by the product; do not extend.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

# the graph's data definitions (node kinds, thresholds, the Graph record, run resolution) and the
# helpers that did not change (cross-thread waits, the Kahn fallback) are the product's own: this
# copy keeps only the old building algorithm
from traceanalyzer.replay.graph import (
    _BLOCKING_SYNC,
    _GAP_WAIT_MAX_TAIL_NS,
    ARRIVE,
    GAP,
    KERNEL,
    NO_REL,
    OP,
    POST,
    SYNC,
    WAIT,
    Graph,
    _cross_thread_waits,
    _kahn,
    resolve_run,
)


def build_graph(store_or_con, run: str | None = None) -> Graph:
    """Build the replay graph of one run from a store (all ranks)."""
    from traceanalyzer.analyses import connect, prepare
    con = connect(store_or_con)
    # the analyses' views (clock offsets, pipeline stages) are needed; binding them costs seconds on
    # a big store, so a connection that already has them (prepared by the caller) is used as it is
    have = {v for (v,) in con.execute("SELECT view_name FROM duckdb_views() WHERE temporary").fetchall()}
    if not {"clock_offsets", "pipeline_stages"} <= have:
        prepare(con)
    run = resolve_run(con, run, "replay")
    g = _Builder(con, run).build()
    g.source = con
    try:
        g.stages = con.execute("SELECT rank, stage FROM pipeline_stages WHERE run = $run ORDER BY stage, rank",
                               {"run": run}).df()
    except Exception:  # noqa: BLE001 - no pipeline views: not a pipeline
        g.stages = None
    return g


class _Builder:
    def __init__(self, con, run):
        self.con, self.run = con, run
        self.nodes: list[pd.DataFrame] = []
        self.edges: list[tuple] = []   # (src_node array, dst_node array)

    def q(self, sql):
        return self.con.execute(sql, {"run": self.run}).df()

    # -- loading ------------------------------------------------------------------------------
    def load(self):
        off = self.q("SELECT rank, offset_ns FROM clock_offsets WHERE run = $run")
        self.offset = dict(zip(off["rank"], off["offset_ns"]))
        ev = self.q("""SELECT rank, event_id, kind, name, ts_ns, dur_ns, tid, is_gpu, correlation
                       FROM events WHERE run = $run AND ph = 'X' AND kind NOT IN ('instant', 'gpu_annotation')
                         AND NOT (kind = 'other' AND name LIKE 'PyTorch Profiler%')""")
        # names and kinds repeat a lot: categories make every later filter and copy cheap
        ev["name"] = ev["name"].astype("category")
        ev["kind"] = ev["kind"].astype("category")
        ev["o"] = ev["rank"].map(self.offset).fillna(0).astype("int64")
        ev["ts"] = ev["ts_ns"] + ev["o"]
        ev["te"] = ev["ts"] + ev["dur_ns"]
        self.ev = ev
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
        self.step_tid = self.q("""SELECT rank, any_value(tid) AS tid FROM events
                                  WHERE run = $run AND kind = 'step' GROUP BY rank""").set_index("rank")["tid"].to_dict()

    def build(self) -> Graph:
        import time
        t0 = time.perf_counter()
        self.load()
        t1 = time.perf_counter()
        self._plan_comm()
        self._cpu_cut_points()
        self._make_cpu_lanes()
        self._make_queue_lanes()
        self._make_edges()
        g = self._finish()
        g.stats.update(load_s=t1 - t0, build_s=time.perf_counter() - t1)
        return g

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
        cm["exec_on_cpu_lane"] = ~cm["on_gpu"].fillna(False) & (cm["exec_tid"] == cm["enqueue_tid"])

    # -- CPU lanes -----------------------------------------------------------------------------
    def _cpu_cut_points(self):
        ev, cm = self.ev, self.cm
        queue_tids = cm.loc[~cm["exec_on_cpu_lane"] & ~cm["on_gpu"].fillna(False), ["rank", "exec_tid"]]
        self.runloop = set(map(tuple, queue_tids.drop_duplicates().to_numpy()))
        cpu = ev[~ev["is_gpu"]]
        rl = pd.MultiIndex.from_tuples(sorted(self.runloop), names=["rank", "tid"]) if self.runloop else None
        is_rl = (pd.MultiIndex.from_arrays([cpu["rank"], cpu["tid"]]).isin(rl) if rl is not None
                 else np.zeros(len(cpu), bool))
        self.cpu = cpu[~is_rl]
        cuts = []   # (rank, tid, t)
        waits = []  # (rank, tid, lo, hi, src_kind, src_ref)  -> segments in [lo, hi) become WAIT; segment at hi gets edge
        # launches: runtime events whose correlation matches a GPU op
        gpu = ev[ev["is_gpu"] & ev["correlation"].notna()]
        rt = self.cpu[self.cpu["kind"].isin(["runtime", "sync"]) & self.cpu["correlation"].notna()]
        launch = rt.merge(gpu[["rank", "correlation", "event_id"]], on=["rank", "correlation"], suffixes=("", "_gpu"))
        self.launch = launch  # rank, tid, te (cut), event_id_gpu
        cuts.append(launch[["rank", "tid", "te"]].rename(columns={"te": "t"}))
        # gloo/collective enqueue -> execution on a runloop thread: cut where the span starts (clipped to the op)
        q = cm[~cm["exec_on_cpu_lane"] & ~cm["on_gpu"].fillna(False)].copy()
        q["cut"] = np.clip(q["start_ts_ns"], q["enqueue_ts_ns"], q["enqueue_ts_ns"] + q["enqueue_dur_ns"].fillna(0))
        self.enq = q
        cuts.append(q[["rank", "enqueue_tid", "cut"]].rename(columns={"enqueue_tid": "tid", "cut": "t"}))
        # execution on the CPU lane itself (gloo send/recv): arrival, last arrival
        x = cm[cm["exec_on_cpu_lane"]]
        self.cpu_exec = x
        cuts.append(x[["rank", "exec_tid", "start_ts_ns"]].rename(columns={"exec_tid": "tid", "start_ts_ns": "t"}))
        cuts.append(x[["rank", "exec_tid", "c"]].rename(columns={"exec_tid": "tid", "c": "t"}))
        waits.append(pd.DataFrame({"rank": x["rank"], "tid": x["exec_tid"], "lo": x["start_ts_ns"], "hi": x["c"],
                                   "src_kind": "sync", "src_ref": x["inst"]}))
        # blocking sync calls: wait for the latest GPU op (launched before the call) that ended inside it
        sy = self.cpu[(self.cpu["kind"] == "sync") & self.cpu["name"].str.contains("|".join(_BLOCKING_SYNC))]
        if len(sy) and len(launch):
            lg = launch.merge(ev[["rank", "event_id", "te"]], left_on=["rank", "event_id_gpu"], right_on=["rank", "event_id"],
                              suffixes=("", "_k"))[["rank", "ts", "event_id_gpu", "te_k"]]
            rows = []
            for rank, s in sy.groupby("rank"):
                k = lg[lg["rank"] == rank].sort_values("te_k")
                if k.empty:
                    continue
                ke, kl = k["te_k"].to_numpy(), k["ts"].to_numpy()
                kid = k["event_id_gpu"].to_numpy()
                for ts, te, tid in zip(s["ts"], s["te"], s["tid"]):
                    j = np.searchsorted(ke, te, side="right") - 1
                    while j >= 0 and kl[j] > ts:
                        j -= 1
                    if j >= 0 and ke[j] > ts:
                        rows.append((rank, tid, ts, ke[j], "gpu", kid[j]))
            if rows:
                w = pd.DataFrame(rows, columns=["rank", "tid", "lo", "hi", "src_kind", "src_ref"])
                waits.append(w)
                cuts.append(w[["rank", "tid", "lo"]].rename(columns={"lo": "t"}))
                cuts.append(w[["rank", "tid", "hi"]].rename(columns={"hi": "t"}))
        self.cuts = pd.concat(cuts, ignore_index=True)
        self.waits = pd.concat(waits, ignore_index=True)

    def _make_cpu_lanes(self):
        cpu = self.cpu
        self.lane_rows, self.lane_points = [], {}
        node_frames = []
        lane_id = 0
        st = self.st
        cuts_by = {k: g["t"].to_numpy() for k, g in self.cuts.groupby(["rank", "tid"])}
        # gloo collectives completing on a runloop: the issuing thread waits in the gap that the completion ends
        gapwait = []
        tops = {}
        for (rank, tid), g in cpu.groupby(["rank", "tid"], sort=True):
            work = g[g["kind"] != "step"].sort_values(["ts", "dur_ns"], ascending=[True, False])
            if work.empty:
                continue
            ts, te = work["ts"].to_numpy(), work["te"].to_numpy()
            prev_max = np.concatenate([[np.iinfo(np.int64).min], np.maximum.accumulate(te)[:-1]])
            top = ts >= prev_max
            tops[(rank, tid)] = (ts[top], np.maximum.reduceat(te, np.flatnonzero(top)),
                                 work["name"].to_numpy()[top], work["kind"].to_numpy()[top])
        cross = _cross_thread_waits(tops)
        if len(cross):
            gapwait.append(cross)
        cross_pts = {k: g["hi"].to_numpy() for k, g in cross.groupby(["rank", "tid"])} if len(cross) else {}
        for (rank, tid), (starts, ends, names, kinds) in tops.items():
            pts = [starts, ends]
            if (rank, tid) in cross_pts:
                pts.append(cross_pts[(rank, tid)])
            s = st[(st["rank"] == rank)]
            if self.step_tid.get(rank) == tid:
                pts += [s["start_ts_ns"].to_numpy(), s["end_ts_ns"].to_numpy()]
            extra = cuts_by.get((rank, tid))
            # completions of this thread's runloop collectives that end inside one of its gaps
            e = self.enq[(self.enq["rank"] == rank) & (self.enq["enqueue_tid"] == tid)]
            if len(e):
                ce = e["end_ts_ns"].to_numpy()
                gi = np.searchsorted(starts, ce, side="right") - 1
                ok = gi >= 0
                gi_ = np.where(ok, gi, 0)
                gap_lo = np.where(ok, ends[gi_], np.iinfo(np.int64).min)
                gap_hi = np.where(gi + 1 < len(starts), starts[np.minimum(gi + 1, len(starts) - 1)], np.iinfo(np.int64).max)
                inside = ok & (ce > gap_lo) & (ce < gap_hi) & (gap_hi - ce <= _GAP_WAIT_MAX_TAIL_NS)
                if inside.any():
                    gw = pd.DataFrame({"rank": rank, "tid": tid, "lo": gap_lo[inside], "hi": ce[inside],
                                       "src_kind": "post", "src_ref": e["comm_id"].to_numpy()[inside]})
                    gapwait.append(gw)
                    pts.append(ce[inside])
                # a synchronous collective: the op that enqueued it is still running when it completes
                # and ends right after (gloo's all_to_all_single, a blocking all_reduce): the op waits
                # from the execution's start (the enqueue cut) to the completion
                cut = e["cut"].to_numpy()
                busy_op = ok & (ce < np.where(ok, ends[gi_], 0)) & (ends[gi_] - ce <= _GAP_WAIT_MAX_TAIL_NS)
                same_op = busy_op & (cut >= starts[gi_]) & (cut < ce)
                if same_op.any():
                    gw = pd.DataFrame({"rank": rank, "tid": tid, "lo": cut[same_op], "hi": ce[same_op],
                                       "src_kind": "post", "src_ref": e["comm_id"].to_numpy()[same_op]})
                    gapwait.append(gw)
                    pts.append(ce[same_op])
            if extra is not None:
                pts.append(extra)
            p = np.unique(np.concatenate(pts).astype(np.int64))
            lo, hi = p[:-1], p[1:]
            j = np.searchsorted(starts, lo, side="right") - 1
            busy = (j >= 0) & (lo < ends[np.maximum(j, 0)])
            label = np.where(busy, names[np.maximum(j, 0)], "(gap)")
            cat = np.where(busy, kinds[np.maximum(j, 0)], "gap")
            node_frames.append(pd.DataFrame({"ms": lo, "me": hi, "lane": lane_id, "rank": rank,
                                             "kind": np.where(busy, OP, GAP), "label": label, "category": cat,
                                             "inst": -1}))
            self.lane_points[(rank, tid)] = (lane_id, p)
            self.lane_rows.append((lane_id, rank, tid, False, "cpu"))
            lane_id += 1
        if gapwait:
            self.waits = pd.concat([self.waits] + gapwait, ignore_index=True)
        self.cpu_nodes = pd.concat(node_frames, ignore_index=True)
        self.next_lane = lane_id

    # -- GPU streams and runloop threads ------------------------------------------------------
    def _make_queue_lanes(self):
        ev, cm = self.ev, self.cm
        frames = []
        lane_id = self.next_lane
        comm_exec = cm[~cm["exec_on_cpu_lane"]]
        gpu = ev[ev["is_gpu"]]
        comm_gpu_ids = set(zip(comm_exec.loc[comm_exec["on_gpu"].fillna(False), "rank"],
                               comm_exec.loc[comm_exec["on_gpu"].fillna(False), "exec_event_id"]))
        lanes = sorted(set(map(tuple, gpu[["rank", "tid"]].drop_duplicates().to_numpy())) |
                       {(r, t) for r, t in self.runloop})
        is_gpu_lane = set(map(tuple, gpu[["rank", "tid"]].drop_duplicates().to_numpy()))
        gpu_groups = gpu.groupby(["rank", "tid"], sort=False).indices
        ce_on_gpu = comm_exec["on_gpu"].fillna(False).to_numpy(bool)
        ce_groups = comm_exec.groupby(["rank", "exec_tid"], sort=False).indices
        for rank, tid in lanes:
            parts = []
            if (rank, tid) in is_gpu_lane:
                g = gpu.iloc[gpu_groups[(rank, tid)]]
                mask = np.array([(rank, i) not in comm_gpu_ids for i in g["event_id"]], dtype=bool)
                g = g[mask]
                parts.append(pd.DataFrame({"ms": g["ts"], "me": g["te"], "kind": KERNEL, "label": g["name"],
                                           "category": g["kind"], "inst": -1, "event_id": g["event_id"], "comm_id": -1,
                                           "sub": 0}))
            ci = ce_groups.get((rank, tid), np.zeros(0, np.int64))
            ci = ci[ce_on_gpu[ci] == ((rank, tid) in is_gpu_lane)]
            c = comm_exec.iloc[ci]
            if len(c):
                parts.append(pd.DataFrame({"ms": c["start_ts_ns"], "me": c["c"], "kind": ARRIVE, "label": c["op"],
                                           "category": "comm", "inst": c["inst"], "event_id": c["exec_event_id"],
                                           "comm_id": c["comm_id"], "sub": 0}))
                parts.append(pd.DataFrame({"ms": c["c"], "me": c["end_ts_ns"], "kind": POST, "label": c["op"],
                                           "category": "comm", "inst": c["inst"], "event_id": c["exec_event_id"],
                                           "comm_id": c["comm_id"], "sub": 1}))
            if not parts:
                continue
            f = pd.concat(parts, ignore_index=True).sort_values(["ms", "sub"], kind="stable")
            f["lane"], f["rank"] = lane_id, rank
            frames.append(f)
            self.lane_rows.append((lane_id, rank, tid, (rank, tid) in is_gpu_lane,
                                   "gpu" if (rank, tid) in is_gpu_lane else "runloop"))
            lane_id += 1
        # communication executed on the CPU lane: its POST segment is found by time later; SYNC nodes here
        inst = self.instances
        frames.append(pd.DataFrame({"ms": inst["last_arrival"],
                                    "me": inst["last_arrival"], "kind": SYNC, "label": inst["op"], "category": "sync",
                                    "inst": inst["inst"], "event_id": -1, "comm_id": -1, "sub": 0, "lane": -1, "rank": -1}))
        q = pd.concat(frames, ignore_index=True)
        nodes = pd.concat([self.cpu_nodes.assign(event_id=-1, comm_id=-1, sub=0), q], ignore_index=True)
        nodes["me"] = np.maximum(nodes["me"], nodes["ms"])
        self.nodes_df = nodes

    # -- edges ---------------------------------------------------------------------------------
    def _point_nodes(self, rank, tid, t, ending: bool):
        """Node on CPU lane (rank, tid) ending at t (ending=True) or starting at t; -1 when none."""
        lp = self.lane_points.get((rank, tid))
        if lp is None:
            return np.full(len(t), -1)
        lane_id, p = lp
        base = self.lane_base[lane_id]
        k = np.searchsorted(p, t)
        found = (k < len(p)) & (p[np.minimum(k, len(p) - 1)] == t)
        idx = k - 1 if ending else k
        ok = found & (idx >= 0) & (idx < len(p) - 1)
        return np.where(ok, base + idx, -1)

    def _by_point(self, df, rank_col, tid_col, t_col, ending):
        out = np.full(len(df), -1, dtype=np.int64)
        if df.empty:
            return out
        for (rank, tid), idx in df.groupby([rank_col, tid_col]).indices.items():
            out[idx] = self._point_nodes(rank, tid, df[t_col].to_numpy()[idx].astype(np.int64), ending)
        return out

    def _make_edges(self):
        nd = self.nodes_df
        n = len(nd)
        # CPU lanes are the first block, in lane order; remember each lane's first node
        self.lane_base = {}
        lanes = nd["lane"].to_numpy()
        for lane_id in np.unique(lanes[lanes >= 0]):
            self.lane_base[int(lane_id)] = int(np.flatnonzero(lanes == lane_id)[0])
        src, dst = [], []
        # lane order
        same = (lanes[1:] == lanes[:-1]) & (lanes[1:] >= 0)
        lane_prev = np.full(n, -1)
        lane_prev[1:][same] = np.flatnonzero(same)
        i = np.flatnonzero(lane_prev >= 0)
        lane_src, lane_dst = lane_prev[i], i
        # launch -> GPU op (kernels and ARRIVE of comm kernels)
        key = nd[["rank", "event_id"]].copy()
        key["node"] = np.arange(n)
        gpu_first = key[(nd["kind"].isin([KERNEL, ARRIVE])) & (nd["event_id"] >= 0)].drop_duplicates(["rank", "event_id"])
        # a GPU op's last node (a collective kernel is ARRIVE then POST): what a wait on it waits for
        gpu_last = key[(nd["kind"].isin([KERNEL, ARRIVE, POST])) & (nd["event_id"] >= 0)].drop_duplicates(
            ["rank", "event_id"], keep="last").rename(columns={"node": "last_node"})
        gpu_first = gpu_first.merge(gpu_last, on=["rank", "event_id"], how="left")
        L = self.launch.merge(gpu_first, left_on=["rank", "event_id_gpu"], right_on=["rank", "event_id"])
        s = self._by_point(L, "rank", "tid", "te", ending=True)
        ok = s >= 0
        src.append(s[ok]); dst.append(L["node"].to_numpy()[ok])
        # cudaStreamWaitEvent: next op launched by the thread waits for the last one launched on another stream
        self._stream_wait_edges(L, src, dst)
        # GPU ops launched by a collective's own thread (gloo with CUDA tensors stages them through
        # host memory: a device-to-host copy before the transfer, host-to-device after it)
        self._runloop_launch_edges(nd, gpu_first, src, dst)
        # runloop enqueue -> ARRIVE
        arr = nd[nd["kind"] == ARRIVE][["rank", "comm_id"]].reset_index().rename(columns={"index": "node"})
        e = self.enq[~self.enq["on_gpu"].fillna(False)].merge(arr, on=["rank", "comm_id"])
        s = self._by_point(e, "rank", "enqueue_tid", "cut", ending=True)
        ok = s >= 0
        src.append(s[ok]); dst.append(e["node"].to_numpy()[ok])
        # ARRIVE -> SYNC -> POST (queue lanes)
        sync_node = pd.Series(np.flatnonzero(nd["kind"].to_numpy() == SYNC), index=nd.loc[nd["kind"] == SYNC, "inst"].to_numpy())
        a = nd[nd["kind"] == ARRIVE]
        src.append(a.index.to_numpy()); dst.append(sync_node.loc[a["inst"]].to_numpy())
        p = nd[nd["kind"] == POST]
        src.append(sync_node.loc[p["inst"]].to_numpy()); dst.append(p.index.to_numpy())
        # communication on the CPU lane: the node ending at the arrival feeds SYNC; the one at c waits for it
        x = self.cpu_exec
        s = self._by_point(x, "rank", "exec_tid", "start_ts_ns", ending=True)
        ok = s >= 0
        src.append(s[ok]); dst.append(sync_node.loc[x["inst"].to_numpy()[ok]].to_numpy())
        # waits: segments in [lo, hi) get duration 0; the segment starting at hi depends on the source
        w = self.waits
        kind = nd["kind"].to_numpy().copy()
        if len(w):
            tgt = self._by_point(w, "rank", "tid", "hi", ending=False)
            first = self._by_point(w, "rank", "tid", "lo", ending=False)
            wsrc = np.full(len(w), -1)
            m = (w["src_kind"] == "sync").to_numpy()
            wsrc[m] = sync_node.reindex(w.loc[m, "src_ref"].to_numpy()).fillna(-1).to_numpy()
            m = (w["src_kind"] == "post").to_numpy()
            post = pd.Series(p.index.to_numpy(), index=pd.MultiIndex.from_arrays([p["rank"], p["comm_id"]]))
            wsrc[m] = post.reindex(pd.MultiIndex.from_arrays([w.loc[m, "rank"], w.loc[m, "src_ref"]])).fillna(-1).to_numpy()
            m = (w["src_kind"] == "gpu").to_numpy()
            kern = pd.Series(key["node"].to_numpy(), index=pd.MultiIndex.from_arrays([key["rank"], key["event_id"]]))
            kern = kern[~kern.index.duplicated(keep="last")]
            wsrc[m] = kern.reindex(pd.MultiIndex.from_arrays([w.loc[m, "rank"], w.loc[m, "src_ref"]])).fillna(-1).to_numpy()
            m = (w["src_kind"] == "cpu").to_numpy()
            if m.any():   # the other thread's node that ends at hi
                wc = w[m]
                wsrc[m] = self._by_point(wc.assign(src_tid=wc["src_ref"].astype(np.int64)), "rank", "src_tid", "hi",
                                         ending=True)
            ok = (tgt >= 0) & (first >= 0) & (wsrc >= 0)
            for f, t in zip(first[ok], tgt[ok]):
                kind[f:t] = WAIT   # contiguous on the lane (CPU lanes are laid out in order)
            src.append(wsrc[ok]); dst.append(tgt[ok])
        # communication executed on the CPU lane: its part after the last arrival is a POST node
        inst = nd["inst"].to_numpy().copy()
        if len(x):
            lo = self._by_point(x, "rank", "exec_tid", "c", ending=False)
            hi = self._by_point(x, "rank", "exec_tid", "end_ts_ns", ending=True)
            for a, b, k in zip(lo, hi, x["inst"].to_numpy()):
                if a >= 0 and b >= a:
                    kind[a:b + 1] = POST
                    inst[a:b + 1] = k
        nd["inst"] = inst
        self.kind = kind
        self.lane_src, self.lane_dst = lane_src, lane_dst
        self.x_src = np.concatenate(src).astype(np.int64)
        self.x_dst = np.concatenate(dst).astype(np.int64)

    def _runloop_launch_edges(self, nd, gpu_first, src, dst):
        """A GPU op launched from a runloop thread inside a collective's execution span depends on
        that collective: on its arrival if launched before the last member arrived (the staging copy
        out), else on its completion (the copy back in). Without the edge the copy keeps its
        recorded distance to the previous op on its stream, whatever the collective does."""
        if not self.runloop or gpu_first.empty:
            return
        ev = self.ev
        rl = pd.DataFrame(sorted(self.runloop), columns=["rank", "tid"])
        rt = ev[~ev["is_gpu"] & ev["correlation"].notna() & ev["kind"].isin(["runtime", "sync"])].merge(rl)
        if rt.empty:
            return
        gpu = ev[ev["is_gpu"] & ev["correlation"].notna()][["rank", "correlation", "event_id"]]
        lg = rt[["rank", "tid", "ts", "correlation"]].merge(gpu, on=["rank", "correlation"]).merge(
            gpu_first[["rank", "event_id", "node"]], on=["rank", "event_id"])
        if lg.empty:
            return
        q = self.enq[["rank", "exec_tid", "start_ts_ns", "end_ts_ns", "c", "comm_id"]].rename(columns={"exec_tid": "tid"})
        q = q.astype({"tid": lg["tid"].dtype}).sort_values("start_ts_ns")
        m = pd.merge_asof(lg.sort_values("ts"), q, left_on="ts", right_on="start_ts_ns", by=["rank", "tid"])
        m = m[m["comm_id"].notna() & (m["ts"] <= m["end_ts_ns"])]
        if m.empty:
            return
        part = np.where(m["ts"] < m["c"], ARRIVE, POST)
        cn = nd[nd["kind"].isin([ARRIVE, POST]) & (nd["comm_id"] >= 0)]
        cn = pd.Series(cn.index.to_numpy(), index=pd.MultiIndex.from_arrays([cn["rank"], cn["comm_id"], cn["kind"]]))
        cn = cn[~cn.index.duplicated()]
        s = cn.reindex(pd.MultiIndex.from_arrays([m["rank"], m["comm_id"].astype(np.int64), part])).fillna(-1).to_numpy()
        ok = s >= 0
        src.append(s[ok].astype(np.int64)); dst.append(m["node"].to_numpy()[ok])

    def _stream_wait_edges(self, L, src, dst):
        sw = self.cpu[self.cpu["name"] == "cudaStreamWaitEvent"]
        if sw.empty or L.empty:
            return
        nd = self.nodes_df
        lanes = nd["lane"].to_numpy()
        by_thread = L.groupby(["rank", "tid"], sort=False).indices
        for (rank, tid), g in sw.groupby(["rank", "tid"], observed=True):
            if (rank, tid) not in by_thread:
                continue
            l = L.iloc[by_thread[(rank, tid)]].sort_values("ts")
            if l.empty:
                continue
            lts, lnode, llast = l["ts"].to_numpy(), l["node"].to_numpy(), l["last_node"].to_numpy()
            for t in g["ts"].to_numpy():
                k = np.searchsorted(lts, t)
                if k >= len(lts):
                    continue
                nxt = lnode[k]
                j = k - 1
                while j >= 0 and lanes[lnode[j]] == lanes[nxt]:
                    j -= 1
                if j >= 0:
                    src.append(np.array([llast[j]])); dst.append(np.array([nxt]))

    # -- fitting lags, order, steps ------------------------------------------------------------
    def _finish(self) -> Graph:
        nd = self.nodes_df
        n = len(nd)
        kind = self.kind
        ms = nd["ms"].to_numpy(np.int64)
        me = nd["me"].to_numpy(np.int64)
        dur = np.where(np.isin(kind, [WAIT, ARRIVE, SYNC]), 0, me - ms).astype(np.int64)
        e_model = ms + dur
        # edges: lane first, then cross edges; drop self loops and duplicates
        src = np.concatenate([self.lane_src, self.x_src])
        dst = np.concatenate([self.lane_dst, self.x_dst])
        is_lane = np.concatenate([np.ones(len(self.lane_src), bool), np.zeros(len(self.x_src), bool)])
        keep = src != dst
        src, dst, is_lane = src[keep], dst[keep], is_lane[keep]
        pair = pd.DataFrame({"s": src, "d": dst, "l": is_lane}).drop_duplicates(["s", "d"])
        src, dst, is_lane = pair["s"].to_numpy(), pair["d"].to_numpy(), pair["l"].to_numpy()
        # fit lags so the recorded start is reproduced (see module docstring)
        E = e_model[src]
        S = ms[dst]
        # slack = recorded start - latest predecessor end: a latency after whatever binds (>= 0, on
        # every edge, so it follows the binding constraint in a what-if), or, when a predecessor
        # recorded ends after the node started (a kernel starting inside its cudaLaunchKernel), the
        # overlap only on the edges that overran it
        max_e = np.full(n, np.iinfo(np.int64).min)
        np.maximum.at(max_e, dst, E)
        slack = S - max_e[dst]
        lag = np.where(slack >= 0, slack, np.minimum(S - E, 0)).astype(np.int64)
        # nodes with no incoming edge start at their recorded time
        has_in = np.zeros(n, bool)
        has_in[dst] = True
        rel = np.where(has_in, NO_REL, ms).astype(np.int64)
        # CSR by destination
        o = np.lexsort((~is_lane, dst))
        src, dst, lag, is_lane = src[o], dst[o], lag[o], is_lane[o]
        ptr = np.zeros(n + 1, dtype=np.int64)
        np.add.at(ptr, dst + 1, 1)
        ptr = np.cumsum(ptr)
        order = _topo_order(ms, kind, src, dst, n)
        labels, label = _codes(nd["label"].astype(str))
        categories, category = _codes(pd.Series(np.where(np.isin(kind, [WAIT]), "wait", nd["category"].astype(str))))
        lanes = pd.DataFrame(self.lane_rows, columns=["lane", "rank", "tid", "is_gpu", "type"])
        steps = self._steps(ms, me)
        steps = self._gpu_tails(steps, me, kind, nd["lane"].to_numpy(), nd["rank"].to_numpy(), ms,
                                lanes.loc[lanes["type"] == "gpu", "lane"].to_numpy())
        return Graph(run=self.run, ms=ms, me=me, dur=dur, lane=nd["lane"].to_numpy(np.int32),
                     rank=nd["rank"].to_numpy(np.int32), kind=kind.astype(np.int8), label=label, category=category,
                     inst=nd["inst"].to_numpy(np.int64), rel=rel, ptr=ptr, src=src, lag=lag, is_lane_edge=is_lane,
                     order=order, labels=labels, categories=categories, lanes=lanes, steps=steps,
                     instances=self.instances[["inst", "key", "op", "bytes", "is_p2p", "n_ranks", "transfer_ns"]])

    def _steps(self, ms, me):
        rows = []
        for r in self.st.itertuples():
            tid = self.step_tid.get(r.rank)
            lp = self.lane_points.get((r.rank, tid))
            if lp is None:
                continue
            lane_id, p = lp
            base = self.lane_base[lane_id]
            ks = int(np.searchsorted(p, r.start_ts_ns))
            ke = int(np.searchsorted(p, r.end_ts_ns))
            start_node = base + ks if ks < len(p) - 1 else base + ks - 1
            end_uses_end = ke >= len(p) - 1
            end_node = base + ke - 1 if end_uses_end else base + ke
            rows.append((r.rank, r.step, r.dur_ns, start_node, ks >= len(p) - 1, end_node, end_uses_end))
        return pd.DataFrame(rows, columns=["rank", "step", "measured_ns", "start_node", "start_uses_end",
                                           "end_node", "end_uses_end"])


    def _gpu_tails(self, steps, me, kind, lane, rank, ms, gpu_lanes):
        """GPU work of each step: the GPU nodes (kernels, GPU collectives) that start between the
        step's recorded CPU start and the next step's. Why: the CPU leaves a step as soon as it
        has launched the work, so a step's time is from its CPU start to the later of its CPU end
        and the end of that GPU work (``gpu_nodes``; the measured time likewise), else a what-if
        that slows the GPU down changes nothing in a trace of one step."""
        on_gpu = np.isin(lane, gpu_lanes) & np.isin(kind, [KERNEL, POST])
        steps["gpu_nodes"] = [np.zeros(0, np.int64)] * len(steps)
        steps["measured_ns"] = steps["measured_ns"].astype(np.int64)
        if not on_gpu.any() or steps.empty:
            return steps
        cpu = self.st.set_index(["rank", "step"])
        for r, sub in steps.groupby("rank"):
            idx = np.flatnonzero(on_gpu & (rank == r))
            if not len(idx):
                continue
            w = cpu.loc[r].loc[sub["step"]]
            starts = w["start_ts_ns"].to_numpy()
            order = np.argsort(starts)
            k = np.searchsorted(starts[order], ms[idx], side="right") - 1
            for pos, row in enumerate(sub.index[order]):
                nodes = idx[k == pos]
                steps.at[row, "gpu_nodes"] = nodes
                if len(nodes):
                    tail = int(me[nodes].max()) - int(w["start_ts_ns"].to_numpy()[order][pos])
                    steps.at[row, "measured_ns"] = max(int(steps.at[row, "measured_ns"]), tail)
        return steps


def _codes(values: pd.Series):
    codes, uniques = pd.factorize(values)
    return list(uniques), codes.astype(np.int32)


def _topo_order(ms, kind, src, dst, n) -> np.ndarray:
    """A topological order: by recorded start (ties: arrivals, then SYNC, then the rest).

    Why a repair pass: a few edges run backwards in recorded time (a kernel that starts inside its
    own cudaLaunchKernel, clock noise between ranks), so the recorded order alone is not always
    topological. Each node gets a key (rank in recorded order); while some edge has key[src] >=
    key[dst], the destination's key is raised just above its source's (vectorised, one hop per
    pass; violations are local, so few passes). Kahn's algorithm is the fallback."""
    prio = np.select([kind == ARRIVE, kind == WAIT, kind == SYNC], [0, 1, 2], 3)
    order = np.lexsort((np.arange(n), prio, ms))
    if len(src) == 0:
        return order
    key = np.empty(n, dtype=np.float64)
    key[order] = np.arange(n, dtype=np.float64)
    for _ in range(200):
        bad = key[src] >= key[dst]
        if not bad.any():
            return np.argsort(key, kind="stable")
        # just above the source: between it and the next key, so the rest of the order is kept
        np.maximum.at(key, dst[bad], key[src[bad]] + 0.5 ** 8)
    return _kahn(key, src, dst, n)
