"""Execute the notebooks and save copies with their outputs in notebooks/executed/, for readers.

    python notebooks/execute.py                      # all of them
    python notebooks/execute.py 01_quickstart        # one (name with or without .ipynb)

The sources in notebooks/ stay without outputs (tests/test_notebooks.py runs them); the executed
copies are what a reader browses (GitHub renders them, figures included). After changing a
notebook, run this and commit both: tests/test_notebooks.py checks that every executed copy has the
code of its source and has outputs. Stores go to a fresh ``$TMPDIR/traceanalyzer_notebooks_executed``
(or TRACEANALYZER_NOTEBOOK_DIR, used as it is). Needs the ``test`` extra (nbclient, ipykernel, nbformat).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "executed"
KERNEL = "traceanalyzer-execute"
#: The stores' folder under the temporary directory (printed in some outputs).
WORK_NAME = "traceanalyzer_notebooks_executed"


def _kernel_env(root: Path) -> dict:
    """A kernelspec for this interpreter, found first through JUPYTER_PATH (a fresh venv has none)."""
    spec = root / "kernels" / KERNEL
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "traceanalyzer", "language": "python"}))
    work = os.environ.get("TRACEANALYZER_NOTEBOOK_DIR")
    if not work:   # our own folder: fresh stores, at one fixed path so re-executing changes few outputs
        work = Path(tempfile.gettempdir()) / WORK_NAME
        shutil.rmtree(work, ignore_errors=True)
    return {"JUPYTER_PATH": str(root), "MPLBACKEND": "Agg", "TRACEANALYZER_NOTEBOOK_DIR": str(work)}


def execute(path: Path, out_dir: Path = OUT) -> Path:
    """Run ``path`` top to bottom and write it, with outputs, to ``out_dir``; returns the copy."""
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, kernel_name=KERNEL, timeout=600, record_timing=False,
                   resources={"metadata": {"path": str(HERE)}}).execute()
    nb.metadata.pop("widgets", None)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / path.name
    nbformat.write(nb, out)
    return out


def main(argv: list[str]) -> int:
    names = [a if a.endswith(".ipynb") else f"{a}.ipynb" for a in argv]
    books = [HERE / n for n in names] if names else sorted(HERE.glob("*.ipynb"))
    missing = [str(b) for b in books if not b.is_file()]
    if missing:
        print(f"execute.py: no such notebook: {', '.join(missing)}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="traceanalyzer-nb-") as tmp:
        saved = {k: os.environ.get(k) for k in ("JUPYTER_PATH", "MPLBACKEND", "TRACEANALYZER_NOTEBOOK_DIR")}
        os.environ.update(_kernel_env(Path(tmp)))   # this script's own process: the kernels inherit it
        try:
            for book in books:
                print(f"executed {execute(book).relative_to(HERE.parent)}")
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
