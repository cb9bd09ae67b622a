"""ctypes binding of the EVENTS block encoder (native/codec/encode.c, built as
heapcast/libheapcast_codec.so).

The writer calls it from its worker thread; ctypes releases the GIL for the call. The decoder is
native/codec/decode.c (heapcast.trace.codec); tests/test_codec_native.py checks that what one
writes the other reads back, and both against numpy references.
"""
from __future__ import annotations

import ctypes
import mmap
from pathlib import Path

import numpy as np

from . import codec
from .base import LoadedOnce, NativeError, bind  # noqa: F401  (re-exported)
from .format import EVENT_DTYPE

LIBRARY = Path(__file__).resolve().parent.parent / "libheapcast_codec.so"
ABI_VERSION = 6   # 3: zero byte planes left out (TRACE_VERSION 2); 4: sparse columns (3); 5: their
                  # presence bits predicted from the ops (4); 6: the hint of planes written

#: The field index of the op column: sparse columns' presence bits are predicted from it.
OP_FIELD = EVENT_DTYPE.names.index("op")

_ERRORS = {-1: "invalid column descriptions", -2: "output buffer too small",
           -4: "block too long for the u32 column lengths"}


class Column(ctypes.Structure):
    """hc_column in native/codec/encode.c."""
    _fields_ = [("data", ctypes.c_void_p), ("stride", ctypes.c_int64), ("field", ctypes.c_uint8),
                ("encoding", ctypes.c_uint8), ("itemsize", ctypes.c_uint8),
                ("pad", ctypes.c_uint8), ("ref", ctypes.c_int32)]


def load(path: Path = LIBRARY) -> ctypes.CDLL:
    """Loads an encoder library and checks that it matches this module."""
    cols, p, u64 = ctypes.POINTER(Column), ctypes.c_void_p, ctypes.c_uint64
    lib = bind(path, {"hc_codec_abi": (u64, [ctypes.c_int]),
                      "hc_encode_bound": (u64, [cols, ctypes.c_uint32, u64]),
                      "hc_encode_events": (ctypes.c_int64, [cols, ctypes.c_uint32, u64, p, u64, p]),
                      "hc_sparsify": (ctypes.c_int64, [p, u64, u64, u64, ctypes.c_int])},
               "EVENTS block encoder (hc_encode_events)")
    if lib.hc_codec_abi(0) != ABI_VERSION or lib.hc_codec_abi(1) != ctypes.sizeof(Column):
        raise NativeError(f"{path} does not match heapcast.trace.native_codec: rebuild it "
                          f"(pip install -e .)")
    return lib


#: The installed encoder library.
library = LoadedOnce(load, LIBRARY)


def stream_buffer(nbytes: int) -> np.ndarray:
    """A fresh uint8 array of nbytes for memory written and read in order (decoded columns,
    encoded blocks), on small pages. numpy asks for transparent huge pages for any array of 4 MiB
    or more; zeroing a huge page that the host has not backed yet (a virtual machine that hands
    freed memory back to its host) ran at 0.45 GB/s here against 2.5 GB/s for small pages, and a
    recording's conversion touches 100-200 MB of such memory. Order of access needs no huge pages:
    the encoder's random-access table keeps them (encode.c, map_huge)."""
    # private: mmap's default for anonymous memory is shared (shmem, slower to fault in)
    memory = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        memory.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(memory, np.uint8, nbytes)


def _column_array(block, name: str) -> np.ndarray:
    """A block's column as a 1-d array of its EVENT_DTYPE field type, read in place when it has
    that type (a field of a structured array has a 64-byte stride: the encoder reads strides)."""
    a = block[name]
    want = EVENT_DTYPE[name]
    if not isinstance(a, np.ndarray) or a.dtype != want or a.ndim != 1:
        a = np.asarray(a)
        if a.ndim != 1:
            raise ValueError(f"column {name} must be one-dimensional, not of shape {a.shape}")
        if a.dtype != want:
            if a.dtype.kind not in "uib":
                raise TypeError(f"column {name} must hold integers, not {a.dtype}")
            a = a.astype(want)
    return a


