"""Run Holistic Trace Analysis (HTA) 0.5.0 on the external traces and write its numbers to JSON.

Run with the separate HTA venv (HTA is never a dependency of traceanalyzer), from the repo root:

    nice -n 10 /work/hta-venv/bin/python tests/reference/make_hta_reference.py

(create the venv with benchmarks/setup_hta_venv.sh if it is missing). Output:
tests/reference/hta_reference.json. The tests only read that JSON; CI never builds HTA.

What is recorded, per trace set (one temp folder handed to ``TraceAnalysis(trace_dir=...)``:
one file per folder, except the folders in --together, whose files form one multi-rank set)
and per rank: see HTA_DEFINITIONS.md for how HTA computes each number. Every HTA call is
wrapped: on failure the JSON holds ``{"error": {"type", "message", "where"}}`` instead.

Besides HTA's public results the script records, clearly labelled, a few *diagnostics* read
from HTA's own loaded DataFrame (the window HTA analysed, rows it used), the overlap ratio
before HTA's rounding, per-rank kernel-type sums for multi-rank sets (HTA only returns the
sum over all ranks), and, for traces with fractional-microsecond timestamps, the same core
numbers with HTA's ns-rounding disabled (HTA_DISABLE_NS_ROUNDING=1), to size that effect.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gzip
import importlib.metadata as _md
import json
import logging
import os
import platform
import re
import shlex
import sys
import tempfile
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

# HTA's default behaviour must be used for the main results.
os.environ.pop("HTA_DISABLE_NS_ROUNDING", None)
warnings.simplefilter("ignore")

import hta.analyzers.communication_analysis as _comm_mod  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from hta.analyzers.breakdown_analysis import BreakdownAnalysis  # noqa: E402
from hta.common.trace import Trace  # noqa: E402
from hta.common.trace_filter import CPUOperatorFilter  # noqa: E402
from hta.trace_analysis import TraceAnalysis  # noqa: E402
from hta.utils.utils import get_kernel_type  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DEFAULT_EXTERNAL = Path("/work/shared/traces/external")
DEFAULT_OUT = Path(__file__).resolve().parent / "hta_reference.json"

TOP_KERNELS = 20  # per (rank, kernel type) in the per-kernel table
NAME_MAX = 240  # longer kernel names are cut (full length and sha1 kept)
IDLE_DELAY = 30  # HTA's default consecutive_kernel_delay (trace time units, i.e. us)
RUNTIME_CUTOFF = 50  # HTA defaults of get_cuda_kernel_launch_stats (us)
LAUNCH_DELAY_CUTOFF = 100


# --------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------
def _py(v: Any, nd: int = 6) -> Any:
    """numpy/pandas scalar -> JSON-able python; floats rounded to nd decimals."""
    if v is None:
        return None
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.bool_, bool)):
        return bool(v)
    if isinstance(v, (np.floating, float)):
        f = float(v)
        if np.isnan(f):
            return None
        if np.isinf(f):
            return "inf" if f > 0 else "-inf"
        if f == int(f) and abs(f) < 2**53:
            return int(f)
        return round(f, nd)
    if isinstance(v, (np.ndarray, list, tuple)):
        return [_py(x, nd) for x in v]
    return v


def _err(e: BaseException) -> Dict[str, Any]:
    msg = str(e).strip().splitlines()
    where = ""
    for fr in reversed(traceback.extract_tb(e.__traceback__)):
        if "/hta/" in fr.filename or "/pandas/" in fr.filename:
            p = fr.filename
            p = p[p.index("/hta/") + 1 :] if "/hta/" in p else p[p.index("/pandas/") + 1 :]
            where = f"{p}:{fr.lineno}"
            if "/hta/" in fr.filename:
                break
    return {
        "error": {
            "type": type(e).__name__,
            "message": (msg[0][:300] if msg else ""),
            "where": where,
        }
    }


def _call(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - we record every failure
        return _err(e)


def _short_name(name: str) -> Dict[str, Any]:
    if len(name) <= NAME_MAX:
        return {"name": name}
    import hashlib

    return {
        "name": name[:NAME_MAX] + "…",
        "name_len": len(name),
        "name_sha1": hashlib.sha1(name.encode()).hexdigest(),
    }


class _WarnCollector(logging.Handler):
    """Keeps HTA's WARNING+ log lines (minus its timing chatter)."""

    NOISE = ("Parsed", "Overall parsing", "leaving ", "Rounding down ns")

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.msgs: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        m = record.getMessage().strip().splitlines()[0][:240] if record.getMessage() else ""
        if m.startswith(self.NOISE):
            if m.startswith("Rounding down ns") and "Rounding down ns-resolution timestamps" not in self.msgs:
                self.msgs.append("Rounding down ns-resolution timestamps")
            return
        if m not in self.msgs and len(self.msgs) < 12:
            self.msgs.append(m)


