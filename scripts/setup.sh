#!/usr/bin/env bash
# Installs what heapcast needs into .venv (idempotent): Debian tools used by tests and workloads,
# then heapcast itself (pip builds the native recorder). Set HEAPCAST_NO_APT=1 to skip apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v gcc >/dev/null || need_apt+=(gcc)
command -v sqlite3 >/dev/null || need_apt+=(sqlite3)
command -v valgrind >/dev/null || need_apt+=(valgrind)
# chromium: the report's tests open the page in a real headless browser.
command -v chromium >/dev/null || need_apt+=(chromium)
# heapcast's allocator's `--backend mimalloc` builds on mimalloc (libmimalloc-dev, before pip
# builds it); its tests and bench/alloc_table.py compare it with jemalloc and tcmalloc.
[ -e /usr/include/mimalloc.h ] || need_apt+=(libmimalloc-dev)
[ -e /usr/lib/x86_64-linux-gnu/libjemalloc.so.2 ] || need_apt+=(libjemalloc2)
[ -e /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 ] || need_apt+=(libtcmalloc-minimal4)
if [ ${#need_apt[@]} -gt 0 ] && [ -z "${HEAPCAST_NO_APT:-}" ] && command -v apt-get >/dev/null; then
  echo "setup: installing ${need_apt[*]} with apt-get" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# PyTorch for the neural forecasting models: pinned to the CPU build, which an open range would
# replace by a multi-GB CUDA build. Skip with HEAPCAST_NO_TORCH=1 (the rest works without it).
extras="test,plot"
if [ -z "${HEAPCAST_NO_TORCH:-}" ]; then
  .venv/bin/python -c 'import torch' 2>/dev/null || .venv/bin/python -m pip install -q torch==2.13.0
  extras="$extras,ml"
  extras="$extras,onnx"   # exporting the network step and checking it in onnxruntime
fi
.venv/bin/python -m pip install -q -e ".[$extras]"
echo "setup: ready (.venv/bin/heapcast)" >&2
