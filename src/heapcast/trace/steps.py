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

import numpy as np

#: The most time between two readings whose run of events is spread between them: the
#: drainer's clock tick (drain.c, CLOCK_TICK_US), which bounds how old a reading can be while
#: the recorded program runs.
MAX_GAP_NS = 100_000


def interpolate_steps(ts: np.ndarray, tid: np.ndarray, every: int,
                      max_gap_ns: int = MAX_GAP_NS) -> int:
    """Spreads, in place, each complete run of `every` equal times of a thread (rows in seq
    order; `ts` uint64 ns, `tid` the thread of each row) up to the thread's next reading, where
    that reading is in these rows and at most `max_gap_ns` later. Returns the runs spread."""
    n = len(ts)
    if every <= 1 or n <= every:
        return 0
    tid = np.ascontiguousarray(tid)   # (a reader's rows are 64-byte strided: copied once)
    order = None
    if not (tid == tid[0]).all():
        # thread ids are small: as 16-bit keys numpy's stable sort is a radix sort (4-5x a
        # merge sort of the 32-bit ids over a section's 2^18 rows)
        key = tid.astype(np.uint16) if int(tid.max()) < 1 << 16 else tid
        order = np.argsort(key, kind="stable")
    t = np.array(ts) if order is None else ts[order]   # (contiguous: spread here, then stored)
    th = tid if order is None else tid[order]
    starts = np.flatnonzero(np.concatenate(([True], (t[1:] != t[:-1]) | (th[1:] != th[:-1]))))
    if len(starts) < 2:
        return 0
    first, nxt = starts[:-1], starts[1:]
    # (a thread's times never go back: its next run's is later, and a wrapped difference fails
    # the bound anyway)
    gap = t[nxt] - t[first]
    spread = first[(nxt - first == every) & (th[nxt] == th[first]) & (gap <= max_gap_ns)]
    if not len(spread):
        return 0
    t0 = t[spread]
    k = np.arange(every, dtype=np.uint64)
    offsets = (t[spread + every] - t0)[:, None] * k // np.uint64(every)   # (< 2^27 * 2^10)
    rows = (spread[:, None] + np.arange(every)).ravel()
    t[rows] = (t0[:, None] + offsets).ravel()
    if order is None:
        ts[:] = t
    else:
        ts[order] = t
    return len(spread)