# --------------------------------------------------------------------------------------
# capture what HTA's last-iteration filter did (wraps, does not change, HTA's method)
# --------------------------------------------------------------------------------------
_ORIG_FILTER = Trace._filter_irrelevant_gpu_kernels


def _filter_wrapper(self: Trace, include_last_profiler_step: Optional[bool] = False) -> None:
    sym = self.symbol_table.get_sym_id_map()
    table = self.symbol_table.get_sym_table()
    ps_ids = [v for k, v in sym.items() if "ProfilerStep" in k]
    info: Dict[str, Any] = {
        "profiler_step_symbols": sorted(k for k in sym if "ProfilerStep" in k),
        "applied": len(ps_ids) >= 2,
        "ranks": {},
    }
    for rank, df in self.traces.items():
        cpu = CPUOperatorFilter()(df, self.symbol_table)
        steps = cpu[cpu["name"].isin(ps_ids)].sort_values("ts")
        info["ranks"][rank] = {
            "profiler_steps": [
                {
                    "name": table[int(r.name)],
                    "cat": table[int(r.cat)],
                    "ts_us": _py(r.ts + self.min_ts),
                    "dur_us": _py(r.dur),
                }
                for r in steps.itertuples()
            ],
            # HTA's cut (start of the last ProfilerStep); only used when "applied"
            "cut_ts_us": _py(steps["ts"].max() + self.min_ts) if len(steps) and len(ps_ids) >= 2 else None,
            "rows_before": int(len(df)),
            "gpu_rows_before": int(df["stream"].ne(-1).sum()),
        }
    _ORIG_FILTER(self, include_last_profiler_step)
    for rank, df in self.traces.items():
        info["ranks"][rank]["rows_after"] = int(len(df))
        info["ranks"][rank]["gpu_rows_after"] = int(df["stream"].ne(-1).sum())
    self._hta_ref_filter_info = info  # type: ignore[attr-defined]


Trace._filter_irrelevant_gpu_kernels = _filter_wrapper  # type: ignore[assignment]


# --------------------------------------------------------------------------------------
# the HTA calls
# --------------------------------------------------------------------------------------
def _temporal(ta: TraceAnalysis) -> Dict[int, Any]:
    df = ta.get_temporal_breakdown(visualize=False)
    return {int(r["rank"]): {k: _py(v) for k, v in r.items() if k != "rank"} for r in df.to_dict("records")}


def _overlap(ta: TraceAnalysis) -> Dict[int, Any]:
    df = ta.get_comm_comp_overlap(visualize=False)
    out = {int(r["rank"]): {"comp_comm_overlap_pctg": _py(r["comp_comm_overlap_pctg"])} for r in df.to_dict("records")}
    # The same HTA function with its final round(…, 2) neutralised, to get the ratio itself.
    _comm_mod.round = lambda x, nd=None: x  # type: ignore[attr-defined]
    try:
        raw = ta.get_comm_comp_overlap(visualize=False)
    finally:
        del _comm_mod.round
    for r in raw.to_dict("records"):
        out[int(r["rank"])]["comp_comm_overlap_pctg_unrounded"] = _py(r["comp_comm_overlap_pctg"], 9)
    return out


