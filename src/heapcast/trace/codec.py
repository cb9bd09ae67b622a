"""Column encodings of EVENTS blocks (docs/trace-format.md): delta, zigzag, byte planes, and
back-references between the two address columns.

Together with zstd they bring a 64-byte event to a few bytes, because sequence numbers step by one,
times by small amounts, and addresses repeat. Byte planes that are all zero are not stored (the
column header's mask names them; files of format version 1 store every plane): the decoder puts
them back as zeros. A column whose stored values are mostly zero (version 3) stores a presence
bit per row and the planes of its non-zero rows only: zstd is slow on such planes and mostly
stores them worse (bench/sparse_columns.py). Encoding is native code (native/codec/encode.c,
bound in native_codec.py: the writer encodes every event it writes); decoding is here: the byte
planes of each column put together and its encoding undone in one native pass
(native/codec/decode.c, which writes straight into a reader's rows and follows the presence
bits of sparse columns), and the address back-references followed by another, in row order
(decode_pair_into).
"""
from __future__ import annotations

import ctypes

import numpy as np

from .base import LoadedOnce, bind
from .format import EVENT_DTYPE

PLAIN, DELTA, ZIGZAG_DELTA, NONZERO_DELTA, BACKREF = 0, 1, 2, 3, 4
#: Flag of a column header's encoding byte (format version 3): the column is sparse, its stored
#: planes hold only the rows whose stored value is not zero, after a presence bit per row.
SPARSE = 0x80
#: Ops that a sparse column's op mask (version 4) predicts: bit o for rows of op o.
OP_KINDS = 16

#: The encoding of each stored column (EVENT_DTYPE order; `proc` is not stored).
COLUMN_ENCODING = {
    "seq": DELTA, "ts": ZIGZAG_DELTA, "addr": BACKREF, "old_addr": BACKREF,
    "size": PLAIN, "arg": PLAIN, "loc": PLAIN, "tid": PLAIN, "free_lag": PLAIN,
    "op": PLAIN, "flags": PLAIN,
}
#: Stored columns in file order.
STORED_FIELDS = [name for name in EVENT_DTYPE.names if name != "proc"]
#: BACKREF columns refer to their partner's values in earlier rows: an allocation's address is
#: usually one freed a few events before (allocators reuse the latest free block of a size), and
#: a release's address one allocated earlier.
PARTNER = {"addr": "old_addr", "old_addr": "addr"}
#: What a reader accepts: any generic encoding for any column (older files used NONZERO_DELTA for
#: addr and old_addr); BACKREF only for the two address columns.
GENERIC_ENCODINGS = frozenset((PLAIN, DELTA, ZIGZAG_DELTA, NONZERO_DELTA))
ALLOWED_ENCODINGS = {name: GENERIC_ENCODINGS | {BACKREF} for name in PARTNER}


def _stored_planes(omitted: int, width: int, what: str) -> list[int]:
    """The planes of `width` that are stored: those not in the mask `omitted`."""
    if omitted >> width:
        raise ValueError(f"plane mask {omitted:#06x} leaves out planes beyond the {width} of "
                         f"{what}")
    return [k for k in range(width) if not omitted >> k & 1]


