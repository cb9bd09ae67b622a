"""The article's size classes: a size's bit length."""
from __future__ import annotations

import ctypes

import numpy as np

from ..trace.base import LoadedOnce, bind


def _load(path=None) -> ctypes.CDLL:
    from .matching import LIBRARY
    p, n = ctypes.c_void_p, ctypes.c_uint64
    return bind(path or LIBRARY, {"hc_bit_lengths": (None, [p, n, p, n])},
                "size classes (hc_bit_lengths)")


_library = LoadedOnce(_load, None)


def size_classes(sizes) -> np.ndarray:
    """The article's size class of each size: `size.bit_length()` (0 for 0, 64 for >= 2**63),
    as int64 of the input's shape. A column of 8-byte integers is read where it lies, at its
    stride (a field of a reader's rows; int64 as its two's complement bits, as a cast to uint64
    gives them); other integers are cast to uint64 first. One native pass
    (native/stats/classes.c)."""
    x = np.asarray(sizes)
    if x.dtype not in (np.uint64, np.int64):
        x = x.astype(np.uint64)
    if x.ndim != 1:
        return size_classes(x.reshape(-1)).reshape(x.shape)
    out = np.empty(len(x), np.int64)
    if len(x):
        if x.strides[0] <= 0:   # (a broadcast or reversed view: its values in order first)
            x = np.ascontiguousarray(x)
        _library().hc_bit_lengths(x.ctypes.data, x.strides[0], out.ctypes.data, len(x))
    return out
