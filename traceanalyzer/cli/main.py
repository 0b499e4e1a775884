"""Command line: ``traceanalyzer ingest|info|sql|analyze|report|diff|export|desync|schema|demo``.

Errors are one line (which file, what is wrong, what to do) and a non-zero exit; ``--debug``
shows the traceback.

Exit codes (the same for every command): 0 done, nothing to flag; 1 done, and the run crosses what
was asked to gate on (``report --fail-on``) or ``desync`` found a hang or desync; 2 an error (bad
input, bad arguments, nothing written); 130 interrupted.
"""
from __future__ import annotations

import argparse
import logging
import sys
import traceback
import warnings

from .. import __version__
from ..errors import StoreWarning, TraceAnalyzerError

#: Exit codes, documented in the module docstring and in ``traceanalyzer --help``.
EXIT_OK, EXIT_FLAGGED, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130


def _cmd_ingest(args) -> int:
    from ..ingest.batch import ingest
    report = ingest(args.paths or [], args.store, run=args.run, rank=args.rank, workers=args.workers,
                    progress=not args.quiet, nccl_logs=args.nccl_log or [], format=args.format,
                    column_map=_column_map(args.column_map), dask=_dask_spec(args))
    print(report.summary())
    return 0


def _dask_spec(args) -> str | None:
    """--dask local[:N] or --scheduler ADDRESS -> ingest's ``dask`` (None: the local process pool)."""
    if args.dask is not None:
        from ..ingest.executor import parse_local_spec
        parse_local_spec(args.dask)  # a bad value fails before any work
        return args.dask
    return args.scheduler


def _cluster_options(s, what: str) -> None:
    """--dask local[:N] | --scheduler ADDRESS (see :mod:`traceanalyzer.ingest.executor`)."""
    cluster = s.add_mutually_exclusive_group()
    cluster.add_argument("--dask", metavar="local[:N]", help=f"{what} on a Dask LocalCluster of N worker processes "
                         "(started and closed here; needs traceanalyzer[dask])")
    cluster.add_argument("--scheduler", metavar="ADDRESS", help=f"{what} on a running Dask cluster (tcp://HOST:8786); "
                         "its workers must see the inputs and the store at the same paths (a shared file system)")


def _column_map(items) -> dict | None:
    """--column-map ours=theirs (repeatable, or comma-separated); 'unit=us' gives the time unit."""
    out = {}
    for item in items or []:
        for pair in filter(None, item.split(",")):
            ours, sep, theirs = pair.partition("=")
            if not sep or not ours.strip() or not theirs.strip():
                raise TraceAnalyzerError(f"--column-map {pair!r}: expected ours=theirs (e.g. start=begin_us, unit=us)")
            out[ours.strip()] = theirs.strip()
    return out or None


def _cmd_desync(args) -> int:
    from ..analyses.desync import diagnose
    d = diagnose(args.paths, run=args.run)
    if args.json:
        print(d.findings.to_json(orient="records", indent=1, default_handler=str))
    else:
        print(d.text())
    return EXIT_OK if d.ok else EXIT_FLAGGED  # CI can gate on a hang


def _cmd_info(args) -> int:
    from ..analyses.summary import format_info, info
    df = info(args.store)
    if args.json:
        print(df.to_json(orient="records", indent=1))
    else:
        print(format_info(df, args.store))
    return 0


def _cmd_sql(args) -> int:
    import duckdb

    from ..analyses import connect
    con = connect(args.store)
    try:
        df = con.sql(args.query).df()
    except duckdb.Error as exc:  # DuckDB's whole message: its 'Did you mean "comms"?' is the useful part
        raise TraceAnalyzerError("query failed: " + " ".join(x.strip() for x in str(exc).splitlines() if x.strip())) from None
    if args.csv:
        df.to_csv(sys.stdout, index=False)
    elif args.json:
        print(df.to_json(orient="records", indent=1, default_handler=str))
    else:
        import pandas as pd
        with pd.option_context("display.max_rows", args.max_rows, "display.max_columns", None, "display.width", 200):
            print(df.to_string(index=False, max_rows=args.max_rows))
        if len(df) > args.max_rows:
            print(f"({len(df):,} rows, {args.max_rows:,} shown; --max-rows N shows more, --csv or --json all)")
    return 0


