"""gloo collective matching from the trace alone, checked against the run's own Flight Recorder.

traces/coll_gloo_2rank: a real 2-rank gloo run calling every collective once per step (plus a
subgroup's all_reduce and broadcast, and a send/recv pair), shipped without its FR dumps; the dumps
lie in its fr_truth/ folder as rank<R>.fr.json.truth (a name no ingest takes for a dump). Ingested with them, every enqueue gets its (group, seq) from the FR
entry created inside its span; ingested without, matching must find the same (op, group, seq) and
the same execution span, from enqueue order, runloop threads and op names only.
"""
from __future__ import annotations

import shutil

import pytest
from conftest import TRACES

import traceanalyzer as ta

RUN = TRACES / "coll_gloo_2rank"
ROWS = """SELECT rank, exec_event_id, enqueue_event_id, op, exec_name, pg_name, seq, seq_source,
                 in_bytes, out_bytes FROM comms WHERE NOT is_p2p"""


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("coll")
    with_fr = tmp / "with_fr"
    with_fr.mkdir()
    for f in RUN.iterdir():
        if f.is_file():
            shutil.copy(f, with_fr / f.name)
    for f in (RUN / "fr_truth").glob("*.truth"):  # named so that no ingest of RUN picks them up
        shutil.copy(f, with_fr / f.name.removesuffix(".truth"))
    ta.ingest([with_fr], tmp / "fr", run="fr")
    ta.ingest([RUN], tmp / "nofr", run="nofr")
    return ta.open(tmp / "fr"), ta.open(tmp / "nofr")


def test_trace_only_matching_agrees_with_the_flight_recorder(stores):
    fr_con, con = stores
    truth = fr_con.sql(ROWS).df()
    got = con.sql(ROWS).df()
    assert set(got["seq_source"]) == {"order"} and got["pg_name"].notna().all()
    joined = truth[(truth["seq_source"] == "flight_recorder") & truth["enqueue_event_id"].notna()]
    # every enqueue of both ranks joined its FR entry: 15 collectives per step (14 on the default group + a
    # subgroup's 2; the send/recv pair is p2p) x 3 profiled steps, less the last step's subgroup ops and object
    # broadcast, whose FR entries lie outside the window's enqueue spans on this recording
    assert len(joined) >= 2 * 3 * 14
    m = joined.merge(got, on=["rank", "enqueue_event_id"], suffixes=("_fr", ""))
    assert len(m) == len(joined)
    # the same execution span, op and group; seq differs by one constant per (rank, group): the FR counts
    # from the group's first collective, the trace from the window's
    assert (m["exec_event_id_fr"] == m["exec_event_id"]).all()
    assert (m["op_fr"] == m["op"]).all() and (m["pg_name_fr"] == m["pg_name"]).all()
    offsets = (m["seq_fr"] - m["seq"]).groupby([m["rank"], m["pg_name"]]).nunique()
    assert (offsets == 1).all(), offsets
    # the FR's own entry at that (group, seq) names the span that ran it
    fr = fr_con.sql("SELECT rank, pg_name, collective_seq_id AS seq_fr, profiling_name FROM fr_entries").df()
    named = m.merge(fr, on=["rank", "seq_fr"], suffixes=("", "_entry"))
    named = named[named["pg_name_entry"] == named["pg_name"]]
    assert len(named) == len(m) and (named["profiling_name"] == named["exec_name"]).all()


def test_barrier_is_not_paired_with_the_object_broadcast(stores):
    _, con = stores
    barriers = con.sql("""SELECT rank, exec_name FROM comms WHERE op = 'barrier' AND enqueue_event_id IS NOT NULL""").df()
    assert len(barriers) == 2 * 3 and set(barriers["exec_name"]) == {"gloo:barrier"}
    # broadcast_object_list = a 1-element size broadcast, then the pickled object's: both run as broadcasts
    orphans = con.sql("""SELECT count(*) AS n FROM comms WHERE enqueue_event_id IS NULL AND exec_name = 'gloo:barrier'""").df()["n"][0]
    assert orphans == 0
    sizes = con.sql("""SELECT rank, in_bytes FROM comms WHERE op = 'broadcast' AND exec_name = 'gloo:broadcast'
                       AND in_bytes = 8""").df()  # the int64 size of the pickled object, once per step and rank
    assert len(sizes) == 2 * 3


def test_subgroup_collectives_get_their_own_group(stores):
    _, con = stores
    groups = con.sql("""SELECT rank, pg_name, count(*) AS n, list(DISTINCT op ORDER BY op) AS ops
                        FROM comms WHERE NOT is_p2p AND enqueue_event_id IS NOT NULL GROUP BY ALL ORDER BY ALL""").df()
    assert set(groups["pg_name"]) == {"0", "1"}
    sub = groups[groups["pg_name"] == "1"]
    assert list(sub["ops"].map(list)) == [["all_reduce", "broadcast"]] * 2 and (sub["n"] == 6).all()
    # the subgroup's runloop threads are not the default group's
    threads = con.sql("""SELECT rank, pg_name, list(DISTINCT exec_tid) AS tids FROM comms
                         WHERE NOT is_p2p AND exec_name LIKE 'gloo:%' GROUP BY ALL""").df()
    for rank, per in threads.groupby("rank"):
        a, b = (set(t) for t in per.sort_values("pg_name")["tids"])
        assert not a & b, rank


