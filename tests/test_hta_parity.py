"""HTA parity: on every GPU trace of ../shared/traces/external that HTA 0.5.0 itself can process,
our HTA-compatible views (traceanalyzer/analyses/sql/hta_compat.sql) give HTA's numbers, and our
default analyses differ from them exactly as tests/reference/DEVIATIONS.md says.

HTA's numbers come from tests/reference/hta_reference.json only (CI never builds or runs HTA). Each
trace set of the JSON is ingested as one run (the 8 DLRM ranks together, as HTA loaded them; a
file without distributedInfo gets the rank HTA gave it, 0 for the AMD trace). Sets where HTA's
temporal breakdown failed (cpu_only: no GPU event) are not compared; we check that we give no
row there either.

The rule, for every number compared: |ours - HTA| <= max(1 % of |HTA|, 0.05), where 0.05 is in
percentage points for percentages and in µs for times; HTA's null (NaN, no communication) must be
our null. Our percentages are compared unrounded (HTA's *_pctg are rounded to 2 decimals, which is
within the rule). The window HTA analysed (µs rounding on or off, last-step cut, rows kept) must
be equal, not close. Today every number is in fact equal up to float rounding (see DEVIATIONS.md).
"""
from __future__ import annotations

import hashlib
import json
import math
import re

import pandas as pd
import pytest
from conftest import ROOT, external_run_name

import traceanalyzer as ta
from traceanalyzer import analyses

REFERENCE = ROOT / "tests" / "reference"
REF = json.loads((REFERENCE / "hta_reference.json").read_text())
DEVIATIONS = REFERENCE / "DEVIATIONS.md"
REL, ABS = 0.01, 0.05


def run_name(trace_set: str) -> str:
    return external_run_name(trace_set)  # the runs of conftest.external_store


def _parity_cases() -> list[tuple[str, int]]:
    """(trace set, rank) for every rank whose temporal breakdown HTA computed."""
    return [(key, int(r)) for key, ts in REF["trace_sets"].items() for r, rr in ts.get("ranks", {}).items()
            if "error" not in rr["temporal_breakdown"]]


CASES = _parity_cases()
IDS = [f"{key}:r{rank}" for key, rank in CASES]


def close(ours, hta) -> bool:
    if hta is None or (isinstance(hta, float) and math.isnan(hta)):
        return ours is None or pd.isna(ours)
    return ours is not None and not pd.isna(ours) and abs(float(ours) - hta) <= max(REL * abs(hta), ABS)


def check(label: str, ours, hta, problems: list) -> None:
    if not close(ours, hta):
        problems.append(f"{label}: ours {ours} vs HTA {hta}")


@pytest.fixture(scope="module")
def con(external_store):
    """Every trace set of REF as one run (conftest.external_store: a file without distributedInfo.rank
    gets the rank HTA gave it; HTA's own fallback is 0)."""
    store, _ = external_store
    connection = ta.open(store)
    connection.execute("SET enable_progress_bar = false")
    return connection


@pytest.fixture(scope="module")
def ours(con) -> dict[str, pd.DataFrame]:
    """Everything compared, computed once: the HTA-compatible views through the public functions,
    the same without HTA's µs rounding, and our default analyses."""
    out = {
        "window": analyses.hta_window(con),
        "temporal": analyses.hta_temporal_breakdown(con),
        "overlap": analyses.hta_overlap(con),
        "kernel_stats": analyses.hta_kernel_stats(con),
    }
    # the connection now has the views (made once, as tables, for the parameters in force)
    out["kernel_type"] = con.sql("SELECT * FROM hta_kernel_type_breakdown").df()
    out["kernel_type_all"] = con.sql("SELECT * FROM hta_kernel_type_all_ranks").df()
    out["gpu_rows"] = con.sql("SELECT run, rank, kernel_type, count(*) AS n FROM hta_kernels GROUP BY ALL").df()
    out["temporal_unrounded"] = analyses.hta_temporal_breakdown(con, ns_rounding=False)
    out["overlap_unrounded"] = analyses.hta_overlap(con, ns_rounding=False)
    out["kernel_type_unrounded"] = analyses.hta_kernel_type_breakdown(con, ns_rounding=False)
    out["default_overlap"] = analyses.overlap(con)
    out["default_temporal"] = analyses.temporal_breakdown(con, per="rank")
    return out


