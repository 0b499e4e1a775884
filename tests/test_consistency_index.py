"""The one-job-per-run check indexes the traces it has seen (linear in the ranks) and refuses the
same trace with the same message as checking every pair: the pairwise check is the spec here."""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from traceanalyzer.errors import TraceInputError
from traceanalyzer.ingest import consistency as C


def pairwise(store, manifest, run, summaries):
    """The check as it was: every trace against every one before it."""
    seen = C._stored_jobs(store, [t for t in manifest.traces if t["run"] == run])
    for s in summaries:
        for other_file, other_rank, other in seen:
            C._compare(s.path, s.rank, s.job, other_file, other_rank, other, run)
        seen.append((s.path, s.rank, s.job))


def outcome(check, stored, batch):
    manifest = SimpleNamespace(traces=[{"run": "r", "trace_file": f"stored{i}.json", "rank": rank, "job": job}
                                       for i, (rank, job) in enumerate(stored)])
    summaries = [SimpleNamespace(path=f"new{i}.json", rank=rank, job=job) for i, (rank, job) in enumerate(batch)]
    try:
        check(None, manifest, "r", summaries)
    except TraceInputError as exc:
        return str(exc)
    return None


def _job(rnd):
    pick = rnd.choice
    return {"run_id": pick([None, "a", "b"]), "world_size": pick([None, 0, 1, 2]), "backend": pick([None, "nccl", "gloo"]),
            "host": pick(["h0", "h1"]), "pid": pick([None, 0, 1, 2]),
            "pg_layout": {pg: [rnd.randrange(4) for _ in range(rnd.randrange(3))]
                          for pg in rnd.sample(["0", "1", "pp:dp0"], rnd.randrange(4))}}


def _traces(rnd):
    return [(rnd.randrange(4), _job(rnd)) for _ in range(rnd.randrange(7))]


@pytest.mark.parametrize("seed", range(4))
def test_same_refusal_as_the_pairwise_check(seed):
    rnd = random.Random(seed)
    refused = 0
    for _ in range(500):
        stored, batch = _traces(rnd), _traces(rnd)
        want = outcome(pairwise, stored, batch)
        assert outcome(C.check_run, stored, batch) == want
        refused += want is not None
    assert 50 < refused < 450  # both outcomes are exercised


def test_consistent_large_run_is_accepted_and_a_late_disagreement_named():
    """2,048 traces (2 M pairs): accepted; a trace at the end whose group disagrees is refused,
    naming the first trace holding that group."""
    jobs = [(r, {"world_size": 2048, "backend": "nccl", "host": f"h{r // 8}", "pid": r,
                 "pg_layout": {"0": list(range(2048)), f"pp:dp{r // 2}": [r - r % 2, r - r % 2 + 1]}})
            for r in range(2048)]
    assert outcome(C.check_run, jobs[:1024], jobs[1024:]) is None
    bad = (2047, dict(jobs[-1][1], pg_layout={"pp:dp7": [14, 99]}))
    msg = outcome(C.check_run, jobs[:1024], jobs[1024:] + [bad])
    assert msg.startswith("new1024.json: process group 'pp:dp7' has ranks [14, 99], but [14, 15] in stored14.json (rank 14)")
