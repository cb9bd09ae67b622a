"""The native EVENTS block encoder (native/codec/encode.c): what it writes is what the numpy
decoder (heapcast.trace.codec.decode) and the reader read back, byte for byte what the numpy
encoder it replaced wrote with its all-zero byte planes left out."""
import shutil
import struct
import subprocess
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import zstandard

import heapcast
from heapcast.trace import codec, native_codec, writer
from heapcast.trace.format import EVENT_DTYPE, OPS, TraceError
from heapcast.trace.model import LocationTable, Process
from heapcast.trace.native_codec import encode_events
from heapcast.trace.writer import COLUMN, EVENTS, FILE_HEADER, SECTION, write_process_file

U64_MAX = 2**64 - 1
FIELDS = codec.STORED_FIELDS
SOURCE = Path(__file__).resolve().parent.parent / "native" / "codec" / "encode.c"


# ---- the numpy encoder that native/codec/encode.c replaced (git a8a3f50), kept as the reference
# (with BACKREF generalized: a column refers to its partner's values, codec.PARTNER)

def _zigzag(d):
    s = d.view(np.int64)
    return ((s << np.int64(1)) ^ (s >> np.int64(63))).view(np.uint64)


def _shuffle(a):
    if a.dtype.itemsize == 1:
        return a.tobytes()
    return np.ascontiguousarray(a.view(np.uint8).reshape(-1, a.dtype.itemsize).T).tobytes()


def _backref(old, addr):
    codes = np.zeros(len(old), np.uint64)
    rel, acq = np.flatnonzero(old), np.flatnonzero(addr)
    vals = np.concatenate([addr[acq], old[rel]])
    pos = np.concatenate([acq, rel])
    kind = np.concatenate([np.ones(len(acq), np.int8), np.zeros(len(rel), np.int8)])
    order = np.lexsort((kind, pos, vals))
    v, p, k = vals[order], pos[order], kind[order]
    last_acq = np.maximum.accumulate(np.where(k == 1, np.arange(len(v)), -1))
    src = np.maximum(last_acq, 0)
    found = (k == 0) & (last_acq >= 0) & (v[src] == v)
    codes[p[found]] = (p[found] - p[src[found]]).astype(np.uint64) + np.uint64(1)
    codes[p[(k == 0) & ~found]] = 1
    return codes


def _encode(values, encoding, block=None, name=None):
    if encoding == codec.BACKREF:
        v = values.astype(np.uint64)
        codes = _backref(v, np.asarray(block[codec.PARTNER[name]], np.uint64))
        return _shuffle(codes) + _encode(v[codes == 1], codec.NONZERO_DELTA)
    if encoding == codec.PLAIN:
        return _shuffle(values)
    v = values.astype(np.uint64)
    if encoding == codec.DELTA:
        return _shuffle(np.diff(v, prepend=np.uint64(0)))
    if encoding == codec.ZIGZAG_DELTA:
        return _shuffle(_zigzag(np.diff(v, prepend=np.uint64(0))))
    out = np.zeros(len(v), np.uint64)   # NONZERO_DELTA
    nz = np.flatnonzero(v)
    out[nz] = _zigzag(np.diff(v[nz], prepend=np.uint64(0))) + np.uint64(1)
    return _shuffle(out)


def _leave_out_zero_planes(data, width, count):
    """(mask of the all-zero planes, the other planes) of `width` shuffled planes of count bytes."""
    planes = np.frombuffer(data, np.uint8).reshape(width, count)
    zero = ~planes.any(axis=1)
    return sum(1 << k for k in np.flatnonzero(zero)), planes[~zero].tobytes()


