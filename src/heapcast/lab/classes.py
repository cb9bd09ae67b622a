"""The lifetime classes the lifetime policies place by: the forecasting stage's scheme, version 1
(heapcast.forecast.lifetime; docs/vocabularies.md), so that a trained lifetime model's predictions
plug straight into `learned-lifetime`.

A block's lifetime is counted in events of its process: how many heap events (on any thread) its
release comes after its allocation. Classes are powers of 16 events:

    0: 1-15   1: 16-255   2: 256-4095   3: 4096-65535   4: >= 65536   5: never freed
"""
from __future__ import annotations

import numpy as np

from .native import NPARAMS, PARAM_BOUND0, PARAM_CLOCK, PARAM_MAIN_CLASS, PARAM_NCLASSES, \
    PARAM_PACK_GRAIN, PARAM_QUANTILE, PARAM_SMALL_MAX, PARAM_SPAN

SCHEME_VERSION = 1
CLASS_NAMES = ("1-15 events", "16-255 events", "256-4095 events", "4096-65535 events",
               ">=65536 events", "never freed")
#: Upper bounds (exclusive, in events) of the classes of freed blocks; class 4 is unbounded and
#: class 5 is "never freed" (given to blocks still live at the end).
BOUNDS = (16, 256, 4096, 65536)
NEVER_FREED = len(CLASS_NAMES) - 1

#: Defaults of the lifetime policies and of the call-site predictor: classes below MAIN_CLASS
#: (lifetimes under 4096 events) get spans of their own, the longer ones share the main heap.
SPAN_BYTES = 64 * 1024
MAIN_CLASS = 3
QUANTILE = 0.9


def kernel_params(span: int = SPAN_BYTES, small_max: int = 0, quantile: float = QUANTILE,
                  main_class: int = MAIN_CLASS, grain: int = 16) -> np.ndarray:
    """The parameter slots the native kernels take (lab.h, PARAM_*). `grain`: the step of the
    heapcast packer's fine size classes (16, or 8 as `heapcast run --align 8`)."""
    p = np.zeros(NPARAMS, np.uint64)
    p[PARAM_NCLASSES] = len(CLASS_NAMES)
    p[PARAM_SPAN] = span
    p[PARAM_SMALL_MAX] = small_max
    p[PARAM_CLOCK] = 0   # events
    p[PARAM_QUANTILE] = int(round(quantile * 1000))
    p[PARAM_MAIN_CLASS] = main_class
    p[PARAM_PACK_GRAIN] = grain
    # Bound slot 4 stays 0 (unbounded): freed blocks never reach "never freed" by their lifetime.
    p[PARAM_BOUND0:PARAM_BOUND0 + len(BOUNDS)] = BOUNDS
    return p


def to_kernel(classes: np.ndarray) -> np.ndarray:
    """Per-event classes as the kernels read them: uint8, NO_CLASS (255) where negative."""
    c = np.asarray(classes)
    return np.where(c < 0, 255, np.minimum(c, NEVER_FREED)).astype(np.uint8)