def row(df: pd.DataFrame, key: str, rank: int) -> pd.Series:
    sel = df[(df["run"] == run_name(key)) & (df["rank"] == rank)]
    assert len(sel) == 1, f"{key} rank {rank}: {len(sel)} rows"
    return sel.iloc[0]


@pytest.mark.parametrize("key,rank", CASES, ids=IDS)
def test_window_is_htas(ours, key, rank):
    """Same µs rounding decision, same last-step cut, same GPU rows of each kernel type."""
    rr = REF["trace_sets"][key]["ranks"][str(rank)]
    hw, w = rr["hta_window"], row(ours["window"], key, rank)
    assert bool(w["rounds_to_us"]) == rr["fractional_us_timestamps"]
    assert bool(w["window_applied"]) == REF["trace_sets"][key]["load"]["last_iteration_filter"]["applied"]
    if hw["cut_ts_us"] is None:
        assert pd.isna(w["cut_ts_us"])
    else:
        assert w["cut_ts_us"] == hw["cut_ts_us"]
    g = ours["gpu_rows"]
    got = dict(g[(g["run"] == run_name(key)) & (g["rank"] == rank)][["kernel_type", "n"]].values)
    assert got == hw["gpu_rows_by_kernel_type"]
    assert sum(got.values()) == hw["gpu_rows_used"]


@pytest.mark.parametrize("key,rank", CASES, ids=IDS)
def test_temporal_breakdown_and_overlap_equal_htas(ours, key, rank):
    rr = REF["trace_sets"][key]["ranks"][str(rank)]
    problems: list[str] = []
    for variant, hta in (("", rr), ("_unrounded", REF["trace_sets"][key].get("without_ns_rounding", {})
                                                  .get("ranks", {}).get(str(rank)))):
        if hta is None:
            continue  # HTA's rerun without rounding exists only for files with fractional-µs timestamps
        t, tb = row(ours["temporal" + variant], key, rank), hta["temporal_breakdown"]
        for part in ("kernel", "idle", "compute", "non_compute"):
            check(f"{part}_time_us{variant}", t[f"{part}_time_us"], tb[f"{part}_time(us)"], problems)
            if part != "kernel":
                check(f"{part}_pct{variant}", t[f"{part}_pct"], tb[f"{part}_time_pctg"], problems)
        o = row(ours["overlap" + variant], key, rank)
        check(f"overlap_pct{variant}", o["overlap_pct"], hta["comm_comp_overlap"]["comp_comm_overlap_pctg_unrounded"],
              problems)
    assert not problems, problems


@pytest.mark.parametrize("key,rank", CASES, ids=IDS)
def test_kernel_type_breakdown_equals_htas(ours, key, rank):
    """Every Venn region (µs and %), per rank, with and without HTA's rounding. HTA may list a
    region of 0 µs (a zero-length segment between equal timestamps); we list only regions that last."""
    ts = REF["trace_sets"][key]
    problems: list[str] = []
    for variant, hta in (("", ts["ranks"][str(rank)]),
                         ("_unrounded", ts.get("without_ns_rounding", {}).get("ranks", {}).get(str(rank)))):
        if hta is None:
            continue
        kt = ours["kernel_type" + variant]
        kt = kt[(kt["run"] == run_name(key)) & (kt["rank"] == rank)].set_index("kernel_type")
        want = {d["kernel_type"]: d for d in hta["kernel_type_breakdown"]}
        assert set(kt.index) == {k for k, d in want.items() if d["sum_us"] > 0}, variant
        for region, d in want.items():
            check(f"{region}{variant} sum_us", kt["sum_us"].get(region, 0), d["sum_us"], problems)
            check(f"{region}{variant} %", kt["pct"].get(region, 0.0), d["percentage_unrounded"], problems)
    assert not problems, problems