class Sparse:
    """How a sparse column's presence bits are stored. Version 3 (`masked` False): the bits as
    they are. Version 4: the column begins with a u16 op mask, and the stored bits are the
    presence XOR the mask's prediction from the block's op values `ops` (row i predicted present
    when ops[i] < 16 and bit ops[i] of the mask is set); `ops` None for the op column itself,
    whose mask must be 0."""

    def __init__(self, masked: bool = False, ops: np.ndarray | None = None):
        self.masked, self.ops = masked, ops

    def layout(self, b: bytes, count: int) -> tuple[int, int, int]:
        """(where the presence bits start, the op mask, how many bytes mask and bits take) of
        the column's bytes b: the op mask, then (count + 7) // 8 bytes of bits, bit i % 8 of
        byte i // 8: row i. ValueError where they do not fit."""
        head = 2 if self.masked else 0
        nbytes = head + (count + 7) // 8
        if len(b) < nbytes:
            raise ValueError(f"sparse column holds {len(b)} bytes, expected at least {nbytes} of "
                             f"{'op mask and ' if head else ''}presence bits for {count} rows")
        if count % 8 and b[nbytes - 1] >> (count % 8):
            raise ValueError("sparse column: presence bits set beyond the last row")
        mask = int.from_bytes(b[:head], "little")
        if mask and self.ops is None:
            raise ValueError(f"op mask {mask:#06x} on the op column itself, expected 0")
        return head, mask, nbytes

    def predictors(self, mask: int, count: int) -> np.ndarray | None:
        """The op values that a mask predicts from (None for mask 0), checked: ValueError unless
        they are `count` rows of uint8 at a positive stride."""
        if not mask:
            return None
        ops = self.ops
        if ops.dtype != np.uint8 or len(ops) != count or (count and ops.strides[0] <= 0):
            raise ValueError(f"the op values are not {count} rows of uint8")
        return ops

    def count(self, b: bytes, count: int) -> tuple[int, int]:
        """How many of the `count` rows the column's bytes b mark present (natively), and how
        many bytes the op mask and the bits take."""
        head, mask, nbytes = self.layout(b, count)
        self.predictors(mask, count)
        bits = np.frombuffer(b, np.uint8, nbytes - head, head)
        n = _library().hc_count_present(bits.ctypes.data if len(bits) else None,
                                        self.ops.ctypes.data if mask and count else None,
                                        self.ops.strides[0] if mask and count else 0, mask, count)
        return int(n), nbytes


class PlaneColumn(ctypes.Structure):
    """hc_plane_column in native/codec/decode.c."""
    _fields_ = [("data", ctypes.c_void_p), ("len", ctypes.c_uint64), ("out", ctypes.c_void_p),
                ("stride", ctypes.c_uint64), ("encoding", ctypes.c_int32),
                ("width", ctypes.c_uint32), ("omitted", ctypes.c_uint32),
                ("out_size", ctypes.c_uint32), ("bits", ctypes.c_void_p),
                ("ops", ctypes.c_void_p), ("ops_stride", ctypes.c_uint64),
                ("mask", ctypes.c_uint32), ("pad", ctypes.c_uint32)]


def _load(path=None) -> ctypes.CDLL:
    """Loads the codec library's column decoder (native/codec/decode.c)."""
    from .native_codec import LIBRARY   # (it imports this module)
    p, n = ctypes.c_void_p, ctypes.c_uint64
    return bind(path or LIBRARY,
                {"hc_decode_columns": (ctypes.c_int, [ctypes.POINTER(PlaneColumn), ctypes.c_uint32,
                                                      n, p]),
                 "hc_count_present": (n, [p, p, n, ctypes.c_uint32, n]),
                 "hc_backref_escapes": (ctypes.c_int64, [p, n]),
                 "hc_backref_resolve": (ctypes.c_int64, [p, p, n, p, p, n, p, p, n, n])},
                "column decoder (hc_decode_columns)")


_library = LoadedOnce(_load, None)


