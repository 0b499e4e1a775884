"""Chrome-trace time: exact microseconds (three decimals) to and from int64 nanoseconds."""
from __future__ import annotations

from decimal import Decimal


def us_from_ns(ns: int) -> Decimal:
    """Nanoseconds as exact microseconds with three decimals."""
    sign, ns = ("-", -ns) if ns < 0 else ("", ns)
    return Decimal(f"{sign}{ns // 1000}.{ns % 1000:03d}")


def ns_from_us(v) -> int:
    """A Chrome-trace ``ts``/``dur`` (µs, number or text) as integer nanoseconds."""
    return int((Decimal(str(v)) * 1000).to_integral_value())
