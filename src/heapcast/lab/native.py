"""ctypes binding of the lab's replay kernels (native/lab, built as heapcast/libheapcast_lab.so).

Python only orchestrates: blocks of events (EVENT_DTYPE numpy arrays) go in, metrics come out.
The structs below mirror native/lab/driver.c (lab_stats) and native/lab/lab.h (lab_metrics);
their sizes are checked against the library when it is loaded.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from ..trace.base import LoadedOnce, NativeError, bind
from ..trace.format import EVENT_DTYPE

LIBRARY = Path(__file__).resolve().parent.parent / "libheapcast_lab.so"

#: Policy names -> the kernel's policy ids (enum in lab.h), in the order `simulate` runs them.
#: The lifetime kernels are named after the fit they layer lifetime segregation over;
#: `simulate` reports "oracle-lifetime" and "learned-lifetime" from them (replay.clairvoyant).
POLICY_IDS = {"first-fit": 0, "next-fit": 1, "best-fit": 2, "buddy": 3, "segregated": 4,
              "glibc": 5, "oracle-lifetime@best-fit": 6, "learned-lifetime@best-fit": 7,
              "oracle-lifetime@first-fit": 8, "oracle-lifetime@next-fit": 9,
              "learned-lifetime@first-fit": 10, "learned-lifetime@next-fit": 11, "heapcast": 12,
              "oracle-lifetime@heapcast": 13, "learned-lifetime@heapcast": 14}
NO_CLASS = 255

# Parameter slots (lab.h, PARAM_*).
PARAM_NCLASSES, PARAM_SPAN, PARAM_SMALL_MAX, PARAM_CLOCK, PARAM_QUANTILE, PARAM_MAIN_CLASS, \
    PARAM_PACK_GRAIN, PARAM_BOUND0 = range(8)
MAX_CLASSES = 16
NPARAMS = PARAM_BOUND0 + MAX_CLASSES

_U64 = ctypes.c_uint64


class _Struct(ctypes.Structure):
    def as_dict(self) -> dict:
        return {name: int(getattr(self, name)) for name, _ in self._fields_}


class Stats(_Struct):
    """What the driver counted (driver.c, lab_stats)."""
    _fields_ = [(n, _U64) for n in (
        "events", "ops", "acquisitions", "releases", "reallocs", "live_bytes", "peak_live",
        "unknown_frees", "double_acquires", "late_releases", "pred_total",
        "pred_exact", "pred_shorter", "ns", "clock", "sum_live16")]


class Metrics(_Struct):
    """What one policy measured (lab.h, lab_metrics)."""
    _fields_ = [(n, _U64) for n in (
        "ops", "events", "live_bytes", "chunk_bytes", "arena_top", "mmapped", "peak_footprint",
        "peak_live_at_footprint", "internal_at_peak", "peak_pages4k", "peak_pages2m",
        "peak_chunk_bytes", "peak_mmapped", "ns", "moves", "inplace", "reclassified",
        "check_failures", "sum_footprint16", "sum_pages4k")]


def _load(path: Path) -> ctypes.CDLL:
    """The kernel library at `path`, its struct layouts checked."""
    vp, u64, i32 = ctypes.c_void_p, _U64, ctypes.c_int
    sigs = {
        "lab_new": (vp, [vp, i32, vp, i32, u64]),
        "lab_set_classes": (None, [vp, vp, vp, vp, u64]),
        "lab_set_prior": (None, [vp, vp, vp, vp, u64]),
        "lab_feed": (None, [vp, vp, u64, u64]),
        "lab_finish": (None, [vp]),
        "lab_fork": (vp, [vp, u64]),
        "lab_free": (None, [vp]),
        "lab_get_stats": (None, [vp, ctypes.POINTER(Stats)]),
        "lab_get_metrics": (i32, [vp, i32, ctypes.POINTER(Metrics)]),
        "lab_failure": (ctypes.c_char_p, [vp, i32]),
        "lab_get_series": (u64, [vp, i32, vp, vp, u64]),
        "lab_sizeof": (u64, [i32]),
        "lab_threads": (i32, [vp]),
    }
    lib = bind(path, sigs, "replay kernels (lab_new)")
    for what, struct in ((0, Stats), (1, Metrics)):
        if lib.lab_sizeof(what) != ctypes.sizeof(struct):
            raise NativeError(f"{path} does not match heapcast.lab.native ({struct.__name__}): "
                              f"rebuild it (pip install -e .)")
    if lib.lab_sizeof(2) != EVENT_DTYPE.itemsize:
        raise NativeError(f"{path} has another event layout than EVENT_DTYPE: rebuild it")
    return lib


#: The loaded kernel library (loaded once).
library = LoadedOnce(_load, LIBRARY)


def _ptr(a: np.ndarray | None):
    return None if a is None else a.ctypes.data


class Replay:
    """One process's replay through a set of policies (a handle on the native driver).

    `params`: uint64 array of NPARAMS slots. `checked`: verify the invariants after every op
    (slower). `series_every`: record the footprint every that many ops (0: no series).
    """

    def __init__(self, policies: list, params: np.ndarray, checked: bool = False,
                 series_every: int = 0, _handle=None):
        self.lib = library()
        self.policies = list(policies)
        self._keep = []   # arrays the native side points into
        if _handle is not None:
            self.handle = _handle
            return
        kinds = np.array([POLICY_IDS[p] for p in self.policies], np.int32)
        self._params = np.ascontiguousarray(params, np.uint64)
        self.handle = self.lib.lab_new(_ptr(kinds), len(kinds), _ptr(self._params), int(checked),
                                       int(series_every))
        if not self.handle:
            raise NativeError("lab_new failed")

    def set_classes(self, oracle=None, model=None, lifetimes=None, n_events: int = 0) -> None:
        """Per-event uint8 arrays of this process: true classes, model classes, and an output
        array that receives each acquisition's true class (any may be None)."""
        arrays = [None if a is None else np.ascontiguousarray(a, np.uint8)
                  for a in (oracle, model)]
        if lifetimes is not None and (lifetimes.dtype != np.uint8 or not lifetimes.flags.c_contiguous):
            raise ValueError("lifetimes must be a contiguous uint8 array")
        self._keep = arrays + [lifetimes]
        self.lib.lab_set_classes(self.handle, _ptr(arrays[0]), _ptr(arrays[1]), _ptr(lifetimes),
                                 n_events)

    def set_prior(self, locs: np.ndarray, size_classes: np.ndarray, counts: np.ndarray) -> None:
        """Lifetime class counts learned elsewhere, one row per (location id, size class):
        counts is uint32 [rows, classes]."""
        locs = np.ascontiguousarray(locs, np.uint32)
        scs = np.ascontiguousarray(size_classes, np.uint8)
        counts = np.ascontiguousarray(counts, np.uint32)
        self._keep += [locs, scs, counts]
        self.lib.lab_set_prior(self.handle, _ptr(locs), _ptr(scs), _ptr(counts), len(locs))

    def feed(self, events: np.ndarray, first_index: int) -> None:
        """Replays a block of events (in seq order); `first_index`: index of events[0] in the process."""
        if events.dtype != EVENT_DTYPE:
            raise ValueError(f"events must be EVENT_DTYPE, not {events.dtype}")
        events = np.ascontiguousarray(events)
        self.lib.lab_feed(self.handle, _ptr(events), len(events), first_index)

    def finish(self) -> None:
        """Replays what is still pending (call once, after the last block)."""
        self.lib.lab_finish(self.handle)

    def fork(self, fork_seq: int) -> "Replay":
        """A copy of the state just before `fork_seq`: a forked child's starting heap."""
        child = Replay(self.policies, None, _handle=self.lib.lab_fork(self.handle, fork_seq))
        return child

    def threads(self) -> int:
        """The most threads this replay ran its policies on, side by side, so far."""
        return int(self.lib.lab_threads(self.handle))

    def stats(self) -> dict:
        s = Stats()
        self.lib.lab_get_stats(self.handle, ctypes.byref(s))
        return s.as_dict()

    def metrics(self, i: int) -> dict:
        m = Metrics()
        self.lib.lab_get_metrics(self.handle, i, ctypes.byref(m))
        return m.as_dict()

    def failure(self, i: int) -> str | None:
        msg = self.lib.lab_failure(self.handle, i)
        return msg.decode() if msg else None

    def series(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Policy i: (max extent, max 4 KiB pages) per interval; i = -1: (ns, max live bytes)."""
        n = self.lib.lab_get_series(self.handle, i, None, None, 0)
        a, b = np.zeros(n, np.uint64), np.zeros(n, np.uint64)
        if n:
            self.lib.lab_get_series(self.handle, i, _ptr(a), _ptr(b), n)
        return a, b

    def close(self) -> None:
        if self.handle:
            self.lib.lab_free(self.handle)
            self.handle = None

    def __del__(self):
        self.close()
