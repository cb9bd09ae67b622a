"""The article's size classes: a size's bit length."""
from __future__ import annotations

import numpy as np


def size_classes(sizes: np.ndarray) -> np.ndarray:
    """The article's size class of each size: `size.bit_length()` (0 for 0, 64 for >= 2**63).

    Exact for all uint64: frexp's exponent is the bit length, except that converting sizes >= 2**53
    to float64 may round them up to the next power of 2; those few are counted bit by bit.
    """
    x = np.asarray(sizes, np.uint64)
    n = np.frexp(x.astype(np.float64))[1].astype(np.int64)
    big = x >= np.uint64(1 << 53)
    if big.any():
        xb = x[big]
        nb = np.zeros(len(xb), np.int64)
        for shift in (32, 16, 8, 4, 2, 1):
            hi = xb >= np.uint64(1 << shift)
            nb[hi] += shift
            xb[hi] >>= np.uint64(shift)
        n[big] = nb + xb.astype(np.int64)   # xb is now 1
    return n
