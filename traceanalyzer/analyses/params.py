"""Checks of the analysis parameters (:data:`traceanalyzer.analyses.PARAMETERS`) before they
reach SQL: a NaN threshold compares false with everything and silently hides every finding, a
negative or infinite one is meaningless, and an enumerated parameter has a fixed set of values.
"""
from __future__ import annotations

import math
from typing import Any

from ..errors import TraceAnalyzerError

#: enumerated parameters: name -> the values they take
CHOICES: dict[str, tuple[str, ...]] = {"align_clocks": ("auto", "always", "never")}


def check_parameter(name: str, value: Any, default: Any) -> Any:
    """``value`` as the type of ``default``, or a one-line :class:`TraceAnalyzerError`."""
    if name in CHOICES:
        if value not in CHOICES[name]:
            raise TraceAnalyzerError(f"analysis parameter {name}={value!r}: takes one of {', '.join(CHOICES[name])}")
        return value
    if isinstance(default, bool) or not isinstance(default, (int, float)):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TraceAnalyzerError(f"analysis parameter {name}={value!r}: takes a number")
    if not math.isfinite(value):
        raise TraceAnalyzerError(f"analysis parameter {name}={value!r}: takes a finite number, not NaN or infinity")
    if value < 0:
        raise TraceAnalyzerError(f"analysis parameter {name}={value!r}: takes a number >= 0")
    if isinstance(default, int) and value != int(value):
        raise TraceAnalyzerError(f"analysis parameter {name}={value!r}: takes a whole number")
    return type(default)(value)
