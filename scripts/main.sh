#!/usr/bin/env bash
# The main job on a bundled real workload: set up, then
#   record   CPython running workloads/py_dicts.py, every object allocation through malloc
#   stats    what its heap did (text, and a plot: live bytes and RSS over time, size classes)
#   train    a forecasting model (the default stateful GRU) on the first part of each thread
#   evaluate it on the held-out rest, next to the n-gram baseline
#   compile  the model into a native policy and evaluate it through the C runtime
#   run      py_dicts under heapcast's allocator with a compiled lifetime policy (a table distilled
#            from an n-gram trained on a recording with native call sites, as the allocator sees them)
#   simulate replay it through every allocation policy of the lab (table and footprint plot)
#   report   one self-contained interactive HTML page of it all: results/report.html
# Results go to results/ (HEAPCAST_OUT to change). py_dicts runs with PYTHONHASHSEED=0 each time: the
# interpreter's string hashes are then the same in every run; its recorded events still differ
# from run to run (dicts and sets of objects hashed by address follow the address space), and so
# do the held-out figures (README).
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
PYTHONHASHSEED=0 PYTHONMALLOC=malloc "$hc" record -o "$trace" -- "$PY" workloads/py_dicts.py
echo "== stats" >&2
"$hc" stats "$trace" --plot "$out/stats.png"
if .venv/bin/python -c 'import torch' 2>/dev/null; then
  echo "== train (default model) and evaluate on the held-out part of each thread" >&2
  "$hc" train "$trace" --split time --max-events 3000000 -o "$out/gru.safetensors"
  "$hc" evaluate "$out/gru.safetensors" "$trace" --protocol time
  echo "== the n-gram baseline, same protocol" >&2
  "$hc" train "$trace" --model ngram --split time --max-events 3000000 -o "$out/ngram.safetensors"
  "$hc" evaluate "$out/ngram.safetensors" "$trace" --protocol time
  echo "== compile the model into a native policy; evaluate it through the C runtime" >&2
  "$hc" compile "$out/gru.safetensors" -o "$out/gru.policy"
  "$hc" evaluate "$out/gru.policy" "$trace" --protocol time
fi
if "$hc" run --env --policy none >/dev/null 2>&1; then
  echo "== run py_dicts under heapcast's allocator with a compiled lifetime policy" >&2
  native="$out/py_dicts-native.trace"
  rm -rf "$native"
  PYTHONHASHSEED=0 PYTHONMALLOC=malloc "$hc" record --no-python -o "$native" -- "$PY" workloads/py_dicts.py
  "$hc" train "$native" --model ngram --task lifetime -q -o "$out/lifetime.safetensors"
  "$hc" compile "$out/lifetime.safetensors" --kind table -o "$out/lifetime.policy"
  PYTHONHASHSEED=0 PYTHONMALLOC=malloc "$hc" run --policy "$out/lifetime.policy" --log "$out/run.json" \
    -- "$PY" workloads/py_dicts.py
fi
echo "== simulate" >&2
"$hc" simulate "$trace" --plot "$out/simulate.png"
echo "== report" >&2
models=()
[ -f "$out/gru.safetensors" ] && models+=(--model "$out/gru.safetensors" --model "$out/ngram.safetensors")
"$hc" report "$trace" ${models[@]+"${models[@]}"} --lab -o "$out/report.html"
echo "main: results in $out/ (stats.png, simulate.png, models); open $out/report.html in a browser" >&2
