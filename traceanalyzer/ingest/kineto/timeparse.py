"""Exact conversion of Kineto's decimal microsecond text to int64 nanoseconds.

Kineto writes ``ts`` and ``dur`` as microseconds with up to 3 decimals, often as epoch
microseconds (about 1.7e15). A float64 has 53 bits of mantissa, so ``ts * 1000`` as a float
cannot represent epoch nanoseconds exactly; we therefore never go through float.

The fast path works on the raw text of all values at once (one byte buffer plus offsets, as
msgspec hands us the raw JSON slices): it walks the character positions left to right and adds
``digit x 10**power`` into an int64 vector, where the power of each position follows from where
the decimal point is. Digits below the nanosecond are truncated. Anything unusual (exponents,
quoted numbers, more than 16 integer digits) goes through :class:`decimal.Decimal`, row by row.
"""
from __future__ import annotations

from decimal import Decimal, InvalidOperation

import numpy as np
import pyarrow as pa

_DOT, _MINUS, _ZERO = ord("."), ord("-"), ord("0")
_POW10 = np.array([10 ** k for k in range(19)], dtype=np.int64)
#: Largest integer-part length the int64 fast path accepts: epoch microseconds have 16 digits,
#: and x1000 stays below 2**63 while the leading digit is at most 8 (until the year 2255).
_MAX_INT_DIGITS = 16


def us_text_to_ns(buf: bytes, offsets: np.ndarray) -> pa.Array:
    """Parse ``len(offsets) - 1`` decimal microsecond texts, stored back to back in ``buf``,
    into an int64 nanosecond array; empty texts become nulls.

    Raises ``ValueError`` naming the first text that is not a number.
    """
    n = len(offsets) - 1
    if n == 0:
        return pa.array([], pa.int64())
    data = np.frombuffer(buf, dtype=np.uint8)
    starts = offsets[:-1]
    lengths = np.diff(offsets)
    width = int(lengths.max()) if n else 0
    negative = np.zeros(n, dtype=bool)
    nonempty = lengths > 0
    first = data[np.minimum(starts, max(len(data) - 1, 0))] if len(data) else np.zeros(n, np.uint8)
    negative[nonempty] = first[nonempty] == _MINUS
    body_start = starts + negative
    body_len = lengths - negative
    # where the decimal point is, relative to the start of the digits (= the integer length)
    int_len = body_len.copy()
    odd = np.zeros(n, dtype=bool)
    chars = []
    for j in range(width):
        inside = j < body_len
        c = np.where(inside, data[np.minimum(body_start + j, len(data) - 1)], 0) if len(data) else np.zeros(n, np.uint8)
        is_dot = inside & (c == _DOT)
        first_dot = is_dot & (int_len == body_len)
        int_len[first_dot] = j
        chars.append(c)
    value = np.zeros(n, dtype=np.int64)
    for j, c in enumerate(chars):
        inside = j < body_len
        digit = c.astype(np.int64) - _ZERO
        is_digit = inside & (digit >= 0) & (digit <= 9)
        is_dot = inside & (j == int_len)
        odd |= inside & ~is_digit & ~is_dot
        power = np.where(j < int_len, int_len - 1 - j + 3, 3 - (j - int_len))
        use = is_digit & (power >= 0)
        value += np.where(use, digit * _POW10[np.clip(power, 0, 18)], 0)
    odd |= (int_len > _MAX_INT_DIGITS) | (nonempty & (body_len == 0))
    odd |= (int_len == _MAX_INT_DIGITS) & (chars[0] > ord("8")) if chars else False
    value = np.where(negative, -value, value)
    out = pa.array(value, mask=~nonempty)
    if odd.any():
        return _fix_rows(out, buf, offsets, np.nonzero(odd)[0])
    return out


def _fix_rows(out: pa.Array, buf: bytes, offsets: np.ndarray, rows: np.ndarray) -> pa.Array:
    values = out.to_numpy(zero_copy_only=False).astype(np.int64, copy=True) if out.null_count == 0 else \
        np.asarray(out.fill_null(0).to_numpy(), dtype=np.int64).copy()
    mask = np.asarray(out.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    for i in rows:
        text = bytes(buf[offsets[i]:offsets[i + 1]]).decode("utf-8", "replace").strip().strip('"')
        try:
            ns = int(Decimal(text).scaleb(3))
        except (InvalidOperation, ValueError, OverflowError):
            raise ValueError(f"not a number: {text[:40]!r}") from None
        if not -2**63 <= ns < 2**63:
            raise ValueError(f"out of the int64 nanosecond range: {text[:40]!r}")
        values[i] = ns
        mask[i] = False
    return pa.array(values, mask=mask)


def texts_to_ns(texts: list[str]) -> pa.Array:
    """Convenience wrapper for a list of strings (tests, small inputs)."""
    raws = [t.encode() for t in texts]
    offsets = np.zeros(len(raws) + 1, dtype=np.int64)
    np.cumsum([len(r) for r in raws], out=offsets[1:])
    return us_text_to_ns(b"".join(raws), offsets)
