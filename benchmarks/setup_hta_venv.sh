#!/usr/bin/env bash
# Create a separate virtual environment with Holistic Trace Analysis (HTA) 0.5.0
# for the ingest benchmark's baseline. HTA needs pandas<3, so it must never be
# installed into the project's own venv.
#
# Usage: benchmarks/setup_hta_venv.sh [VENV_DIR]   (default: /work/hta-venv)
#
# torch is pinned to 2.13.0 (the CPU wheel that lies on this machine's disk):
# any other torch version would download a multi-GB CUDA build.
set -euo pipefail

VENV="${1:-${HTA_VENV:-/work/hta-venv}}"
PY="${PYTHON:-python3.11}"

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import hta, pandas; assert pandas.__version__ < '3'" 2>/dev/null; then
    echo "HTA venv already present at $VENV"
    "$VENV/bin/python" -c "import importlib.metadata as m; print('holistictraceanalysis', m.version('holistictraceanalysis'), 'pandas', m.version('pandas'))"
    exit 0
fi

"$PY" -m venv "$VENV"
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
cat > "$CONSTRAINTS" <<'CONS'
torch==2.13.0
pandas<3
CONS

# PIP_CONSTRAINT replaces any constraint file from the global pip config; ours is stricter.
LOG="$VENV/pip-install.log"
echo "installing holistictraceanalysis==0.5.0 (about 100 packages) into $VENV; log: $LOG"
if ! PIP_CONSTRAINT="$CONSTRAINTS" "$VENV/bin/pip" install \
    "holistictraceanalysis==0.5.0" "pandas<3" >"$LOG" 2>&1; then
    tail -n 30 "$LOG" >&2
    exit 1
fi
"$VENV/bin/python" -c "import importlib.metadata as m; print('holistictraceanalysis', m.version('holistictraceanalysis'), 'pandas', m.version('pandas'))"
