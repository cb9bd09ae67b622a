"""ctypes binding of native/codec/match.c: the two passes of block matching around numpy's sort
(heapcast.trace.blocks.match)."""
from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from .format import ALLOC_OPS, EVENT_DTYPE, FREE, REALLOC, REALLOCARRAY
from .base import LoadedOnce, NativeError, bind
from .native_codec import LIBRARY

# match.c reads these fields at these byte offsets of a row
assert {f: EVENT_DTYPE.fields[f][1] for f in ("seq", "addr", "old_addr", "size", "free_lag", "op")} \
    == {"seq": 0, "addr": 16, "old_addr": 24, "size": 32, "free_lag": 56, "op": 62}, \
    "EVENT_DTYPE changed: update native/codec/match.c's field offsets"

#: What each op code is, for match.c: 1 acquires, 2 resizes (realloc-like), 4 frees.
OP_KINDS = np.zeros(256, np.uint8)
OP_KINDS[list(ALLOC_OPS)] |= 1
OP_KINDS[[REALLOC, REALLOCARRAY]] |= 2
OP_KINDS[FREE] |= 4


def load(path: Path = LIBRARY) -> ctypes.CDLL:
    """Loads the codec library's matching passes."""
    p, n = ctypes.c_void_p, ctypes.c_uint64
    return bind(path, {"hc_match_rows": (n, [p, n, n, p, n, p, p, p, p, p, p, p]),
                       "hc_match_pass": (ctypes.c_int,
                                         [p, p, p, p, n, p, n, n, n, p, p, p, p, p, p])},
                "block matching")


library = LoadedOnce(load, LIBRARY)


def rows(ev: np.ndarray, inherited: np.ndarray) -> tuple:
    """(acquires, releases, addr, pos, kind, event) of match.c's first pass over `ev` (a
    contiguous EVENT_DTYPE array) and the `inherited` addresses."""
    n, k = len(ev), len(inherited)
    acquires, releases = np.zeros(n, bool), np.zeros(n, bool)
    cap = k + 2 * n   # (a realloc both releases and acquires; pages past the rows stay untouched)
    addr, pos = np.empty(cap, np.uint64), np.empty(cap, np.int64)
    kind, event = np.empty(cap, np.int8), np.empty(cap, np.int64)
    m = library().hc_match_rows(ev.ctypes.data, n, EVENT_DTYPE.itemsize, OP_KINDS.ctypes.data, k,
                                inherited.ctypes.data, acquires.ctypes.data,
                                releases.ctypes.data, addr.ctypes.data, pos.ctypes.data,
                                kind.ctypes.data, event.ctypes.data)
    return acquires, releases, addr[:m], pos[:m], kind[:m], event[:m]


def walk(ev: np.ndarray, addr, kind, event, order, inherited_sizes, outputs: dict) -> tuple:
    """match.c's second pass over the rows in `order`; fills `outputs` (alloc_of, release_of,
    released_size, inherited_release_of, pre-filled) and returns (unmatched releases, double
    acquisitions)."""
    counts = np.zeros(2, np.int64)
    sizes = inherited_sizes.ctypes.data if inherited_sizes is not None else None
    rc = library().hc_match_pass(
        addr.ctypes.data, kind.ctypes.data, event.ctypes.data, order.ctypes.data, len(order),
        ev.ctypes.data, len(ev), EVENT_DTYPE.itemsize, len(outputs["inherited_release_of"]),
        sizes, outputs["alloc_of"].ctypes.data, outputs["release_of"].ctypes.data,
        outputs["released_size"].ctypes.data, outputs["inherited_release_of"].ctypes.data,
        counts.ctypes.data)
    if rc:
        raise NativeError("hc_match_pass: a row or an event index out of range")
    return int(counts[0]), int(counts[1])
