"""Model files: safetensors (never pickle), written and read with the `safetensors` library.

A model is one `.safetensors` file (https://github.com/huggingface/safetensors), readable by any
safetensors reader and by torch. heapcast's own description lives in the header's `__metadata__`
under the key `heapcast`: a JSON object with `format` ("heapcast-forecast"), `format_version`, the
model kind, task, vocabulary and its version, the configuration, what it was trained on, and
`crc32` of the tensors' bytes (in name order), so that a damaged file is refused with a message
instead of silently predicting garbage: safetensors itself checks the layout, not the contents.

Writing is deterministic (JSON with sorted keys; safetensors orders tensors itself) and atomic
(a temporary name, then rename): the same weights give the same bytes. The tensors go to the file
from their own memory (safetensors' save_file): building the file in memory first held the model
three times over at once (an n-gram of 20M events: 5.9 GB of tables, 22.6 GB at its peak).

Version 2 (the n-gram's labels stored ragged, models/ngram.py) is written; versions 1 and 2 are
read. A heapcast that reads version 1 only refuses version 2 files instead of misreading them.
"""
from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

FORMAT = "heapcast-forecast"
FORMAT_VERSION = 2
READ_VERSIONS = (1, 2)
META_KEY = "heapcast"


class ModelError(ValueError):
    """A model file that cannot be used: corrupt, truncated, not a heapcast model, or a model of
    another task/vocabulary than asked. The message names the file and what is wrong."""


def _crc(tensors: dict) -> int:
    crc = 0
    for name in sorted(tensors):
        crc = zlib.crc32(np.ascontiguousarray(tensors[name]).data, crc)
    return crc


def save_model_file(path, tensors: dict, meta: dict) -> Path:
    """Writes `tensors` (name -> numpy array) and `meta` (JSON-able dict) to `path` atomically."""
    path = Path(path)
    arrays = {}
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        arrays[name] = arr
    full_meta = {"format": FORMAT, "format_version": FORMAT_VERSION, **meta,
                 "crc32": _crc(arrays)}
    tmp = path.with_name(path.name + ".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        save_file(arrays, tmp, metadata={META_KEY: json.dumps(full_meta, sort_keys=True)})
    except (SafetensorError, ValueError, TypeError) as e:
        tmp.unlink(missing_ok=True)
        raise TypeError(f"{path}: these tensors cannot be stored in a model file: {e}") from None
    os.chmod(tmp, 0o666 & ~_umask())   # (safetensors creates its files 0600)
    os.replace(tmp, path)
    return path


def _umask() -> int:
    """The process's umask, read without changing it (os.umask would, for every thread)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def read_model_file(path) -> tuple[dict, dict]:
    """Reads a model file: (tensors: name -> numpy array, meta: the heapcast metadata dict).

    Raises ModelError naming the file and the problem (and FileNotFoundError if it is absent).
    """
    path = Path(path)
    size = _check_size(path)
    try:
        with safe_open(str(path), framework="numpy") as f:
            block = f.metadata()
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except SafetensorError as e:
        raise ModelError(f"{path}: not a valid safetensors file, or truncated ({e})") from None
    meta = _meta(path, block)
    if _crc(tensors) != meta.get("crc32"):
        raise ModelError(f"{path}: tensor data is corrupt (CRC-32 mismatch over {size} bytes)")
    return tensors, meta


def _check_size(path: Path) -> int:
    """The size of a model file; ModelError for a directory or a file too short to be one (an
    OSError, as FileNotFoundError, names the file)."""
    if path.is_dir():
        raise ModelError(f"{path}: is a directory, expected a model file (.safetensors)")
    size = path.stat().st_size
    if size < 8:
        raise ModelError(f"{path}: {size} bytes, too short for a model file (safetensors)")
    return size


def read_model_meta(path) -> dict:
    """The heapcast metadata of a model file, without reading its tensors (ModelError as
    read_model_file)."""
    path = Path(path)
    _check_size(path)
    try:
        with safe_open(str(path), framework="numpy") as f:
            return _meta(path, f.metadata())
    except SafetensorError as e:
        raise ModelError(f"{path}: not a valid safetensors file, or truncated ({e})") from None


def _meta(path: Path, block) -> dict:
    if not isinstance(block, dict) or META_KEY not in block:
        raise ModelError(f"{path}: no heapcast metadata: a safetensors file, but not a heapcast "
                         f"forecasting model")
    try:
        meta = json.loads(block[META_KEY])
    except (TypeError, ValueError) as e:
        raise ModelError(f"{path}: heapcast metadata is not JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else meta
        raise ModelError(f"{path}: metadata format is {found!r}, expected {FORMAT!r}")
    if meta.get("format_version") not in READ_VERSIONS:
        raise ModelError(f"{path}: model format version {meta.get('format_version')!r}; this "
                         f"heapcast reads versions {', '.join(map(str, READ_VERSIONS))}")
    return meta
