"""ctypes binding of the raw-file decoder (native/codec/raw_decode.c, built into
heapcast/libheapcast_codec.so with the EVENTS encoder).

heapcast.trace.raw.RawProcess calls it to scan chunks and to decode the events of a window of seq
numbers; ctypes releases the GIL for each call, so the trace writer's worker thread encodes the
previous block meanwhile. The raw file is passed as the address and length of its mapping, not as
a buffer object: no frame of these functions (which an exception's traceback keeps) holds an
export of the mmap, which could then not be closed. tests/test_raw_native.py checks the results against the numpy decoder
this code replaced.
"""
from __future__ import annotations

import ctypes
import os
import sys
import threading
from pathlib import Path

import numpy as np

from .base import bind
from .native_codec import LIBRARY, LoadedOnce, NativeError, stream_buffer

ABI_VERSION = 3
ERR_ARGS, ERR_SPACE, ERR_NOMEM, ERR_EXT = -1, -2, -3, -5

#: hc_raw_chunk: one chunk to decode, with its cursor (where the window before stopped reading
#: it; see raw_decode.c).
CHUNK_DTYPE = np.dtype([("offset", "<u8"), ("size", "<u8"), ("n", "<u8"), ("tsc", "<u8"),
                        ("tid", "<u4"), ("ordered", "<u4"), ("next_slot", "<u8"),
                        ("next_tsc", "<u8"), ("next_seq", "<u8")])
#: The columns the decoder fills, in hc_raw_columns order (EVENT_DTYPE's fields but `proc`).
COLUMNS = (("seq", np.uint64), ("ts", np.uint64), ("addr", np.uint64), ("old_addr", np.uint64),
           ("size", np.uint64), ("arg", np.uint64), ("loc", np.uint32), ("tid", np.uint32),
           ("free_lag", np.uint32), ("op", np.uint8), ("flags", np.uint8))
ROW_BYTES = sum(np.dtype(dtype).itemsize for _, dtype in COLUMNS)   # 43, widest columns first


class Clock(ctypes.Structure):
    """hc_raw_clock: ticks -> ns, identity or n0 + rint((ticks - t0) * slope)."""
    _fields_ = [("slope", ctypes.c_double), ("t0", ctypes.c_int64), ("n0", ctypes.c_int64),
                ("identity", ctypes.c_uint32), ("pad", ctypes.c_uint32)]


class Columns(ctypes.Structure):
    """hc_raw_columns: where row i of each column goes."""
    _fields_ = [(name, ctypes.c_void_p) for name, _ in COLUMNS]


class ExtError(Exception):
    """A two-slot event lacks its HC_EXT slot: chunk (index in the chunks given), slot index."""

    def __init__(self, chunk: int, slot: int):
        super().__init__(chunk, slot)
        self.chunk, self.slot = chunk, slot


_u64, _ptr = ctypes.c_uint64, ctypes.c_void_p


def load(path: Path = LIBRARY) -> ctypes.CDLL:
    """Loads a decoder library and checks that it matches this module."""
    clock, columns, i64 = ctypes.POINTER(Clock), ctypes.POINTER(Columns), ctypes.c_int64
    lib = bind(path, {
        "hc_raw_abi": (_u64, [ctypes.c_int]),
        "hc_raw_scan_chunk": (i64, [_ptr, _u64, _u64, _u64, _ptr]),
        "hc_raw_scan_chunks": (i64, [_ptr, _u64, _u64, _ptr, _ptr, _ptr]),
        "hc_raw_decode_chunk": (i64, [_ptr, _u64, _ptr, clock, _u64, _u64, _ptr, _u64, columns,
                                      _u64, _u64, _ptr]),
        "hc_raw_window": (i64, [_ptr, _u64, _ptr, _u64, clock, _u64, _u64, _ptr, _u64, columns,
                                _u64, _ptr])}, "raw-file decoder (hc_raw_window)")
    abi = lib.hc_raw_abi
    if abi(0) != ABI_VERSION or abi(1) != CHUNK_DTYPE.itemsize \
            or abi(2) != ctypes.sizeof(Clock) or abi(3) != ctypes.sizeof(Columns):
        raise NativeError(f"{path} does not match heapcast.trace.native_raw: rebuild it "
                          f"(pip install -e .)")
    return lib


