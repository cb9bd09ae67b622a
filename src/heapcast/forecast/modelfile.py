"""Model files: safetensors (never pickle), written and checked with numpy alone.

A model is one `.safetensors` file (https://github.com/huggingface/safetensors: an 8-byte
little-endian header length, a JSON header naming each tensor's dtype, shape and byte range, then
the raw bytes), readable by the `safetensors` library and by torch. heapcast's own description
lives in the header's `__metadata__` under the key `heapcast`: a JSON object with `format`
("heapcast-forecast"), `format_version`, the model kind, task, vocabulary and its version, the
configuration, what it was trained on, and `crc32` of the tensor bytes, so that a damaged file is
refused with a message instead of silently predicting garbage.

Writing is deterministic (tensors in name order, JSON with sorted keys) and atomic (a temporary
name, then rename): the same weights give the same bytes.
"""
from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path

import numpy as np

FORMAT = "heapcast-forecast"
FORMAT_VERSION = 1
META_KEY = "heapcast"
MAX_HEADER = 100 << 20

_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
           "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?"}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}


class ModelError(ValueError):
    """A model file that cannot be used: corrupt, truncated, not a heapcast model, or a model of
    another task/vocabulary than asked. The message names the file and what is wrong."""


def save_model_file(path, tensors: dict, meta: dict) -> Path:
    """Writes `tensors` (name -> numpy array) and `meta` (JSON-able dict) to `path` atomically."""
    path = Path(path)
    names = sorted(tensors)
    arrays = [np.ascontiguousarray(tensors[n]) for n in names]
    header, offset = {}, 0
    for name, arr in zip(names, arrays):
        arr_dtype = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
        if np.dtype(arr_dtype) not in _NAMES:
            raise TypeError(f"{name}: dtype {arr.dtype} cannot be stored in a model file")
        header[name] = {"dtype": _NAMES[np.dtype(arr_dtype)], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    data = b"".join(a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes() for a in arrays)
    full_meta = {"format": FORMAT, "format_version": FORMAT_VERSION, **meta,
                 "crc32": zlib.crc32(data)}
    header["__metadata__"] = {META_KEY: json.dumps(full_meta, sort_keys=True)}
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = path.with_name(path.name + ".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        f.write(data)
    os.replace(tmp, path)
    return path


def read_model_file(path) -> tuple[dict, dict]:
    """Reads a model file: (tensors: name -> numpy array, meta: the heapcast metadata dict).

    Raises ModelError naming the file and the problem (and FileNotFoundError if it is absent).
    """
    path = Path(path)
    if path.is_dir():
        raise ModelError(f"{path}: is a directory, expected a model file (.safetensors)")
    raw = path.read_bytes()
    if len(raw) < 8:
        raise ModelError(f"{path}: {len(raw)} bytes, too short for a model file (safetensors)")
    (hlen,) = struct.unpack_from("<Q", raw, 0)
    if hlen > min(MAX_HEADER, len(raw) - 8):
        raise ModelError(f"{path}, offset 0: header length {hlen} exceeds the file "
                         f"({len(raw)} bytes): not a safetensors model file, or truncated")
    try:
        header = json.loads(raw[8:8 + hlen])
    except (UnicodeDecodeError, ValueError) as e:
        raise ModelError(f"{path}, offset 8: header is not JSON ({e}): not a model file") from None
    if not isinstance(header, dict):
        raise ModelError(f"{path}, offset 8: header is not a JSON object")
    meta = _meta(path, header.pop("__metadata__", None))
    data = raw[8 + hlen:]
    if zlib.crc32(data) != meta.get("crc32"):
        raise ModelError(f"{path}: tensor data is corrupt or truncated (CRC-32 mismatch over "
                         f"{len(data)} bytes at offset {8 + hlen})")
    tensors = {}
    for name, info in header.items():
        tensors[name] = _tensor(path, name, info, data, 8 + hlen)
    return tensors, meta


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
    if meta.get("format_version") != FORMAT_VERSION:
        raise ModelError(f"{path}: model format version {meta.get('format_version')!r}; this "
                         f"heapcast reads version {FORMAT_VERSION}")
    return meta


def _tensor(path: Path, name: str, info, data: bytes, base: int) -> np.ndarray:
    try:
        dtype = np.dtype(_DTYPES[info["dtype"]])
        shape = tuple(int(s) for s in info["shape"])
        begin, end = (int(v) for v in info["data_offsets"])
    except (KeyError, TypeError, ValueError):
        raise ModelError(f"{path}: tensor {name!r}: bad header entry {info!r}") from None
    count = int(np.prod(shape, dtype=np.int64))
    if not (0 <= begin <= end <= len(data)) or end - begin != count * dtype.itemsize:
        raise ModelError(f"{path}: tensor {name!r}: byte range {begin}..{end} (file offset "
                         f"{base + begin}) does not hold shape {list(shape)} of {info['dtype']}")
    return np.frombuffer(data, dtype, count, begin).reshape(shape)
