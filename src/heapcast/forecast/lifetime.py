"""Lifetime labels of allocations, their classes, and the lifetime predictions other stages use.

A block's lifetime is counted in events of its process (how many heap events, on any thread, its
release comes after its allocation: deterministic, independent of the recorder's overhead) and
in nanoseconds. Classes are log-scale (docs/vocabularies.md, "Lifetime classes", version 1):

    0: 1-15 events   1: 16-255   2: 256-4095   3: 4096-65535   4: >= 65536   5: never freed

`predict_lifetime_classes(model_path, process)` is the stable entry point for the allocator lab
and the policy runtime: a lifetime class per event from a model trained with `--task lifetime`.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..trace.blocks import NEVER, Blocks
from ..stats import size_classes

LIFETIME_VERSION = 1
#: Class names, by class id.
LIFETIME_CLASSES = ("1-15 events", "16-255 events", "256-4095 events", "4096-65535 events",
                    ">=65536 events", "never freed")
NEVER_FREED = 5
NOT_ALLOCATION = -1     # class of events that produce no block
LIFETIME_BASE_LOG2 = 4  # classes are powers of 16 events

#: Nanosecond classes (a side label of datasets): powers of 10 from 1 us, then never freed.
LIFETIME_NS_CLASSES = ("<1us", "1-10us", "10-100us", "0.1-1ms", "1-10ms", "10-100ms", "0.1-1s",
                       ">=1s", "never freed")


def lifetime_labels(ev: np.ndarray, blocks: Blocks) -> dict:
    """Lifetimes of the blocks produced by a process's events (arrays indexed by event).

    Returns `events` and `ns` (int64; -1 for events that produce no block and for blocks never
    freed), `cls` (int8 event class, see the module docstring) and `ns_cls` (int8, the
    nanosecond classes).
    """
    n = len(ev)
    idx = np.arange(n, dtype=np.int64)
    rel = blocks.release_of
    freed = blocks.acquires & (rel != NEVER)
    life = np.full(n, -1, np.int64)
    life[freed] = rel[freed] - idx[freed]
    ns = np.full(n, -1, np.int64)
    ts = ev["ts"].astype(np.int64)
    ns[freed] = np.maximum(ts[rel[freed]] - ts[freed], 0)
    return {"events": life, "ns": ns, "cls": lifetime_classes(life, blocks.acquires),
            "ns_cls": _ns_classes(ns, blocks.acquires)}


def lifetime_classes(life_events: np.ndarray, acquires: np.ndarray) -> np.ndarray:
    """Class of each lifetime in events (-1: never freed); NOT_ALLOCATION where no block."""
    life = np.asarray(life_events, np.int64)
    log16 = (size_classes(np.maximum(life, 1).astype(np.uint64)) - 1) // LIFETIME_BASE_LOG2
    cls = np.where(life < 0, NEVER_FREED, np.minimum(log16, NEVER_FREED - 1))
    return np.where(acquires, cls, NOT_ALLOCATION).astype(np.int8)


def _ns_classes(ns: np.ndarray, acquires: np.ndarray) -> np.ndarray:
    bounds = 10 ** np.arange(3, 3 + len(LIFETIME_NS_CLASSES) - 2, dtype=np.int64)  # 1us..1s
    cls = np.where(ns < 0, len(LIFETIME_NS_CLASSES) - 1, np.searchsorted(bounds, ns, "right"))
    return np.where(acquires, cls, NOT_ALLOCATION).astype(np.int8)


def predict_lifetime_classes(model_path, process) -> np.ndarray:
    """Predicted lifetime class (int8) of every event of `process` (a heapcast Process), in its
    seq order, by the model at `model_path` (trained with `heapcast train --task lifetime`).

    Meaningful for allocation events; NOT_ALLOCATION (-1) for the others. Raises ModelError
    (a ValueError) for a model file that is corrupt or not a lifetime model.
    """
    from .features import featurize_process
    from .modelfile import ModelError
    from .models import load_model
    from .tasks import make_task

    model = load_model(Path(model_path))
    if model.task != "lifetime":
        raise ModelError(f"{model_path}: a {model.task!r} model, not a lifetime model "
                         f"(train one with --task lifetime)")
    # One process in "process" order: the rows are its events in seq order.
    data = make_task(featurize_process(process, order="process", need_ranks=False), "lifetime",
                     model.vocab)
    out = np.full(len(data), NOT_ALLOCATION, np.int8)
    rows = np.flatnonzero(data.labels >= 0)
    if len(rows):
        out[rows] = model.predict(data, rows, k=1)[:, 0]
    return out
