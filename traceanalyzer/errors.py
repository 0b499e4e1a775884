"""User-facing errors: one line that names the file and says what is wrong."""
from __future__ import annotations


class TraceAnalyzerError(Exception):
    """Base class: the message is complete and meant for the user as is."""


class TraceInputError(TraceAnalyzerError):
    """A trace (or other input file) cannot be used."""

    def __init__(self, path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class StoreError(TraceAnalyzerError):
    """The store cannot be read or written."""


class StoreWarning(UserWarning):
    """Something the user must know while reading a store (a damaged run left out, results not
    saved in a read-only store); the command line prints it as one line."""
