"""Forecasting tasks: what is predicted at which row of the event streams, from what.

- `next`: the token of event j, from the events before it in its stream (the article's task).
- `free`: at a free of a known block, which live block it releases, named from either end of the
  recency order (free_label: the youngest FREE_YOUNG and the oldest FREE_OLD blocks each have a
  label; others share FREE_BEYOND, never counted right), from the events before it. Needs
  process-order streams to be meaningful.
- `lifetime`: the lifetime class of the block allocated by event j, from that allocation itself
  (its token, call site) and the events before it.

A TaskData is what models read: per-row inputs (token, call-site key, time-delta bucket), a
label per row (-1: nothing to predict there) and the stream boundaries.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .features import Features
from .lifetime import LIFETIME_CLASSES
from .names import TASKS  # noqa: F401 (re-exported)
from .vocab import get_vocab

#: `free` labels (docs/vocabularies.md, "Free labels", version 2): 0..FREE_YOUNG-1 name the
#: youngest live blocks (LIFO end), FREE_YOUNG..FREE_BEYOND-1 the oldest (FIFO end).
FREE_YOUNG = 64
FREE_OLD = 64
FREE_BEYOND = FREE_YOUNG + FREE_OLD
FREE_LABELS_VERSION = 2
#: The stream order each task uses by default.
DEFAULT_ORDER = {"next": "thread", "free": "process", "lifetime": "process"}


@dataclass
class TaskData:
    """Inputs and labels of one task over some streams (rows = events in stream order)."""

    task: str
    vocab: str
    tokens: np.ndarray       # vocabulary tokens of the events (uint8/uint16)
    sites: np.ndarray        # uint32 call-site keys
    dt: np.ndarray           # uint8 time-delta buckets
    labels: np.ndarray       # int64 label per row, -1 where nothing is predicted
    offsets: np.ndarray      # int64 stream boundaries
    ts: np.ndarray           # uint64 event times (time split)
    proc: np.ndarray         # uint16 process numbers (time split)
    life: np.ndarray         # int64 lifetime in events (causal baselines), -1 none/never

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def n_labels(self) -> int:
        return n_labels(self.task, self.vocab)

    @property
    def shift(self) -> bool:
        """True when row j is predicted from rows before it only (next, free); False when the
        row's own event is an input too (lifetime: the allocation is known when it happens)."""
        return self.task != "lifetime"

    def position_in_stream(self) -> np.ndarray:
        lengths = np.diff(self.offsets)
        return np.arange(len(self), dtype=np.int64) - np.repeat(self.offsets[:-1], lengths)

    def select(self, mask: np.ndarray) -> "TaskData":
        """The rows where `mask` is true, as streams: a new stream starts at every original
        stream start and after every gap (so a prefix of each stream stays one stream)."""
        rows = np.flatnonzero(mask)
        starts = np.zeros(len(self), bool)
        starts[self.offsets[:-1][self.offsets[:-1] < len(self)]] = True
        new_start = starts[rows].copy()
        if len(rows):
            new_start[0] = True
            new_start[1:] |= np.diff(rows) != 1
        offsets = np.append(np.flatnonzero(new_start), len(rows)).astype(np.int64)
        return replace(self, tokens=self.tokens[rows], sites=self.sites[rows], dt=self.dt[rows],
                       labels=self.labels[rows], offsets=offsets, ts=self.ts[rows],
                       proc=self.proc[rows], life=self.life[rows])


def n_labels(task: str, vocab: str) -> int:
    """Number of label classes of a task."""
    if task == "next":
        return get_vocab(vocab).size
    if task == "free":
        return FREE_BEYOND + 1
    if task == "lifetime":
        return len(LIFETIME_CLASSES)
    raise ValueError(f"unknown task {task!r} (known: {', '.join(TASKS)})")


def label_names(task: str, vocab: str) -> list:
    """A name for every label class."""
    if task == "next":
        return get_vocab(vocab).names()
    if task == "free":
        return ([f"youngest {r}" for r in range(FREE_YOUNG)]
                + [f"oldest {r}" for r in range(FREE_OLD)] + ["beyond"])
    return list(LIFETIME_CLASSES)


def free_label(rank, live) -> np.ndarray:
    """The `free` label of frees of the block of recency rank `rank` (0: the youngest live
    block) among `live` live blocks (the freed one included); -1 where rank < 0 (no label).

    The block is named from the nearer end of the recency order: label `rank` when rank <=
    older (older = live - 1 - rank, how many live blocks are older; ties go to the young end),
    else FREE_YOUNG + older; FREE_BEYOND when that number is beyond its end's labels. So a LIFO
    stack frees label 0, a FIFO queue of any length label FREE_YOUNG (its oldest block).
    Vectorized over arrays; a native runtime computes the same from its live count."""
    rank = np.asarray(rank, np.int64)
    older = np.asarray(live, np.int64) - 1 - rank
    young_end = np.where(rank < FREE_YOUNG, rank, FREE_BEYOND)
    old_end = np.where(older < FREE_OLD, FREE_YOUNG + older, FREE_BEYOND)
    return np.where(rank < 0, -1, np.where(rank <= older, young_end, old_end))


def free_label_rank(label, live) -> np.ndarray:
    """The inverse of free_label: the recency rank (0: youngest) of the block a `free` label
    names when `live` blocks are live; -1 where it names none (FREE_BEYOND, or past the live
    blocks)."""
    label = np.asarray(label, np.int64)
    live = np.asarray(live, np.int64)
    rank = np.where(label < FREE_YOUNG, label, live - 1 - (label - FREE_YOUNG))
    ok = (label >= 0) & (label < FREE_BEYOND) & (rank >= 0) & (rank < live)
    return np.where(ok, rank, -1)


def make_task(feats: Features, task: str, vocab: str = "rich") -> TaskData:
    """The TaskData of `task` over `feats`, with tokens of vocabulary `vocab`."""
    get_vocab(vocab)
    if vocab not in feats.columns:
        raise ValueError(f"vocabulary {vocab!r} is not a token column of these features")
    cols = feats.columns
    tokens = cols[vocab]
    if task == "next":
        labels = tokens.astype(np.int64)
    elif task == "free":
        if "free_rank" not in cols or "free_live" not in cols:
            raise ValueError("features were built without free ranks (need_ranks=False)")
        labels = free_label(cols["free_rank"], cols["free_live"])
    elif task == "lifetime":
        labels = cols["lifetime_class"].astype(np.int64)
    else:
        raise ValueError(f"unknown task {task!r} (known: {', '.join(TASKS)})")
    return TaskData(task, vocab, tokens, cols["site"], cols["dt"], labels, feats.offsets,
                    cols["ts"], cols["proc"], cols["lifetime_events"])
