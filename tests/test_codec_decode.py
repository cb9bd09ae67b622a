"""The native column decoder (native/codec/decode.c via heapcast.trace.codec.decode_columns_into
and decode_pair_into) against the numpy decoding it replaced: every encoding, value width, plane
mask and output stride, several columns through one call, the address pair's back-references,
and the errors of bytes that do not fit."""
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


U64 = np.dtype(np.uint64)


def _planes(values: np.ndarray) -> tuple[bytes, int]:
    """uint64 values as the stored planes of a PLAIN column, and the mask of its zero planes."""
    planes = [((values >> np.uint64(8 * k)) & np.uint64(0xFF)).astype(np.uint8) for k in range(8)]
    omitted = sum(1 << k for k in range(8) if not planes[k].any())
    return b"".join(planes[k].tobytes() for k in range(8) if not omitted >> k & 1), omitted


def _pair_column(rng, count: int, sparse: bool):
    """A BACKREF column's bytes (codes: 0, 1 for an escape, k > 1 for the partner's value k - 1
    rows before; then the escapes as NONZERO_DELTA planes), its mask, and the codes and
    escapes' stored values for the reference."""
    codes = np.zeros(count, np.uint64)
    kind = rng.random(count)
    for i in range(count):
        if kind[i] < 0.2:
            codes[i] = 1
        elif kind[i] < 0.7 and i > 0:   # near rows mostly, some far back: long chains
            codes[i] = 1 + (int(rng.integers(1, min(i, 3) + 1)) if rng.random() < 0.7
                            else int(rng.integers(1, i + 1)))
    m = int((codes == 1).sum())
    esc = rng.integers(0, 1 << 40, m, dtype=np.uint64)
    esc_data, esc_omitted = _planes(esc)
    if not sparse:
        code_data, omitted = _planes(codes)
        return code_data + esc_data, omitted | esc_omitted << 8, codes, esc
    present = codes != 0
    code_data, omitted = _planes(codes[present])
    bits = np.packbits(present, bitorder="little").tobytes()
    return bits + code_data + esc_data, omitted | esc_omitted << 8, codes, esc


def _reference_pair(a, b, count: int):
    """The numpy decoding of the pair until stop 51 (backrefs, then resolve_pair as a loop):
    each column (codes, escapes' stored values) or (None, its values)."""
    vals, src = [], []
    for codes, esc in (a, b):
        if codes is None:
            vals.append(esc.astype(np.uint64).copy())
            src.append(np.full(count, -1, np.int64))
            continue
        v = np.zeros(count, np.uint64)
        data, _ = _planes(esc)
        _, omitted = _planes(esc)
        v[codes == 1] = _reference(data, codec.NONZERO_DELTA, U64, len(esc), omitted)
        s = np.full(count, -1, np.int64)
        rows = np.flatnonzero(codes > 1)
        s[rows] = rows - (codes[rows] - np.uint64(1)).astype(np.int64)
        vals.append(v)
        src.append(s)
    for i in range(count):
        if src[0][i] >= 0:
            vals[0][i] = vals[1][src[0][i]]
        if src[1][i] >= 0:
            vals[1][i] = vals[0][src[1][i]]
    return vals


@pytest.mark.parametrize("count", [0, 1, 2, 255, 256, 257, 3000])
@pytest.mark.parametrize("sparse", [False, True])
def test_the_address_pair_agrees_with_numpy(count, sparse):
    """Both columns BACKREF (dense or sparse codes), into a reader's 64-byte rows or contiguous
    arrays; then one column stored as plain values (older files), the other referring to it."""
    from heapcast.trace.format import EVENT_DTYPE
    rng = np.random.default_rng(count + 7 * sparse)
    ca, ma, codes_a, esc_a = _pair_column(rng, count, sparse)
    cb, mb, codes_b, esc_b = _pair_column(rng, count, sparse)
    want = _reference_pair((codes_a, esc_a), (codes_b, esc_b), count)
    how = codec.Sparse() if sparse else None
    rows = np.zeros(count, EVENT_DTYPE)
    codec.decode_pair_into((ca, codec.BACKREF, ma, how), (cb, codec.BACKREF, mb, how), count,
                           rows["addr"], rows["old_addr"])
    assert rows["addr"].tolist() == want[0].tolist()
    assert rows["old_addr"].tolist() == want[1].tolist()
    flat = np.zeros((2, count), np.uint64)
    codec.decode_pair_into((ca, codec.BACKREF, ma, how), (cb, codec.BACKREF, mb, how), count,
                           flat[0], flat[1])
    assert flat[0].tolist() == want[0].tolist() and flat[1].tolist() == want[1].tolist()
    plain = rng.integers(0, 1 << 48, count, dtype=np.uint64)
    data, omitted = _planes(plain)
    want = _reference_pair((None, plain), (codes_b, esc_b), count)
    rows = np.zeros(count, EVENT_DTYPE)
    codec.decode_pair_into((data, codec.PLAIN, omitted, None), (cb, codec.BACKREF, mb, how),
                           count, rows["addr"], rows["old_addr"])
    assert rows["addr"].tolist() == want[0].tolist()
    assert rows["old_addr"].tolist() == want[1].tolist()


def test_bad_address_pairs_name_their_column():
    rng = np.random.default_rng(3)
    count = 50
    ca, ma, codes_a, _ = _pair_column(rng, count, False)
    zeros = (bytes(0), codec.PLAIN, 0xFF, None)
    out = np.zeros((2, count), np.uint64)
    # a code that points before the block's start: row 10, code 12
    bad = codes_a.copy()
    bad[10] = 12
    m = int((bad == 1).sum())
    data, omitted = _planes(bad)
    esc, esc_omitted = _planes(np.arange(1, m + 1, dtype=np.uint64))
    with pytest.raises(codec.ColumnError, match=r"points before the start of the block \(row 10: "
                                                r"code 12\)") as e:
        codec.decode_pair_into(zeros, (data + esc, codec.BACKREF, omitted | esc_omitted << 8,
                                       None), count, out[0], out[1])
    assert e.value.column == 1
    # escapes' bytes that are not the escapes' planes; codes cut short
    with pytest.raises(codec.ColumnError, match=r"for \d+ escapes") as e:
        codec.decode_pair_into((ca[:-1], codec.BACKREF, ma, None), zeros, count, out[0], out[1])
    assert e.value.column == 0
    with pytest.raises(codec.ColumnError, match=r"expected at least \d+ for the codes of 50 rows"):
        codec.decode_pair_into((ca[:20], codec.BACKREF, ma, None), zeros, count, out[0], out[1])
    with pytest.raises(ValueError, match="uint64 rows of one stride"):
        codec.decode_pair_into(zeros, zeros, count, out[0], out[1][:-1])
