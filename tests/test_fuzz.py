"""Fuzzing in the suite: seeded mutations of real shipped traces and a Flight Recorder dump
(tests/fuzzing.py) for a fixed budget; every input is refused with one line naming the file, or
accepted with info and analyze running on it; the store stays readable throughout.
A longer budget: benchmarks/fuzz_bench.py."""
from __future__ import annotations

import os

import fuzzing

#: seconds of mutating and ingesting, then one info + analyze over every accepted input (about as
#: long again on the shared 2 cores: 40 s gave 31 inputs and 137 s in all at load 14); at least
#: ``min_cases`` inputs whatever the budget. The suite's share: 15 s (29 s in all, quiet, at 25)
BUDGET_S = float(os.environ.get("TRACEANALYZER_FUZZ_BUDGET_S", "15"))


def test_fuzzed_inputs_get_a_clean_error_or_a_working_analysis(tmp_path):
    tally = fuzzing.run_fuzz(tmp_path, BUDGET_S, seed=15, min_cases=12)
    print(tally.line())
    assert not tally.crashes, "\n".join(f"{label}: {what} [{kept}]" for label, what, kept in tally.crashes)
    assert tally.clean > 0 and tally.accepted > 0, tally.line()  # both paths were exercised
