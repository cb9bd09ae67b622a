"""Column encodings of EVENTS blocks (docs/trace-format.md): delta, zigzag, byte planes.

Each transform is a few vectorized numpy passes; together with zstd they bring a 64-byte event to
a few bytes, because sequence numbers step by one, times by small amounts, and addresses repeat.
"""
from __future__ import annotations

import numpy as np

PLAIN, DELTA, ZIGZAG_DELTA, NONZERO_DELTA = 0, 1, 2, 3

#: The encoding of each stored column (EVENT_DTYPE order; `proc` is not stored).
COLUMN_ENCODING = {
    "seq": DELTA, "ts": ZIGZAG_DELTA, "addr": NONZERO_DELTA, "old_addr": NONZERO_DELTA,
    "size": PLAIN, "arg": PLAIN, "loc": PLAIN, "tid": PLAIN, "free_lag": PLAIN,
    "op": PLAIN, "flags": PLAIN,
}


def _zigzag(d: np.ndarray) -> np.ndarray:
    s = d.view(np.int64)
    return ((s << np.int64(1)) ^ (s >> np.int64(63))).view(np.uint64)


def _unzigzag(z: np.ndarray) -> np.ndarray:
    return ((z >> np.uint64(1)) ^ (np.uint64(0) - (z & np.uint64(1)))).astype(np.uint64)


def _shuffle(a: np.ndarray) -> bytes:
    """Byte planes: all first bytes, then all second bytes..."""
    if a.dtype.itemsize == 1:
        return a.tobytes()
    return np.ascontiguousarray(a.view(np.uint8).reshape(-1, a.dtype.itemsize).T).tobytes()


def _unshuffle(b: bytes, dtype: np.dtype, count: int) -> np.ndarray:
    if dtype.itemsize == 1:
        return np.frombuffer(b, dtype, count).copy()
    planes = np.frombuffer(b, np.uint8).reshape(dtype.itemsize, count)
    return np.ascontiguousarray(planes.T).view(dtype).reshape(count)


def encode(values: np.ndarray, encoding: int) -> bytes:
    """Encodes one column (unsigned integers) to bytes."""
    if encoding == PLAIN:
        return _shuffle(values)
    v = values.astype(np.uint64)
    if encoding == DELTA:
        return _shuffle(np.diff(v, prepend=np.uint64(0)))
    if encoding == ZIGZAG_DELTA:
        return _shuffle(_zigzag(np.diff(v, prepend=np.uint64(0))))
    if encoding == NONZERO_DELTA:
        out = np.zeros(len(v), np.uint64)
        nz = np.flatnonzero(v)
        vals = v[nz]
        out[nz] = _zigzag(np.diff(vals, prepend=np.uint64(0))) + np.uint64(1)
        return _shuffle(out)
    raise ValueError(f"unknown encoding {encoding}")


def decode(data: bytes, encoding: int, dtype: np.dtype, count: int) -> np.ndarray:
    """Inverse of encode(); raises ValueError on a length that does not fit."""
    stored = dtype if encoding == PLAIN else np.dtype(np.uint64)
    if len(data) != stored.itemsize * count:
        raise ValueError(f"column holds {len(data)} bytes, expected {stored.itemsize * count}")
    a = _unshuffle(data, stored, count)
    if encoding == PLAIN:
        return a
    if encoding == DELTA:
        return np.cumsum(a, dtype=np.uint64).astype(dtype)
    if encoding == ZIGZAG_DELTA:
        return np.cumsum(_unzigzag(a), dtype=np.uint64).astype(dtype)
    if encoding == NONZERO_DELTA:
        out = np.zeros(count, np.uint64)
        nz = np.flatnonzero(a)
        out[nz] = np.cumsum(_unzigzag(a[nz] - np.uint64(1)), dtype=np.uint64)
        return out.astype(dtype)
    raise ValueError(f"unknown column encoding {encoding}")
