"""The reduce of ``analyze --run R`` reads run R's files only (issue 18): its cross-rank views
read canonical tables (comms, steps, ranks), which over the whole store held every run's rows -- a
store of 150 runs made the reduce of one run as large as that of all 150."""
from __future__ import annotations

import shutil

#: the run analysed: the smallest shipped one
RUN = "ddp_gloo_2rank"


def test_the_reduce_of_one_run_holds_that_run_only(shipped_store, tmp_path, monkeypatch):
    from traceanalyzer.analyses import results
    store = shutil.copytree(shipped_store, tmp_path / "store")   # its own: one run's results saved
    real, seen = results.compute, {}

    def compute(con, run=None, **kw):                  # the real compute; then what its tables hold
        out = real(con, run=run, **kw)
        seen["tables"] = {t for (t,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE temporary").fetchall()}
        seen["runs"] = {v: {r for (r,) in con.execute(f"SELECT DISTINCT run FROM {v}").fetchall()}
                        for v in ("comms", "steps", "collective_ranks", "collective_instances")}
        seen["provided"] = con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = 'activity_segments'").fetchone()[0]
        return out

    monkeypatch.setattr(results, "compute", compute)
    out = results.analyze(store, run=RUN, only=["collectives"])
    assert seen["provided"] and {"collective_ranks", "collective_instances"} <= seen["tables"]   # the reduce ran
    assert all(runs == {RUN} for runs in seen["runs"].values()), seen["runs"]
    assert set(out["collectives"]["run"]) == {RUN} and len(out["collectives"])
