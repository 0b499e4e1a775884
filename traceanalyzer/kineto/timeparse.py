"""Exact conversion of Kineto's decimal microsecond text to int64 nanoseconds.

Kineto writes ``ts`` and ``dur`` as microseconds with up to 3 decimals, often as epoch
microseconds (about 1.7e15). A float64 has 53 bits of mantissa, so ``ts * 1000`` as a float
cannot represent epoch nanoseconds exactly; we therefore never go through float. The text is
split at the decimal point, the fraction is right-padded (or cut) to 3 digits, and both parts are
cast to int64 -- vectorised in Arrow. Digits beyond the nanosecond are truncated toward zero.
Rare exponent forms (``1.5e3``) go through :class:`decimal.Decimal`.
"""
from __future__ import annotations

from decimal import Decimal, InvalidOperation

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def us_text_to_ns(texts: list[str]) -> pa.Array:
    """Parse decimal microsecond strings into an int64 nanosecond array.

    Empty strings become nulls. Raises ``ValueError`` naming the first text that is not a number.
    """
    arr = pa.array(texts, pa.string())
    empty = pc.equal(pc.utf8_length(arr), 0)
    arr = pc.if_else(empty, pa.scalar(None, pa.string()), arr)
    odd = pc.match_substring_regex(arr, r"[eE]")
    if pc.any(odd).as_py():
        return _slow_path(arr)
    negative = pc.starts_with(pc.utf8_trim(arr, "\""), "-")
    unsigned = pc.utf8_ltrim(pc.utf8_trim(arr, "\""), "-+")
    # give every text a decimal point so that the split always yields two parts
    dotted = pc.if_else(pc.match_substring(unsigned, "."), unsigned,
                        pc.binary_join_element_wise(unsigned, ".", ""))
    parts = pc.split_pattern(dotted, ".", max_splits=1)
    whole = pc.list_element(parts, 0)
    whole = pc.if_else(pc.equal(pc.utf8_length(whole), 0), "0", whole)
    frac = pc.list_element(parts, 1)
    frac = pc.utf8_slice_codeunits(pc.utf8_rpad(frac, 3, "0"), 0, 3)
    try:
        ns = pc.add(pc.multiply(whole.cast(pa.int64()), 1000), frac.cast(pa.int64()))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return _slow_path(arr)
    return pc.if_else(negative, pc.negate(ns), ns)


def _slow_path(arr: pa.Array) -> pa.Array:
    out = np.zeros(len(arr), dtype=np.int64)
    mask = np.zeros(len(arr), dtype=bool)
    for i, text in enumerate(arr.to_pylist()):
        if text is None:
            mask[i] = True
            continue
        try:
            out[i] = int(Decimal(text).scaleb(3))
        except (InvalidOperation, ValueError):
            raise ValueError(f"not a number: {text[:40]!r}") from None
    return pa.array(out, mask=mask)
