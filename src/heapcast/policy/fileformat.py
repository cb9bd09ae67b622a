"""POLICY files: a compiled model, one safetensors file (docs/policy-format.md).

The tensors are what the native runtime (native/policy/) reads: `cfg` (int32 settings, in the
order of CFG_FIELDS, the C enum of native/policy/internal.h) and the kind's tables or weights.
The metadata holds strings the C loader reads without a JSON parser (`heapcast_kind`,
`heapcast_abi`, `heapcast_crc32` of the data section, `heapcast_model_sha256`) and the full spec
as JSON under `heapcast_policy` (task, vocabulary, inputs, outputs, the source model and how it
was compiled) for Python and for people.
"""
from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open

from ..forecast.modelfile import ModelError
from .names import KINDS  # noqa: F401 (re-exported)

FORMAT = "heapcast-policy"
ABI = 2
TASK_IDS = {"next": 0, "free": 1, "lifetime": 2}
VOCAB_IDS = {"seed64": 0, "rich": 1}
#: The int32 settings tensor `cfg`, in order (native/policy/internal.h, enum CFG_*).
CFG_FIELDS = ("abi", "kind", "task", "vocab", "n_labels", "shift",
              "hidden", "n_out", "n_in_tokens", "site_buckets", "n_dt", "hints", "n_cache",
              "int8", "ng_orders", "ng_sites", "ng_dt", "ng_topk", "ng_classes",
              "tab_ctx", "tab_bits")
_CRC_DIGITS = 10


class PolicyError(ModelError):
    """A POLICY file that cannot be used, or a model that cannot be compiled; the message names
    the file and the field."""


def cfg_array(**values) -> np.ndarray:
    """The `cfg` tensor from named settings (unnamed ones are 0)."""
    unknown = set(values) - set(CFG_FIELDS)
    if unknown:
        raise ValueError(f"unknown policy settings: {', '.join(sorted(unknown))}")
    return np.array([int(values.get(f, 0)) for f in CFG_FIELDS], np.int32)


#: safetensors' dtype names, in the order its writer lays tensors out (larger first, then by
#: name); policies are written in that same layout.
_DTYPES = {"u8": ("U64", 0), "i8": ("I64", 1), "f8": ("F64", 2), "f4": ("F32", 3),
           "u4": ("U32", 4), "i4": ("I32", 5), "f2": ("F16", 6), "u2": ("U16", 7),
           "i2": ("I16", 8), "i1": ("I8", 9), "u1": ("U8", 10), "b1": ("BOOL", 11)}


def write_policy(path, tensors: dict, spec: dict, align: str | None = None) -> Path:
    """Writes a POLICY atomically: `tensors` (name -> numpy array) and `spec` (JSON-able).

    The file is a safetensors file written here, from the arrays' own memory, in the layout
    safetensors' own writer gives (tensors by dtype then name; the header's keys sorted, so that
    the same model compiles to the same bytes: safetensors writes its metadata in a hash map's
    order). Building it in memory with safetensors' `save` held a policy four times over: a GRU
    with the hints of ring's 20M events (a 5.3 GB policy) ran out of 24 GB. The data section's
    CRC-32 is in the header (`heapcast_crc32`). With `align`, the header is padded (metadata
    `heapcast_pad`, spaces) so that that tensor's data starts on a 64-byte boundary of the file
    where its offset allows: the runtime then reads it in place, with no aligned copy."""
    path = Path(path)
    arrays = {}
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)      # (a 0-d array becomes one value)
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        if a.dtype.str[1:] not in _DTYPES:
            raise PolicyError(f"{path}: tensor {name!r} has dtype {a.dtype}, which a POLICY "
                              f"cannot hold")
        arrays[name] = a
    names = sorted(arrays, key=lambda n: (_DTYPES[arrays[n].dtype.str[1:]][1], n))
    entries, offset, crc = {}, 0, 0
    for name in names:
        a = arrays[name]
        entries[name] = {"data_offsets": [offset, offset + a.nbytes],
                         "dtype": _DTYPES[a.dtype.str[1:]][0], "shape": list(a.shape)}
        offset += a.nbytes
        crc = zlib.crc32(a.data, crc)
    meta = {"heapcast_policy": json.dumps({"format": FORMAT, **spec}, sort_keys=True),
            "heapcast_kind": spec["kind"], "heapcast_abi": str(ABI),
            "heapcast_model_sha256": spec.get("model", {}).get("sha256", ""),
            "heapcast_crc32": str(crc).zfill(_CRC_DIGITS)}
    if align:
        meta["heapcast_pad"] = ""
        base, at = len(_header(meta, entries)), entries[align]["data_offsets"][0]
        # the padding that aligns, a multiple of 8 (none where the tensor's offset is not one)
        pad = -(8 + _round8(base) + at) % 64
        if (8 + _round8(base + pad) + at) % 64 == 0:
            meta["heapcast_pad"] = " " * pad
    text = _header(meta, entries)
    text += b" " * (_round8(len(text)) - len(text))
    tmp = path.with_name(path.name + ".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name in names:
            if arrays[name].nbytes:
                f.write(arrays[name].reshape(-1).data)
    os.replace(tmp, path)
    return path


def _header(meta: dict, entries: dict) -> bytes:
    """The safetensors header: tensors and metadata, keys sorted, compact JSON."""
    header = {"__metadata__": meta, **entries}
    return json.dumps(header, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode()


def _round8(n: int) -> int:
    return -(-n // 8) * 8


def read_spec(path) -> dict:
    """The spec of the POLICY at `path` (PolicyError if it is not one; the native loader checks
    the rest)."""
    path = Path(path)
    if path.is_dir():
        raise PolicyError(f"{path}: is a directory, expected a POLICY file")
    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
    except SafetensorError as e:
        raise PolicyError(f"{path}: not a valid safetensors file, or truncated ({e})") from None
    if "heapcast_policy" not in meta:
        raise PolicyError(f"{path}: no heapcast_policy metadata: not a compiled POLICY")
    try:
        spec = json.loads(meta["heapcast_policy"])
    except ValueError as e:
        raise PolicyError(f"{path}: field heapcast_policy is not JSON ({e})") from None
    if spec.get("format") != FORMAT:
        raise PolicyError(f"{path}: field format is {spec.get('format')!r}, expected {FORMAT!r}")
    return spec


def is_policy(path) -> bool:
    """Whether `path` is a compiled POLICY (rather than a forecasting model file)."""
    try:
        with safe_open(str(path), framework="numpy") as f:
            return "heapcast_policy" in (f.metadata() or {})
    except (SafetensorError, OSError):
        return False