def planes_hint() -> np.ndarray:
    """A hint for encode_events' `hint`: one per stream of blocks (a process's trace file)."""
    return np.zeros(len(codec.STORED_FIELDS), np.uint8)


def encode_events(block, out: np.ndarray | None = None, lib: ctypes.CDLL | None = None,
                  sparse: bool = True, hint: np.ndarray | None = None) -> memoryview:
    """The uncompressed payload of one EVENTS section (block: EVENT_DTYPE array or column dict).

    Returns a memoryview of `out` (a uint8 array; a new one when it is None or too small: the
    result's .obj). The encodings are codec.COLUMN_ENCODING's, except that a NONZERO_DELTA or
    BACKREF column whose values cannot be stored that way (two non-zero values exactly 2**63
    apart) is stored as DELTA. `lib`: another build of the library (tests). `sparse=False`:
    the columns left dense (version 2's layout), for sparsify() to finish. `hint`: a
    planes_hint() kept from one block of a stream to the next: the encoder writes only the byte
    planes each column needed in the previous block (the same bytes, faster; encode.c, "planes
    written"); without it every plane."""
    lib = lib or library()
    n = len(block["seq"])
    arrays = [_column_array(block, name) for name in codec.STORED_FIELDS]
    cols = (Column * len(arrays))()
    for i, (name, a) in enumerate(zip(codec.STORED_FIELDS, arrays)):
        if len(a) != n:
            raise ValueError(f"column {name} has {len(a)} rows, seq has {n}")
        enc = codec.COLUMN_ENCODING[name]
        partner = codec.STORED_FIELDS.index(codec.PARTNER[name]) if enc == codec.BACKREF else -1
        cols[i] = Column(a.ctypes.data, a.strides[0], EVENT_DTYPE.names.index(name), enc,
                         a.itemsize, 0, partner)
    need = lib.hc_encode_bound(cols, len(arrays), n)
    if out is not None and not (isinstance(out, np.ndarray) and out.dtype == np.uint8
                                and out.ndim == 1 and out.flags.c_contiguous and out.flags.writeable):
        raise ValueError("out must be a writable contiguous uint8 array")
    if out is None or len(out) < need:
        # room for a block a little longer than this one: the next block takes this buffer
        out = stream_buffer(need + need // 8)
    if hint is not None and not (isinstance(hint, np.ndarray) and hint.dtype == np.uint8
                                 and hint.shape == (len(arrays),) and hint.flags.c_contiguous
                                 and hint.flags.writeable):
        raise ValueError(f"hint must be a writable array of {len(arrays)} uint8 (planes_hint())")
    written = lib.hc_encode_events(cols, len(arrays), n, out.ctypes.data, len(out),
                                   None if hint is None else hint.ctypes.data)
    if written < 0:
        if written == -3:
            raise MemoryError("encoding an EVENTS block")
        raise NativeError(f"hc_encode_events: {_ERRORS.get(written, f'error {written}')}")
    payload = memoryview(out)[:written]
    return sparsify(payload, n, lib) if sparse else payload


def sparsify(payload: memoryview, n: int, lib: ctypes.CDLL | None = None) -> memoryview:
    """The payload of n events that encode_events(..., sparse=False) returned, with its
    mostly-zero columns made sparse (format version 4: presence bits predicted from the op
    column), in place in the same buffer: what encode_events returns by default. The trace
    writer calls it on its compressing thread."""
    lib = lib or library()
    out = payload.obj
    if not (isinstance(out, np.ndarray) and out.dtype == np.uint8 and out.ndim == 1
            and out.flags.c_contiguous and out.flags.writeable and payload.nbytes
            and np.frombuffer(payload, np.uint8).ctypes.data == out.ctypes.data):
        raise ValueError("sparsify takes a payload from encode_events(..., sparse=False): a "
                         "view of the start of its writable uint8 array")
    written = lib.hc_sparsify(out.ctypes.data, len(payload), n, len(out), OP_FIELD)
    if written == -1:
        raise ValueError(f"hc_sparsify: not a payload of columns of {n} rows")
    if written < 0:
        raise NativeError(f"hc_sparsify: {_ERRORS.get(written, f'error {written}')}")
    return memoryview(out)[:written]
