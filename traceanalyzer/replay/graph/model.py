"""The replay graph's record (``Graph``), its node kinds and the named thresholds of its build.

See ``replay/graph/__init__.py`` for what the nodes and edges mean.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

# node kinds
OP, GAP, WAIT, KERNEL, ARRIVE, POST, SYNC = range(7)
KIND_NAMES = ("op", "gap", "wait", "gpu", "arrive", "comm", "sync")
NO_REL = np.iinfo(np.int64).min // 4

#: a gap on a CPU thread is a wait for a completion (a collective's, another thread's work) that
#: ends it within this time
GAP_WAIT_MAX_TAIL_NS = 1_000_000
#: the transfer of a lazily waited p2p (gloo isend/irecv) is at most this quantile, over the run's
#: p2p of the same size, of (first completion - last arrival): the instances whose receiver was
#: already waiting (load.py)
LAZY_P2P_TRANSFER_QUANTILE = 0.25
#: shorter gaps on a CPU thread are not taken as waits for another thread of the rank
CROSS_THREAD_MIN_GAP_NS = 100_000
#: a CUDA runtime call whose name holds this blocks its thread until the GPU work it waits for is done
#: (cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize)
BLOCKING_SYNC_NAME = "Synchronize"
#: the runtime call after which the next launch of the thread waits for another stream's last op
STREAM_WAIT_NAME = "cudaStreamWaitEvent"

#: the analysis modules that define pipeline_stages (and what they read): binding these alone takes
#: a fraction of a second where every analysis view takes seconds (deep view chains bind slowly)
PIPELINE_VIEWS = ("clock_offsets", "step_alignment", "pipelines")


@dataclass
class Graph:
    """Flat arrays (one entry per node) plus an incoming-edge CSR; see replay/graph/__init__.py."""
    run: str
    ms: np.ndarray          # recorded start (clock-aligned), ns
    me: np.ndarray          # recorded end, ns
    dur: np.ndarray         # modelled duration (identity), ns
    child: np.ndarray       # of an OP node's duration, the time nested events cover, ns (0: none, or not a pipeline)
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
    lanes: pd.DataFrame     # lane, rank, tid, is_gpu, type
    steps: pd.DataFrame     # rank, step, measured_ns, start_node, end_node, end_uses_end, gpu_nodes
    instances: pd.DataFrame  # inst, key, op, bytes, is_p2p, n_ranks, transfer_ns
    stats: dict = field(default_factory=dict)
    stages: pd.DataFrame | None = None   # rank, stage (pipelines: the analyses' stage detection)
    source: object = None                # the DuckDB connection it was built from (alpha-beta fits)
    alphabeta: object = None             # the run's alpha-beta fit, once a plan asked for it
    cache: dict = field(default_factory=dict, repr=False)   # what plans derive from the graph alone (plans.py)

    @property
    def n(self) -> int:
        return len(self.dur)


def merge_intervals(iv) -> np.ndarray:
    """Sorted, disjoint union of (start, end) intervals (an (n, 2) array; empty stays empty): the
    one interval-union rule of the package (the SQL modules' is ``analyses/sql/intervals.sql``):
    in order of start, an interval opens a new one when it starts after every earlier one ended;
    one starting exactly where an earlier one ends joins it."""
    iv = np.asarray(iv)
    if not len(iv):
        return iv.reshape(0, 2)
    iv = iv[np.argsort(iv[:, 0], kind="stable")]
    lo, hi = iv[:, 0], iv[:, 1]
    idx = np.flatnonzero(np.concatenate([[True], lo[1:] > np.maximum.accumulate(hi)[:-1]]))
    return np.column_stack([lo[idx], np.maximum.reduceat(hi, idx)]).astype(iv.dtype, copy=False)
