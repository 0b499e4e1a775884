"""``traceanalyzer analyze``: run the analyses, save their results in the store, print them.

Results are saved as Parquet under ``STORE/_results/<analysis>/<run>.<generation>.parquet`` and
listed in the store manifest together with the results version and the parameters (thresholds)
used, so that reports, notebooks and CI read them without recomputing. Saving is atomic like
ingest: files first, then the manifest.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
from typing import Iterator

import pandas as pd
import pyarrow as pa

from .. import __version__
from .. import schema as S
from ..errors import TraceAnalyzerError
from ..store import files as st
from ..store import writers
from ..store.runs import resolve_run, store_runs
from . import PARAMETERS, prepare
from . import registry as R


def __getattr__(name):
    # views of the registry (analyses.registry), made when read so that registered analyses count
    if name == "QUERIES":  #: analysis name -> the SQL that produces its result table
        return {a.name: a.sql for a in R.analyses() if a.view}
    if name == "PRODUCERS":  #: analyses computed in Python: name -> f(con, run, cache) -> DataFrame
        return {a.name: a.producer for a in R.analyses() if a.producer is not None}
    if name == "ALL":
        return R.names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def query(con, name: str, run: str | None = None, **params):
    """The result of SQL analysis ``name`` as a lazy DuckDB relation over ``con`` (its modules bound,
    ``params`` set; defaults for the rest)."""
    a = R.get(name) if name in R.names() else None
    if a is None or a.view is None:
        sql_names = [x.name for x in R.analyses() if x.view]
        raise TraceAnalyzerError(f"no SQL analysis {name!r}" + (" (computed in Python)" if a is not None else "")
                                 + f"; SQL analyses: {', '.join(sql_names)}")
    prepare(con, views=[a.view], **params)
    return _select(con, a, run)


def _select(con, a, run: str | None):
    """Analysis ``a``'s rows (of ``run``) as a lazy relation; its modules must be bound in ``con``."""
    if run is None:
        return con.sql(a.sql)
    return con.sql(f"SELECT * FROM ({a.sql}) WHERE run = $run", params={"run": run})


def compute(con, run: str | None = None, only: list[str] | None = None, **params) -> dict[str, pd.DataFrame]:
    """Run the analyses on an open store connection; returns name -> DataFrame (schema columns)."""
    known = R.names()
    names = list(known) if not only else list(only)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise TraceAnalyzerError(f"unknown analysis: {', '.join(unknown)}; known: {', '.join(known)}")
    prepare(con, views=["pipeline_shape"], **params)
    where = "" if run is None else " WHERE run = $run"
    has_pipeline = con.execute(f"SELECT count(*) FROM pipeline_shape{where}",
                               {"run": run} if run is not None else {}).fetchone()[0] > 0
    # the pipeline views cost more than the others together: skipped without a pipeline (in the run)
    skip = {n for n in names if n.startswith("pipeline_") and n != "pipeline_shape" and not has_pipeline}
    views = [R.get(n).view for n in names if n not in skip and R.get(n).producer is None]
    if views:  # every module the SQL analyses read, bound once (not once per analysis)
        prepare(con, views=views, **params)
    out, cache = {}, {}
    for name in names:
        if name in skip:
            out[name] = S.RESULTS[name].arrow_schema.empty_table().to_pandas()
            continue
        a = R.get(name)
        df = a.producer(con, run, cache) if a.producer is not None else _select(con, a, run).df()
        out[name] = _conform(name, df)
    return out


def _conform(name: str, df: pd.DataFrame) -> pd.DataFrame:
    want = S.RESULTS[name].column_names
    if list(df.columns) != want:
        raise TraceAnalyzerError(f"internal: analysis {name} returned columns {list(df.columns)}, schema says {want}")
    return df


