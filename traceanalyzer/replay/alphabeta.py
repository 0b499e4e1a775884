"""Alpha-beta communication cost model, fitted per collective type from a recorded run.

    ab = alphabeta.fit("store", run="ddp4")
    ab.table                                  # op, n_instances, n_sizes, alpha_ns, beta_ns_per_byte, ...
    ab.time_ns("all_reduce", 25 * 2**20, n=8) # predicted transfer time at another size / group size

Model (NCCL's ring algorithms, the nccl-tests bus-bandwidth convention of METRICS.md): a collective
of ``bytes`` (nccl-tests bytes: the all_reduce buffer, the all_gather output, the reduce_scatter
input) over ``n`` ranks takes

    time = alpha * hops(op, n) + beta * bytes * wire(op, n)

    op                                   wire(op, n)   hops(op, n)
    all_reduce                           2(n-1)/n      2(n-1)     (reduce-scatter + all-gather ring)
    all_gather, reduce_scatter, all_to_all (n-1)/n     n-1
    broadcast, reduce                    1             n-1        (pipelined ring/chain)
    send / recv (p2p), others            1             1

so ``alpha`` is the latency of one hop and ``beta`` the time per byte on the wire (1/busbw). Because
the group size enters only through wire() and hops(), a fit at n=2 rescales to n=8.

Fit: per op, the measured transfer time of every instance (``collective_instances.transfer_ns`` =
earliest end - latest arrival, METRICS.md; p2p: the same over the send and the recv), by default
made exclusive (divided among the transfers in flight at the same time, ``_exclusive``), against
x = bytes * wire. Robust and median based (Theil-Sen): beta = median of the pairwise slopes between
instances of different sizes, alpha = median(y - beta * x) / hops (or the mean: ``center``). With
one size only (or a fit that goes negative), the split between alpha and beta is not identifiable:
alpha = 0 and beta = median(y / x) (flagged in ``identifiable``). Quality: the median and P90 of |fit - measured| / measured over the instances.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..errors import TraceAnalyzerError
from ..store.runs import resolve_run

MAX_PAIRS = 20_000       # Theil-Sen: pairwise slopes from at most this many sampled pairs (per op)
MIN_SIZE_RATIO = 1.05    # two instances count as different sizes when their wire bytes differ by 5 %

_WIRE_N = {"all_reduce": lambda n: 2.0 * (n - 1) / n,
           "all_gather": lambda n: (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
           "all_to_all": lambda n: (n - 1) / n}
_HOPS_N = {"all_reduce": lambda n: 2.0 * (n - 1),
           "all_gather": lambda n: n - 1.0, "reduce_scatter": lambda n: n - 1.0, "all_to_all": lambda n: n - 1.0,
           "broadcast": lambda n: n - 1.0, "reduce": lambda n: n - 1.0}


def wire(op: str, n: int) -> float:
    """Bytes on the wire per rank per nccl-tests byte (the bus-bandwidth factor); 1 for p2p."""
    if n <= 1:
        return 0.0
    return float(_WIRE_N.get(op, lambda n: 1.0)(n))


def hops(op: str, n: int) -> float:
    """Latency steps of the ring algorithm; 1 for p2p."""
    if n <= 1:
        return 0.0
    return float(_HOPS_N.get(op, lambda n: 1.0)(n))


@dataclass
class AlphaBeta:
    """Fitted per-op costs; ``table`` has one row per op (see ``fit``)."""
    run: str
    table: pd.DataFrame     # op, is_p2p, group_size, n_instances, n_sizes, alpha_ns, beta_ns_per_byte,
    #                         busbw_gbps, identifiable, fit_err_median, fit_err_p90
    samples: pd.DataFrame   # op, is_p2p, group_size, bytes, transfer_ns, exclusive_ns, fitted_ns (per instance)
    shared: bool = True     # fitted on exclusive_ns (True) or transfer_ns

    def params(self, op: str) -> tuple[float, float]:
        """(alpha_ns per hop, beta_ns per wire byte) of ``op``; p2p ops are 'send'/'recv'."""
        row = self.table[self.table["op"] == op]
        if row.empty:
            raise TraceAnalyzerError(f"replay: run '{self.run}' has no measured {op} to fit an alpha-beta model "
                                     f"(measured: {', '.join(self.table['op']) or 'none'})")
        return float(row["alpha_ns"].iloc[0]), float(row["beta_ns_per_byte"].iloc[0])

    def time_ns(self, op: str, nbytes, n: int):
        """Predicted transfer time (ns) of ``op`` moving ``nbytes`` (nccl-tests bytes) over ``n`` ranks."""
        a, b = self.params(op)
        return a * hops(op, n) + b * np.asarray(nbytes, dtype=float) * wire(op, n)


def _samples(con, run: str, busy: np.ndarray | None = None) -> pd.DataFrame:
    """One row per measured collective / p2p instance: op, is_p2p, group_size, bytes, transfer_ns."""
    coll = con.execute("""
        SELECT op, false AS is_p2p, coalesce(group_size, n_ranks) AS group_size, bytes, transfer_ns,
               last_arrival_ns AS t0_ns
        FROM collective_instances
        WHERE run = $run AND complete AND bytes > 0 AND transfer_ns > 0""", {"run": run}).df()
    # p2p: a send and its recv, keyed like the replay graph (pg, src, dst, tag, p2p_seq); transfer as
    # for collectives (earliest end - latest arrival of the two sides), bytes = the message
    p2p = con.execute("""
        SELECT 'send' AS op, true AS is_p2p, 2 AS group_size, max(in_bytes) AS bytes,
               greatest(min(end_ts_ns) - max(start_ts_ns), 0) AS transfer_ns, max(start_ts_ns) AS t0_ns
        FROM comms
        WHERE run = $run AND is_p2p AND p2p_seq IS NOT NULL AND start_ts_ns IS NOT NULL
        GROUP BY coalesce(pg_name, '?'), src_rank, dst_rank, tag, p2p_seq
        HAVING count(*) = 2 AND max(in_bytes) > 0 AND min(end_ts_ns) > max(start_ts_ns)""", {"run": run}).df()
    s = pd.concat([coll, p2p], ignore_index=True)
    s["exclusive_ns"] = _exclusive(s["t0_ns"].to_numpy(np.int64), s["transfer_ns"].to_numpy(np.int64), busy)
    return s


def _exclusive(t0: np.ndarray, dur: np.ndarray, busy: np.ndarray | None = None) -> np.ndarray:
    """Per transfer interval [t0, t0 + dur): the integral of 1 / (number of transfers in flight),
    halved where ``busy`` (sorted, disjoint [start, end) rows) says the core was also computing.

    Why: gloo runs up to two collectives at once (two runloop threads per process group) on the
    rank's core and socket; two at once each take about twice as long. Under fair sharing, the time
    a transfer would take alone is its share of the resource integrated over its interval; a
    compute thread on the same core (``busy``) takes half of it."""
    if len(t0) == 0:
        return np.zeros(0)
    t1 = t0 + dur
    extra = [] if busy is None or not len(busy) else [busy[:, 0], busy[:, 1]]
    pts = np.unique(np.concatenate([t0, t1, *extra]))
    k = np.searchsorted(np.sort(t0), pts[:-1], side="right") - np.searchsorted(np.sort(t1), pts[:-1], side="right")
    w = np.diff(pts) / np.maximum(k, 1)
    if extra:
        j = np.searchsorted(busy[:, 0], pts[:-1], side="right") - 1
        inside = (j >= 0) & (pts[:-1] < busy[np.maximum(j, 0), 1])
        w = np.where(inside, w / 2, w)
    cum = np.concatenate([[0.0], np.cumsum(w)])
    return cum[np.searchsorted(pts, t1)] - cum[np.searchsorted(pts, t0)]


def _theil_sen(x: np.ndarray, y: np.ndarray, rng, center=np.median) -> tuple[float, float, bool]:
    """(intercept, slope, identifiable): median pairwise slope over pairs of different x; the
    intercept is ``center`` (median or mean) of the residuals. ``center="tail"``: the intercept is
    the median residual and the tail of the residuals (their mean over their median) goes to the
    slope, spread over the mean x (see :func:`fit`)."""
    if center == "tail":
        icpt, slope, ident = _theil_sen(x, y, rng, np.median)
        if not ident:
            return _theil_sen(x, y, rng, np.mean)
        return icpt, slope + float(np.mean(y - slope * x) - icpt) / float(np.mean(x)), True
    n = len(x)
    if n >= 2:
        if n * (n - 1) // 2 <= MAX_PAIRS:
            i, j = np.triu_indices(n, 1)
        else:
            i, j = rng.integers(0, n, MAX_PAIRS), rng.integers(0, n, MAX_PAIRS)
        lo, hi = np.minimum(x[i], x[j]), np.maximum(x[i], x[j])
        ok = hi > lo * MIN_SIZE_RATIO
        if ok.any():
            slope = float(np.median((y[j][ok] - y[i][ok]) / (x[j][ok] - x[i][ok])))
            if slope > 0:
                icpt = float(center(y - slope * x))
                if icpt >= 0:
                    return icpt, slope, True
    # one size (or a fit that goes negative): all of the time is bandwidth
    return 0.0, float(np.mean(y) / np.mean(x) if center is np.mean else np.median(y / x)), False


def prepare_comm_views(store_or_con):
    """A connection with the analysis views the replay needs (clock_offsets, collectives and the
    modules before it), loaded once: far cheaper than every analysis module (``analyses.prepare``)."""
    from ..analyses import bind_views, connect
    con = connect(store_or_con)
    bind_views(con, ["clock_offsets", "collective_instances"])
    return con


def fit(store_or_con, run: str | None = None, shared: bool = True, busy=None, center: str = "median") -> AlphaBeta:
    """Fit alpha (ns per hop) and beta (ns per wire byte) per op from the run's measured transfers;
    ``shared``: fit the exclusive time (transfers in flight together share the time, ``_exclusive``)
    rather than the raw transfer time; ``busy``: (start, end) intervals, clock-aligned, in which the
    ranks' cores were also computing (the DDP model passes its backward passes), or None;
    ``center``: "median" (robust: the typical transfer) or "mean" for the intercept (the slope is
    always the median pairwise slope): a step that sums several transfers takes their *mean*, and
    gloo's transfer times have a long tail (scheduling delays); or "tail": the typical (median)
    intercept, and the tail (mean residual over the median) charged per byte -- a transfer is
    descheduled for a share of the time it is in flight, so its tail grows with its length, not
    with the number of transfers. The DDP model uses "tail": with "mean", the tail of a run's few
    big buckets became per-bucket latency, which a smaller bucket size then paid once per bucket
    (the shipped 25 -> 4 MB pair: 3.2 ms of a 3.4 ms intercept was the tail of one 29 ms transfer;
    predicted 68.1 ms vs the real 56.6 ms; with "tail" 56.1 ms, and 4 -> 25 MB 59.6 vs 59.8 ms).
    The mean over the fitted instances is the same for "mean" and "tail"."""
    if center not in ("median", "mean", "tail"):
        raise TraceAnalyzerError(f"alpha-beta fit: center must be 'median', 'mean' or 'tail', got {center!r}")
    cfun = {"median": np.median, "mean": np.mean, "tail": "tail"}[center]
    con = prepare_comm_views(store_or_con)
    if run is None:
        run = resolve_run(con, run, where="alpha-beta fit", table="comms", flag="run=", what="runs with communication")
    if busy is not None and len(busy):   # merge into sorted disjoint intervals
        from .graph import merge_intervals
        busy = merge_intervals(np.asarray(busy, dtype=np.int64))
    s = _samples(con, run, busy if shared else None)
    if s.empty:
        raise TraceAnalyzerError(f"alpha-beta fit: run '{run}' has no complete collective or p2p with bytes "
                                 "and a measured transfer time")
    s["wire"] = [wire(o, int(n)) for o, n in zip(s["op"], s["group_size"])]
    s["hops"] = [hops(o, int(n)) for o, n in zip(s["op"], s["group_size"])]
    s["x"] = s["bytes"].astype(float) * s["wire"]
    rng = np.random.default_rng(0)
    rows, parts = [], []
    for op, g in s.groupby("op", sort=True):
        x, y = g["x"].to_numpy(float), g["exclusive_ns" if shared else "transfer_ns"].to_numpy(float)
        ok = y > 0
        if not ok.any():
            continue
        g, x, y = g[ok], x[ok], y[ok]
        icpt, slope, ident = _theil_sen(x, y, rng, cfun)
        h = float(np.median(g["hops"])) or 1.0
        fitted = icpt + slope * x
        err = np.abs(fitted - y) / y
        parts.append(g.assign(fitted_ns=fitted))
        sizes = np.unique(np.round(np.log(x) / np.log(MIN_SIZE_RATIO)))
        rows.append({"op": op, "is_p2p": bool(g["is_p2p"].iloc[0]), "group_size": int(np.median(g["group_size"])),
                     "n_instances": len(g), "n_sizes": len(sizes), "alpha_ns": icpt / h, "beta_ns_per_byte": slope,
                     "busbw_gbps": 1.0 / slope if slope > 0 else float("nan"), "identifiable": ident,
                     "fit_err_median": float(np.median(err)), "fit_err_p90": float(np.quantile(err, 0.9))})
    samples = pd.concat(parts, ignore_index=True)[["op", "is_p2p", "group_size", "bytes", "transfer_ns",
                                                   "exclusive_ns", "fitted_ns"]]
    return AlphaBeta(run=run, table=pd.DataFrame(rows), samples=samples, shared=shared)
