"""Evaluation protocols and the train/test splits they imply.

- `article`: the article's split. Samples are the rows at position >= WINDOW (100) of their
  stream that have a label, streams concatenated in order (threads in tid order); the last 15%
  of the samples are held out, as Keras' `validation_split=0.15` did. Train on everything
  before the first held-out row (`heapcast train --split article`), test on the held-out ones.
- `time`: per process, events from 85% of its time span on are held out (per-thread streams are
  each cut at that time): train with `--split time`, test on the rest.
- `cross-run`: train on one recording, test on all of another recording of the same program with
  a different input.
- `cross-program`: train on some programs, test on all of another one.
"""
from __future__ import annotations

import numpy as np

from .names import PROTOCOLS, SPLITS  # noqa: F401 (re-exported)
from .tasks import TaskData

WINDOW = 100
HOLDOUT = 0.15


def split_masks(data: TaskData, split: str, window: int = WINDOW,
                holdout: float = HOLDOUT) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) row masks of `split`: "all" (everything in both), "article" or "time".

    `train` marks the rows a model may read while training (history included; it learns the
    labels among them), `test` the labeled rows that are scored."""
    labeled = data.labels >= 0
    if split == "all":
        return np.ones(len(data), bool), labeled.copy()
    if split == "article":
        samples = np.flatnonzero(labeled & (data.position_in_stream() >= window))
        cut = int(len(samples) * (1.0 - holdout))        # Keras: split_at = int(n * (1 - v))
        test = np.zeros(len(data), bool)
        test[samples[cut:]] = True
        first = samples[cut] if cut < len(samples) else len(data)
        return np.arange(len(data)) < first, test
    if split == "time":
        ts = data.ts.astype(np.int64)
        cut = np.zeros(len(data), np.int64)
        for p in np.unique(data.proc):
            sel = data.proc == p
            lo, hi = ts[sel].min(), ts[sel].max()
            cut[sel] = lo + int((hi - lo) * (1.0 - holdout))
        late = ts >= cut
        return ~late, labeled & late
    raise ValueError(f"unknown split {split!r} (known: {', '.join(SPLITS)})")
