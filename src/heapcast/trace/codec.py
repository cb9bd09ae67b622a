"""Column encodings of EVENTS blocks (docs/trace-format.md): delta, zigzag, byte planes.

Each transform is a few vectorized numpy passes; together with zstd they bring a 64-byte event to
a few bytes, because sequence numbers step by one, times by small amounts, and addresses repeat.
"""
from __future__ import annotations

import numpy as np

PLAIN, DELTA, ZIGZAG_DELTA, NONZERO_DELTA, BACKREF = 0, 1, 2, 3, 4

#: The encoding of each stored column (EVENT_DTYPE order; `proc` is not stored).
COLUMN_ENCODING = {
    "seq": DELTA, "ts": ZIGZAG_DELTA, "addr": NONZERO_DELTA, "old_addr": BACKREF,
    "size": PLAIN, "arg": PLAIN, "loc": PLAIN, "tid": PLAIN, "free_lag": PLAIN,
    "op": PLAIN, "flags": PLAIN,
}
#: What a reader accepts: any generic encoding for any column (older files used NONZERO_DELTA for
#: old_addr); BACKREF only for old_addr, which follows addr in the block.
GENERIC_ENCODINGS = frozenset((PLAIN, DELTA, ZIGZAG_DELTA, NONZERO_DELTA))
ALLOWED_ENCODINGS = {"old_addr": GENERIC_ENCODINGS | {BACKREF}}


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


def _backref(old: np.ndarray, addr: np.ndarray) -> np.ndarray:
    """For each row: 0 if old is 0, d + 1 if old equals addr of the row d rows earlier (the latest
    such row), 1 if no earlier row of the block produced it (an escape)."""
    codes = np.zeros(len(old), np.uint64)
    rel, acq = np.flatnonzero(old), np.flatnonzero(addr)
    vals = np.concatenate([addr[acq], old[rel]])
    pos = np.concatenate([acq, rel])
    kind = np.concatenate([np.ones(len(acq), np.int8), np.zeros(len(rel), np.int8)])
    order = np.lexsort((kind, pos, vals))     # per value, by row; a release before its row's own
    v, p, k = vals[order], pos[order], kind[order]
    last_acq = np.maximum.accumulate(np.where(k == 1, np.arange(len(v)), -1))
    src = np.maximum(last_acq, 0)
    found = (k == 0) & (last_acq >= 0) & (v[src] == v)
    codes[p[found]] = (p[found] - p[src[found]]).astype(np.uint64) + np.uint64(1)
    codes[p[(k == 0) & ~found]] = 1
    return codes


def encode(values: np.ndarray, encoding: int, block=None) -> bytes:
    """Encodes one column (unsigned integers) to bytes. BACKREF needs the block's `addr`."""
    if encoding == BACKREF:
        v = values.astype(np.uint64)
        codes = _backref(v, np.asarray(block["addr"], np.uint64))
        return _shuffle(codes) + encode(v[codes == 1], NONZERO_DELTA)
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


def decode(data: bytes, encoding: int, dtype: np.dtype, count: int, decoded=None) -> np.ndarray:
    """Inverse of encode(); raises ValueError on data that does not fit. BACKREF needs the
    block's decoded `addr` column in `decoded`."""
    if encoding == BACKREF:
        if len(data) < 8 * count:
            raise ValueError(f"column holds {len(data)} bytes, expected at least {8 * count}")
        codes = _unshuffle(data[:8 * count], np.dtype(np.uint64), count)
        escapes = codes == 1
        out = np.zeros(count, np.uint64)
        out[escapes] = decode(data[8 * count:], NONZERO_DELTA, np.dtype(np.uint64),
                              int(np.count_nonzero(escapes)))
        rows = np.flatnonzero(codes > 1)
        src = rows - (codes[rows] - np.uint64(1)).astype(np.int64)
        if len(src) and (src.min() < 0 or (codes[rows] > np.uint64(count)).any()):
            raise ValueError("a back-reference points before the start of the block")
        out[rows] = decoded["addr"][src]
        return out.astype(dtype)
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
