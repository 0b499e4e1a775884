"""Command line: `python -m traceanalyzer.workloads WORKLOAD [options]` (under torchrun)."""

from __future__ import annotations

import argparse
import importlib
import sys

from traceanalyzer.workloads import WORKLOADS, common


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:  # `torchrun ... -m traceanalyzer.workloads -- ddp --run X` passes "--" on
        argv = argv[1:]
    chosen = argv[0] if argv and argv[0] in WORKLOADS else None
    parser = argparse.ArgumentParser(prog="python -m traceanalyzer.workloads")
    sub = parser.add_subparsers(dest="workload", required=True)
    for name, module_name in WORKLOADS.items():
        if chosen is not None and name != chosen:
            # Import only the chosen workload: every rank pays each import (FSDP and
            # pipelining are slow to import), and one workload's import error must not
            # break the others.
            sub.add_parser(name)
            continue
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=(module.__doc__ or "").strip().splitlines()[0])
        common.add_common_args(p)
        module.add_args(p)
        p.set_defaults(run_workload=module.run)
    args = parser.parse_args(argv)
    args.run_workload(args)


if __name__ == "__main__":
    main()
