"""Event times between a thread's clock readings (`record --clock-every N`), estimated.

With `--clock-every N` one event in N of a thread reads the clock and the N - 1 after it carry
that reading (recorder.c, event_ticks), so a thread's times are steps: a run of N events with
one time, then the next reading. A run that the recorder did not cut short (exactly N events of
the thread, and the thread's next event read the clock) lies between its own reading and that
next one, so the reader spreads it linearly between the two: event k of the run gets
t0 + (t1 - t0) * k // N. It does so only where the two readings are at most MAX_GAP_NS apart
(the drainer's clock tick): a longer gap holds a pause (a thread that slept, or was not
scheduled), which the run's events came before, so they keep their reading. Shorter runs (a tick
or a new chunk made a thread read the clock early) and a thread's last run in a section keep
their steps too. Decided within one EVENTS section at a time, so that every reader of a trace
(whole processes, streaming blocks) gives the same times. `heapcast.load(path,
clock_steps=True)` reads the times as recorded.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from .base import LoadedOnce, bind
from .native_codec import LIBRARY

#: The most time between two readings whose run of events is spread between them: the
#: drainer's clock tick (drain.c, CLOCK_TICK_US), which bounds how old a reading can be while
#: the recorded program runs.
MAX_GAP_NS = 100_000


def load(path: Path = LIBRARY) -> ctypes.CDLL:
    """Loads the codec library's pass over a section's times (native/codec/steps.c)."""
    p, n = ctypes.c_void_p, ctypes.c_uint64
    return bind(path, {"hc_spread_steps": (ctypes.c_int64, [p, n, p, n, n, ctypes.c_uint32, n])},
                "--clock-every estimates (hc_spread_steps)")


library = LoadedOnce(load, LIBRARY)


def interpolate_steps(ts: np.ndarray, tid: np.ndarray, every: int,
                      max_gap_ns: int = MAX_GAP_NS) -> int:
    """Spreads, in place, each complete run of `every` equal times of a thread (rows in seq
    order; `ts` uint64 ns, `tid` the thread of each row, either strided, as a reader's rows are)
    up to the thread's next reading, where that reading is in these rows and at most
    `max_gap_ns` later: event k of the run gets t0 + (t1 - t0) * k // every. Returns the runs
    spread."""
    n = len(ts)
    if len(tid) != n:
        raise ValueError(f"interpolate_steps: {n} times but {len(tid)} thread ids")
    if every <= 1 or n <= every:
        return 0
    if not 1 < every < 2**32 or not 0 <= max_gap_ns < 2**64:
        raise ValueError(f"interpolate_steps: every {every}, max_gap_ns {max_gap_ns} out of range")
    if ts.dtype != np.uint64 or ts.ndim != 1 or not ts.flags.writeable:
        raise ValueError("interpolate_steps: ts must be a writable 1-D uint64 array")
    tid = np.asarray(tid)
    if tid.dtype != np.uint32 or tid.ndim != 1 or tid.strides[0] <= 0:
        tid = np.ascontiguousarray(tid, np.uint32)
    target = ts if ts.strides[0] > 0 else np.ascontiguousarray(ts)
    got = library().hc_spread_steps(target.ctypes.data, target.strides[0], tid.ctypes.data,
                                    tid.strides[0], n, every, int(max_gap_ns))
    if got < 0:
        if got == -3:
            raise MemoryError("interpolate_steps: no memory for the threads' runs")
        raise ValueError(f"interpolate_steps: {n} rows or every {every} out of range")
    if target is not ts:
        ts[:] = target
    return int(got)