def test_split_at_gaps_places_a_group_with_an_idle_runloop_thread():
    """Rank 0 of this run: the subgroup's first runloop thread ran nothing in the window, so 3
    runloop threads show for 2 groups (consecutive ids per group)."""
    from traceanalyzer.ingest.comms import _split_at_gaps

    assert _split_at_gaps([11529, 11530, 11534], ["0", "1"]) == ["0", "0", "1"]
    assert _split_at_gaps([10, 14, 15], ["0", "1"]) == ["0", "1", "1"]


def test_list_collectives_have_bytes(stores):
    _, con = stores
    rows = con.sql("""SELECT op, exec_name, in_bytes, out_bytes FROM comms WHERE rank = 0 AND enqueue_event_id IS NOT NULL
                      AND op IN ('all_gather', 'gather', 'all_to_all', 'reduce_scatter')""").df()
    assert rows["in_bytes"].notna().all() and rows["out_bytes"].notna().all()
    # all_gather of a 2-rank group: the output is twice the input, the list form as the tensor form
    ag = rows[rows["op"] == "all_gather"]
    assert len(ag) == 6 and ((ag["out_bytes"] == 2 * ag["in_bytes"])).all()


def test_every_execution_has_its_fr_seq_and_the_trace_alone_finds_it(stores):
    """Executions without an enqueue of their own (the list reduce_scatter's second gloo:all_reduce)
    join the FR too, and no two collectives of a group share a seq, with or without the FR."""
    fr_con, con = stores
    for c in (fr_con, con):
        dup = c.sql("""SELECT rank, pg_name, seq, count(*) AS n FROM comms WHERE NOT is_p2p
                       GROUP BY ALL HAVING count(*) > 1""").df()
        assert dup.empty, dup
    truth = fr_con.sql(ROWS).df()
    assert set(truth["seq_source"]) == {"flight_recorder"}
    fr = fr_con.sql("SELECT rank, pg_name, collective_seq_id AS seq, profiling_name FROM fr_entries").df()
    named = truth.merge(fr, on=["rank", "pg_name", "seq"])
    assert len(named) == len(truth) and (named["profiling_name"] == named["exec_name"]).all()
    got = con.sql(ROWS).df()
    m = truth.merge(got, on=["rank", "exec_event_id"], suffixes=("_fr", ""))
    assert len(m) == len(truth) == len(got)
    assert (m["pg_name_fr"] == m["pg_name"]).all()
    assert ((m["seq_fr"] - m["seq"]).groupby([m["rank"], m["pg_name"]]).nunique() == 1).all()


def test_scatter_receiver_size_from_the_fr_dtype(stores):
    """The receiving rank of a gloo scatter records the element count (its output list) but no dtype:
    unknown from the trace alone (NULL, not 0), known with the FR entry's dtype."""
    fr_con, con = stores
    q = "SELECT in_bytes FROM comms WHERE op = 'scatter' AND rank = 1"
    assert con.sql(q).df()["in_bytes"].isna().all()
    assert (fr_con.sql(q).df()["in_bytes"] == 384 * 4).all()


def test_dp_groups_of_a_pp_x_dp_run_found_across_ranks(tmp_path):
    """traces/pp_1f1b_2x2_dp without its FR dumps: each rank is in 3 groups but only its DP group's
    runloop threads ran anything, so no trace alone names the group of its all_reduces; across the
    ranks exactly one group has every member running the same ones (coll_groups.py)."""
    src = TRACES / "pp_1f1b_2x2_dp"
    nofr = tmp_path / "nofr"
    nofr.mkdir()
    for f in src.iterdir():
        if not f.name.endswith(".fr.json"):
            shutil.copy(f, nofr / f.name)
    report = ta.ingest([nofr], tmp_path / "n", run="n")
    assert "warning" not in report.summary()
    ta.ingest([src], tmp_path / "f", run="f")
    q = "SELECT rank, exec_event_id, pg_name, pg_source, seq FROM comms WHERE NOT is_p2p"
    got, truth = ta.open(tmp_path / "n").sql(q).df(), ta.open(tmp_path / "f").sql(q).df()
    assert set(truth["pg_source"]) == {"flight_recorder"} and set(got["pg_source"]) == {"collective_match"}
    m = truth.merge(got, on=["rank", "exec_event_id"], suffixes=("_fr", ""))
    assert len(m) == len(truth) == len(got) == 12 and (m["pg_name_fr"] == m["pg_name"]).all()
    assert set(m["pg_name"]) == {"3", "4"}  # DP groups [0, 2] and [1, 3]
