"""Features of a trace kept in its directory (`<trace>/.cache/features-*.hcf`), so that the
forecasting commands run one after another on the same trace (`train`, `evaluate`, `compile`
then `evaluate` of the policy, `report`) featurize it once: on the main job's trace (13.7 million
events) featurize takes 6.5-10.7 s, reading its features back 0.4 s.

An entry is found only under the key of everything it came from (heapcast.trace.cache.key: the
trace's .hct files, heapcast's own code, the stream order and the rank columns asked for), so a
stale entry is never read; a newer entry for the same order and rank columns replaces the older.
The file holds no pickle: a JSON header (the key, the order, the trace's source line, each
column's name, dtype, rows and stored length) and one zstd frame per column, `ts` and `seq` as
wrapping differences from the row before (their frames are then a few bytes per row instead of
eight). It takes 2.5-4 bytes per event (35 MB for the main job's trace, whose .hct file is 10
MB; 50 MB for ring 10M's 20M events). A trace keeps at most MAX_ENTRIES of them, the most
recently used (each read marks its entry used): a user who tries every stream order and rank
choice does not leave sixteen entries behind. An unreadable or damaged entry is computed again
and replaced; a trace directory that cannot be written is not cached. HEAPCAST_CACHE=0 turns the
cache off.
"""
from __future__ import annotations

import json
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import zstandard

from ..trace import cache

KIND = "features"
MAGIC = b"HCFEAT1\n"
_LEN = struct.Struct("<I")
_DELTA = ("ts", "seq")      # increasing within a stream: stored as differences
_LEVEL = 3
MAX_ENTRIES = 4             # per trace: the most recently used are kept


def entry_key(trace_dir, order: str, groups: tuple) -> str | None:
    """The key of the features of the trace in `trace_dir` in stream `order` with the rank
    groupings `groups`, or None when it is not a trace directory or caching is off."""
    if not Path(trace_dir).is_dir():
        return None
    return cache.key(trace_dir, kind=KIND, order=order, ranks=list(groups))


def load(trace_dir, k: str | None):
    """(Features, source) kept under key `k`, or None (no entry, or one that cannot be read)."""
    from .features import Features
    if k is None:
        return None
    path = cache.entry_path(trace_dir, KIND, k, ".hcf")
    try:
        with open(path, "rb") as f:
            if f.read(len(MAGIC)) != MAGIC:
                return None
            (n,) = _LEN.unpack(f.read(_LEN.size))
            head = json.loads(f.read(n))
            if head.get("key") != k:
                return None
            offsets = _read_column(f, head["offsets"])
            columns = {c["name"]: _read_column(f, c) for c in head["columns"]}
    except (OSError, ValueError, KeyError, TypeError, struct.error, zstandard.ZstdError):
        return None
    if len(offsets) < 1 or any(len(v) != offsets[-1] for v in columns.values()):
        return None
    try:
        os.utime(path)          # used now: the last to go (_evict)
    except OSError:
        pass
    return Features(head["order"], offsets, columns), head["source"]


def save(trace_dir, k: str | None, feats, source: dict) -> None:
    """Keeps `feats` (one trace's features) and its `source` line under key `k`, if the trace's
    directory can be written (0600, through a rename; older entries of the same parts go)."""
    if k is None:
        return
    names = list(feats.columns)
    with ThreadPoolExecutor(max(1, min(2, len(os.sched_getaffinity(0))))) as pool:
        frames = list(pool.map(lambda c: _frame(c, feats.columns[c]), names))
    offsets = _frame("offsets", feats.offsets)
    head = {"key": k, "order": feats.order, "source": source,
            "offsets": _describe("offsets", feats.offsets, offsets),
            "columns": [_describe(c, feats.columns[c], z) for c, z in zip(names, frames)]}
    data = json.dumps(head).encode()
    cache.write_entry(trace_dir, KIND, k, ".hcf",
                      [MAGIC, _LEN.pack(len(data)), data, offsets, *frames])
    _evict(trace_dir)


def _evict(trace_dir) -> None:
    """Removes the trace's feature entries beyond the MAX_ENTRIES most recently used."""
    kept = []
    for p in (Path(trace_dir) / cache.CACHE_DIR).glob(f"{KIND}-*.hcf"):
        try:
            kept.append((p.stat().st_mtime_ns, p))
        except OSError:
            pass                # removed meanwhile (another command's eviction)
    kept.sort(reverse=True)
    for _, p in kept[MAX_ENTRIES:]:
        try:
            p.unlink()
        except OSError:
            pass


def _describe(name: str, values: np.ndarray, frame: bytes) -> dict:
    return {"name": name, "dtype": np.dtype(values.dtype).str, "rows": int(len(values)),
            "stored": len(frame), "delta": name in _DELTA}


def _frame(name: str, values: np.ndarray) -> bytes:
    v = np.ascontiguousarray(values)
    if name in _DELTA and len(v):
        v = np.diff(v, prepend=v.dtype.type(0))   # wraps like the cumsum that undoes it
    return zstandard.ZstdCompressor(level=_LEVEL).compress(v.data)


def _read_column(f, c: dict) -> np.ndarray:
    dtype = np.dtype(c["dtype"])
    if dtype.hasobject:
        raise ValueError("object column")
    out = np.empty(int(c["rows"]), dtype)
    frame = f.read(int(c["stored"]))
    if len(frame) != c["stored"]:
        raise ValueError("truncated")
    view = memoryview(out).cast("B")
    with zstandard.ZstdDecompressor().stream_reader(frame) as r:
        got = 0
        while got < len(view):
            n = r.readinto(view[got:])
            if not n:
                raise ValueError("short column")
            got += n
        if r.read(1):
            raise ValueError("long column")
    if c.get("delta") and len(out):
        np.cumsum(out, out=out)
    return out

