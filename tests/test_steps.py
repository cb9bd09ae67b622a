"""heapcast.trace.steps: the times of `record --clock-every N`'s events between two readings of
their thread, spread linearly where the recorder's run was complete and the readings close."""
from __future__ import annotations

import numpy as np

from heapcast.trace.format import EVENT_DTYPE
from heapcast.trace.steps import MAX_GAP_NS, interpolate_steps


def test_a_complete_run_is_spread_up_to_the_next_reading():
    ts = np.array([1000] * 4 + [1400] * 4 + [1800], np.uint64)
    tid = np.zeros(len(ts), np.uint32)
    assert interpolate_steps(ts, tid, 4) == 2
    assert ts.tolist() == [1000, 1100, 1200, 1300, 1400, 1500, 1600, 1700, 1800]


def test_short_runs_the_last_run_and_long_gaps_keep_their_steps():
    # a run cut short (3 events: a tick), a complete one, a complete one before a pause longer
    # than the tick, and a complete one that is the last of its thread here (no next reading)
    ts = np.array([10] * 3 + [40] * 4 + [80] * 4 + [80 + MAX_GAP_NS + 1] * 4, np.uint64)
    tid = np.zeros(len(ts), np.uint32)
    before = ts.copy()
    assert interpolate_steps(ts, tid, 4) == 1   # only [40] * 4, up to 80
    want = before.copy()
    want[3:7] = [40, 50, 60, 70]
    assert ts.tolist() == want.tolist()


def test_threads_are_spread_apart_in_a_strided_block():
    """Two threads interleaved in seq order, in the EVENT_DTYPE rows a reader decodes into
    (strided views): each thread's runs are its own, whatever the other's times."""
    rows = np.zeros(18, EVENT_DTYPE)
    a = [500] * 4 + [900] * 4 + [1300]                   # thread 1: one reading per 4 events
    b = [510, 510, 510, 510, 910, 910, 910, 910, 5_000_000]   # thread 2: then a long pause
    rows["tid"][0::2], rows["ts"][0::2] = 1, a
    rows["tid"][1::2], rows["ts"][1::2] = 2, b
    assert interpolate_steps(rows["ts"], rows["tid"], 4) == 3
    assert rows["ts"][0::2].tolist() == [500, 600, 700, 800, 900, 1000, 1100, 1200, 1300]
    assert rows["ts"][1::2].tolist() == [510, 610, 710, 810] + [910] * 4 + [5_000_000]


def test_nothing_to_spread():
    ts = np.arange(10, dtype=np.uint64) * 7   # every event its own reading
    tid = np.zeros(10, np.uint32)
    assert interpolate_steps(ts, tid, 1) == 0 and interpolate_steps(ts, tid, 4) == 0
    assert ts.tolist() == (np.arange(10) * 7).tolist()
    assert interpolate_steps(np.zeros(0, np.uint64), np.zeros(0, np.uint32), 16) == 0


def test_the_spread_is_the_integer_one_for_any_n():
    """t0 + (t1 - t0) * k // N exactly, whatever N and the gap (the offsets are computed in
    float64), against a plain loop over random runs of three threads."""
    rng = np.random.default_rng(7)
    for every in (3, 7, 16, 1000, 1024):
        tid = rng.integers(0, 3, 30 * every).astype(np.uint32)
        ts = np.zeros(len(tid), np.uint64)
        for th in range(3):
            idx = np.flatnonzero(tid == th)
            readings = np.cumsum(rng.integers(1, MAX_GAP_NS + 2, len(idx) // every + 1))
            ts[idx] = readings[np.arange(len(idx)) // every].astype(np.uint64)
        want = ts.copy()
        for th in range(3):
            idx = np.flatnonzero(tid == th)
            for i in range(0, len(idx) - every, every):
                t0, t1 = int(ts[idx[i]]), int(ts[idx[i + every]])
                if t1 - t0 <= MAX_GAP_NS:
                    want[idx[i:i + every]] = [t0 + (t1 - t0) * k // every for k in range(every)]
        interpolate_steps(ts, tid, every)
        assert ts.tolist() == want.tolist(), every


def _reference(ts, tid, every, max_gap_ns=MAX_GAP_NS):
    """The estimate as numpy computes it (the reader's form until stop 50): each thread's rows
    in order, its maximal runs of equal times, the complete ones before a close next reading."""
    ts = ts.copy()
    order = np.argsort(tid, kind="stable")
    t, th = ts[order], tid[order]
    starts = np.flatnonzero(np.concatenate(([True], (t[1:] != t[:-1]) | (th[1:] != th[:-1]))))
    first, nxt = starts[:-1], starts[1:]
    spread = first[(nxt - first == every) & (th[nxt] == th[first])
                   & (t[nxt] - t[first] <= max_gap_ns)]
    for s in spread:
        t0, t1 = int(t[s]), int(t[s + every])
        t[s:s + every] = [t0 + (t1 - t0) * k // every for k in range(every)]
    ts[order] = t
    return ts, len(spread)


def test_the_native_pass_agrees_with_numpys_over_many_threads_and_odd_runs():
    """Hundreds of interleaved threads (ids up to 2^32 - 1, the lookup's table growing), runs cut
    short, runs longer than N (a reading that repeats), pauses past the bound, a strided block."""
    rng = np.random.default_rng(11)
    for every, threads in ((4, 1), (16, 3), (16, 300), (5, 40)):
        ids = rng.choice(2**32 - 1, threads, replace=False).astype(np.uint32)
        tid = ids[rng.integers(0, threads, 40 * every * threads)]
        ts = np.zeros(len(tid), np.uint64)
        for th in ids:
            idx = np.flatnonzero(tid == th)
            lengths = rng.choice([every, every, every, every - 1, 2 * every, 1], 2 * len(idx))
            run_of = np.repeat(np.arange(len(lengths)), lengths)[:len(idx)]
            steps = rng.choice([1, 500, MAX_GAP_NS, MAX_GAP_NS + 1, 10**7], len(lengths),
                               p=[0.1, 0.5, 0.1, 0.1, 0.2])
            ts[idx] = np.cumsum(steps)[run_of].astype(np.uint64)
        want, runs = _reference(ts, tid, every)
        rows = np.zeros(len(ts), EVENT_DTYPE)
        rows["ts"], rows["tid"] = ts, tid
        assert interpolate_steps(rows["ts"], rows["tid"], every) == runs, (every, threads)
        assert runs > 0 and (rows["ts"] == want).all(), (every, threads)


def test_bad_arguments_are_refused():
    import pytest
    with pytest.raises(ValueError, match="thread ids"):
        interpolate_steps(np.zeros(8, np.uint64), np.zeros(7, np.uint32), 4)
    with pytest.raises(ValueError, match="uint64"):
        interpolate_steps(np.zeros(8, np.int64), np.zeros(8, np.uint32), 4)
    with pytest.raises(ValueError, match="out of range"):
        interpolate_steps(np.zeros(8, np.uint64), np.zeros(8, np.uint32), 4, max_gap_ns=-1)


def test_a_library_without_the_pass_is_named_not_a_traceback(tmp_path):
    import pytest
    from heapcast.trace import steps
    from heapcast.trace.base import NativeError
    other = steps.LIBRARY.with_name("libheapcast_drain.so")   # a library of heapcast's without it
    with pytest.raises(NativeError, match="has no --clock-every estimates.*rebuild"):
        steps.load(other)
    with pytest.raises(NativeError, match="is missing: build"):
        steps.load(tmp_path / "libheapcast_codec.so")
