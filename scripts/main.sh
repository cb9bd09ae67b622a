#!/usr/bin/env bash
# The main job on a bundled real workload: set up, record CPython running workloads/py_dicts.py
# (every object allocation through malloc), then print the trace's statistics and draw its plot.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
out=${HEAPCAST_OUT:-results/main}
mkdir -p "$(dirname "$out")"
rm -rf "$out"
PY=$(.venv/bin/python -c 'import sys; print(sys.executable)')
PYTHONMALLOC=malloc .venv/bin/heapcast record -o "$out" -- "$PY" workloads/py_dicts.py
.venv/bin/heapcast stats "$out" --plot "$out.png"