@pytest.mark.parametrize("key", sorted({k for k, _ in CASES}))
def test_kernel_type_breakdown_all_ranks_equals_htas(ours, key):
    """HTA's public kernel-type table: the regions summed over the ranks of the trace set."""
    kt = ours["kernel_type_all"]
    kt = kt[kt["run"] == run_name(key)].set_index("kernel_type")
    problems: list[str] = []
    for d in REF["trace_sets"][key]["kernel_type_all_ranks"]:
        check(f"{d['kernel_type']} sum_us", kt["sum_us"].get(d["kernel_type"], 0), d["sum_us"], problems)
        check(f"{d['kernel_type']} %", kt["pct"].get(d["kernel_type"], 0.0), d["percentage_unrounded"], problems)
    assert not problems, problems


@pytest.mark.parametrize("key,rank", CASES, ids=IDS)
def test_kernel_table_equals_htas(ours, key, rank):
    """Per kernel type: the number of names and total µs; for HTA's top 20 names, count, sum,
    mean, min, max and std; the rest (names, µs, count). Long names are matched by their SHA-1."""
    ks = ours["kernel_stats"]
    ks = ks[(ks["run"] == run_name(key)) & (ks["rank"] == rank)]
    problems: list[str] = []
    for kernel_type, table in REF["trace_sets"][key]["ranks"][str(rank)]["kernel_table"].items():
        mine = ks[ks["kernel_type"] == kernel_type]
        records = mine.to_dict("records")
        by_name = {r["name"]: r for r in records}
        by_sha = {hashlib.sha1(r["name"].encode()).hexdigest(): r for r in records}
        assert len(mine) == table["n_kernel_names"], kernel_type
        check(f"{kernel_type} sum_us_all", mine["sum_us"].sum(), table["sum_us_all"], problems)
        for want in table["top"]:
            got = by_sha.get(want["name_sha1"]) if "name_sha1" in want else by_name.get(want["name"])
            assert got is not None, f"{kernel_type}: {want['name'][:80]} missing"
            assert got["count"] == want["count"], want["name"][:80]
            for stat in ("sum_us", "mean_us", "min_us", "max_us", "std_us"):
                check(f"{kernel_type} {want['name'][:60]} {stat}", got[stat], want[stat], problems)
        rest = mine[mine["rank_in_type"] > len(table["top"])]
        assert len(rest) == table["rest"]["n_kernel_names"], kernel_type
        assert rest["count"].sum() == table["rest"]["count"], kernel_type
        check(f"{kernel_type} rest sum_us", rest["sum_us"].sum(), table["rest"]["sum_us"], problems)
    assert not problems, problems


def test_public_function_with_run_all_ranks_and_no_rounding(con, ours):
    """hta_kernel_type_breakdown with a run filter, all_ranks and ns_rounding=False: on a
    one-file set, HTA's rerun without rounding (HTA_DISABLE_NS_ROUNDING=1)."""
    key = "tracelens/vllm_b200_rank0_nccl2275.json.gz"
    kt = analyses.hta_kernel_type_breakdown(con, run=run_name(key), all_ranks=True, ns_rounding=False)
    assert set(kt["run"]) == {run_name(key)}
    want = REF["trace_sets"][key]["without_ns_rounding"]["ranks"]["0"]["kernel_type_breakdown"]
    assert dict(zip(kt["kernel_type"], kt["sum_us"])) == {d["kernel_type"]: d["sum_us"] for d in want}


