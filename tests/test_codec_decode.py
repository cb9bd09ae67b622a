"""The native column decoder (native/codec/decode.c via heapcast.trace.codec.decode_columns_into)
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
        codec.decode_columns_into([c[:4] + (None, c[4]) for c in columns], count)
        for i, w in enumerate(want):
            assert rows[f"c{i}"].tolist() == w.tolist(), cases[i]
        # one at a time, into contiguous arrays, as codec.decode does
        for (data, enc, dt, omitted, _), w in zip(columns, want):
            assert codec.decode(data, enc, dt, count, omitted).tolist() == w.tolist()


def test_bytes_that_do_not_fit_name_their_column():
    ok = (bytes(16), codec.PLAIN, np.dtype("<u8"), 0xFE, None, np.zeros(16, np.uint64))
    short = (bytes(15), codec.DELTA, np.dtype("<u8"), 0xFE, None, np.zeros(16, np.uint64))
    with pytest.raises(codec.ColumnError, match="holds 15 bytes, expected 16") as e:
        codec.decode_columns_into([ok, short], 16)
    assert e.value.column == 1
    with pytest.raises(ValueError, match="unknown column encoding 9"):
        codec.decode_columns_into([(bytes(16), 9, np.dtype("<u8"), 0xFE, None,
                                    np.zeros(16, np.uint64))], 16)
    with pytest.raises(ValueError, match="planes beyond"):
        codec.decode_columns_into([(bytes(16), codec.PLAIN, np.dtype("<u1"), 0x02, None,
                                    np.zeros(16, np.uint8))], 16)
    with pytest.raises(ValueError, match="17 columns, at most 16"):
        codec.decode_columns_into([ok] * 17, 16)
    with pytest.raises(ValueError, match="writable rows"):
        codec.decode_columns_into([(bytes(16), codec.PLAIN, np.dtype("<u1"), 0, None,
                                    np.zeros(15, np.uint8))], 16)


@pytest.mark.parametrize("masked", [False, True])
def test_sparse_columns_agree_with_numpy(masked):
    """Presence bits (version 4: XOR the op mask's prediction from the rows' op values, read at
    their stride), the present rows' planes, every encoding, beside a dense column in one call."""
    rng = np.random.default_rng(5 + masked)
    count = 1000
    rows = np.zeros(count, [("op", "u1"), ("a", "<u8"), ("b", "<u4"), ("c", "<u8"), ("d", "u1")])
    rows["op"] = rng.integers(0, 20, count)
    for enc, dt, name in ((codec.PLAIN, np.dtype("<u4"), "b"), (codec.DELTA, np.dtype("<u8"), "a"),
                          (codec.ZIGZAG_DELTA, np.dtype("<u8"), "c"),
                          (codec.NONZERO_DELTA, np.dtype("<u8"), "c")):
        mask = int(rng.integers(1, 1 << 16)) if masked else 0
        pred = np.array([int(o) < 16 and bool(mask >> int(o) & 1) for o in rows["op"]])
        present = rng.random(count) < 0.2
        bits = np.packbits(present ^ pred if masked else present, bitorder="little")
        width = dt.itemsize if enc == codec.PLAIN else 8
        omitted = 0b11110000 if width == 8 else 0b1000
        kept = [k for k in range(width) if not omitted >> k & 1]
        vals = rng.integers(1, 1 << (8 * len(kept)), int(present.sum()), dtype=np.uint64)
        planes = b"".join(((vals >> np.uint64(8 * i)) & np.uint64(0xFF)).astype(np.uint8).tobytes()
                          for i in range(len(kept)))
        data = (mask.to_bytes(2, "little") if masked else b"") + bits.tobytes() + planes
        stored = np.zeros(count, np.uint64)
        stored[present] = vals
        packed = np.zeros((len(kept), count), np.uint8)   # as a dense column's planes, for _reference
        for i in range(len(kept)):
            packed[i] = (stored >> np.uint64(8 * i)) & np.uint64(0xFF)
        want = _reference(packed.tobytes(), enc, dt, count, omitted)
        how = codec.Sparse(masked, rows["op"])
        dense = rng.integers(0, 256, count, dtype=np.uint8)
        codec.decode_columns_into([(data, enc, dt, omitted, how, rows[name]),
                                   (dense.tobytes(), codec.PLAIN, np.dtype("u1"), 0, None,
                                    rows["d"])], count)
        assert rows[name].tolist() == want.tolist(), (enc, masked)
        assert rows["d"].tolist() == dense.tolist()
        with pytest.raises(codec.ColumnError, match=r"column holds \d+ bytes, expected \d+ \("):
            codec.decode_columns_into([(data[:-1], enc, dt, omitted, how, rows[name])], count)