def _cmd_analyze(args) -> int:
    from ..analyses.results import analyze, format_text, json_pieces
    params = _parse_params(args.set or [])
    only = [x.strip() for x in args.only.split(",")] if args.only else None
    results = analyze(args.store, run=args.run, only=only, save_results=not args.no_save,
                      summaries=not args.no_summaries, dask=_dask_spec(args), n_workers=args.workers, **params)
    if not args.json:
        print(format_text(results, params))
        return 0
    for piece in json_pieces(results, params):  # written as made: the document is never whole in memory
        sys.stdout.write(piece)
    sys.stdout.write("\n")
    return 0


def _parse_params(items: list[str]) -> dict:
    from ..analyses import PARAMETERS
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in PARAMETERS:
            raise TraceAnalyzerError(f"--set {item}: expected NAME=VALUE with NAME one of {', '.join(PARAMETERS)}")
        default = PARAMETERS[key][0]
        try:
            out[key] = type(default)(value)
        except ValueError:
            raise TraceAnalyzerError(f"--set {item}: {key} takes a {type(default).__name__}") from None
    return out


def _cmd_schema(args) -> int:
    from ..analyses import params, registry
    from ..schema import describe
    print(describe())
    print(registry.describe())
    print(params.describe())
    return 0


def _cmd_report(args) -> int:
    from .. import report as rp
    from ..report.record import ms
    rules = rp.parse_fail_on(args.fail_on or [])  # bad rules fail before any work
    fmt = rp.format_for(args.output or "", args.format)
    out = args.output or f"report.{fmt}"
    rep = rp.build_report(args.store, run=args.run, progress=lambda m: print(m, file=sys.stderr),
                          replay=not args.no_replay, replay_max_events=args.replay_max_events, dask=_dask_spec(args),
                          figures="listed" if fmt == "json" else True)  # JSON names the figures, draws none
    rp.write_report(rep, out, fmt)
    print(f"wrote {out} ({fmt}, {len(rep.runs)} run{'s' if len(rep.runs) != 1 else ''})")
    for rr in rep.runs:
        top = rr.findings[0] if rr.findings else None
        print(f"  {rr.run}: " + (f"#1 {top.title}, {ms(top.recoverable_ns_per_step)} per step "
                                 f"({top.recoverable_pct:.1f}% of the step) recoverable" if top else "no findings"))
    failed = rp.check({rr.run: rr.metrics for rr in rep.runs}, rules)
    if failed:
        print(f"traceanalyzer: fail-on: {'; '.join(failed)}", file=sys.stderr)
        return EXIT_FLAGGED
    return 0


def _cmd_diff(args) -> int:
    from ..analyses.diff import diff_runs
    d = diff_runs(args.store_a, args.store_b, run_a=args.run_a, run_b=args.run_b)
    print(d.to_json() if args.json else d.text(top=args.top))
    return 0


def _cmd_export(args) -> int:
    from ..export.trace import export_trace, write_trace
    if args.rank is None and not args.all_ranks:
        raise TraceAnalyzerError("export: give --rank K or --all-ranks")
    doc = export_trace(args.store, run=args.run, rank=None if args.all_ranks else args.rank,
                       overlays=not args.no_overlays, flows=not args.no_flows, replay_plan=args.replay_plan)
    write_trace(doc, args.output)
    n = sum(1 for e in doc["traceEvents"] if e.get("ph") in ("X", "i"))
    print(f"wrote {args.output}: {n} events of run '{doc['otherData']['run']}' "
          f"({'all ranks' if args.all_ranks else f'rank {args.rank}'}); open it in https://ui.perfetto.dev")
    return 0


