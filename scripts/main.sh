#!/usr/bin/env bash
# The main job on a bundled real workload: set up, then
#   record   CPython running workloads/py_dicts.py, every object allocation through malloc
#   stats    what its heap did (text, and a plot: live bytes and RSS over time, size classes)
#   simulate replay it through every allocation policy of the lab (table and footprint plot)
# Results go to results/ (HEAPCAST_OUT to change).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
out=${HEAPCAST_OUT:-results}
mkdir -p "$out"
trace="$out/py_dicts.trace"
rm -rf "$trace"
hc=.venv/bin/heapcast
PY=$(.venv/bin/python -c 'import os, sys; print(os.path.realpath(sys.executable))')

echo "== record" >&2
PYTHONMALLOC=malloc "$hc" record -o "$trace" -- "$PY" workloads/py_dicts.py
echo "== stats" >&2
"$hc" stats "$trace" --plot "$out/stats.png"
echo "== simulate" >&2
"$hc" simulate "$trace" --plot "$out/simulate.png"
echo "main: results in $out/ (stats.png, simulate.png)" >&2