def test_no_numbers_where_hta_has_none(ours):
    """HTA's temporal breakdown fails on traces without GPU events (cpu_only); ours gives no row."""
    failed = [key for key, ts in REF["trace_sets"].items() for rr in ts.get("ranks", {}).values()
              if "error" in rr["temporal_breakdown"]]
    assert failed, "the reference has a set HTA could not process"
    for key in failed:
        assert run_name(key) not in set(ours["temporal"]["run"])
        assert run_name(key) not in set(ours["overlap"]["run"])


# -- our default analyses: how far from HTA, as DEVIATIONS.md documents it ----------------------

def _documented() -> dict[tuple[str, int], dict[str, float | None]]:
    """The parity table of DEVIATIONS.md: trace set, rank, then HTA / compat / default for
    overlap %, idle % and compute %."""
    text = DEVIATIONS.read_text()
    table = text.split("<!-- parity-table -->")[1].split("<!-- /parity-table -->")[0]
    out = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 11 or not cells[0].startswith("`"):
            continue
        nums = [None if c in ("n/a", "") else float(c) for c in cells[2:11]]
        names = [f"{m}_{w}" for m in ("overlap", "idle", "compute") for w in ("hta", "compat", "default")]
        out[(cells[0].strip("`"), int(cells[1]))] = dict(zip(names, nums))
    return out


def _default_numbers(ours) -> dict[tuple[str, str], tuple[float, float, float]]:
    """Our default per-rank figures: overlap (overlap_ranks) and temporal_breakdown(per="rank")
    (temporal_ranks): both swept over the rank's whole window, as HTA does."""
    tb = ours["default_temporal"].set_index(["run", "rank"])
    ov = ours["default_overlap"].set_index(["run", "rank"])["overlap_pct"]
    return {k: (ov.get(k), v["idle_pct"], v["compute_pct"]) for k, v in tb.iterrows()}


def test_default_analyses_deviate_as_documented(ours):
    """Every parity case is in DEVIATIONS.md's table, and its HTA, compat and default columns are
    today's numbers (2 decimals: within 0.01 pp). When a default analysis changes, this fails:
    update the table and explain the new deviation."""
    doc = _documented()
    assert set(doc) == set(CASES), f"DEVIATIONS.md table lacks or has extra rows: {set(CASES) ^ set(doc)}"
    defaults = _default_numbers(ours)
    stale = []
    for (key, rank), d in doc.items():
        rr = REF["trace_sets"][key]["ranks"][str(rank)]
        hta = (rr["comm_comp_overlap"]["comp_comm_overlap_pctg_unrounded"],
               rr["temporal_breakdown"]["idle_time_pctg"], rr["temporal_breakdown"]["compute_time_pctg"])
        t, o = row(ours["temporal"], key, rank), row(ours["overlap"], key, rank)
        compat = (o["overlap_pct"], t["idle_pct"], t["compute_pct"])
        default = defaults[(run_name(key), rank)]
        for i, metric in enumerate(("overlap", "idle", "compute")):
            for who, value in (("hta", hta[i]), ("compat", compat[i]), ("default", default[i])):
                want = d[f"{metric}_{who}"]
                same = (want is None and (value is None or pd.isna(value))) or \
                       (want is not None and value is not None and not pd.isna(value) and abs(value - want) <= 0.011)
                if not same:
                    stale.append(f"{key} r{rank} {metric} {who}: documented {want}, now {value}")
    assert not stale, "DEVIATIONS.md is stale:\n" + "\n".join(stale)


def test_deviations_doc_explains_every_cause():
    """Each cause named in the table's last column has its own section in DEVIATIONS.md."""
    text = DEVIATIONS.read_text()
    table = text.split("<!-- parity-table -->")[1].split("<!-- /parity-table -->")[0]
    causes = set(re.findall(r"\bD\d+\b", table))
    assert causes, "the table names no cause"
    for cause in causes:
        assert re.search(rf"^### {cause}\b", text, re.M), f"{cause} has no section"
