"""The two simplest baselines: majority class and repeat-last.

- `majority`: the training set's most frequent labels, in order, whatever the context.
- `repeat-last`: the last label known before the row, then the majority order. "Known" is
  causal: for `next` and `free` the previous row's label (previous event, previous free) of the
  same stream; for `lifetime` the class of the latest block *from the same call site* whose
  release has already happened (a block's lifetime is unknown until it is freed).
"""
from __future__ import annotations

import time

import numpy as np

from ..tasks import TaskData
from .base import Model, pad_k


class Majority(Model):
    """Predicts the training set's label frequency order for every row."""

    kind = "majority"

    def fit(self, data: TaskData, train: np.ndarray, **options) -> dict:
        self.check_data(data, fitting=True)
        t0 = time.perf_counter()
        y = data.labels[train & (data.labels >= 0)]
        self.counts = np.bincount(y, minlength=self.n_labels).astype(np.int64)
        return {"events": int(train.sum()), "seconds": time.perf_counter() - t0}

    def order(self) -> np.ndarray:
        """Labels by decreasing training frequency (ties: lower label first)."""
        seen = np.flatnonzero(self.counts > 0)
        return seen[np.argsort(-self.counts[seen], kind="stable")]

    def predict(self, data: TaskData, rows: np.ndarray, k: int = 5) -> np.ndarray:
        self.check_data(data)
        best = self.order()[:k]
        return pad_k(np.broadcast_to(best, (len(rows), len(best))).astype(np.int64), k)

    def tensors(self) -> dict:
        return {"counts": self.counts}

    def load_tensors(self, tensors: dict) -> None:
        self.counts = np.array(tensors["counts"], np.int64)


class RepeatLast(Majority):
    """The last known label of the same stream (same call site for lifetimes), then majority."""

    kind = "repeat-last"

    def predict(self, data: TaskData, rows: np.ndarray, k: int = 5) -> np.ndarray:
        self.check_data(data)
        last = last_known_labels(data)[rows]
        return fill_after(last, self.order(), k)


def last_known_labels(data: TaskData) -> np.ndarray:
    """For each row, the latest label that is known before it (-1: none); see the module doc."""
    n = len(data)
    stream = np.repeat(np.arange(len(data.offsets) - 1, dtype=np.int64), np.diff(data.offsets))
    idx = np.arange(n, dtype=np.int64)
    has = data.labels >= 0
    if data.task == "lifetime":
        group = (stream << 32) | data.sites.astype(np.int64)
        has &= data.life >= 0
        avail = idx + np.maximum(data.life, 0)     # known once the release (that row) is past
    else:
        group, avail = stream, idx
    ev = np.flatnonzero(has)
    # Events (a label becomes known at `avail`) and queries (rows), ordered by group, then time;
    # a query at the time an event becomes known comes first (it must not see it).
    g = np.concatenate([group[ev], group])
    t = np.concatenate([avail[ev], idx])
    is_ev = np.concatenate([np.ones(len(ev), bool), np.zeros(n, bool)])
    order = np.lexsort((is_ev, t, g))
    pos = np.where(is_ev[order], np.arange(len(order)), -1)
    latest = np.maximum.accumulate(pos)
    src = order[np.maximum(latest, 0)]
    ok = (latest >= 0) & (g[src] == g[order])
    label = np.where(ok, data.labels[ev[np.minimum(src, len(ev) - 1)]] if len(ev) else -1, -1)
    out = np.empty(n, np.int64)
    q = ~is_ev[order]
    out[order[q] - len(ev)] = label[q]
    return out


def fill_after(first: np.ndarray, fallback: np.ndarray, k: int) -> np.ndarray:
    """Rows of k labels: `first` (where >= 0), then `fallback`'s labels without repeating it."""
    n = len(first)
    f = np.full(k + 1, -1, np.int64)
    f[:min(k + 1, len(fallback))] = fallback[:k + 1]
    has = first >= 0
    dup = f[None, :k] == first[:, None]
    dup_at = np.where(dup.any(1), dup.argmax(1), k)
    out = np.empty((n, k), np.int64)
    # Rows without a first label: the fallback itself.
    out[~has] = f[:k]
    h = np.flatnonzero(has)
    out[h, 0] = first[h]
    for c in range(1, k):
        j = c - 1 + (dup_at[h] <= c - 1)
        out[h, c] = f[j]
    return out
