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
