"""`analyze --json` is written in pieces of a few thousand rows (results.json_pieces): the same text
as the whole document made at once (json.dumps(doc, indent=1)), whatever the piece size."""
import json

import numpy as np
import pandas as pd
import pytest

from traceanalyzer.analyses import results as R


def _whole(results, params):
    """The document made whole (what to_json wrote before it was written in pieces)."""
    doc = {"traceanalyzer": R.__version__, "store_schema_version": R.S.SCHEMA_VERSION,
           "results_version": R.S.RESULTS_VERSION, "parameters": R.effective_params(params),
           "results": {name: json.loads(df.to_json(orient="records")) for name, df in results.items()}}
    return json.dumps(doc, indent=1)


def _frame(n, seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "rank": rng.integers(0, 8192, n), "ms": rng.random(n) * 1e3, "pct": [None, 12.5] * (n // 2) + [None] * (n % 2),
        "name": [f"op\n{i} \u00b5s \"q\"" for i in range(n)], "nested": [[1, 2], {"k": [3, None]}] * (n // 2) + [[]] * (n % 2),
        "flag": rng.random(n) < 0.5})


@pytest.mark.parametrize("rows", [1, 3, 4096, 10**6])
def test_json_pieces_are_the_whole_document(monkeypatch, rows):
    monkeypatch.setattr(R, "JSON_ROWS", rows)
    df = _frame(1001)
    for results in ({}, {"empty": df.iloc[:0]}, {"one": df.iloc[:1]}, {"a": df, "b": df.iloc[:0], "c": df.iloc[:7]}):
        params = {"exposed_top": 3}
        assert R.to_json(results, params) == _whole(results, params)
        assert json.loads("".join(R.json_pieces(results, params)))["results"].keys() == results.keys()


def test_json_pieces_hold_one_piece_at_a_time(monkeypatch):
    """A generator: the pieces come one at a time (none larger than a piece's rows)."""
    monkeypatch.setattr(R, "JSON_ROWS", 10)
    df = _frame(95)
    pieces = list(R.json_pieces({"x": df}, {}))
    assert len(pieces) >= 95 // 10 and max(len(p) for p in pieces) < len(R.to_json({"x": df.iloc[:20]}, {}))
