"""Percentiles of a stream of non-negative integers in bounded memory.

Exact (numpy's inverted-CDF percentile over every value, as stats always reported) while the
stream holds at most `exact_limit` values; past that the values are dropped and the percentiles
come from a log-linear histogram kept alongside from the start: 1024 sub-buckets per power of two,
so a reported percentile is within 0.1% of the exact one, and it is still an observed value (the
smallest value seen in its bucket).
"""
from __future__ import annotations

import numpy as np

SUB_BITS = 10
_SUB = 1 << SUB_BITS
_NBUCKETS = (64 - SUB_BITS + 1) * _SUB


def bucket_of(values: np.ndarray) -> np.ndarray:
    """Histogram bucket of each value (uint64): exact below 2**(SUB_BITS + 1), then 1024 per
    octave: bucket = shift * 1024 + (value >> shift), shift = bit_length - SUB_BITS - 1."""
    v = np.asarray(values, np.uint64)
    if len(v) and int(v.max()) >= 1 << 53:     # float64 would round the bit length: exact path
        from .classes import size_classes
        bits = np.maximum(size_classes(v) - SUB_BITS - 1, 0)
    else:
        bits = np.maximum(np.frexp(v.astype(np.float64))[1] - (SUB_BITS + 1), 0)
    bits = bits.astype(np.uint64)
    return ((bits << np.uint64(SUB_BITS)) + (v >> bits)).astype(np.int64)


class StreamingPercentiles:
    """p50/p90/p99/max of everything `add`ed, exact up to `exact_limit` values."""

    def __init__(self, exact_limit: int = 1 << 22):
        self.exact_limit = exact_limit
        self.parts: list | None = []
        self.n = 0
        self.count = np.zeros(_NBUCKETS + _SUB, np.int64)
        self.least = np.full(_NBUCKETS + _SUB, np.iinfo(np.int64).max, np.int64)
        self.max = 0

    def add(self, values: np.ndarray) -> None:
        """Adds integer values >= 0."""
        if not len(values):
            return
        values = np.asarray(values, np.int64)
        self.n += len(values)
        self.max = max(self.max, int(values.max()))
        b = bucket_of(values.astype(np.uint64))
        self.count += np.bincount(b, minlength=len(self.count))
        np.minimum.at(self.least, b, values)
        if self.parts is not None:
            self.parts.append(values)
            if self.n > self.exact_limit:
                self.parts = None

    @property
    def exact(self) -> bool:
        return self.parts is not None

    def result(self, percentiles=(50, 90, 99)) -> dict:
        """{"p50": .., "p90": .., "p99": .., "max": ..}, zeros when nothing was added."""
        if not self.n:
            return {f"p{q}": 0 for q in percentiles} | {"max": 0}
        if self.parts is not None:
            ps = np.percentile(np.concatenate(self.parts), percentiles, method="inverted_cdf")
            out = [int(v) for v in ps]
        else:
            cum = np.cumsum(self.count)
            # inverted CDF: the smallest value whose cumulative count reaches q% of n
            out = [int(self.least[int(np.searchsorted(cum, max(1, -(-q * self.n // 100))))])
                   for q in percentiles]
        return {f"p{q}": v for q, v in zip(percentiles, out)} | {"max": self.max}