#: The installed decoder library.
library = LoadedOnce(load, LIBRARY)


def _check(rc: int, what: str) -> int:
    if rc >= 0:
        return rc
    if rc == ERR_NOMEM:
        raise MemoryError(what)
    raise NativeError(f"{what}: error {rc}")   # arguments that the callers never pass


def scan_chunk(address: int, length: int, offset: int, size: int) -> tuple:
    """(n, events, seq_min, seq_max, loc slots, first bad slot or None, ordered) of the chunk at
    offset in the raw file's bytes (address, length: its mapping, which must stay mapped
    meanwhile); ordered: its events' seqs increase in slot order."""
    out = (ctypes.c_uint64 * 7)()   # (a ctypes array: a chunk's scan takes a few us)
    _check(library().hc_raw_scan_chunk(address, length, offset, size, out), "hc_raw_scan_chunk")
    n, events, lo, hi, locs, bad, ordered = out
    return n, events, lo, hi, locs, None if bad == 2**64 - 1 else bad, bool(ordered)


#: Fewer chunks than this to scan are not worth a second thread (starting one costs about as
#: much as scanning a few cold 1 MiB chunks, 0.1 ms each).
PARALLEL_SCAN = 16


def scan_chunks(address: int, length: int, offsets, sizes, threads: int = 2) -> np.ndarray:
    """scan_chunk's seven numbers for each chunk (offsets[i], sizes[i]: uint64 arrays), as an
    (n, 7) uint64 array (a bad slot's index is 2**64 - 1 where there is none, ordered 0 or 1),
    scanned by up to `threads` threads, each a part of similar size: chunks that the conversion
    while the program ran did not read are scanned after its exit, when nothing else runs (ring:
    350-400 chunks, 35-40 ms on one core). The mapping must stay mapped meanwhile."""
    offsets = np.ascontiguousarray(offsets, np.uint64)
    sizes = np.ascontiguousarray(sizes, np.uint64)
    n = len(offsets)
    out = np.zeros((n, 7), np.uint64)
    parts = 1 if n < PARALLEL_SCAN else max(1, min(threads, len(os.sched_getaffinity(0))))
    # contiguous parts of about the same bytes (chunks are 4 KiB to 1 MiB)
    ends = np.searchsorted(np.cumsum(sizes), np.arange(1, parts) * (int(sizes.sum()) / parts))
    bounds = [0, *[int(e) for e in ends], n]
    errors: list = []

    def scan(lo: int, hi: int) -> None:
        if hi <= lo:
            return
        rc = library().hc_raw_scan_chunks(address, length, hi - lo, offsets[lo:].ctypes.data,
                                          sizes[lo:].ctypes.data, out[lo:].ctypes.data)
        if rc:
            errors.append(rc)

    helpers = [threading.Thread(target=scan, args=(bounds[k], bounds[k + 1]), daemon=True)
               for k in range(1, parts)]
    for t in helpers:
        t.start()
    scan(bounds[0], bounds[1])   # (ctypes releases the GIL: the parts run at once)
    for t in helpers:
        t.join()
    for rc in errors:
        _check(rc, "hc_raw_scan_chunks")
    return out


def chunk_table(chunks) -> np.ndarray:
    """The CHUNK_DTYPE table of chunks (heapcast.trace.raw.Chunk), cursors at their start."""
    table = np.zeros(len(chunks), CHUNK_DTYPE)
    for name in ("offset", "size", "n", "tsc", "tid", "ordered"):
        table[name] = [getattr(c, name) for c in chunks]
    table["next_tsc"] = table["tsc"]
    return table


def _columns(cap: int) -> tuple[np.ndarray, dict, Columns]:
    """Room for cap rows of every column, in one allocation: (that memory, the columns, their
    addresses for the decoder)."""
    memory = stream_buffer(cap * ROW_BYTES)
    cols, at = {}, 0
    for name, dtype in COLUMNS:
        cols[name] = memory[at:at + cap * np.dtype(dtype).itemsize].view(dtype)
        at += cap * np.dtype(dtype).itemsize
    return memory, cols, Columns(*(cols[name].ctypes.data for name, _ in COLUMNS))