def decode_columns_into(columns: list, count: int) -> None:
    """Decodes columns of `count` rows (not BACKREF) in one native pass, a tile of rows at a
    time through them all (native/codec/decode.c): each (data, encoding, dtype, omitted, sparse,
    out), `sparse` a Sparse or None, `out` count writable rows of any positive stride (fields of
    a reader's rows; a sparse column's op values, where its mask predicts from them, decoded
    already: Sparse.ops). Raises ColumnError (a ValueError that says which column) on a column whose
    bytes do not fit."""
    if not columns:
        return
    if len(columns) > 16:   # (decode.c keeps each column's state on its stack: 16 of them)
        raise ValueError(f"decode_columns_into: {len(columns)} columns, at most 16 at a time")
    cols = (PlaneColumn * len(columns))()
    keep = []   # (the buffers, referenced during the call)
    for c, (data, encoding, dtype, omitted, sparse, out) in enumerate(columns):
        src = np.frombuffer(data, np.uint8)
        bits = ops = None
        mask = 0
        try:
            if sparse:
                head, mask, nbytes = sparse.layout(data, count)
                bits, src = src[head:nbytes], src[nbytes:]
                ops = sparse.predictors(mask, count)
            _check_column(src, encoding, dtype, count, omitted, out, bits is not None)
        except ValueError as e:
            raise ColumnError(c, str(e)) from None
        width = dtype.itemsize if encoding == PLAIN else 8
        keep.append((src, bits, ops))
        cols[c] = PlaneColumn(src.ctypes.data if len(src) else None, len(src),
                              out.ctypes.data if count else None, out.strides[0] if count else 0,
                              encoding, width, omitted, out.dtype.itemsize,
                              bits.ctypes.data if bits is not None and len(bits) else None,
                              ops.ctypes.data if ops is not None and count else None,
                              ops.strides[0] if ops is not None and count else 0, mask, 0)
    bad = np.zeros(2, np.uint64)
    rc = _library().hc_decode_columns(cols, len(columns), count, bad.ctypes.data)
    c, rows = int(bad[0]), int(bad[1])
    if rc == -2:   # (a sparse column's planes: its present rows are counted there)
        col = cols[c]
        kept = col.width - bin(col.omitted).count("1")
        raise ColumnError(c, f"column holds {col.len} bytes, expected {kept * rows} ({kept} of "
                             f"the {col.width} byte planes of {rows} values; mask "
                             f"{col.omitted:#06x})")
    if rc:   # (checked above: the library and this module disagree)
        raise ColumnError(c, f"hc_decode_columns: error {rc}")


class ColumnError(ValueError):
    """A column of decode_columns_into's whose bytes do not fit: `column` its index there."""

    def __init__(self, column: int, message: str):
        super().__init__(message)
        self.column = column


def _check_column(data, encoding: int, dtype: np.dtype, count: int, omitted: int,
                 out: np.ndarray, sparse: bool = False) -> None:
    """ValueError unless `data` holds the planes a dense column of `count` values has (a sparse
    one's are checked natively, against the rows its presence bits mark), and `out` can take
    them."""
    if encoding not in (PLAIN, DELTA, ZIGZAG_DELTA, NONZERO_DELTA):
        raise ValueError(f"unknown column encoding {encoding}")
    width = dtype.itemsize if encoding == PLAIN else 8
    kept = _stored_planes(omitted, width, f"{count} values of {width} bytes")
    if not sparse and len(data) != len(kept) * count:
        raise ValueError(f"column holds {len(data)} bytes, expected {len(kept) * count} "
                         f"({len(kept)} of the {width} byte planes of {count} values; mask "
                         f"{omitted:#06x})")
    if len(out) != count or out.ndim != 1 or (count and out.strides[0] <= 0) \
            or not out.flags.writeable or out.dtype.itemsize > 8:
        raise ValueError(f"out must be {count} writable rows of at most 8 bytes")


