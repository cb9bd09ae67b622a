"""The native column decoder (native/codec/decode.c via heapcast.trace.codec.decode_dense_into)
against the numpy decoding it replaced: every encoding, value width, plane mask and output
stride, several columns through one call, and the errors of bytes that do not fit."""
from __future__ import annotations

import numpy as np
import pytest

from heapcast.trace import codec


def _reference(data: bytes, encoding: int, dtype: np.dtype, count: int, omitted: int):
    """The numpy decoding of a dense column until stop 50."""
    stored = dtype if encoding == codec.PLAIN else np.dtype(np.uint64)
    kept = [k for k in range(stored.itemsize) if not omitted >> k & 1]
    planes = np.frombuffer(data, np.uint8).reshape(len(kept), count)
    a = np.zeros(count, stored)
    a.view(np.uint8).reshape(count, stored.itemsize)[:, kept] = planes.T
    if encoding == codec.PLAIN:
        return a
    if encoding == codec.DELTA:
        return np.cumsum(a, dtype=np.uint64).astype(dtype)
    z = (a >> np.uint64(1)) ^ (np.uint64(0) - (a & np.uint64(1)))
    if encoding == codec.ZIGZAG_DELTA:
        return np.cumsum(z, dtype=np.uint64).astype(dtype)
    out = np.zeros(count, np.uint64)
    nz = np.flatnonzero(a)
    zz = a[nz] - np.uint64(1)
    out[nz] = np.cumsum((zz >> np.uint64(1)) ^ (np.uint64(0) - (zz & np.uint64(1))), dtype=np.uint64)
    return out.astype(dtype)


def _column(rng, encoding, dtype, count):
    width = dtype.itemsize if encoding == codec.PLAIN else 8
    omitted = int(rng.integers(0, 1 << width))
    kept = width - bin(omitted).count("1")
    data = rng.integers(0, 256, kept * count, dtype=np.uint8)
    if encoding == codec.NONZERO_DELTA:   # (rows of zeros: no value)
        planes = data.reshape(kept, count)
        planes[:, rng.random(count) < 0.3] = 0
    return data.tobytes(), omitted


@pytest.mark.parametrize("count", [0, 1, 255, 256, 257, 5000])
def test_every_encoding_width_and_mask_agrees_with_numpy(count):
    rng = np.random.default_rng(count)
    cases = [(codec.PLAIN, np.dtype(t)) for t in ("<u1", "<u2", "<u4", "<u8")] + \
            [(e, np.dtype(t)) for e in (codec.DELTA, codec.ZIGZAG_DELTA, codec.NONZERO_DELTA)
             for t in ("<u8", "<u4", "<u1")]
    for _ in range(3):
        rows = np.zeros(count, [(f"c{i}", dt) for i, (_, dt) in enumerate(cases)] + [("pad", "u1")])
        columns, want = [], []
        for i, (enc, dt) in enumerate(cases):
            data, omitted = _column(rng, enc, dt, count)
            columns.append((data, enc, dt, omitted, rows[f"c{i}"]))   # strided fields
            want.append(_reference(data, enc, dt, count, omitted))
        codec.decode_dense_into(columns, count)
        for i, w in enumerate(want):
            assert rows[f"c{i}"].tolist() == w.tolist(), cases[i]
        # one at a time, into contiguous arrays, as codec.decode does
        for (data, enc, dt, omitted, _), w in zip(columns, want):
            assert codec.decode(data, enc, dt, count, omitted).tolist() == w.tolist()


def test_bytes_that_do_not_fit_name_their_column():
    ok = (bytes(16), codec.PLAIN, np.dtype("<u8"), 0xFE, np.zeros(16, np.uint64))
    short = (bytes(15), codec.DELTA, np.dtype("<u8"), 0xFE, np.zeros(16, np.uint64))
    with pytest.raises(codec.ColumnError, match="holds 15 bytes, expected 16") as e:
        codec.decode_dense_into([ok, short], 16)
    assert e.value.column == 1
    with pytest.raises(ValueError, match="unknown column encoding 9"):
        codec.decode_dense_into([(bytes(16), 9, np.dtype("<u8"), 0xFE, np.zeros(16, np.uint64))], 16)
    with pytest.raises(ValueError, match="planes beyond"):
        codec.decode_dense_into([(bytes(16), codec.PLAIN, np.dtype("<u1"), 0x02,
                                  np.zeros(16, np.uint8))], 16)
    with pytest.raises(ValueError, match="writable rows"):
        codec.decode_dense_into([(bytes(16), codec.PLAIN, np.dtype("<u1"), 0,
                                  np.zeros(15, np.uint8))], 16)