def reference_column(values, enc, block=None, name=None):
    """(plane mask, bytes) of one column, as the format stores it (version 2)."""
    data = _encode(values, enc, block, name)
    n = len(values)
    width = values.dtype.itemsize if enc == codec.PLAIN else 8
    if enc != codec.BACKREF:
        return _leave_out_zero_planes(data, width, n)
    codes_mask, codes = _leave_out_zero_planes(data[:8 * n], 8, n)
    esc_mask, escapes = _leave_out_zero_planes(data[8 * n:], 8, len(data) // 8 - n)
    return codes_mask | esc_mask << 8, codes + escapes


def predicted(mask, ops):
    """The presence an op mask predicts for rows of these ops (version 4)."""
    ops = np.asarray(ops, np.int64)
    return (ops < codec.OP_KINDS) & (mask >> np.minimum(ops, 63) & 1).astype(bool)


def reference_sparse(data, enc, mask, count, ops=None, version=4):
    """(encoding byte, bytes) of a sparse-format column from its version 2 (mask, bytes):
    sparse (codec.SPARSE) when at least 64 rows and at most 3/4 of them not zero: version 3,
    presence bits, then the planes of the rows whose stored value is not zero; version 4, an
    op mask first (bit o: most rows of op o present; 0 for the op column, whose `ops` is None)
    and the presence bits XOR its prediction from the block's ops."""
    planes = 8 - bin(mask & 0xFF).count("1") if enc == codec.BACKREF else len(data) // max(count, 1)
    if count < 64 or not planes:
        return enc, data
    codes = np.frombuffer(data[:planes * count], np.uint8).reshape(planes, count)
    present = codes.any(axis=0)
    if 4 * int(present.sum()) > 3 * count:
        return enc, data
    head, bits = b"", present
    if version >= 4:
        op_mask = 0
        for o in range(codec.OP_KINDS if ops is not None else 0):
            rows = np.asarray(ops) == o
            if 2 * int(present[rows].sum()) > int(rows.sum()):
                op_mask |= 1 << o
        head = struct.pack("<H", op_mask)
        if op_mask:
            bits = present ^ predicted(op_mask, ops)
    packed = np.packbits(bits, bitorder="little").tobytes()
    return enc | codec.SPARSE, head + packed + codes[:, present].tobytes() + data[planes * count:]


def reference_encode_events(block, version=4):
    """The payload the format specifies; version 1: every plane stored (mask 0); version 2: the
    zero planes left out; version 3: and mostly-zero columns sparse; version 4: their presence
    bits predicted from the op column."""
    parts = []
    for name in FIELDS:
        enc = codec.COLUMN_ENCODING[name]
        values = np.ascontiguousarray(block[name])
        mask, data = (reference_column(values, enc, block, name) if version >= 2
                      else (0, _encode(values, enc, block, name)))
        if version >= 3:
            ops = None if name == "op" else np.asarray(block["op"])
            enc, data = reference_sparse(data, enc, mask, len(values), ops, version)
        parts += [COLUMN.pack(EVENT_DTYPE.names.index(name), enc, mask, len(data)), data]
    return b"".join(parts)


# ---- helpers

def raw_columns(payload):
    """{name: (encoding, plane mask, stored bytes)} of an EVENTS payload; checks the column order
    and that the lengths add up."""
    payload = bytes(payload)
    out, pos = {}, 0
    for name in FIELDS:
        field, enc, mask, n = COLUMN.unpack_from(payload, pos)
        assert field == EVENT_DTYPE.names.index(name), name
        pos += COLUMN.size
        out[name] = (enc, mask, payload[pos:pos + n])
        pos += n
    assert pos == len(payload)
    return out


def _with_zero_planes(data, mask, width, count):
    """Shuffled bytes of `width` planes from the planes stored (the others zero)."""
    kept = [k for k in range(width) if not mask >> k & 1]
    assert len(data) == len(kept) * count
    planes = np.zeros((width, count), np.uint8)
    planes[kept] = np.frombuffer(data, np.uint8).reshape(len(kept), count)
    return planes.tobytes()


def sparse_bits(data, count, ops):
    """(presence, bytes they take) of a version 4 sparse column's data (the bits XOR the op
    mask's prediction, in numpy; the reader follows them natively); ops: the block's op values
    (the layout is the reader's codec.Sparse's, which the round trips of this file check)."""
    head, mask, nbytes = codec.Sparse(True, ops).layout(data, count)
    bits = np.unpackbits(np.frombuffer(data, np.uint8, nbytes - head, head), bitorder="little")
    table = np.array([o < codec.OP_KINDS and mask >> o & 1 for o in range(256)], bool)
    return bits[:count].view(bool) ^ table[np.asarray(ops)], nbytes


def dense(enc, mask, data, count, ops):
    """(encoding, bytes) of a column of a version 4 payload as version 2 stores it: a sparse
    one's rows put back (ops: the block's op values)."""
    if not enc & codec.SPARSE:
        return enc, data
    enc &= ~codec.SPARSE
    present, head = sparse_bits(data, count, ops)
    m = int(present.sum())
    planes = 8 - bin(mask & 0xFF).count("1") if enc == codec.BACKREF else (len(data) - head) // m
    codes = np.zeros((planes, count), np.uint8)
    codes[:, present] = np.frombuffer(data[head:head + planes * m], np.uint8).reshape(planes, m)
    return enc, codes.tobytes() + data[head + planes * m:]


def columns(payload, count):
    """{name: (encoding, bytes with every plane)} of an EVENTS payload of `count` rows: the
    layout of version 1, which the hand-computed expectations below spell out."""
    out = {}
    ops = decode(payload, count)["op"]
    for name, (enc, mask, data) in raw_columns(payload).items():
        enc, data = dense(enc, mask, data, count, ops)
        width = EVENT_DTYPE[name].itemsize if enc == codec.PLAIN else 8
        if enc != codec.BACKREF:
            assert mask >> width == 0, name
            out[name] = (enc, _with_zero_planes(data, mask, width, count))
            continue
        codes_len = (8 - bin(mask & 0xFF).count("1")) * count
        codes = _with_zero_planes(data[:codes_len], mask & 0xFF, 8, count)
        m = int((np.frombuffer(codes, np.uint8).reshape(8, count).T.copy().view("<u8") == 1).sum())
        out[name] = (enc, codes + _with_zero_planes(data[codes_len:], mask >> 8, 8, m))
    return out


def decode(payload, count, version=4):
    """An EVENT_DTYPE array from an EVENTS payload, with the reader's numpy decoder (the op
    column first: the others' presence bits are predicted from it)."""
    ev = np.zeros(count, EVENT_DTYPE)
    pairs = {}
    cols = sorted(raw_columns(payload).items(), key=lambda c: c[0] != "op")
    for name, (enc, mask, data) in cols:
        sparse, enc = bool(enc & codec.SPARSE), enc & ~codec.SPARSE
        how = codec.Sparse(version >= 4, None if name == "op" else ev["op"]) if sparse else None
        if name in codec.PARTNER:
            pairs[name] = (data, enc, mask, how)
        else:
            ev[name] = codec.decode(data, enc, EVENT_DTYPE[name], count, mask, how)
    codec.decode_pair_into(pairs["addr"], pairs["old_addr"], count, ev["addr"], ev["old_addr"])
    return ev


def block(n, **fields):
    ev = np.zeros(n, EVENT_DTYPE)
    ev["seq"] = np.arange(1, n + 1)
    for name, values in fields.items():
        ev[name] = values
    return ev


def realistic(n, seed, pool=5000):
    """n events like a real program's: addresses reused from a pool, frees and reallocs of
    addresses produced earlier (in this block or before it), seq gaps, every op."""
    rng = np.random.default_rng(seed)
    ev = np.zeros(n, EVENT_DTYPE)
    ev["seq"] = 100 + np.cumsum(rng.integers(1, 3, n))
    ev["ts"] = 10**12 + np.cumsum(rng.integers(0, 3000, n)) - rng.integers(0, 2000, n)  # threads
    addrs = 0x7F00_0000_0000 + 16 * rng.permutation(1 << 20)[:pool].astype(np.uint64)
    op = rng.integers(0, len(OPS), n)
    produced = rng.random(n) < 0.55
    ev["addr"] = np.where(produced, addrs[rng.integers(0, pool, n)], 0)
    back = np.maximum(np.arange(n) - rng.integers(1, 400, n), 0)   # an earlier row's address
    old = np.where(rng.random(n) < 0.8, ev["addr"][back], addrs[rng.integers(0, pool, n)])
    own = rng.random(n) < 0.05                                     # realloc in place
    ev["old_addr"] = np.where(own, ev["addr"], np.where(rng.random(n) < 0.5, old, 0))
    ev["size"] = np.where(rng.random(n) < 0.01, np.uint64(U64_MAX),
                          rng.integers(0, 1 << 16, n, dtype=np.uint64))
    ev["arg"] = rng.integers(0, 2**63, n, dtype=np.uint64) * (rng.random(n) < 0.1)
    ev["loc"] = rng.integers(0, 2**32, n, dtype=np.uint64) % 70000
    ev["tid"] = rng.integers(0, 9, n)
    ev["free_lag"] = rng.integers(0, 3, n)
    ev["op"] = op
    ev["flags"] = rng.integers(0, 2, n)
    return ev


def as_dict(ev, **dtypes):
    return {name: np.array(ev[name], dtype=dtypes.get(name, EVENT_DTYPE[name]))
            for name in EVENT_DTYPE.names}


# ---- byte for byte what the numpy encoder wrote

@pytest.mark.parametrize("n", [0, 1, 2, 15, 16, 17, 63, 64, 65, 100, 4095, 4096, 4097, 9000])
def test_same_bytes_as_the_numpy_encoder(n):
    ev = realistic(n, seed=n)
    want = reference_encode_events(ev)
    assert bytes(encode_events(ev)) == want                                # 64-byte strides
    assert bytes(encode_events(as_dict(ev))) == want                       # contiguous columns
    backwards = ev[::-1].copy()[::-1]                                      # -64-byte strides
    assert bytes(encode_events(backwards)) == want
    np.testing.assert_array_equal(decode(want, n), ev)


def test_same_bytes_on_random_values():
    """Any u64 values, no address reuse: mostly escapes, all deltas wrap both ways."""
    rng = np.random.default_rng(7)
    n = 20000
    ev = np.zeros(n, EVENT_DTYPE)
    for name in FIELDS:
        hi = 2**63 if EVENT_DTYPE[name].itemsize == 8 else 2**(8 * EVENT_DTYPE[name].itemsize)
        ev[name] = rng.integers(0, hi, n, dtype=np.uint64) * (rng.random(n) < 0.6)
    payload = encode_events(ev)
    assert bytes(payload) == reference_encode_events(ev)
    np.testing.assert_array_equal(decode(payload, n), ev)


def test_other_integer_dtypes_and_strides_give_the_same_bytes():
    ev = realistic(3000, seed=11)
    want = reference_encode_events(ev)
    wide = as_dict(ev, seq=np.int64, loc=np.int64, tid=np.uint64, op=np.int32, flags=np.uint16)
    assert bytes(encode_events(wide)) == want
    strided = {name: np.repeat(ev[name], 3)[::3] for name in EVENT_DTYPE.names}
    assert strided["addr"].strides[0] == 24
    assert bytes(encode_events(strided)) == want


@pytest.mark.parametrize("order", [("addr", "seq", "old_addr"), ("old_addr", "addr"),
                                   ("addr", "size")])
@pytest.mark.parametrize("strided", [False, True])
def test_address_columns_encode_the_same_alone_or_as_a_pair(order, strided):
    """The two address columns are encoded in one pass when they come side by side (the
    format's order), each alone otherwise (a column between them; or a partner that is not a
    back-reference column): the same bytes per column either way."""
    from heapcast.trace import native_codec as nc
    ev = realistic(9000, seed=5)
    if strided:
        arrays = {name: ev[name] for name in order}
    else:
        arrays = {name: np.ascontiguousarray(ev[name]) for name in order}
    cols = (nc.Column * len(order))()
    for i, name in enumerate(order):
        a = arrays[name]
        enc = codec.COLUMN_ENCODING[name]
        partner = order.index(codec.PARTNER[name]) if enc == codec.BACKREF and \
            codec.PARTNER[name] in order else -1
        if partner < 0:
            enc = codec.PLAIN if name != "addr" else codec.DELTA
        cols[i] = nc.Column(a.ctypes.data, a.strides[0], EVENT_DTYPE.names.index(name), enc,
                            a.itemsize, 0, partner)
    lib = nc.library()
    out = np.zeros(lib.hc_encode_bound(cols, len(order), len(ev)), np.uint8)
    n = lib.hc_encode_events(cols, len(order), len(ev), out.ctypes.data, len(out), None)
    assert n > 0
    # encode_events does both; no op column here, so no op prediction (masks 0)
    n = lib.hc_sparsify(out.ctypes.data, n, len(ev), len(out), nc.OP_FIELD)
    assert n > 0
    got, pos = {}, 0
    for name in order:
        field, enc, mask, length = COLUMN.unpack_from(out, pos)
        got[name] = (enc, mask, bytes(out[pos + COLUMN.size:pos + COLUMN.size + length]))
        pos += COLUMN.size + length
    assert pos == n
    whole = raw_columns(encode_events(ev))
    for name in order:   # the same column, but for the presence bits' op prediction
        if cols[order.index(name)].ref >= 0:
            assert dense(*got[name], len(ev), ev["op"]) == dense(*whole[name], len(ev), ev["op"])
            assert got[name][1] == whole[name][1], name
    if order == ("addr", "size"):   # addr without its partner: a DELTA column
        assert got["addr"][0] == codec.DELTA


def test_a_scalar_build_writes_the_same_bytes(tmp_path):
    """The library without SSE2 code (what a non-x86 machine runs) agrees with this one."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    so = tmp_path / "libheapcast_codec_scalar.so"
    subprocess.run(["gcc", "-std=c11", "-O2", "-shared", "-fPIC", "-DHC_NO_SIMD", "-Wall",
                    "-Werror", "-o", str(so), str(SOURCE)], check=True)
    scalar = native_codec.load(so)
    blocks = [realistic(n, seed) for n, seed in ((0, 1), (1, 2), (33, 3), (4100, 4), (20000, 5))]
    blocks += [np.zeros(17, EVENT_DTYPE), one_byte_at(4100, 4099, 3, "ts"),
               one_byte_at(100, 97, 2, "loc"), one_byte_at(100, 50, 7, "size")]
    for ev in blocks:
        want = reference_encode_events(ev)
        assert bytes(native_codec.encode_events(ev, lib=scalar)) == want
        assert bytes(native_codec.encode_events(as_dict(ev), lib=scalar)) == want


# ---- edge cases, decoded back by the reader's numpy code

def test_empty_block():
    payload = encode_events(np.zeros(0, EVENT_DTYPE))
    cols = columns(payload, 0)
    assert len(payload) == COLUMN.size * len(FIELDS)
    assert {name: enc for name, (enc, _) in cols.items()} == codec.COLUMN_ENCODING
    assert all(data == b"" for _, data in cols.values())
    assert len(decode(payload, 0)) == 0


def test_one_row_of_maximal_values():
    ev = block(1, seq=U64_MAX, ts=U64_MAX, addr=U64_MAX, old_addr=U64_MAX, size=U64_MAX,
               arg=U64_MAX, loc=2**32 - 1, tid=2**32 - 1, free_lag=2**32 - 1, op=255, flags=255)
    payload = encode_events(ev)
    assert bytes(payload) == reference_encode_events(ev)
    cols = columns(payload, 1)
    assert cols["size"] == (codec.PLAIN, b"\xff" * 8)
    assert cols["seq"] == (codec.DELTA, b"\xff" * 8)
    assert cols["ts"] == (codec.ZIGZAG_DELTA, b"\x01" + b"\x00" * 7)    # zigzag(-1) = 1
    # addr: code 1 (an escape: no earlier row freed it), then the escape as zigzag(-1) + 1
    assert cols["addr"] == (codec.BACKREF, b"\x01" + b"\x00" * 7 + b"\x02" + b"\x00" * 7)
    assert cols["old_addr"] == (codec.BACKREF, b"\x01" + b"\x00" * 7 + b"\x02" + b"\x00" * 7)
    np.testing.assert_array_equal(decode(payload, 1), ev)


def test_backref_codes_of_a_hand_computed_block():
    ev = block(6, addr=[0x10, 0x20, 0x10, 0, 0x30, 0],
               old_addr=[0, 0x10, 0x10, 0x10, 0x30, 0x99])
    # row 1: 0x10 is row 0's address (d = 1); row 2: its own row's 0x10 does not count, row 0's
    # does (d = 2); row 3: row 2's (d = 1); rows 4 and 5: no earlier row produced it (escapes).
    codes = [0, 2, 3, 2, 1, 1]
    escapes = [(0x30 << 1) + 1, ((0x99 - 0x30) << 1) + 1]   # nonzero-delta: zigzag(diff) + 1
    want = bytes(codes) + bytes(7 * 6) + bytes(escapes) + bytes(7 * 2)
    cols = columns(encode_events(ev), 6)
    assert cols["old_addr"] == (codec.BACKREF, want)
    # addr: rows 0, 1 and 4 were freed by no earlier row (escapes 0x10, 0x20, 0x30: nonzero
    # deltas of 0x10 each); row 2's 0x10 was freed by row 1 (d = 1; its own free does not count).
    assert cols["addr"] == (codec.BACKREF, bytes([1, 1, 2, 0, 1, 0]) + bytes(7 * 6)
                            + bytes([0x21] * 3) + bytes(7 * 3))
    np.testing.assert_array_equal(decode(encode_events(ev), 6), ev)
    np.testing.assert_array_equal(decode(encode_events(ev), 6), ev)


def backref_codes(ev):
    enc, data = columns(encode_events(ev), len(ev))["old_addr"]
    assert enc == codec.BACKREF
    n = len(ev)
    codes = np.frombuffer(data[:8 * n], np.uint8).reshape(8, n).T.copy().view("<u8").ravel()
    return codes.tolist(), len(data) // 8 - n


def test_old_addr_never_refers_to_its_own_row():
    ev = block(4, addr=[0x40, 0x50, 0x50, 0x60], old_addr=[0x40, 0x50, 0x50, 0x40])
    # rows 0 and 1: only their own rows produced it: escapes; row 2: row 1 (d = 1), not itself;
    # row 3: row 0 (d = 3)
    assert backref_codes(ev) == ([1, 1, 2, 4], 2)
    np.testing.assert_array_equal(decode(encode_events(ev), 4), ev)


def test_the_latest_earlier_row_is_chosen():
    addr = [0xA0, 0xB0, 0xA0, 0xA0, 0, 0xB0, 0, 0]
    old = [0, 0, 0, 0, 0xA0, 0, 0xB0, 0xA0]
    ev = block(8, addr=addr, old_addr=old)
    assert backref_codes(ev) == ([0, 0, 0, 0, 2, 0, 2, 5], 0)
    np.testing.assert_array_equal(decode(encode_events(ev), 8), ev)


def test_all_zero_old_addr():
    ev = realistic(5000, seed=5)
    ev["old_addr"] = 0
    codes, escapes = backref_codes(ev)
    assert set(codes) == {0} and escapes == 0
    assert bytes(encode_events(ev)) == reference_encode_events(ev)
    np.testing.assert_array_equal(decode(encode_events(ev), len(ev)), ev)


def test_back_references_reach_across_the_whole_block():
    n = 70000   # more distinct addresses than the hash table starts with: it grows
    ev = block(2 * n, addr=np.r_[0x1000 + 16 * np.arange(n), np.zeros(n)],
               old_addr=np.r_[np.zeros(n), 0x1000 + 16 * np.arange(n)[::-1]])
    codes, escapes = backref_codes(ev)
    assert escapes == 0
    assert codes[n:] == [2 * k + 2 for k in range(n)]   # row n + k frees row n - 1 - k's address
    assert bytes(encode_events(ev)) == reference_encode_events(ev)
    np.testing.assert_array_equal(decode(encode_events(ev), 2 * n), ev)


def test_wrapping_deltas():
    seq = [U64_MAX - 1, U64_MAX, 0, 5, 2]            # decreasing and wrapping past 2**64
    ts = [0, U64_MAX, 1, 2**63, 2**63 - 1]           # signed differences of every size
    addr = [U64_MAX, 1, 0, 2**63 - 2, U64_MAX - 3]  # (escapes never exactly 2**63 apart:
    old = [1, U64_MAX, U64_MAX, 2**63 - 1, 5]        # see test_differences_of_2_63...)
    ev = block(5, seq=seq, ts=ts, addr=addr, old_addr=old)
    payload = encode_events(ev)
    assert bytes(payload) == reference_encode_events(ev)
    assert columns(payload, 5)["seq"][1][:5] == bytes([0xFE, 1, 1, 5, 0xFD])   # low bytes of deltas
    np.testing.assert_array_equal(decode(payload, 5), ev)
    # 16 rows at a time take another path (registers): 11 groups of 16, then 9 rows
    n = 5 * 37
    ev = block(n, seq=seq * 37, ts=ts * 37, addr=addr * 37, old_addr=old * 37)
    payload = encode_events(ev)
    assert bytes(payload) == reference_encode_events(ev)
    assert columns(payload, n)["seq"][1][5:10] == bytes([0xFC, 1, 1, 5, 0xFD])  # (2**64 - 2) - 2
    np.testing.assert_array_equal(decode(payload, n), ev)


def test_differences_of_2_63_fall_back_to_delta():
    """Nonzero-delta stores zigzag(difference) + 1, which is 0 (a zero value) for a difference of
    exactly 2**63: such a column is stored with plain deltas, which readers accept for any
    column. (The numpy encoder wrote it as nonzero-delta and lost the values.)"""
    ev = block(4, addr=[0, 2**63, 7, 2**63 + 7], old_addr=[2**63, 0, 2**63, 5])
    payload = encode_events(ev)
    cols = columns(payload, 4)
    assert cols["addr"][0] == codec.DELTA and len(cols["addr"][1]) == 32
    assert cols["old_addr"][0] == codec.DELTA and len(cols["old_addr"][1]) == 32
    assert cols["seq"][0] == codec.DELTA and cols["ts"][0] == codec.ZIGZAG_DELTA
    np.testing.assert_array_equal(decode(payload, 4), ev)
    lossy = decode(reference_encode_events(ev), 4)
    assert lossy["addr"].tolist() != ev["addr"].tolist()
    # escapes alone can need it too: here the addr column is fine
    ev = block(3, addr=[0, 0, 0], old_addr=[2**62, 2**62 + 2**63, 0])
    cols = columns(encode_events(ev), 3)
    assert cols["addr"][0] == codec.BACKREF and cols["old_addr"][0] == codec.DELTA
    np.testing.assert_array_equal(decode(encode_events(ev), 3), ev)
    # the fallback leaves its zero planes out too (rows in registers, then staged rows): deltas
    # 5 (row 10), 2**63 (row 50: the escapes' nonzero-delta wraps), 0x100 (row 98)
    addr = np.r_[np.zeros(10, np.uint64), np.full(40, 5, np.uint64),
                 np.full(48, 2**63 + 5, np.uint64), np.full(3, 2**63 + 0x105, np.uint64)]
    ev = block(101, addr=addr)
    enc, mask, _ = raw_columns(encode_events(ev))["addr"]
    assert (enc, mask) == (codec.DELTA | codec.SPARSE, 0b01111100)   # 3 deltas of 101 not 0
    np.testing.assert_array_equal(decode(encode_events(ev), 101), ev)


# ---- byte planes left out

FULL_MASK = {name: (1 << (EVENT_DTYPE[name].itemsize if enc == codec.PLAIN else 8)) - 1
             | (0xFF00 if enc == codec.BACKREF else 0)
             for name, enc in codec.COLUMN_ENCODING.items()}


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 63, 64, 65, 4097])
def test_a_block_of_zeros_stores_no_plane(n):
    ev = np.zeros(n, EVENT_DTYPE)
    payload = encode_events(ev)
    assert bytes(encode_events(as_dict(ev))) == bytes(payload)
    assert len(payload) == COLUMN.size * len(FIELDS)
    assert {name: mask for name, (_, mask, _) in raw_columns(payload).items()} == FULL_MASK
    assert bytes(payload) == reference_encode_events(ev)
    np.testing.assert_array_equal(decode(payload, n), ev)


def one_byte_at(n, r, k, name):
    """A block whose column `name` stores a single non-zero byte: 0x5A (0xB4 once zigzagged) in
    plane k of row r; every other column as block() makes it."""
    v = np.uint64(0x5A << 8 * k)
    enc = codec.COLUMN_ENCODING[name]
    col = (np.where(np.arange(n) >= r, v, np.uint64(0)) if enc != codec.PLAIN     # one delta
           else np.where(np.arange(n) == r, v, np.uint64(0)))
    return block(n, **{name: col})


@pytest.mark.parametrize("name", ["seq", "ts", "size", "loc", "op"])
def test_one_byte_anywhere_keeps_its_plane_only(name):
    """Each path that writes planes (16 rows in registers, staged chunks, the last rows of a
    block, a byte column) counts every row of every plane."""
    n = 4100   # one tile of 4096 rows and 4 more
    width = EVENT_DTYPE[name].itemsize if codec.COLUMN_ENCODING[name] == codec.PLAIN else 8
    for r in (0, 1, 15, 16, 17, 63, 64, 2000, 4095, 4096, 4099):
        for k in range(width):
            ev = one_byte_at(n, r, k, name)
            for form in (ev, as_dict(ev)):
                payload = encode_events(form)
                enc, mask, data = raw_columns(payload)[name]
                assert mask == FULL_MASK[name] & ~(1 << k), (r, k)
                # one row of 4100 not zero: an op mask of 0 (all rows op 0, mostly absent),
                # presence bits, one byte
                assert enc & codec.SPARSE
                assert data == bytes(2) + bytes(np.packbits(np.arange(n) == r, bitorder="little")
                                                ) + bytes([0xB4 if name == "ts" else 0x5A])
                _, data = dense(enc, mask, data, n, ev["op"])
                assert data == bytes(r) + bytes([0xB4 if name == "ts" else 0x5A]) + bytes(n - r - 1)
                np.testing.assert_array_equal(decode(payload, n), ev)


def test_backref_codes_and_escapes_leave_their_planes_out_apart():
    """Bits 0-7: the codes' planes, bits 8-15: the escapes'."""
    for d, codes_mask in ((1, 0xFE), (254, 0xFE), (255, 0xFD), (70000, 0xF8)):
        n = d + 5
        addr, old = np.zeros(n, np.uint64), np.zeros(n, np.uint64)
        addr[2], old[2 + d] = 0x1000, 0x1000                  # freed d rows later: code d + 1
        ev = block(n, addr=addr, old_addr=old)
        payload = encode_events(ev)
        assert bytes(encode_events(as_dict(ev))) == bytes(payload)
        cols = raw_columns(payload)
        sparse = codec.SPARSE if n >= 64 else 0   # one code not zero in each column
        assert cols["old_addr"][:2] == (codec.BACKREF | sparse, 0xFF00 | codes_mask), d
        assert cols["addr"][:2] == (codec.BACKREF | sparse, 0xFCFE), d   # escape 0x1000: 0x2001
        assert bytes(payload) == reference_encode_events(ev)
        np.testing.assert_array_equal(decode(payload, n), ev)
    # an escape of only a high byte: nonzero-delta zigzag(0x5A << 56) + 1 = 0xB4 << 56 | 1
    ev = block(40, old_addr=np.r_[np.zeros(39), 0x5A << 56].astype(np.uint64))
    payload = encode_events(ev)
    assert raw_columns(payload)["old_addr"] == (codec.BACKREF, 0x7EFE,
                                                bytes(39) + b"\x01" + b"\x01" + b"\xb4")
    np.testing.assert_array_equal(decode(payload, 40), ev)


def test_random_plane_patterns():
    """Columns whose values use random sets of byte planes, rows set at random: the encoder's
    masks are the reference's (which looks at the planes themselves), also where an address
    column falls back to DELTA (escapes 2**63 apart: values of plane 7 alone)."""
    rng = np.random.default_rng(99)
    for trial in range(60):
        n = int(rng.choice([1, 2, 16, 31, 64, 100, 4095, 4097, 9000]))
        ev = realistic(n, seed=trial)
        for name in FIELDS:
            width = EVENT_DTYPE[name].itemsize
            planes = rng.random(width) < 0.3
            rows = rng.random(n) < rng.choice([0.001, 0.1, 1.0])
            values = rng.integers(0, 256, (n, width), dtype=np.uint64) << (
                8 * np.arange(width, dtype=np.uint64))
            values = (values * planes).sum(axis=1, dtype=np.uint64) * rows
            if name == "seq":
                values = np.cumsum(values, dtype=np.uint64)
            ev[name] = values
        payload = encode_events(ev)
        assert bytes(encode_events(as_dict(ev))) == bytes(payload)   # one column at a time
        for name, (enc, mask, data) in raw_columns(payload).items():
            assert enc & ~codec.SPARSE in (codec.COLUMN_ENCODING[name], codec.DELTA)
            want = reference_column(np.ascontiguousarray(ev[name]), enc & ~codec.SPARSE, ev, name)
            assert mask == want[0], (trial, name)
            ops = None if name == "op" else ev["op"]
            assert (enc, data) == reference_sparse(want[1], enc & ~codec.SPARSE, mask, n,
                                                   ops), (trial, name)
        np.testing.assert_array_equal(decode(payload, n), ev)


def test_blocks_of_version_1_still_decode():
    """Every plane stored, mask 0 (files written before planes were left out)."""
    for n, seed in ((0, 1), (1, 2), (5000, 3)):
        ev = realistic(n, seed)
        old = reference_encode_events(ev, version=1)
        assert all(mask == 0 for _, mask, _ in raw_columns(old).values())
        np.testing.assert_array_equal(decode(old, n), ev)


def test_a_mask_that_does_not_fit_is_a_clear_error():
    data = bytes(range(1, 9)) * 3                 # 3 u64 values, every plane stored
    with pytest.raises(ValueError, match=r"holds 24 bytes, expected 21 \(7 of the 8 byte planes "
                                         r"of 3 values; mask 0x0004\)"):
        codec.decode(data, codec.PLAIN, np.dtype("<u8"), 3, 0x04)
    with pytest.raises(ValueError, match=r"plane mask 0x0010 leaves out planes beyond the 4"):
        codec.decode(bytes(12), codec.PLAIN, np.dtype("<u4"), 3, 0x10)
    with pytest.raises(ValueError, match=r"plane mask 0x0100 leaves out planes beyond the 8"):
        codec.decode(bytes(24), codec.DELTA, np.dtype("<u8"), 3, 0x100)
    codes = bytes([1, 0, 1]) + bytes(3 * 7)        # two escapes
    rows, zeros = np.zeros((2, 3), np.uint64), (bytes(0), codec.PLAIN, 0xFF, None)
    with pytest.raises(ValueError, match=r"holds 19 bytes, expected 17: 3 of codes and 14 for 2 "
                                         r"escapes \(plane mask 0x01fe\)"):
        codec.decode_pair_into((codes[:3] + bytes(16), codec.BACKREF, 0x01FE, None), zeros, 3,
                               rows[0], rows[1])
    with pytest.raises(ValueError, match=r"expected at least 24 for the codes of 3 rows"):
        codec.decode_pair_into((codes[:20], codec.BACKREF, 0, None), zeros, 3, rows[0], rows[1])


def test_bad_blocks_are_refused():
    ev = realistic(10, seed=1)
    cols = as_dict(ev)
    cols["tid"] = cols["tid"][:9]
    with pytest.raises(ValueError, match="tid"):
        encode_events(cols)
    cols = as_dict(ev)
    cols["size"] = cols["size"].astype(np.float64)
    with pytest.raises(TypeError, match="size"):
        encode_events(cols)
    with pytest.raises(ValueError, match="out"):
        encode_events(ev, out=np.zeros(10**4, np.int32))


def test_output_buffer_is_reused_when_large_enough():
    ev = realistic(1000, seed=2)
    out = np.zeros(1 << 20, np.uint8)
    payload = encode_events(ev, out)
    assert payload.obj is out and bytes(payload) == reference_encode_events(ev)
    small = np.zeros(16, np.uint8)
    assert encode_events(ev, small).obj is not small


def test_missing_library_is_reported(monkeypatch, tmp_path):
    monkeypatch.setattr(native_codec, "library",
                        native_codec.LoadedOnce(native_codec.load, tmp_path / "libheapcast_codec.so"))
    with pytest.raises(native_codec.NativeError, match=r"missing.*pip install -e \."):
        encode_events(realistic(5, seed=1))


def test_threads_encode_independently():
    """The writer encodes on a worker thread: calls share no state."""
    blocks = [realistic(30000, seed=s) for s in range(6)]
    want = [reference_encode_events(b) for b in blocks]
    start = threading.Barrier(3)

    def work(i):
        start.wait() if i < 3 else None
        return bytes(encode_events(blocks[i]))

    with ThreadPoolExecutor(3) as pool:
        assert list(pool.map(work, range(6))) == want


def test_one_thread_block_after_block_keeps_no_stale_addresses():
    """A thread keeps its back-reference table from one block to the next (cleared by epoch,
    started at the previous block's size): blocks with many distinct addresses, then few, then
    the same addresses again, each encode exactly as alone, on one thread."""
    sizes = [(200_000, 150_000), (3000, 50), (200_000, 150_000), (200_000, 150_000),
             (70_000, 5000), (1, 1), (0, 1), (120_000, 100_000)]
    blocks = [realistic(n, seed=40 + i, pool=pool) for i, (n, pool) in enumerate(sizes)]
    blocks[3] = blocks[2].copy()   # the very addresses of the previous block: none may leak in
    blocks[3]["old_addr"][:1000] = blocks[2]["addr"][-1000:]
    want = [reference_encode_events(b) for b in blocks]

    def all_on_one_thread():
        return [bytes(encode_events(b)) for b in blocks]

    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(all_on_one_thread).result() == want
        assert pool.submit(all_on_one_thread).result() == want   # a thread with a big table



def test_the_tables_epoch_wraps_without_stale_addresses():
    """A slot carries its table's epoch in 8 bits: after 255 tables the epochs repeat, and the
    table memory is emptied for real. Block t produces the addresses of set t % 256 and first
    releases those of set (t + 1) % 256, which no block since the one 255 tables before has
    produced: a slot left from that block would carry the epoch in use again and turn those
    escapes into references. 600 blocks on one thread (two wraps, whatever epoch the thread's
    table starts at), each encoded as the reference encoder does."""
    def addresses(i):
        return 0x7000_0000_0000 + 16 * (64 * (i % 256) + np.arange(8, dtype=np.uint64))

    def block_at(t):   # 2048 rows: a table of 4096 slots, which few of the addresses share
        zeros = np.zeros(8, np.uint64)
        op = np.full(2048, OPS.index("free"))
        op[8:16] = OPS.index("malloc")
        return block(2048, addr=np.concatenate([zeros, addresses(t), np.zeros(2032, np.uint64)]),
                     old_addr=np.concatenate([addresses(t + 1), np.zeros(2040, np.uint64)]),
                     op=op)

    blocks = [block_at(t) for t in range(256)]
    want = [reference_encode_events(b) for b in blocks]

    def all_on_one_thread():
        return [bytes(encode_events(blocks[t % 256])) for t in range(600)]

    with ThreadPoolExecutor(1) as pool:
        got = pool.submit(all_on_one_thread).result()
    assert all(g == want[t % 256] for t, g in enumerate(got))

# ---- through the writer and the reader

def write_and_load(tmp_path, events, name="7.hct"):
    p = Process(index=0, pid=7, ppid=1, exe="/bin/x", argv=["x"],
                locations=LocationTable.from_lists([[], [0x401000]]))
    write_process_file(tmp_path / name, p, events)
    return heapcast.load(tmp_path / name).processes[0].events


def test_writers_share_the_compressing_workers_and_a_forked_child_starts_its_own(tmp_path):
    """Every trace file written by a process compresses on the same workers (a shell's short
    programs each had a pool started and joined); a child forked after they started (whose
    copies of them are not running) writes its files with workers of its own."""
    import os
    ev = realistic(3 * writer.BLOCK_EVENTS // 2, seed=7)   # two EVENTS blocks
    np.testing.assert_array_equal(write_and_load(tmp_path, ev, "1.hct")["addr"], ev["addr"])
    pool = writer._POOLS[(os.getpid(), 0)]
    np.testing.assert_array_equal(write_and_load(tmp_path, ev, "2.hct")["addr"], ev["addr"])
    assert writer._POOLS[(os.getpid(), 0)] is pool and len(pool._threads) <= 2
    pid = os.fork()
    if pid == 0:   # the child: 0 if its file reads back whole, 2 if the writer hangs
        done = []
        try:
            t = threading.Thread(target=lambda: done.append(
                np.array_equal(write_and_load(tmp_path, ev, "3.hct")["addr"], ev["addr"])),
                daemon=True)
            t.start()
            t.join(30)
        finally:
            os._exit(2 if not done else 0 if done[0] else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "2: the child's writer waited for workers " \
        "that are not in it"


def test_random_block_through_write_process_file_and_load(tmp_path):
    ev = realistic(100_000, seed=2024)
    got = write_and_load(tmp_path, ev)
    assert len(got) == len(ev)
    for name in EVENT_DTYPE.names:
        assert got.dtype[name] == EVENT_DTYPE[name]
        if name != "proc":
            np.testing.assert_array_equal(got[name], ev[name], err_msg=name)
    assert (got["proc"] == 0).all()


def test_many_blocks_share_the_writers_buffer(tmp_path, monkeypatch):
    monkeypatch.setattr(writer, "BLOCK_EVENTS", 4000)
    ev = realistic(30_000, seed=9)
    parts = [ev[:7000], as_dict(ev[7000:20000]), ev[20000:20001], ev[20001:]]
    got = write_and_load(tmp_path, iter(parts))
    np.testing.assert_array_equal(got, ev)
    blocks = heapcast.load(tmp_path / "7.hct").processes[0]._blocks
    assert [b.count for b in blocks] == [4000, 3000, 4000, 4000, 4000, 1000, 1, 4000, 4000, 1999]


def test_addresses_refer_to_each_other_along_long_chains():
    """One block reused over and over: each malloc refers to the free before it, each free to
    the malloc before it, 2000 links deep; the reader follows them all (pointer doubling)."""
    n = 4000
    addr = np.where(np.arange(n) % 2 == 0, 0x1000, 0)          # even rows: malloc 0x1000
    old = np.where(np.arange(n) % 2 == 1, 0x1000, 0)           # odd rows: free it
    ev = block(n, addr=addr, old_addr=old)
    cols = columns(encode_events(ev), n)
    codes = np.frombuffer(cols["addr"][1][:n], np.uint8)       # lowest byte plane
    assert codes[0] == 1 and (codes[2::2] == 2).all()          # one escape, then d = 1
    np.testing.assert_array_equal(decode(encode_events(ev), n), ev)


def test_files_with_delta_coded_addresses_still_read():
    """Files written before addr was back-referenced stored it as NONZERO_DELTA."""
    ev = realistic(5000, seed=3)
    parts = []
    for name in FIELDS:
        enc = codec.NONZERO_DELTA if name == "addr" else codec.COLUMN_ENCODING[name]
        data = _encode(np.ascontiguousarray(ev[name]), enc, ev, name)
        parts += [COLUMN.pack(EVENT_DTYPE.names.index(name), enc, 0, len(data)), data]
    np.testing.assert_array_equal(decode(b"".join(parts), len(ev)), ev)


def rewrite(path, version, events_payload):
    """Rewrites a .hct file with another format version and each EVENTS payload passed through
    events_payload(payload, count), with correct lengths and checksums."""
    data = path.read_bytes()
    magic, _, flags, reserved = FILE_HEADER.unpack_from(data)
    parts, off = [FILE_HEADER.pack(magic, version, flags, reserved)], FILE_HEADER.size
    while off < len(data):
        kind, codec_id, stored_len, raw_len, crc, count = SECTION.unpack_from(data, off)
        stored = data[off + SECTION.size:off + SECTION.size + stored_len]
        if kind == EVENTS:
            raw = events_payload(zstandard.ZstdDecompressor().decompress(stored), count)
            stored = zstandard.ZstdCompressor().compress(raw)
            raw_len, crc = len(raw), zlib.crc32(stored)
        parts += [SECTION.pack(kind, codec_id, len(stored), raw_len, crc, count), stored]
        off += SECTION.size + stored_len
    path.write_bytes(b"".join(parts))


def all_planes(payload, count):
    """A version 2 EVENTS payload in the layout of version 1: every plane stored, mask 0."""
    return b"".join(COLUMN.pack(EVENT_DTYPE.names.index(name), enc, 0, len(data)) + data
                    for name, (enc, data) in columns(payload, count).items())


def with_mask(payload, column, mask):
    """An EVENTS payload with another plane mask in the header of `column`."""
    payload, pos = bytearray(payload), 0
    for name in FIELDS:
        if name == column:
            struct.pack_into("<H", payload, pos + 2, mask)
        pos += COLUMN.size + COLUMN.unpack_from(payload, pos)[3]
    return bytes(payload)


def version_2(payload, count):
    """A version 4 EVENTS payload in the layout of version 2: no column sparse."""
    parts = []
    ops = decode(payload, count)["op"]
    for name, (enc, mask, data) in raw_columns(payload).items():
        enc, data = dense(enc, mask, data, count, ops)
        parts.append(COLUMN.pack(EVENT_DTYPE.names.index(name), enc, mask, len(data)) + data)
    return b"".join(parts)


def version_3(payload, count):
    """A version 4 EVENTS payload in the layout of version 3: sparse columns' presence bits as
    they are, without an op mask."""
    parts = []
    ops = decode(payload, count)["op"]
    for name, (enc, mask, data) in raw_columns(payload).items():
        if enc & codec.SPARSE:
            present, head = sparse_bits(data, count, ops)
            data = np.packbits(present, bitorder="little").tobytes() + data[head:]
        parts.append(COLUMN.pack(EVENT_DTYPE.names.index(name), enc, mask, len(data)) + data)
    return b"".join(parts)


@pytest.mark.parametrize("version, layout", [(1, all_planes), (2, version_2), (3, version_3)])
def test_files_of_older_versions_still_read(tmp_path, monkeypatch, version, layout):
    monkeypatch.setattr(writer, "BLOCK_EVENTS", 4000)
    ev = realistic(10_000, seed=12)
    write_and_load(tmp_path, ev)
    path = tmp_path / "7.hct"
    rewrite(path, version, layout)
    assert path.read_bytes()[8:10] == bytes([version, 0])
    np.testing.assert_array_equal(heapcast.load(path).processes[0].events, ev)


@pytest.mark.parametrize("n, present, sparse", [(128, 96, True), (128, 97, False), (64, 48, True),
                                                (63, 1, False), (4100, 4100, False)])
def test_a_column_is_sparse_when_at_most_three_quarters_of_its_rows_are_not_zero(n, present,
                                                                                 sparse):
    rows = np.random.default_rng(n + present).permutation(n)[:present]
    size = np.zeros(n, np.uint64)
    size[rows] = 0x1234
    ev = block(n, size=size)
    payload = encode_events(ev)
    enc, mask, data = raw_columns(payload)["size"]
    assert bool(enc & codec.SPARSE) == sparse and mask == 0xFC
    assert len(data) == (2 + (n + 7) // 8 + 2 * present if sparse else 2 * n)
    assert bytes(encode_events(as_dict(ev))) == bytes(payload) == reference_encode_events(ev)
    np.testing.assert_array_equal(decode(payload, n), ev)


def test_presence_bits_are_stored_as_their_difference_from_the_ops_prediction():
    """A malloc has a size and a new address, a free an old address: an op mask per sparse
    column predicts that, and the presence bits stored are zeros but for the exceptions."""
    rng = np.random.default_rng(21)
    n = 10_000
    op = np.where(rng.random(n) < 0.5, OPS.index("malloc"), OPS.index("free"))
    malloc = op == OPS.index("malloc")
    size = np.where(malloc, rng.integers(1, 1 << 20, n), 0)
    size[np.flatnonzero(malloc)[:3]] = 0            # malloc(0): three exceptions
    ev = block(n, op=op, size=size, ts=np.cumsum(rng.integers(0, 2, n)))
    payload = encode_events(ev)
    assert bytes(payload) == reference_encode_events(ev)
    nbits = (n + 7) // 8
    enc, _, data = raw_columns(payload)["size"]
    assert enc & codec.SPARSE and data[:2] == struct.pack("<H", 1 << OPS.index("malloc"))
    stored = np.unpackbits(np.frombuffer(data[2:2 + nbits], np.uint8), bitorder="little")[:n]
    assert stored.nonzero()[0].tolist() == np.flatnonzero(malloc)[:3].tolist()
    enc, _, data = raw_columns(payload)["op"]        # the op column itself: mask 0
    assert enc & codec.SPARSE and data[:2] == bytes(2)
    np.testing.assert_array_equal(decode(payload, n), ev)


@pytest.mark.parametrize("strided", [False, True])
def test_planes_the_last_block_needed_are_a_hint_only(strided):
    """With a hint kept from block to block of a stream, a column is written with the low planes
    that it needed in the last block (the others predicted zero, not written); a block whose
    values need more is encoded again with every plane: the same bytes whatever came before."""
    rng = np.random.default_rng(23)
    n = 5000
    small = realistic(n, seed=30)
    small["size"] = rng.integers(0, 200, n)                    # one plane
    small["loc"] = rng.integers(0, 200, n)
    small["ts"] = np.arange(n) * 3                               # deltas of one plane
    big = small.copy()
    big["size"] = rng.integers(0, 2**63, n, dtype=np.uint64)     # every plane
    big["loc"] = rng.integers(0, 2**32, n, dtype=np.uint64)
    big["ts"] = np.cumsum(rng.integers(0, 2**40, n, dtype=np.uint64))
    big["addr"] = rng.integers(1, 2**63, n, dtype=np.uint64)     # codes of far rows, escapes
    form = (lambda ev: ev) if strided else as_dict
    hint = native_codec.planes_hint()
    size = FIELDS.index("size")
    for i, ev in enumerate((small, big, small, small, big, big)):
        assert bytes(encode_events(form(ev), hint=hint)) == reference_encode_events(ev)
        assert hint[size] == (1 if i == 0 else 8)   # the most planes needed so far
    with pytest.raises(ValueError, match="hint must be a writable array of 11 uint8"):
        encode_events(small, hint=np.zeros(3, np.uint8))


def test_encoding_then_sparse_columns_in_two_calls_is_the_same():
    """The writer encodes a block (dense) on one thread and makes it sparse on another."""
    ev = realistic(5000, seed=18)
    one = bytes(encode_events(ev))
    dense = native_codec.encode_events(ev, sparse=False)
    assert bytes(dense) == reference_encode_events(ev, version=2)
    assert bytes(native_codec.sparsify(dense, len(ev))) == one == reference_encode_events(ev)
    small = np.zeros(len(one) + 10, np.uint8)   # no room for the presence bits after it
    small[:len(dense)] = np.frombuffer(bytes(dense), np.uint8)[:len(small)][:len(dense)]
    with pytest.raises(native_codec.NativeError, match="output buffer too small"):
        native_codec.sparsify(memoryview(small)[:len(one)], len(ev))
    with pytest.raises(ValueError, match="a view of the start of its writable uint8 array"):
        native_codec.sparsify(memoryview(bytes(dense)), len(ev))   # not the encoder's buffer
    # not columns of this many rows (lengths that do not add up, planes that do not fit): left
    # as it was
    for cut, rows in ((1, len(ev)), (0, len(ev) + 1)):
        dense = native_codec.encode_events(ev, sparse=False)
        before = bytes(dense)
        with pytest.raises(ValueError, match=f"not a payload of columns of {rows} rows"):
            native_codec.sparsify(dense[:len(dense) - cut], rows)
        assert bytes(dense) == before


def test_bad_sparse_columns_are_refused(tmp_path):
    write_and_load(tmp_path, realistic(1000, seed=17))
    path = tmp_path / "7.hct"
    shutil.copy(path, tmp_path / "bits.hct")
    rewrite(path, 2, lambda payload, count: payload)   # sparse columns in a version 2 file
    with pytest.raises(TraceError, match=r"7\.hct, offset 16: EVENTS block: column addr is sparse "
                                         r"\(encoding flag 0x80\), which a version 2 file has not"):
        heapcast.load(path).processes[0].events

    def one_row_more(payload, count):   # the presence bit of row 999 set: one value missing
        cols = raw_columns(payload)   # arg: an op mask of 0 (rarely present), 125 bytes of bits
        assert cols["arg"][0] & codec.SPARSE and cols["arg"][2][:2] == bytes(2)
        assert not cols["arg"][2][126] & 0x80
        parts = []
        for name, (enc, mask, data) in cols.items():
            if name == "arg":
                data = data[:126] + bytes([data[126] | 0x80]) + data[127:]
            parts.append(COLUMN.pack(EVENT_DTYPE.names.index(name), enc, mask, len(data)) + data)
        return b"".join(parts)
    path = tmp_path / "bits.hct"
    rewrite(path, 4, one_row_more)
    with pytest.raises(TraceError, match=r"bits\.hct, offset 16: EVENTS block, column arg: column "
                                         r"holds \d+ bytes, expected \d+ \(8 of the 8 byte planes"):
        heapcast.load(path).processes[0].events
    # 10 rows: 2 bytes of presence bits, of which 6 name no row (version 3: no op mask)
    v3 = codec.Sparse()
    with pytest.raises(ValueError, match="presence bits set beyond the last row"):
        codec.decode(b"\x01\x80\x05\x07", codec.PLAIN, np.dtype(np.uint8), 10, 0, v3)
    got = codec.decode(b"\x01\x02\x05\x07", codec.PLAIN, np.dtype(np.uint8), 10, 0, v3)
    assert got.tolist() == [5, 0, 0, 0, 0, 0, 0, 0, 0, 7]
    # version 4: op mask 0x0201 predicts rows of ops 0 and 9 present (0, 2, 4, 5), not op 3 nor
    # op 20 (16 or more); present are rows 0, 1, 2, 5 and 9, so the stored bits are rows 1, 4, 9
    ops = np.array([0, 3, 9, 3, 0, 0, 3, 3, 3, 20], np.uint8)
    got = codec.decode(b"\x01\x02\x12\x02" + bytes(range(1, 6)), codec.PLAIN,
                       np.dtype(np.uint8), 10, 0, codec.Sparse(True, ops))
    assert got.tolist() == [1, 2, 3, 0, 0, 4, 0, 0, 0, 5]
    with pytest.raises(ValueError, match="op mask 0x0001 on the op column itself, expected 0"):
        codec.decode(b"\x01\x00\x00\x00" + bytes(5), codec.PLAIN, np.dtype(np.uint8), 10, 0,
                     codec.Sparse(True, None))


def test_a_version_1_file_with_planes_left_out_is_refused(tmp_path):
    write_and_load(tmp_path, realistic(1000, seed=13))
    path = tmp_path / "7.hct"
    shutil.copy(path, tmp_path / "v2.hct")
    rewrite(path, 1, lambda payload, count: payload)        # too short for version 1
    with pytest.raises(TraceError, match=r"7\.hct, offset 32: EVENTS block of 1000 events has "
                                         r"\d+ bytes, expected 62088 to 78088"):
        heapcast.load(path)
    path = tmp_path / "v2.hct"
    rewrite(path, 1, lambda payload, count: with_mask(all_planes(payload, count), "ts", 0x80))
    with pytest.raises(TraceError, match=r"v2\.hct, offset 16: .*column ts leaves byte planes out "
                                         r"\(mask 0x0080\), expected 0 in a version 1 file"):
        heapcast.load(path).processes[0].events


def test_a_newer_format_version_is_refused(tmp_path):
    write_and_load(tmp_path, realistic(10, seed=14))
    path = tmp_path / "7.hct"
    rewrite(path, 5, lambda payload, count: payload)
    with pytest.raises(TraceError, match=r"offset 8: trace format version 5 is not supported; "
                                         r"this heapcast reads versions 1, 2, 3, 4"):
        heapcast.load(path)


@pytest.mark.parametrize("column, mask, message", [
    ("size", 0xFF, r"column size: column holds \d+ bytes, expected 0 \(0 of the 8 byte planes"),
    ("loc", 0x1F, r"column loc: plane mask 0x001f leaves out planes beyond the 4"),
    ("old_addr", 0xFFFF, r"column old_addr: column holds \d+ bytes, expected 127: 127 of "
                         r"presence bits and codes"),   # sparse: an op mask, 1000 presence bits
    ("free_lag", 0, r"column free_lag: column holds \d+ bytes, expected \d+ \(4 of the 4 "),
])
def test_a_wrong_mask_is_an_error_naming_file_offset_and_column(tmp_path, column, mask, message):
    """A mask that does not match the column's length (behind a valid checksum: a bad writer)."""
    write_and_load(tmp_path, realistic(1000, seed=15))
    path = tmp_path / "7.hct"
    rewrite(path, 4, lambda payload, count: with_mask(payload, column, mask))
    with pytest.raises(TraceError, match=r"7\.hct, offset 16: EVENTS block, " + message):
        heapcast.load(path).processes[0].events


def test_released_workers_finish_their_work_and_the_next_block_starts_others(tmp_path):
    """release_workers while another thread's writer has blocks in flight: they are written
    whole, and that writer's next blocks go to new workers."""
    ev = realistic(3 * writer.BLOCK_EVENTS, seed=11)
    p = Process(index=0, pid=7, ppid=1, exe="/bin/x", argv=["x"],
                locations=LocationTable.from_lists([[], [0x401000]]))
    w = writer.ProcessFileWriter(tmp_path / "7.hct")
    w.add(ev[:2 * writer.BLOCK_EVENTS])   # (two blocks in flight)
    writer.release_workers()
    w.add(ev[2 * writer.BLOCK_EVENTS:])
    w.finish(p)
    np.testing.assert_array_equal(heapcast.load(tmp_path / "7.hct").processes[0].events["addr"],
                                  ev["addr"])


def test_a_recording_leaves_no_compressing_worker_behind(tmp_path):
    """heapcast.record called from a program: its trace files' shared workers stop at the end."""
    import sys
    import threading as th
    r = heapcast.record([sys.executable, "-c", "x = [bytes(100) for _ in range(50000)]"],
                        output=tmp_path / "t", env={"PYTHONMALLOC": "malloc"}, progress=False)
    assert r.exit_code == 0 and r.events > 0
    assert not [t for t in th.enumerate() if t.name.startswith("heapcast-zstd")]
    assert not writer._POOLS