def decode_pair_into(a: tuple, b: tuple, count: int, out_a: np.ndarray,
                     out_b: np.ndarray) -> None:
    """Decodes the two address columns (PARTNER) into out_a and out_b (`count` uint64 rows of one
    stride: a reader's addr and old_addr fields), each given as (data, encoding, omitted, sparse)
    like decode_columns_into's columns, BACKREF or a generic encoding. A BACKREF column stores a
    code per row (0: the value 0; 1: the next of its escapes, stored after the codes; k > 1: the
    value its partner held k - 1 rows before), and `omitted` masks the codes' planes in bits 0-7
    and the escapes' in bits 8-15. The codes and the other column are decoded in one native pass,
    the escapes in another, and the back-references followed in row order straight into the
    rows (native/codec/decode.c: chains of reuse run thousands of links deep). Raises ColumnError
    (column 0: a, 1: b) on bytes that do not fit."""
    if not (out_a.dtype == out_b.dtype == np.uint64 and len(out_a) == len(out_b) == count
            and out_a.strides == out_b.strides):
        raise ValueError(f"out_a and out_b must be {count} uint64 rows of one stride")
    u64 = np.dtype(np.uint64)
    batch, codes, tails = [], [None, None], [None, None]   # (batch: one entry a column, in order)
    for k, ((data, encoding, omitted, sparse), out) in enumerate(((a, out_a), (b, out_b))):
        if encoding != BACKREF:
            batch.append((data, encoding, u64, omitted, sparse, out))
            continue
        data = memoryview(data)
        try:
            present, head = sparse.count(data, count) if sparse else (count, 0)
        except ValueError as e:
            raise ColumnError(k, str(e)) from None
        codes_len = head + (8 - bin(omitted & 0xFF).count("1")) * present
        if len(data) < codes_len:
            raise ColumnError(k, f"column holds {len(data)} bytes, expected at least {codes_len} "
                                 f"for the codes of {count} rows (plane mask {omitted:#06x})")
        codes[k] = np.empty(count, np.uint64)
        batch.append((data[:codes_len], PLAIN, u64, omitted & 0xFF, sparse, codes[k]))
        tails[k] = (data, codes_len, omitted, sparse)
    decode_columns_into(batch, count)   # (its ColumnError's column: 0 for a, 1 for b)
    lib, escapes = _library(), [np.empty(0, np.uint64)] * 2
    for k in (0, 1):
        if codes[k] is None:
            continue
        data, codes_len, omitted, sparse = tails[k]
        m = lib.hc_backref_escapes(codes[k].ctypes.data, count)
        if m < 0:
            raise ColumnError(k, f"a back-reference points before the start of the block (row "
                                 f"{-1 - m}: code {int(codes[k][-1 - m])})")
        want = codes_len + (8 - bin(omitted >> 8).count("1")) * m
        if len(data) != want:
            raise ColumnError(k, f"column holds {len(data)} bytes, expected {want}: {codes_len} "
                                 f"of {'presence bits and ' if sparse else ''}codes and "
                                 f"{want - codes_len} for {m} escapes (plane mask {omitted:#06x})")
        escapes[k] = np.empty(m, np.uint64)
        try:
            decode_columns_into([(data[codes_len:], NONZERO_DELTA, u64, omitted >> 8, None,
                                  escapes[k])], m)
        except ColumnError as e:
            raise ColumnError(k, str(e)) from None
    if count and (codes[0] is not None or codes[1] is not None) and lib.hc_backref_resolve(
            *(p for k in (0, 1) for p in (codes[k].ctypes.data if codes[k] is not None else None,
                                          escapes[k].ctypes.data, len(escapes[k]))),
            out_a.ctypes.data, out_b.ctypes.data, out_a.strides[0], count):
        raise ValueError("hc_backref_resolve: the codes do not match the checks above")


def decode(data: bytes, encoding: int, dtype: np.dtype, count: int,
           omitted: int = 0, sparse: Sparse | None = None) -> np.ndarray:
    """One column's values from its bytes (the inverse of native/codec/encode.c), `omitted`
    the header's mask of the byte planes left out (zero), `sparse` a Sparse where the header
    has the SPARSE flag;
    raises ValueError on data that does not fit. BACKREF columns decode in pairs:
    decode_pair_into()."""
    out = np.empty(count, dtype)
    decode_into(data, encoding, dtype, count, omitted, sparse, out)
    return out


def decode_into(data: bytes, encoding: int, dtype: np.dtype, count: int, omitted: int,
                sparse: Sparse | None, out: np.ndarray) -> None:
    """decode(), into `out` (count rows of the column's dtype, any positive stride: a field of
    a reader's rows)."""
    if encoding == BACKREF:
        raise ValueError("BACKREF columns decode with their partner (codec.decode_pair_into)")
    if encoding not in (PLAIN, DELTA, ZIGZAG_DELTA, NONZERO_DELTA):
        raise ValueError(f"unknown column encoding {encoding}")
    decode_columns_into([(data, encoding, dtype, omitted, sparse, out)], count)