def _cmd_replay(args) -> int:
    from ..session import Session
    with Session(args.store) as s:
        r = s.replay(args.plan, run=args.run, straggler_metrics=args.straggler_metrics, chrome_trace=args.chrome_trace)
    e = r.identity_error
    if r.structural:
        print(f"run '{r.run}', plan '{r.plan['name']}' ({r.action} model): identity model error "
              f"(the recorded settings through the same model) median {100 * e['median']:.2f}%, "
              f"P90 {100 * e['p90']:.2f}% over {e['n']} rank-steps")
    else:
        print(f"run '{r.run}', plan '{r.plan['name']}': {r.nodes:,} nodes, {r.edges:,} edges; identity-replay error "
              f"median {100 * e['median']:.2f}%, P90 {100 * e['p90']:.2f}% over {e['n']} rank-steps")
    print((r.per_rank_ns / 1e6).round(3).rename(columns=lambda c: c.replace("_ns", "_ms")).to_string())
    print(f"job step (slowest rank's mean step): measured {r.job_step_ns('measured_ns') / 1e6:.3f} ms, identity "
          f"{r.job_step_ns('identity_ns') / 1e6:.3f} ms, predicted {r.job_step_ns() / 1e6:.3f} ms")
    for line in getattr(r, "limits", None) or ():
        print(f"limit: {line}")
    if r.breakdown_ns is not None:
        print("breakdown delta vs identity (ms per step; the columns add up to step_time, the rank's step; "
              "waiting_other = waiting for peers and work on parallel lanes):")
        print((r.breakdown_ns / 1e6).round(3).to_string())
    m = r.straggler
    if m is not None:
        print(f"straggler what-if (docs/metrics.md): T {m['T_ns'] / 1e6:.3f} ms (replayed job step), T_ideal "
              f"{m['T_ideal_ns'] / 1e6:.3f} ms (every rank idealised), S = T / T_ideal {m['S']:.3f} "
              f"(slowdown {100 * (m['S'] - 1):.1f}%), waste {m['waste']:.3f}; S_w: " +
              ", ".join(f"rank {int(x.rank)} {x.S_w:.3f}" for x in m["per_rank"].itertuples()))
        print("S_t: " + ", ".join(f"{x.op_type} {x.S_t:.3f}" for x in m["per_op_type"].itertuples()))
        line = (f"idealising only the worst {len(m['top_ranks'])} rank(s) ({', '.join(map(str, m['top_ranks']))}) "
                f"recovers {_recovered(m['top_ranks_recovered'])} of the slowdown")
        if m["last_stage_ranks"]:
            line += f"; only the last pipeline stage: {_recovered(m['last_stage_recovered'])}"
        print(line)
    if r.chrome_trace is not None:
        print(f"wrote {r.chrome_trace}: {r.chrome_slices} predicted slices")
    return 0


def _recovered(frac) -> str:
    """A share of the slowdown, never above 100 % (the model can predict a little more than all of it)."""
    if frac is None or frac != frac:
        return "an unknown share (no slowdown to recover)"
    if frac > 1.0:
        return f"all ({100 * frac:.0f}% by the model: idealising these alone predicts a shorter step than idealising every rank)"
    return f"{100 * max(frac, 0.0):.0f}%"


def _cmd_rm(args) -> int:
    from ..store.check import remove_run
    n = remove_run(args.store, args.run)
    print(f"removed run '{args.run}' ({n} trace(s) and per-process inputs) from {args.store}")
    return 0


def _cmd_check(args) -> int:
    from ..store.check import check_store
    report = check_store(args.store, repair=args.repair)
    print(report.text())
    return 0 if report.ok or report.repaired else 1


