"""Read a pickle that holds only plain data, without ever running code from it.

``pickle.load`` on a file from elsewhere runs whatever the file asks for (``os.system`` through a
``__reduce__``, for one). The only way a pickle reaches a callable is by naming it: the GLOBAL /
STACK_GLOBAL / EXT* opcodes, which all go through ``Unpickler.find_class``, and persistent ids,
which go through ``persistent_load``. Both refuse here, so REDUCE, BUILD, NEWOBJ and INST have
nothing to call. What comes out is then checked to be plain containers and scalars only, and
converted to JSON-compatible values (tuples become lists) with a bound on the work, so that a
pickle whose lists share themselves exponentially (a "billion laughs") fails instead of filling
memory.

Flight Recorder pickles (``torch._C._distributed_c10d._dump_fr_trace``) are exactly such plain
data: a dict of str, int, float, bool, None, lists, tuples and dicts (checked with torch 2.13).
"""
from __future__ import annotations

import io
import pickle
from pathlib import Path

from ..errors import TraceInputError

#: Values a plain-data pickle may hold.
PLAIN_SCALARS = (str, int, float, bool, type(None), bytes)

#: Conversion visits at most this many values per input byte (plus a floor): a real dump
#: expands by a small factor (shared stack frames), a hostile one by orders of magnitude.
MAX_EXPANSION = 200
MIN_BUDGET = 1_000_000


class _PlainUnpickler(pickle.Unpickler):
    """An unpickler that knows no classes and no functions."""

    def find_class(self, module, name):  # noqa: D401 - pickle's API
        raise pickle.UnpicklingError(f"refused to load {module}.{name}: only plain data is accepted")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("refused a persistent id: only plain data is accepted")


def load_plain(data: bytes, path: str | Path) -> object:
    """The plain data in the pickle ``data`` (read from ``path``), as JSON-compatible values.

    Raises :class:`~traceanalyzer.errors.TraceInputError` naming ``path`` for anything else: a
    pickle that names a class or function (it is refused before anything runs), a truncated or
    corrupt pickle, or one that expands beyond :data:`MAX_EXPANSION` times its size.
    """
    try:
        obj = _PlainUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        text = str(exc)
        if text.startswith("refused"):
            raise TraceInputError(path, f"unsafe pickle {text}; it was not executed") from None
        if "truncated" in text:
            raise TraceInputError(path, "truncated pickle (the data ends early)") from None
        raise TraceInputError(path, f"corrupt pickle ({text})") from None
    except (EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError, MemoryError,
            RecursionError, OverflowError) as exc:
        what = "truncated pickle (the data ends early)" if isinstance(exc, EOFError) else \
            f"corrupt pickle ({type(exc).__name__}: {exc})"
        raise TraceInputError(path, what) from None
    return to_plain(obj, path, budget=max(MIN_BUDGET, MAX_EXPANSION * len(data)))


def to_plain(obj: object, path: str | Path, budget: int = MIN_BUDGET) -> object:
    """A copy of ``obj`` with tuples as lists and bytes as text; refuses any other type.

    Iterative (no recursion limit to hit) and bounded by ``budget`` visited values.
    """
    root: list = [None]
    stack = [(obj, root, 0)]
    visited = 0
    while stack:
        value, parent, key = stack.pop()
        visited += 1
        if visited > budget:
            raise TraceInputError(path, f"pickle expands to more than {budget:,} values; refused as hostile")
        if isinstance(value, bool) or value is None or isinstance(value, (int, float, str)):
            parent[key] = value
        elif isinstance(value, bytes):
            parent[key] = value.decode("utf-8", errors="replace")
        elif isinstance(value, (list, tuple)):
            out = [None] * len(value)
            parent[key] = out
            stack.extend((v, out, i) for i, v in enumerate(value))
        elif isinstance(value, dict):
            out_d: dict = {}
            parent[key] = out_d
            for k, v in value.items():
                if not isinstance(k, (str, int, float, bool, type(None))):
                    raise TraceInputError(path, f"pickle holds a dict key of type {type(k).__name__}; only plain data is accepted")
                out_d[k if isinstance(k, str) else str(k)] = None
                stack.append((v, out_d, k if isinstance(k, str) else str(k)))
        else:
            raise TraceInputError(path, f"pickle holds a {type(value).__name__}; only plain data is accepted")
    return root[0]