def _kernel_type_rows(df: pd.DataFrame) -> List[Dict[str, Any]]:
    total = df["sum"].sum()
    return [
        {
            "kernel_type": r["kernel_type"],
            "sum_us": _py(r["sum"]),
            "percentage": _py(r["percentage"]) if "percentage" in r else None,
            "percentage_unrounded": _py(100.0 * r["sum"] / total, 9) if total else None,
        }
        for r in df.to_dict("records")
    ]


def _kernel_breakdown(ta: TraceAnalysis) -> Dict[str, Any]:
    # num_kernels huge + duration_ratio 1.0: HTA's aggregation into "others" never triggers, so
    # every row is the exact groupby(name)["dur"].agg([sum,max,min,mean,std]) of HTA.
    type_df, kern_df = ta.get_gpu_kernel_breakdown(
        visualize=False, duration_ratio=1.0, num_kernels=10**9, include_memory_kernels=True
    )
    per_rank: Dict[int, Dict[str, Any]] = {}
    for (rank, ktype), g in kern_df.groupby(["rank", "kernel_type"]):
        g = g.sort_values("sum (us)", ascending=False)
        top, rest = g.iloc[:TOP_KERNELS], g.iloc[TOP_KERNELS:]
        rows = []
        for r in top.to_dict("records"):
            row = _short_name(r["name"])
            row.update(
                count=int(round(r["sum (us)"] / r["mean (us)"])) if r["mean (us)"] else None,
                sum_us=_py(r["sum (us)"]),
                mean_us=_py(r["mean (us)"], 4),
                min_us=_py(r["min (us)"]),
                max_us=_py(r["max (us)"]),
                std_us=_py(r["stddev"], 4),
            )
            rows.append(row)
        per_rank.setdefault(int(rank), {})[ktype] = {
            "n_kernel_names": int(len(g)),
            "sum_us_all": _py(g["sum (us)"].sum()),
            "top": rows,
            "rest": {
                "n_kernel_names": int(len(rest)),
                "sum_us": _py(rest["sum (us)"].sum()),
                "count": int(sum(round(s / m) for s, m in zip(rest["sum (us)"], rest["mean (us)"]) if m)),
            },
        }
    return {"kernel_type_all_ranks": _kernel_type_rows(type_df), "per_rank_tables": per_rank}


def _kernel_type_per_rank(ta: TraceAnalysis) -> Dict[int, Any]:
    """HTA's own helper on each rank alone (get_gpu_kernel_breakdown, lines 79-92, before it
    sums over ranks)."""
    t = ta.t
    sym_table = t.symbol_table.get_sym_table()
    out: Dict[int, Any] = {}
    for rank, trace_df in t.traces.items():
        gk = trace_df[trace_df["stream"].ne(-1)].copy()
        gk["kernel_type"] = gk[["name"]].apply(lambda x: get_kernel_type(sym_table[x["name"]]), axis=1)
        gk["name"] = gk["name"].apply(lambda x: sym_table[x])
        df = BreakdownAnalysis._get_gpu_kernel_type_time(gk, ["COMPUTATION", "COMMUNICATION", "MEMORY"])
        df = df.sort_values("sum", ascending=False, ignore_index=True)
        df["percentage"] = (100 * df["sum"] / df["sum"].sum()).round(1)
        out[int(rank)] = _kernel_type_rows(df)
    return out


def _idle(ta: TraceAnalysis, rank: int) -> Dict[str, Any]:
    res, stats = ta.get_idle_time_breakdown(
        ranks=[rank], visualize=False, show_idle_interval_stats=True, consecutive_kernel_delay=IDLE_DELAY
    )
    rows = [
        {
            "stream": _py(r["stream"]),
            "idle_category": r["idle_category"],
            "idle_time_us": _py(r["idle_time"]),
            "idle_time_ratio": _py(r["idle_time_ratio"]),
        }
        for r in res.to_dict("records")
    ]
    st = []
    if stats is not None:
        for cat, r in stats.iterrows():
            st.append(
                {
                    "stream": _py(r["stream"]),
                    "idle_category": str(cat),
                    **{k: _py(r[k], 2) for k in ("count", "mean", "std", "min", "25%", "50%", "75%", "max")},
                }
            )
    return {"consecutive_kernel_delay": IDLE_DELAY, "rows": rows, "interval_stats": st}


