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
import zlib
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save

from ..forecast.modelfile import ModelError, write_atomic
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


def write_policy(path, tensors: dict, spec: dict, align: str | None = None) -> Path:
    """Writes a POLICY atomically: `tensors` (name -> numpy array) and `spec` (JSON-able).

    The data section's CRC-32 goes into the header as a fixed-width number, so that the header
    has the same length before and after it is known (the data does not move). With `align`, the
    header is padded (metadata `heapcast_pad`, spaces) so that that tensor's data starts on a
    64-byte boundary of the file: the runtime then reads it in place, with no aligned copy."""
    path = Path(path)
    arrays = {name: np.ascontiguousarray(a) for name, a in tensors.items()}
    meta = {"heapcast_policy": json.dumps({"format": FORMAT, **spec}, sort_keys=True),
            "heapcast_kind": spec["kind"], "heapcast_abi": str(ABI),
            "heapcast_model_sha256": spec.get("model", {}).get("sha256", ""),
            "heapcast_crc32": "0" * _CRC_DIGITS}
    if align:
        meta["heapcast_pad"] = ""
    try:
        blob = save(arrays, metadata=meta)
        hlen = int.from_bytes(blob[:8], "little")
        meta["heapcast_crc32"] = str(zlib.crc32(blob[8 + hlen:])).zfill(_CRC_DIGITS)
        if align:
            start = 8 + hlen + json.loads(blob[8:8 + hlen])[align]["data_offsets"][0]
            # offsets and the header's length are multiples of 8, and so is the padding: the
            # header (padded to 8 bytes by safetensors) grows by exactly its length
            meta["heapcast_pad"] = " " * (-start % 64)
            hlen += -start % 64
        blob = _canonical(save(arrays, metadata=meta))
    except (SafetensorError, ValueError, TypeError) as e:
        raise PolicyError(f"{path}: these tensors cannot be stored in a POLICY: {e}") from None
    assert int.from_bytes(blob[:8], "little") == hlen
    return write_atomic(path, blob)


def _canonical(blob: bytes) -> bytes:
    """The safetensors file `blob` with its header's keys (tensors, metadata) in sorted order:
    the same model compiles to the same bytes (safetensors writes the metadata in a hash map's
    order, which changes from run to run). The header keeps its length, so no data moves."""
    hlen = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + hlen])
    if isinstance(header.get("__metadata__"), dict):
        header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    if len(text) > hlen or json.loads(text) != json.loads(blob[8:8 + hlen]):
        return blob   # (never seen: serde's escapes differ from Python's) as safetensors wrote it
    return blob[:8] + text.ljust(hlen) + blob[8 + hlen:]


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
