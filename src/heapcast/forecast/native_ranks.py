"""ctypes binding of native/forecast/ranks.c: the dominance count behind a freed block's recency
rank (heapcast.forecast.features.free_ranks)."""
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