def _launch(ta: TraceAnalysis, rank: int) -> Dict[str, Any]:
    d = ta.get_cuda_kernel_launch_stats(
        ranks=[rank], runtime_cutoff=RUNTIME_CUTOFF, launch_delay_cutoff=LAUNCH_DELAY_CUTOFF, visualize=False
    )
    df = d[rank]
    out: Dict[str, Any] = {
        "runtime_cutoff_us": RUNTIME_CUTOFF,
        "launch_delay_cutoff_us": LAUNCH_DELAY_CUTOFF,
        "count": int(len(df)),
    }
    if len(df) == 0:
        return out
    for col in ("cpu_duration", "gpu_duration", "launch_delay"):
        s = df[col].astype(float)
        out[col] = {
            "sum": _py(s.sum()),
            "mean": _py(s.mean(), 4),
            "median": _py(s.median()),
            "p95": _py(s.quantile(0.95), 4),
            "min": _py(s.min()),
            "max": _py(s.max()),
        }
    # the three sets HTA's visualisation plots (cuda_kernel_analysis.py:363-368)
    out["n_short_gpu_kernels"] = int(((df.cpu_duration <= RUNTIME_CUTOFF) & (df.gpu_duration < df.cpu_duration)).sum())
    out["n_runtime_outliers"] = int((df.cpu_duration > RUNTIME_CUTOFF).sum())
    out["n_launch_delay_outliers"] = int((df.launch_delay > LAUNCH_DELAY_CUTOFF).sum())
    return out


def _queue(ta: TraceAnalysis, rank: int) -> Any:
    df = ta.get_queue_length_summary(ranks=[rank])
    if df is None:
        return {"result": None}
    df = df.copy()
    df.columns = [c[1] if isinstance(c, tuple) else c for c in df.columns]
    rows = []
    for (rk, stream), r in df.iterrows():
        rows.append({"stream": _py(stream), **{k: _py(r[k], 4) for k in df.columns}})
    return {"per_stream": rows}


def _diagnostics(ta: TraceAnalysis, rank: int) -> Dict[str, Any]:
    """What HTA analysed for this rank: rows of its loaded frame with stream != -1 (the set
    used by the temporal/kernel/overlap analyses), in the original trace's time base."""
    t = ta.t
    sym = t.symbol_table.get_sym_table()
    df = t.traces[rank]
    g = df[df["stream"].ne(-1)]
    d: Dict[str, Any] = {
        "rows": int(len(df)),
        "gpu_rows_used": int(len(g)),
        "duplicate_index_rows": int(df.index.duplicated().sum()),
    }
    if len(g):
        end = g["ts"] + g["dur"]
        d.update(
            gpu_rows_by_cat={sym[int(c)]: int(n) for c, n in g["cat"].value_counts().items()},
            gpu_rows_by_kernel_type={k: int(n) for k, n in g["name"].map(lambda x: get_kernel_type(sym[x])).value_counts().items()},
            streams=sorted(int(s) for s in g["stream"].unique()),
            first_gpu_ts_us=_py(g["ts"].min() + t.min_ts),
            last_gpu_end_us=_py(end.max() + t.min_ts),
            gpu_rows_dur_negative=int((g["dur"] < 0).sum()),
            gpu_rows_dur_zero=int((g["dur"] == 0).sum()),
            ts_dtype=str(g["ts"].dtype),
            dur_dtype=str(g["dur"].dtype),
        )
        other = sorted({sym[x] for x in g["name"].unique() if get_kernel_type(sym[x]) == "OTHER"})
        if other:
            d["other_type_names"] = [n[:120] for n in other[:10]]
    return d


