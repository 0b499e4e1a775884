"""The light collector: an op timeline (one row per operation) recorded by the training loop itself.

    from traceanalyzer.collect.op_timeline import OpTimeline
    tl = OpTimeline(rank, dp=d, pp=s)
    with tl.op("forward-compute", step, microbatch=mb):
        out = stage(x)
    ...
    tl.write(out_dir / "op_timeline.parquet")   # every rank calls it: rank 0 writes all ranks' rows

Times are ``time.perf_counter_ns()`` (CLOCK_MONOTONIC on Linux: one clock for every process of a
host), written as ``start_ns``/``duration_ns`` so the unit is in the column names. Hosts do not
share that clock, so every row also carries the rank's ``host`` and ``clock_offset_ns``: wall
time minus monotonic time, read together when the timeline is made (the tightest of a few reads),
which the import adds to ``start_ns`` -- every rank then lies on the wall clock, and the analyses
align what NTP leaves between hosts from the collectives (``clock_offsets``). The table is
what :mod:`traceanalyzer.ingest.op_timeline` reads (the op vocabulary is documented there). No
profiler runs: the cost is two clock reads per op, which is why large jobs keep such a record on
every rank.
"""
from __future__ import annotations

import socket
import time
from contextlib import contextmanager
from pathlib import Path

#: clock pairs read to find wall - monotonic; the pair read in the shortest time is kept
CLOCK_PAIR_READS = 5


def clock_pair_offset_ns() -> int:
    """Wall-clock time minus ``perf_counter_ns`` now: from the pair of reads that took least time
    (monotonic before and after a wall read, the wall read taken at their midpoint)."""
    best = None
    for _ in range(CLOCK_PAIR_READS):
        a = time.perf_counter_ns()
        w = time.time_ns()
        b = time.perf_counter_ns()
        if best is None or b - a < best[0]:
            best = (b - a, w - (a + b) // 2)
    return best[1]


class OpTimeline:
    """Rows of one rank; ``write`` gathers every rank's rows to rank 0 (over the default group)."""

    def __init__(self, rank: int, dp: int = 0, pp: int = 0, tp: int = 0, cp: int = 0, ep: int = 0):
        self.rank = rank
        self.coords = {"dp": dp, "pp": pp, "tp": tp, "cp": cp, "ep": ep}
        self.rows: list[tuple] = []
        self._seq: dict[tuple, int] = {}
        self.host = socket.gethostname()
        self.clock_offset_ns = clock_pair_offset_ns()

    @contextmanager
    def op(self, op: str, step: int, microbatch: int = -1, vpp: int = 0):
        t0 = time.perf_counter_ns()
        try:
            yield
        finally:
            t1 = time.perf_counter_ns()
            key = (step, op)
            seq = self._seq.get(key, 0)
            self._seq[key] = seq + 1
            self.rows.append((op, step, microbatch, vpp, seq, t0, t1 - t0))

    def table(self):
        import pyarrow as pa
        n = len(self.rows)
        cols = list(zip(*self.rows)) if n else [[]] * 7
        data = {"rank": pa.array([self.rank] * n, pa.int32())}
        data.update({k: pa.array([v] * n, pa.int32()) for k, v in self.coords.items()})
        for name, values, typ in zip(("op", "step", "microbatch", "vpp", "seq", "start_ns", "duration_ns"), cols,
                                     (pa.string(), pa.int32(), pa.int32(), pa.int32(), pa.int32(), pa.int64(), pa.int64())):
            data[name] = pa.array(list(values), typ)
        data["host"] = pa.array([self.host] * n, pa.string())
        data["clock_offset_ns"] = pa.array([self.clock_offset_ns] * n, pa.int64())
        return pa.table(data)

    def write_rank(self, path: str | Path, metadata: dict | None = None) -> Path:
        """Write this rank's rows alone (no collective: what ``profile(op_timeline=True)`` does on
        every rank, so that the record scales with the job); ``metadata`` values are stored as JSON."""
        import json

        import pyarrow.parquet as pq
        t = self.table().sort_by([("start_ns", "ascending")])
        if metadata:
            t = t.replace_schema_metadata({k: json.dumps(v, sort_keys=True) for k, v in metadata.items()})
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        pq.write_table(t, tmp)
        tmp.replace(path)
        return path

    def write(self, path: str | Path) -> Path | None:
        """Gather every rank's rows and write them, one Parquet file, on rank 0 (a collective:
        every rank calls it). Returns the path on rank 0, else None."""
        import pyarrow as pa
        import pyarrow.parquet as pq
        import torch.distributed as dist
        mine = self.table()
        if dist.is_available() and dist.is_initialized():
            parts = [None] * dist.get_world_size()
            dist.all_gather_object(parts, mine.to_pylist())
            if dist.get_rank() != 0:
                return None
            mine = pa.Table.from_pylist([row for part in parts for row in part], schema=mine.schema)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(mine.sort_by([("rank", "ascending"), ("start_ns", "ascending")]), path)
        return path
