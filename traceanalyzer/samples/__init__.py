"""Real sample runs shipped inside the package, so that ``traceanalyzer demo`` works from an
installed wheel: a 4-rank gloo DDP run whose rank 2 sleeps 20 ms in every forward, and a 4-stage
1F1B pipeline whose stage 2 sleeps 10 ms in every micro-batch forward (recording commands in the
repository's ``traces/README.md``; ``traces/`` links to them)."""
from __future__ import annotations

from importlib import resources
from pathlib import Path


def runs() -> dict[str, Path]:
    """Run name -> folder of each shipped sample run."""
    root = Path(str(resources.files(__package__)))
    return {p.name: p for p in sorted(root.iterdir()) if p.is_dir() and not p.name.startswith(("_", "."))}