# --------------------------------------------------------------------------------------
# per trace set
# --------------------------------------------------------------------------------------
def _raw_info(path: Path) -> Dict[str, Any]:
    with gzip.open(path, "rb") as fh:
        d = json.load(fh)
    ev = d.get("traceEvents", [])
    frac = any(isinstance(e.get("ts"), float) and not float(e["ts"]).is_integer() for e in ev)
    di = d.get("distributedInfo") or {}
    # HTA's own rank discovery (hta/common/trace_file.py:45-73): first match of this regex in
    # the file text, else rank 0 with a warning.
    m = None
    with gzip.open(path, "rt", errors="replace") as fh:
        for line in fh:
            m = re.search(r'"rank":\s+(\d+)', line)
            if m:
                break
    return {
        "hta_rank_source": f"HTA rank regex matched: {m.group(1)}" if m else "no match: HTA default rank 0",
        "distributedInfo_rank": di.get("rank"),
        "distributedInfo_world_size": di.get("world_size"),
        "n_trace_events": len(ev),
        "fractional_us_timestamps": frac,
    }


def _load(folder: str, collector: _WarnCollector) -> TraceAnalysis:
    collector.msgs.clear()
    return TraceAnalysis(trace_dir=folder)


def run_set(key: str, files: List[Path], external: Path, collector: _WarnCollector) -> Dict[str, Any]:
    t0 = _dt.datetime.now()
    out: Dict[str, Any] = {"files": [str(f.relative_to(external)) for f in files]}
    raw = {str(f.relative_to(external)): _raw_info(f) for f in files}
    with tempfile.TemporaryDirectory(prefix="hta_ref_") as tmp:
        for f in files:
            os.symlink(f, os.path.join(tmp, f.name))
        try:
            ta = _load(tmp, collector)
        except Exception as e:  # noqa: BLE001
            out["load"] = _err(e)
            out["hta_log_warnings"] = list(collector.msgs)
            return out
        t = ta.t
        name_of = {os.path.realpath(p): str(Path(os.path.realpath(p)).relative_to(external)) for p in t.trace_files.values()}
        rank_file = {int(r): name_of[os.path.realpath(p)] for r, p in t.trace_files.items()}
        out["load"] = {
            "ok": True,
            "hta_rank_of_file": {v: k for k, v in rank_file.items()},
            "files_not_loaded": sorted(set(out["files"]) - set(rank_file.values())),
            "min_ts_us": _py(t.min_ts),
            "last_iteration_filter": {
                k: v for k, v in getattr(t, "_hta_ref_filter_info", {}).items() if k != "ranks"
            },
        }
        filt = getattr(t, "_hta_ref_filter_info", {"ranks": {}})["ranks"]

        temporal = _call(lambda: _temporal(ta))
        overlap = _call(lambda: _overlap(ta))
        kb = _call(lambda: _kernel_breakdown(ta))
        kt_rank = _call(lambda: _kernel_type_per_rank(ta))
        out["kernel_type_all_ranks"] = kb.get("kernel_type_all_ranks", kb) if "error" not in kb else kb

        ranks: Dict[str, Any] = {}
        for rank in sorted(t.traces):
            rel = rank_file[rank]
            r: Dict[str, Any] = {"file": rel, **raw[rel]}
            r["hta_window"] = {**filt.get(rank, {}), **_call(lambda: _diagnostics(ta, rank))}
            r["temporal_breakdown"] = temporal if "error" in temporal else temporal.get(rank)
            r["comm_comp_overlap"] = overlap if "error" in overlap else overlap.get(rank)
            r["kernel_type_breakdown"] = kt_rank if "error" in kt_rank else kt_rank.get(rank)
            r["kernel_table"] = kb if "error" in kb else kb["per_rank_tables"].get(rank, {})
            r["idle_time_breakdown"] = _call(lambda: _idle(ta, rank))
            r["cuda_kernel_launch_stats"] = _call(lambda: _launch(ta, rank))
            r["queue_length_summary"] = _call(lambda: _queue(ta, rank))
            ranks[str(rank)] = r
        out["ranks"] = ranks
        out["hta_log_warnings"] = list(collector.msgs)

        # Sensitivity: same core numbers without HTA's ns rounding (only where it matters).
        if any(v["fractional_us_timestamps"] for v in raw.values()):
            os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"
            try:
                ta2 = TraceAnalysis(trace_dir=tmp)
                tb2 = _call(lambda: _temporal(ta2))
                ov2 = _call(lambda: _overlap(ta2))
                kt2 = _call(lambda: _kernel_type_per_rank(ta2))
                out["without_ns_rounding"] = {
                    "note": "diagnostic only: HTA rerun with HTA_DISABLE_NS_ROUNDING=1 (not HTA's default)",
                    "ranks": {
                        str(rk): {
                            "temporal_breakdown": tb2 if "error" in tb2 else tb2.get(rk),
                            "comm_comp_overlap": ov2 if "error" in ov2 else ov2.get(rk),
                            "kernel_type_breakdown": kt2 if "error" in kt2 else kt2.get(rk),
                        }
                        for rk in sorted(ta2.t.traces)
                    },
                }
            except Exception as e:  # noqa: BLE001
                out["without_ns_rounding"] = _err(e)
            finally:
                os.environ.pop("HTA_DISABLE_NS_ROUNDING", None)
    out["seconds"] = round((_dt.datetime.now() - t0).total_seconds(), 1)
    return out


