"""_collective_blocked finds the compute inside each wait through time buckets (issue 18): row for
row what the old SQL (every wait joined with every compute segment of its rank, frozen in
tests/reference/collective_blocked.sql) gives, on shipped runs -- with the width the view picks
and with widths that force every compute segment to be cut into pieces, or none."""
from __future__ import annotations

import re

from conftest import ROOT

#: the view's own bucket width (the mean clipped wait), as its SQL says it
WIDTH_RE = re.compile(r"width AS MATERIALIZED \(SELECT [^\n]*FROM _collective_waits\)")
#: forced widths (ns): ~1 us (off the traces' microsecond grid) cuts most compute segments into
#: pieces, 2^40 ns (18 min) none
WIDTHS = (1237, 1 << 40)
#: every wait moved this much earlier on its rank's clock (clock offsets raised; ns, off the grid):
#: a wait's start then falls inside compute segments (on the traces it is where a segment starts)
SHIFT_NS = 123_457


def _rows(con, view: str) -> list[tuple]:
    return sorted(con.execute(f"SELECT * FROM {view}").fetchall(), key=repr)


def test_bucketed_blocked_time_is_the_old_join(shipped_store):
    from traceanalyzer.analyses import connect, prepare
    from traceanalyzer.analyses import modules as M
    from traceanalyzer.analyses.results import effective_params
    con = connect(shipped_store)
    prepare(con, modules=[], **effective_params({}))
    M.bind(con, M.modules_for(["collective_ranks", "clock_offsets", "step_phases", "activity_segments"]) + ["intervals"])
    for statement in con.extract_statements((ROOT / "tests" / "reference" / "collective_blocked.sql").read_text()):
        con.execute(statement)
    old = _rows(con, "_ref_collective_blocked")

    statements = [s.query for s in con.extract_statements(M.modules()["stragglers"].text)]
    (waits,) = [q for q in statements if "VIEW _collective_waits AS" in q]
    (view,) = [q for q in statements if "VIEW _collective_blocked AS" in q]
    assert len(WIDTH_RE.findall(view)) == 1
    con.execute(waits)                                # views: the shift below reaches them
    con.execute(view)
    assert _rows(con, "_collective_blocked") == old
    for width in WIDTHS:
        con.execute(WIDTH_RE.sub(f"width AS (SELECT {width}::BIGINT AS b)", view)
                    .replace("VIEW _collective_blocked AS", f"VIEW _blocked_{width} AS"))
    long = con.execute(f"SELECT count(*) FROM activity_segments WHERE n_compute > 0 AND dur_ns > {WIDTHS[0]}").fetchone()[0]
    assert long > 0                                   # the small width does cut segments into pieces
    assert len({r[0] for r in old}) >= 3 and any(r[4] > 0 for r in old)   # waits in several runs

    # the waits moved off the segments' edges (collective_ranks is a table: its arrivals stay), where
    # a segment a wait starts in may start in an earlier bucket
    con.execute(f"CREATE OR REPLACE TEMP TABLE clock_offsets AS "
                f"SELECT * REPLACE (coalesce(offset_ns, 0) + {SHIFT_NS} AS offset_ns) FROM clock_offsets")
    shifted = _rows(con, "_ref_collective_blocked")
    assert shifted != old
    for name in ["_collective_blocked"] + [f"_blocked_{width}" for width in WIDTHS]:
        assert _rows(con, name) == shifted, name
    con.close()
