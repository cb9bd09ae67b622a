"""ctypes binding of the policy runtime (native/policy/, built as heapcast/libheapcast_policy.so).

`Policy(path)` loads a POLICY through the native loader (which checks it and names the file and
the field that is wrong); `Policy.run(...)` runs one event stream through it in C and returns the
prediction made at every row asked for. The tests and `heapcast evaluate POLICY` use it; programs
use the same C code through the recorder (`heapcast record --policy`) and the allocator.
"""
from __future__ import annotations

import ctypes
import threading
import time
from pathlib import Path

import numpy as np

from ..trace.base import LoadedOnce, NativeError, bind
from .fileformat import PolicyError

LIBRARY = Path(__file__).resolve().parent.parent / "libheapcast_policy.so"
TOPK = 5
#: hc_event of native/policy/heapcast_policy.h.
EVENT = np.dtype([("site", "<u4"), ("op", "<u2"), ("token", "<u2"), ("size", "<u8"),
                  ("ts", "<u8"), ("free_null", "u1"), ("free_unknown", "u1"), ("pad", "u1", 6)])
#: hc_prediction.
PREDICTION = np.dtype([("label", "<i4", TOPK), ("conf", "<f4"), ("level", "<u4")])
assert EVENT.itemsize == 32 and PREDICTION.itemsize == 28

def _load(path: Path) -> ctypes.CDLL:
    """The runtime library at `path`; PolicyError where it is missing or lacks a function."""
    vp, cp, i, u32, u64 = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint32,
                           ctypes.c_uint64)
    try:
        return bind(path, {
            "hc_policy_open": (vp, [cp, cp, ctypes.c_size_t]),
            "hc_policy_close": (i, [vp]),
            "hc_policy_kind": (i, [vp]), "hc_policy_task": (i, [vp]),
            "hc_policy_labels": (i, [vp]),
            "hc_run": (i, [vp, vp, vp, vp, u64, vp, i, u64]),
            "hc_index_build": (i, [vp, u64, u32, vp]),
            "hc_table_key": (u64, [i, u32, u32, u64]),
            "hc_site_key": (u32, [u32, u64]),
            "hc_rich_token": (ctypes.c_uint16, [i, u64, i, i])}, "policy runtime (hc_run)")
    except NativeError as e:
        raise PolicyError(str(e)) from None


#: The runtime library, loaded once.
library = LoadedOnce(_load, LIBRARY)


def index_build(keys: np.ndarray, bits: int) -> np.ndarray:
    """The open-addressing index (int32[1 << bits]: entry + 1, 0 empty) of distinct uint64
    `keys`, as the runtime probes it."""
    keys = np.ascontiguousarray(keys, np.uint64)
    slots = np.zeros(1 << bits, np.int32)
    rc = library().hc_index_build(keys.ctypes.data, len(keys), bits, slots.ctypes.data)
    if rc == -2:
        raise ValueError("duplicate keys in an index")
    if rc != 0:
        raise ValueError(f"{len(keys)} keys do not fit an index of 2^{bits} slots")
    return slots


class Policy:
    """A POLICY loaded by the native runtime."""

    def __init__(self, path):
        self.path = Path(path)
        err = ctypes.create_string_buffer(1024)
        lib = library()
        self._h = lib.hc_policy_open(str(self.path).encode(), err, len(err))
        if not self._h:
            raise PolicyError(err.value.decode(errors="replace"))
        self.kind = {1: "table", 2: "rnn"}[lib.hc_policy_kind(self._h)]
        self.task = ("next", "free", "lifetime")[lib.hc_policy_task(self._h)]
        self.n_labels = lib.hc_policy_labels(self._h)
        self.run_seconds = 0.0      # time spent inside the runtime by run(), all calls summed
        self._seconds_lock = threading.Lock()   # (run() may be called from several threads)

    def close(self) -> None:
        if self._h:
            library().hc_policy_close(self._h)
            self._h = None

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def run(self, events: np.ndarray, labels: np.ndarray, want: np.ndarray,
            memory_log2: int = 0, warm_from: int = 0) -> np.ndarray:
        """Runs one stream from its start: the PREDICTION at every row where `want` is true (rows
        elsewhere are zero). `labels` are the rows' true labels (-1: none), which the in-run
        memory reads once a row has happened (`memory_log2`: its slots per order, 0 the
        runtime's default, as in a recorded program). Rows before `warm_from` only feed the
        histories and the memory (an rnn's network starts from rest there)."""
        n = len(events)
        events = np.ascontiguousarray(events, EVENT)
        labels = np.ascontiguousarray(labels, np.int32)
        want = np.ascontiguousarray(want, np.uint8)
        # zeros as the kernel gives them: only the pages of wanted rows are ever touched (their
        # faults, about 0.1% of an evaluation's runtime, are inside the timed call)
        out = np.zeros(n, PREDICTION)
        if n:
            t0 = time.perf_counter()
            rc = library().hc_run(self._h, events.ctypes.data, labels.ctypes.data,
                                  want.ctypes.data, n, out.ctypes.data, memory_log2, warm_from)
            with self._seconds_lock:
                self.run_seconds += time.perf_counter() - t0
            if rc != 0:
                raise MemoryError("the policy runtime could not map a stream's state")
        return out


def events_of(tokens: np.ndarray, sites: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """EVENT rows from per-row tokens (already in the policy's vocabulary), call-site keys and
    CLOCK_MONOTONIC times."""
    ev = np.zeros(len(tokens), EVENT)
    ev["token"] = tokens
    ev["site"] = sites
    ev["ts"] = ts
    return ev
