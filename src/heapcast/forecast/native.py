"""ctypes bindings of native/forecast/: the dominance count behind a freed block's recency rank
(ranks.c, heapcast.forecast.features.free_ranks) and the n-gram's context hashes (contexts.c,
heapcast.forecast.models.ngram)."""
from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from ..trace.base import LoadedOnce
from ..trace.native_codec import NativeError

LIBRARY = Path(__file__).resolve().parent.parent / "libheapcast_forecast.so"
_ERRORS = {-1: "out of memory", -2: "points or queries not in ascending x order",
           -3: "a value below 0 or above the largest, or 2^32 points or more"}


def _load(path: Path) -> ctypes.CDLL:
    if not path.exists():
        raise NativeError(f"{path} is missing: build heapcast's native code "
                          f"(pip install -e . in the repository)")
    lib = ctypes.CDLL(str(path))
    p, u64, i64 = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int64
    lib.hc_dominance_count.restype = ctypes.c_int
    lib.hc_dominance_count.argtypes = [p, p, u64, p, p, u64, i64, p]
    lib.hc_contexts.restype = ctypes.c_int
    u32 = ctypes.c_uint32
    lib.hc_contexts.argtypes = [p, u64, p, p, u64, ctypes.c_int, u32, u32, p, p]
    return lib


library = LoadedOnce(_load, LIBRARY)


def dominance_count(px: np.ndarray, pv: np.ndarray, qx: np.ndarray, qv: np.ndarray
                    ) -> np.ndarray:
    """For each query (qx, qv): the number of points with px < qx and pv > qv. px and qx in
    ascending order, values ints >= 0 (ValueError otherwise)."""
    px, pv, qx, qv = (np.ascontiguousarray(v, np.int64) for v in (px, pv, qx, qv))
    if len(px) != len(pv) or len(qx) != len(qv):
        raise ValueError("dominance_count: each point and each query needs an x and a value")
    out = np.zeros(len(qx), np.int64)
    if not len(qx) or not len(px):
        return out
    vmax = int(max(pv.max(), qv.max()))
    rc = library().hc_dominance_count(px.ctypes.data, pv.ctypes.data, len(px), qx.ctypes.data,
                                      qv.ctypes.data, len(qx), vmax, out.ctypes.data)
    if rc:
        raise ValueError(f"dominance_count: {_ERRORS.get(rc, f'error {rc}')}")
    return out


class Contexts:
    """The rolling context hashes of rows of a stream of symbols, order after order
    (NGram._contexts): each next(order) gives the hashes of that order, the orders ascending,
    one pass over the rows per call, with one hash per row kept in between."""

    def __init__(self, sym: np.ndarray, rows: np.ndarray, pos: np.ndarray, shift: bool):
        self.sym = np.ascontiguousarray(sym, np.uint64)
        self.rows, self.pos = (np.ascontiguousarray(v, np.int64) for v in (rows, pos))
        self.shift = int(bool(shift))
        self.h = np.zeros(len(self.rows), np.uint64)
        self.order = 0

    def next(self, order: int) -> np.ndarray:
        """uint64 context hash of every row at `order` (above the order of the call before)."""
        out = np.empty(len(self.rows), np.uint64)
        rc = library().hc_contexts(self.sym.ctypes.data, len(self.sym), self.rows.ctypes.data,
                                   self.pos.ctypes.data, len(self.rows), self.shift, self.order,
                                   int(order), self.h.ctypes.data, out.ctypes.data)
        if rc:
            raise ValueError(f"contexts: order {order} after {self.order} (ascending, up to "
                             f"4096), or a row or position outside the symbols")
        self.order = int(order)
        return out