class Buffers:
    """Output memory for decode_window, reused once no array made from it is referenced any more
    (a view of it, however derived, refers to it: its reference count tells). Fresh memory costs
    the kernel zeroing it (slowly in a virtual machine, where it was a fifth of `heapcast
    record`'s conversion); the trace writer holds two or three blocks at a time, so a few sets of
    columns suffice. Thread-safe: get() makes the views it returns under its lock, so a set is
    counted as taken before another thread looks."""

    def __init__(self, keep: int = 4):
        self.keep = keep
        self.sets: list = []   # [memory, columns, Columns, rows, its reference count when free]
        self.lock = threading.Lock()

    def get(self, cap: int) -> tuple[dict, Columns]:
        with self.lock:
            for entry in self.sets:
                if entry[3] >= cap and sys.getrefcount(entry[0]) == entry[4]:
                    return {name: col[:cap] for name, col in entry[1].items()}, entry[2]
            rows = cap + cap // 8   # room for the next windows, which differ a little in size
            memory, cols, ccols = _columns(rows)
            if len(self.sets) < self.keep:
                entry = [memory, cols, ccols, rows, 0]
                del memory
                entry[4] = sys.getrefcount(entry[0])   # measured as get() measures it
                self.sets.append(entry)
            return {name: col[:cap] for name, col in cols.items()}, ccols


#: The process's decoding memory: the converter while the program runs, then the conversion
#: after its exit, take their windows' columns from it.
SHARED = Buffers()


def _remap(remap) -> tuple:
    if remap is None:
        return None, 0, None
    remap = np.ascontiguousarray(remap, np.uint32)
    return remap, len(remap), remap.ctypes.data


def decode_chunk(address: int, length: int, chunk: np.ndarray, clock: Clock, lo: int = 0,
                 hi: int = 2**64 - 1, remap=None) -> dict:
    """The events of one chunk (a CHUNK_DTYPE array of one) with seq in [lo, hi), in slot order,
    as columns, from the raw file mapped at address (length bytes). Raises ExtError(0, slot)."""
    chunk = np.ascontiguousarray(chunk, CHUNK_DTYPE).reshape(1)
    cap = int(chunk["n"][0])
    _, cols, ccols = _columns(cap)
    remap, nremap, premap = _remap(remap)   # (kept referenced during the call)
    bad = np.zeros(1, np.uint64)
    rc = library().hc_raw_decode_chunk(address, length, chunk.ctypes.data,
                                       ctypes.byref(clock), lo, hi, premap, nremap,
                                       ctypes.byref(ccols), 0, cap, bad.ctypes.data)
    if rc == ERR_EXT:
        raise ExtError(0, int(bad[0]))
    m = _check(rc, "hc_raw_decode_chunk")
    return {name: col[:m] for name, col in cols.items()}


def decode_window(address: int, length: int, chunks: np.ndarray, clock: Clock, lo: int, hi: int,
                  remap=None, buffers: Buffers | None = None) -> dict:
    """The events with seq in [lo, hi) of the chunks (a contiguous CHUNK_DTYPE array, whose
    cursors this advances: pass the same rows for the next window) of the raw file mapped at
    address (length bytes), in seq order (rows of equal seq: in chunk order, then slot order), as
    columns. `remap`: loc = remap[raw id], 0 beyond it. Raises ExtError(k, slot)."""
    if chunks.dtype != CHUNK_DTYPE or not chunks.flags.c_contiguous or not chunks.flags.writeable:
        raise ValueError("decode_window: chunks must be a writable contiguous CHUNK_DTYPE array")
    lo, hi = min(lo, 2**64 - 1), min(hi, 2**64 - 1)   # seq numbers are below 2**56
    cap = int(chunks["n"].sum())
    if buffers is not None:
        cols, ccols = buffers.get(cap)
    else:
        _, cols, ccols = _columns(cap)
    remap, nremap, premap = _remap(remap)   # (kept referenced during the call)
    where = np.zeros(2, np.uint64)
    rc = library().hc_raw_window(address, length, chunks.ctypes.data, len(chunks),
                                 ctypes.byref(clock), lo, hi, premap, nremap, ctypes.byref(ccols),
                                 cap, where.ctypes.data)
    if rc == ERR_EXT:
        raise ExtError(int(where[0]), int(where[1]))
    m = _check(rc, "hc_raw_window")
    return {name: col[:m] for name, col in cols.items()}