def _summary(ts: Dict[str, Any]) -> Dict[str, Any]:
    calls = [
        "temporal_breakdown",
        "kernel_type_breakdown",
        "kernel_table",
        "comm_comp_overlap",
        "idle_time_breakdown",
        "cuda_kernel_launch_stats",
        "queue_length_summary",
    ]
    s: Dict[str, Any] = {}
    for key, v in ts.items():
        if "error" in v.get("load", {}):
            s[key] = {"load": "error: " + v["load"]["error"]["type"]}
            continue
        row: Dict[str, Any] = {"load": "ok"}
        for c in calls:
            st = set()
            for r in v["ranks"].values():
                x = r.get(c)
                if isinstance(x, dict) and "error" in x:
                    st.add("error: " + x["error"]["type"])
                elif not x or (c == "comm_comp_overlap" and x.get("comp_comm_overlap_pctg") is None):
                    st.add("ok, empty/NaN")
                elif c == "cuda_kernel_launch_stats" and x.get("count") == 0:
                    st.add("ok, 0 launches")
                elif c == "queue_length_summary" and x.get("result", 1) is None:
                    st.add("ok, None")
                else:
                    st.add("ok")
            row[c] = "/".join(sorted(st))
        s[key] = row
    return s


def _dumps(obj: Any, ind: str = "") -> str:
    """JSON with one line per small object/list (<= 160 chars), indented otherwise."""
    flat = json.dumps(obj, ensure_ascii=False)
    if len(flat) <= 160 or not isinstance(obj, (dict, list)) or not obj:
        return flat
    sub = ind + " "
    if isinstance(obj, dict):
        items = [f"{sub}{json.dumps(k, ensure_ascii=False)}: {_dumps(v, sub)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + ind + "}"
    items = [sub + _dumps(v, sub) for v in obj]
    return "[\n" + ",\n".join(items) + "\n" + ind + "]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--external", type=Path, default=DEFAULT_EXTERNAL)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument(
        "--together",
        nargs="*",
        default=["param_dlrm_8rank"],
        help="sub-folders whose files are loaded together as one multi-rank set",
    )
    ap.add_argument("--only", nargs="*", default=None, help="only these set keys (debugging)")
    args = ap.parse_args()
    external = args.external.resolve()

    hta_logger = logging.getLogger("hta")
    for h in hta_logger.handlers:
        h.setLevel(logging.ERROR)
    collector = _WarnCollector()
    hta_logger.addHandler(collector)

    sets: Dict[str, List[Path]] = {}
    for sub in sorted(p for p in external.iterdir() if p.is_dir()):
        files = sorted(sub.glob("*.json.gz")) + sorted(sub.glob("*.json"))
        if not files:
            continue
        if sub.name in args.together:
            sets[sub.name + "/"] = files
        else:
            for f in files:
                sets[str(f.relative_to(external))] = [f]
    if args.only:
        sets = {k: v for k, v in sets.items() if k in args.only}

    results: Dict[str, Any] = {}
    for key, files in sets.items():
        print(f"[hta-ref] {key} ({len(files)} file(s))", file=sys.stderr, flush=True)
        results[key] = run_set(key, files, external, collector)
        print(f"[hta-ref]   done in {results[key].get('seconds')} s", file=sys.stderr, flush=True)

    file_index = {}
    for key, v in results.items():
        for rk, r in v.get("ranks", {}).items():
            file_index[r["file"]] = {"trace_set": key, "hta_rank": int(rk)}
        for f in v["files"]:
            file_index.setdefault(f, {"trace_set": key, "hta_rank": None})

    cmd = "nice -n 10 /work/hta-venv/bin/python " + " ".join(
        shlex.quote(str(Path(a).resolve().relative_to(REPO)) if i == 0 else a) for i, a in enumerate(sys.argv)
    )
    doc = {
        "meta": {
            "command": cmd,
            "run_from": "repository root",
            "date_utc": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
            "holistictraceanalysis": _md.version("holistictraceanalysis"),
            "pandas": pd.__version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
            "external_folder": str(args.external),
            "trace_sets_loaded_together": args.together,
            "hta_env": {"HTA_DISABLE_NS_ROUNDING": "unset (HTA default: fractional-us timestamps rounded inward)"},
            "units": (
                "all times in microseconds (us), the Kineto trace time unit; HTA's own column names "
                "say (us) although get_temporal_breakdown's docstring says ns. *_ts_us values are in "
                "the original trace's time base. Percentages are 0-100."
            ),
            "hta_call_parameters": {
                "TraceAnalysis": "TraceAnalysis(trace_dir=<temp folder of symlinks>) (include_last_profiler_step=False)",
                "get_temporal_breakdown": "visualize=False",
                "get_comm_comp_overlap": "visualize=False",
                "get_gpu_kernel_breakdown": "visualize=False, include_memory_kernels=True, duration_ratio=1.0, num_kernels=1e9 (no 'others' grouping; top %d per type kept here)" % TOP_KERNELS,
                "get_idle_time_breakdown": f"ranks=[r], consecutive_kernel_delay={IDLE_DELAY}, show_idle_interval_stats=True",
                "get_cuda_kernel_launch_stats": f"ranks=[r], runtime_cutoff={RUNTIME_CUTOFF}, launch_delay_cutoff={LAUNCH_DELAY_CUTOFF}",
                "get_queue_length_summary": "ranks=[r]",
            },
            "recorded_by_this_script_not_by_hta": [
                "hta_window (rows of HTA's loaded frame, last-iteration filter cut, profiler steps)",
                "comp_comm_overlap_pctg_unrounded (HTA's function with its final round() disabled)",
                "kernel_type_breakdown per rank (HTA's BreakdownAnalysis._get_gpu_kernel_type_time on one rank; "
                "HTA's public result is kernel_type_all_ranks, summed over the set's ranks)",
                "percentage_unrounded, kernel_table count (= round(sum/mean)), kernel_table rest",
                "cuda_kernel_launch_stats summary statistics (HTA returns the per-launch table)",
                "without_ns_rounding (HTA rerun with HTA_DISABLE_NS_ROUNDING=1)",
                "distributedInfo_rank, fractional_us_timestamps, n_trace_events (read from the raw file)",
            ],
            "kernel_names": f"names longer than {NAME_MAX} chars are cut, with name_len and name_sha1 of the full name",
        },
        "summary": _summary(results),
        "file_index": file_index,
        "trace_sets": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = _dumps(doc)
    args.out.write_text(text + "\n")
    print(f"[hta-ref] wrote {args.out} ({len(text) // 1024} KiB)", file=sys.stderr)


if __name__ == "__main__":
    main()