def save(store: str | os.PathLike, results: dict[str, pd.DataFrame], params: dict, runs: list[str]) -> None:
    """Write results into the store atomically: one file per analysis and run, for every run
    analysed (an empty result replaces an older non-empty one)."""
    store = st.location(store)
    if not st.writable(store):  # reading needs no write access: say it once, keep the results in hand
        import warnings

        from ..errors import StoreWarning
        warnings.warn(StoreWarning(f"{store}: the store is read-only: results not saved in it"), stacklevel=3)
        return
    tables = {name: pa.Table.from_pandas(df, schema=S.RESULTS[name].arrow_schema, preserve_index=False)
              for name, df in results.items()}

    def change(manifest):  # the replaced files are retired, not deleted: a reader may hold them
        gen = manifest.generation
        saved = manifest.extra.setdefault("results", {})
        for name, table in tables.items():
            entry = saved.setdefault(name, {"files": {}})
            if entry.get("version") != S.RESULTS_VERSION or entry.get("params") != params:
                # the entry's version and parameters are those of every file it lists: the other runs'
                # files, made by another version or with other parameters, are no longer its results
                entry["files"] = {r: f for r, f in entry["files"].items() if r in runs}
            for run in runs:
                rel = st.put_table(store, table.filter(pa.compute.equal(table["run"], run)),
                                   f"_results/{name}/{run}.{gen}")
                entry["files"][run] = rel
            entry.update(version=S.RESULTS_VERSION, params=params,
                         created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    writers.update(store, change)  # waits for another analyze's commit (store lock; remote: done again)


def analyze(store: str | os.PathLike, run: str | None = None, only: list[str] | None = None,
            save_results: bool = True, summaries: bool = True, dask=None, n_workers: int | None = None,
            **params) -> dict[str, pd.DataFrame]:
    """Run the analyses over ``store`` (all ranks), save them in it, and return them. With
    ``summaries`` (and a writable store) the rank-local views are computed rank by rank (on
    ``dask`` / ``n_workers``, :mod:`traceanalyzer.ingest.executor`; ``n_workers`` None: one process
    per CPU for a run larger than one map task, :func:`.summaries.map_plan`), saved, and read from there by
    the cross-rank ones (:mod:`.summaries`); a second call reuses them."""
    from . import connect
    con = connect(store, run=run)   # with a run: its files only (the reduce reads no other run's)
    try:
        runs = [resolve_run(con, run, where=store)] if run is not None else store_runs(con)
        results = None
        if summaries and save_results and st.writable(st.location(store)):
            from . import summaries as sm
            sm.ensure(store, runs, effective_params(params), dask=dask, n_workers=n_workers)
            if sm.attach(con, store, runs, effective_params(params)):  # the reduce: memory capped, spills
                sm.limit_memory(con, store)
                results = sm.under_cap(con, lambda: compute(con, run=run, only=only, **params))
        if results is None:
            results = compute(con, run=run, only=only, **params)
    finally:
        con.close()
    if save_results:
        save(store, results, effective_params(params), [run] if run is not None else runs)
    return results


def effective_params(params: dict) -> dict:
    return {k: params.get(k, default) for k, (default, _) in PARAMETERS.items()}


def to_json(results: dict[str, pd.DataFrame], params: dict) -> str:
    """One document for bots: keys from the schema module, with the schema versions."""
    return "".join(json_pieces(results, params))


#: result rows encoded at a time by :func:`json_pieces`
JSON_ROWS = 4096


def json_pieces(results: dict[str, pd.DataFrame], params: dict) -> Iterator[str]:
    """:func:`to_json`'s document (``json.dumps(doc, indent=1)``, the same text) in pieces of
    :data:`JSON_ROWS` rows: the Python objects of one piece in memory at a time, not the document's
    (~450 MB of text at 8,192 op-timeline ranks: made whole, ~4 GB more memory)."""
    head = json.dumps({"traceanalyzer": __version__, "store_schema_version": S.SCHEMA_VERSION,
                       "results_version": S.RESULTS_VERSION, "parameters": effective_params(params),
                       "results": {}}, indent=1)
    if not results:
        yield head
        return
    yield head[:-len("}\n}")]  # the document up to the results' opening brace
    for i, (name, df) in enumerate(results.items()):
        yield ("," if i else "") + "\n  " + json.dumps(name) + ": "
        yield from _json_records(df, depth=2)
    yield "\n }\n}"


def _json_records(df: pd.DataFrame, depth: int) -> Iterator[str]:
    """``df``'s rows as the list ``json.dumps(..., indent=1)`` writes at nesting ``depth``."""
    if df.empty:
        yield "[]"
        return
    inner = "\n" + " " * (depth + 1)
    for start in range(0, len(df), JSON_ROWS):
        rows = json.loads(df.iloc[start:start + JSON_ROWS].to_json(orient="records"))
        yield ("[" if start == 0 else ",") + ",".join(inner + json.dumps(r, indent=1).replace("\n", inner) for r in rows)
    yield "\n" + " " * depth + "]"


def _short(name, limit: int = 80) -> str:
    """A kernel or operator name cut to `limit` characters for one line of text (CUDA kernel names
    with their template arguments run to hundreds); the full name is in the result tables."""
    name = str(name)
    return name if len(name) <= limit else name[:limit - 1] + "…"


def _ms(ns) -> str:
    return "unknown" if ns is None or pd.isna(ns) else f"{ns / 1e6:.2f} ms"


def _na(v, unknown: str = "unknown") -> str:
    """A value for text: never 'nan' or '<NA>'."""
    return unknown if v is None or (not isinstance(v, str) and pd.isna(v)) else str(v)


def _pct(v) -> str:
    return "unknown %" if v is None or pd.isna(v) else f"{v:.1f}%"


def _where(r) -> str:
    """Where a straggler is slower: its phase, and the innermost named range holding the excess."""
    out = f"{_na(r.phase)} phase, {_ms(r.phase_excess_ns_per_step)} per step slower than its peers"
    if isinstance(r.annotation, str) and r.annotation:
        return out + f", in the range {_short(r.annotation)} (+{_ms(r.annotation_excess_ns_per_step)})"
    return out + ", named range unknown (no record_function range recorded in that phase)"


def format_text(results: dict[str, pd.DataFrame], params: dict) -> str:
    """A one-screen summary per run: findings first, then the context numbers."""
    p = effective_params(params)
    runs = sorted({r for df in results.values() if "run" in df for r in df["run"].unique()})
    lines = []
    for run in runs:
        lines.append(f"== run '{run}'")
        sel = {k: v[v["run"] == run] for k, v in results.items()}
        ph = sel.get("phases", pd.DataFrame())
        if not ph.empty:  # the one denominator of every '% of the step' (docs/metrics.md: step_ms)
            lines.append(f"median step {_ms(ph.groupby('step')['step_ns'].median().median())} (median over steps of "
                         f"the median over ranks); every '% of the step' below is of it")
        lines.append("(the analyses' candidates, by their thresholds; `traceanalyzer report` replays each one and keeps "
                     "only those worth acting on: a rank that only waited, or whose idealisation gives nothing back, "
                     "is dropped there)")
        if "stragglers" in sel:
            s = sel["stragglers"]
            if s.empty:
                lines.append(f"stragglers: none (no rank cost its peers >= {p['straggler_min_delay_pct']}% of a step "
                             f"while being >= {p['straggler_min_excess_pct']}% of a step slower in a phase or waiting that much "
                             f"longer for a CPU core)")
            for r in s.itertuples():
                lines.append(f"straggler #{r.rank_order}: rank {r.rank} costs its peers {_ms(r.delay_ns_per_step)} per step "
                             f"({_pct(r.delay_pct)} of the step), {r.pattern} ({r.steps_flagged}/{r.steps} steps); "
                             f"where: {_where(r)}")
        if "imbalance" in sel:
            im = sel["imbalance"]
            found = im[im["is_finding"]]
            if im.empty:
                pass
            elif found.empty:
                lines.append(f"imbalance: none (no rank computes >= {p['imbalance_min_ratio']}x the mean with more work)")
            for r in im[im["above_thresholds"].fillna(False) & im["same_work"].fillna(False)].itertuples():
                lines.append(f"  rank {r.rank} computes {r.ratio_to_mean:.2f}x the mean of the ranks on the same ops and "
                             f"input shapes: they ran slower (its core: slower, shared or busy with its own threads), not more work (same_work)")
            for r in found.itertuples():
                lines.append(f"imbalance #{r.rank_order}: rank {r.rank} computes {r.ratio_to_mean:.2f}x the mean of the ranks "
                             f"(+{_ms(r.excess_ns_per_step)} per step, {r.excess_pct:.1f}% of the step)")
            ops = sel.get("imbalance_ops", pd.DataFrame())
            ops = ops[ops["category"] == "compute"] if not ops.empty else ops
            if not found.empty and not ops.empty:
                o = ops.iloc[0]
                lines.append(f"  most unbalanced op: {o['name']} ({o['category']}): rank {o['max_rank']} spends "
                             f"{o['max_over_mean']:.2f}x the mean (+{_ms(o['excess_ns_per_step'])} per step)")
        if "pipeline_shape" in sel and not sel["pipeline_shape"].empty:
            sh = sel["pipeline_shape"].iloc[0]
            b = sel.get("pipeline_bubbles", pd.DataFrame())
            measured = f", measured {b['bubble_pct'].median():.1f}% idle per stage (median)" if not b.empty else ""
            n_pipes = len(sel["pipeline_shape"])  # PP x DP: one pipeline per replica (the first is shown)
            many = f"{n_pipes} pipelines (first: ranks from {sh.pipeline_id}), each " if n_pipes > 1 else ""
            lines.append(f"pipeline: {many}{sh.n_stages} stages x {sh.stages_per_rank}, {sh.microbatches:g} micro-batches, "
                         f"{sh.schedule}: theoretical bubble {sh.theoretical_bubble_pct:.1f}%{measured}")
            slow = sel.get("pipeline_slow_stages", pd.DataFrame())
            slow = slow[slow["is_finding"]] if not slow.empty else slow
            if slow.empty:
                lines.append(f"slow stage: none (no stage's own time exceeds the others' by >= {p['slow_stage_min_excess_pct']}% of a step)")
            for r in slow.itertuples():
                lines.append(f"slow stage #{r.rank_order}: stage {r.stage} (rank {r.rank}) spends {_ms(r.excess_ns_per_step)} "
                             f"more of its own time per step than the others ({r.excess_pct:.1f}% of the step); "
                             f"the others stalled {_ms(r.stall_caused_ns_per_step)} per step waiting on it")
        a2a = sel.get("all_to_all_balance", pd.DataFrame())
        for r in (a2a[a2a["is_finding"]].itertuples() if not a2a.empty else ()):
            lines.append(f"all_to_all imbalance #{r.rank_order}: rank {r.rank} receives {r.recv_over_mean:.2f}x and sends "
                         f"{r.sent_over_mean:.2f}x the mean bytes of the ranks (MoE routing skew)")
        if "overlap" in sel and sel["overlap"]["overlap_pct"].notna().any():
            o = sel["overlap"].dropna(subset=["overlap_pct"])
            lines.append(f"overlap: {o['overlap_pct'].mean():.1f}% of communication overlapped on average "
                         f"(min rank {int(o.loc[o['overlap_pct'].idxmin(), 'rank'])}: {o['overlap_pct'].min():.1f}%); "
                         f"exposed {_ms(o['exposed_ns'].sum() / max(len(o), 1))} per rank in the window")
        elif "overlap" in sel and not sel["overlap"].empty:
            lines.append("overlap: n/a (unknown: an op timeline records no kernels, so not how communication overlapped "
                         "GPU work)")
        if "exposed_comm" in sel and not sel["exposed_comm"].empty:
            for r in sel["exposed_comm"].head(3).itertuples():
                lines.append(f"  exposed #{r.rank_order}: rank {r.rank} step {_na(r.step)}: {_ms(r.exposed_ns)} of {r.op} "
                             f"(pg {_na(r.pg)}, seq {_na(r.seq, 'unknown: p2p ops have none')}, {_na(r.bytes)} bytes) "
                             f"after {_short(_na(r.compute_before))}")
        if "collectives" in sel and not sel["collectives"].empty:
            c = sel["collectives"]
            last = c["last_arriver"].value_counts()
            lines.append(f"collectives: {len(c)} joined across ranks ({int((~c['complete']).sum())} incomplete); "
                         f"median arrival skew {_ms(c['arrival_skew_ns'].median())}; most often last: rank {last.index[0]} "
                         f"({last.iloc[0]} times)")
        if "critical_path_summary" in sel and not sel["critical_path_summary"].empty:
            cp = sel["critical_path_summary"].groupby(["rank", "label"])["path_ns"].sum().sort_values(ascending=False)
            total = cp.sum()
            top = ", ".join(f"rank {r} {lab} {100 * v / total:.0f}%" for (r, lab), v in cp.head(3).items())
            lines.append(f"critical path (all steps): {top}")
        if "temporal_ranks" in sel and not sel["temporal_ranks"].empty:
            t = sel["temporal_ranks"]
            lines.append("time: compute {:.1f}%, exposed comm {:.1f}%, memory {:.1f}%, idle {:.1f}% (mean over ranks)".format(
                t["compute_pct"].mean(), t["comm_pct"].mean(), t["memory_pct"].mean(), t["idle_pct"].mean()))
        lines.append("")
    return "\n".join(lines).rstrip()
