"""The ``traceanalyzer`` command: argument parsing and text formatting over the library's calls."""
from .main import main

__all__ = ["main"]