def _cmd_demo(args) -> int:
    from .demo import demo
    return demo(args.store, record=args.record)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; the help texts that need the library's tables (analysis names, parameters, report
    keys: a second of imports) are filled in only for ``command`` (None: every command)."""
    def full(name: str) -> bool:
        return command is None or command == name

    p = argparse.ArgumentParser(prog="traceanalyzer", description="Trace-driven analysis of distributed training runs.",
                                epilog="exit codes: 0 done; 1 done and flagged (report --fail-on crossed, desync found a "
                                       "hang); 2 error (one line on stderr, nothing written); 130 interrupted")
    p.add_argument("--version", action="version", version=f"traceanalyzer {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("ingest", help="parse Kineto traces, Nsight Systems SQLite exports and op timelines (files or folders; recognised by content) into a store")
    s.add_argument("paths", nargs="*", help="trace files or folders (searched recursively); Flight Recorder dumps, "
                                            "NCCL debug logs and NCCL profiler plugin output found there are ingested too")
    s.add_argument("--store", required=True, help="store folder (created if missing)")
    s.add_argument("--run", help="run name (default: the folder name of the first path)")
    s.add_argument("--rank", type=int, help="rank for traces without distributedInfo.rank (else taken from the file name); for an Nsight Systems export, the rank of its first process (the others follow)")
    s.add_argument("--workers", type=int, help="parallel worker processes (default: number of CPUs)")
    _cluster_options(s, "parse the files (one task per file)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.add_argument("--nccl-log", action="append", metavar="FILE",
                   help="an NCCL_DEBUG=INFO log (NCCL_DEBUG_SUBSYS=COLL), whatever its name (repeatable)")
    s.add_argument("--format", choices=("op-timeline",), default=None,
                   help="read the files named as op timelines (Parquet/CSV, one row per op of every rank); "
                        "default: every input is recognised by its content")
    s.add_argument("--column-map", action="append", metavar="OURS=THEIRS",
                   help="op timeline: the file's name for one of our columns (rank, dp, pp, vpp, tp, cp, ep, step, "
                        "op, start, duration, microbatch, seq), and unit=ns|us|ms|s; repeatable or comma-separated")
    s.set_defaults(func=_cmd_ingest)

    s = sub.add_parser("desync", help="diagnose a hang from the Flight Recorder dumps of all ranks: which collective, "
                                      "which ranks are missing, and where they wait")
    s.add_argument("paths", nargs="+", help="FR dumps (rank{R}.fr.json, .fr.pkl, nccl_trace_rank_{R}) or folders of "
                                            "them, or one store")
    s.add_argument("--run", help="the run, when a store holds dumps of several")
    s.add_argument("--json", action="store_true", help="print the findings as JSON records")
    s.epilog = "exit code 1 when a hang or desync is found (0: none), 2 on bad input"
    s.set_defaults(func=_cmd_desync)

    s = sub.add_parser("info", help="summarise a store: runs, ranks, steps, events, collectives, time span")
    s.add_argument("store")
    s.add_argument("--json", action="store_true", help="print JSON records")
    s.set_defaults(func=_cmd_info)

    s = sub.add_parser("sql", help="run a DuckDB query over the store's views")
    s.add_argument("store")
    s.add_argument("query")
    fmt = s.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true")
    fmt.add_argument("--json", action="store_true")
    s.add_argument("--max-rows", type=int, default=200)
    s.set_defaults(func=_cmd_sql)

    PARAMETERS, ANALYSES, REPLAY_MAX_EVENTS, METRICS = {}, (), None, ()
    if full("analyze"):
        from ..analyses import PARAMETERS
        from ..analyses.results import ALL as ANALYSES
    if full("report"):
        from ..report.metrics import METRICS
        from ..report.whatif import REPLAY_MAX_EVENTS
    s = sub.add_parser("analyze", help="run the analyses (stragglers, overlap, imbalance, breakdowns, ...) and save them in the store",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="parameters (--set NAME=VALUE):\n" + "\n".join(
                           f"  {k} = {d!r}: {doc}" for k, (d, doc) in PARAMETERS.items()))
    s.add_argument("store")
    s.add_argument("--run", help="only this run (default: every run)")
    s.add_argument("--only", help="comma-separated analyses (default: all): " + ", ".join(ANALYSES))
    s.add_argument("--set", "--param", dest="set", action="append", metavar="NAME=VALUE",
                   help="analysis parameter (repeatable); the list and defaults are below")
    s.add_argument("--json", action="store_true", help="print one JSON document (keys from the schema, with versions)")
    s.add_argument("--no-save", action="store_true", help="do not save the results in the store")
    s.add_argument("--no-summaries", action="store_true",
                   help="compute every view over all ranks' events in one connection (no per-rank summaries)")
    s.add_argument("--workers", type=int, default=None, metavar="N",
                   help="per-rank summaries on a local pool of N processes (default: one per CPU when the run's "
                        "events exceed one task's 16 MB, else in this process)")
    _cluster_options(s, "compute the per-rank summaries (one task per chunk of ranks)")
    s.set_defaults(func=_cmd_analyze)

    s = sub.add_parser("schema", help="print every table and column of the store schema, and every analysis's result table")
    s.set_defaults(func=_cmd_schema)

    s = sub.add_parser("report", help="a report of the findings ranked by recoverable time, with figures "
                                      "(self-contained HTML, Markdown, JSON or PDF)")
    s.add_argument("store")
    s.add_argument("--run", help="only this run (default: every run of the store)")
    s.add_argument("-o", "--output", help="output file (default: report.<format>)")
    s.add_argument("--format", choices=("html", "md", "json", "pdf"),
                   help="default: from the output's extension (.html, .md, .json, .pdf; another one is an error), "
                        "html without one")
    s.add_argument("--no-replay", action="store_true",
                   help="value rank findings by the analyses' estimates only (no what-if replay)")
    s.add_argument("--replay-max-events", type=int, default=REPLAY_MAX_EVENTS, metavar="N",
                   help=f"replay runs of at most N stored events (default {REPLAY_MAX_EVENTS or 0:,}; building the "
                        f"replay graph costs about 1 s per million events)")
    s.add_argument("--fail-on", action="extend", nargs="+", metavar="KEY>VALUE",
                   help="exit 1 with a one-line reason when a metric crosses a threshold (quote it for the shell: "
                        "'slowdown_pct>10'); also >=, <, <=, ==. Keys: " + ", ".join(METRICS))
    _cluster_options(s, "build the runs' reports (one task per run: replay, figures)")
    s.set_defaults(func=_cmd_report)

    s = sub.add_parser("diff", help="compare two runs: step time, breakdown, ops and kernels, collectives; "
                                    "changes ranked by impact")
    s.add_argument("store_a", help="store of the baseline run")
    s.add_argument("store_b", nargs="?", help="store of the other run (default: the same store)")
    s.add_argument("--run-a", help="baseline run (needed when STORE_A holds several)")
    s.add_argument("--run-b", help="other run (needed when STORE_B holds several)")
    s.add_argument("--top", type=int, default=15, help="changes listed (default 15)")
    s.add_argument("--json", action="store_true", help="print one JSON document")
    s.set_defaults(func=_cmd_diff)

    s = sub.add_parser("export", help="write a Chrome/Perfetto JSON trace of the stored events with overlay "
                                      "tracks for the findings")
    s.add_argument("store")
    s.add_argument("--run", help="the run (needed when the store holds several)")
    s.add_argument("--rank", type=int, help="the rank to export")
    s.add_argument("--all-ranks", action="store_true", help="every rank of the run, one process each")
    s.add_argument("-o", "--output", required=True, help="output .json (or .json.gz)")
    s.add_argument("--no-overlays", action="store_true", help="only the original events")
    s.add_argument("--no-flows", action="store_true", help="no flow arrows (recorded flows, send -> recv, "
                                                          "last arriver -> waiters)")
    s.add_argument("--replay-plan", metavar="PLAN.json", help="also the replay's predicted timeline under this plan "
                   "(idealize/scale/scale_comm), one process per rank beside the measured one")
    s.set_defaults(func=_cmd_export)

    s = sub.add_parser("replay", help="what-if: replay the run under a plan (idealize, scale, scale_comm, pipeline, ddp)")
    s.add_argument("store")
    s.add_argument("--run", help="the run (needed when the store holds several)")
    s.add_argument("--plan", required=True, help="plan JSON file: {\"actions\": [{\"action\": \"idealize\", \"ranks\": [2]}, ...]}; "
                   "actions: idealize, scale, scale_comm (factor or bandwidth/latency), or alone: pipeline "
                   "(schedule, microbatches), ddp (bucket_mb, overlap, dp)")
    s.add_argument("--chrome-trace", metavar="FILE", help="write the predicted timeline as a Chrome/Perfetto trace")
    s.add_argument("--straggler-metrics", action="store_true", help="also print T, T_ideal, S, waste and S_w per rank")
    s.set_defaults(func=_cmd_replay)

    s = sub.add_parser("rm", help="remove a run (its traces, inputs and saved results) from a store, atomically")
    s.add_argument("store")
    s.add_argument("--run", required=True, help="the run to remove")
    s.set_defaults(func=_cmd_rm)

    s = sub.add_parser("check", help="check a store: missing or truncated files (damaged runs), leftovers of "
                                     "interrupted writes; exit 1 when something is wrong")
    s.add_argument("store")
    s.add_argument("--repair", action="store_true", help="remove the damaged runs' listings and the leftovers")
    s.set_defaults(func=_cmd_check)

    s = sub.add_parser("demo", help="the main job: record (or use shipped) real gloo traces, ingest, summarise")
    s.add_argument("--store", default="store", help="store folder (default: ./store)")
    s.add_argument("--record", action="store_true", help="record a fresh 2-rank gloo DDP run with torchrun (needs torch)")
    s.set_defaults(func=_cmd_demo)
    return p


class _StderrHandler(logging.StreamHandler):
    """Log records on whatever ``sys.stderr`` is when they are emitted, as one line each."""

    def __init__(self):
        super().__init__()
        self.setFormatter(logging.Formatter("traceanalyzer: %(levelname)s: %(message)s"))

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


def _command(argv) -> str | None:
    """The command named in ``argv`` ("" when none is: the top-level help or an error)."""
    words = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")]
    return words[0] if words else ""


def main(argv=None) -> int:
    args = build_parser(_command(argv)).parse_args(argv)
    # the library reports through `logging` ("traceanalyzer.*" loggers); the CLI shows it on stderr
    log = logging.getLogger("traceanalyzer")
    if not any(isinstance(h, _StderrHandler) for h in log.handlers):
        log.addHandler(_StderrHandler())
    log.setLevel(logging.DEBUG if args.debug else logging.INFO)
    with warnings.catch_warnings():  # our warnings as one line each (restored on return)
        warnings.simplefilter("default", StoreWarning)
        warnings.showwarning = _show_warning
        return _run(args)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    if issubclass(category, StoreWarning):
        print(f"traceanalyzer: warning: {message}", file=sys.stderr)
    else:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def _columns_differ(exc: Exception) -> str | None:
    """One line for DuckDB's error on a store file whose columns are not its table's (the store's
    views read one footer per table: store.files.same_columns; such a file was put there by hand)."""
    import duckdb
    text = str(exc)
    if not isinstance(exc, duckdb.InvalidInputException) or "schema mismatch" not in text:
        return None
    first = text.splitlines()[0].replace("Invalid Input Error: ", "")
    return (f"{first} -- a store file whose columns are not those its ingest wrote (changed by hand?): "
            "ingest that run again into a new store")


def _run(args) -> int:
    try:
        return args.func(args)
    except TraceAnalyzerError as exc:
        if args.debug:
            traceback.print_exc()
            tb = getattr(exc, "debug_traceback", None)
            if tb:
                print(tb, file=sys.stderr)
        print(f"traceanalyzer: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("traceanalyzer: interrupted; the store is unchanged", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0
    except Exception as exc:  # (after BrokenPipeError: an Exception too)
        line = _columns_differ(exc)
        if line is None:
            raise
        print(f"traceanalyzer: error: {line}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
