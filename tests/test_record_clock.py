"""`record --clock-every N` (recorder.c, event_ticks; drain.c's clock tick): one event in N of a
thread reads the clock, and so does the first event after each of the drainer's ticks; the others
carry their thread's latest reading."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import heapcast
from heapcast.recorder.session import finalize, recorder_library
from heapcast.stats.text import format_stats
from heapcast.trace.format import OP
from test_report import open_page

# phases.c: THREADS threads x PHASES phases of PAIRS malloc/free pairs, PAUSE_US asleep between
# (phases of 40,006 events: their first events fall anywhere in a thread's runs of EVERY events).
THREADS, PHASES, PAIRS, PAUSE_US = 2, 5, 20_003, 20_000
EVERY = 16


def _own_events(trace) -> list:
    """The events of phases.c's worker threads, one array per thread, in seq order."""
    ev = trace.events
    return [ev[ev["tid"] == tid] for tid in np.unique(ev["tid"])
            if (ev["tid"] == tid).sum() >= 2 * PHASES * PAIRS]


def test_one_clock_reading_in_n_events_and_a_fresh_one_after_every_pause(build, tmp_path):
    out = tmp_path / "t"
    r = heapcast.record([build("phases"), str(THREADS), str(PHASES), str(PAIRS), str(PAUSE_US)],
                        output=out, clock_every=EVERY, progress=False)
    assert r.exit_code == 0 and r.lost_events == 0
    trace = heapcast.load(out)
    assert [p.clock_every for p in trace.processes] == [EVERY]
    summary = heapcast.stats(trace)
    assert summary["clock_every"] == EVERY
    assert f"clock       read once in {EVERY} events" in format_stats(summary)
    # the report's card of lifetimes says so too
    page = heapcast.report(trace, output=tmp_path / "page.html")
    dom, console, _ = open_page(page, tmp_path)
    assert console == [] and (f"clock read once in {EVERY} events: times between readings "
                              "estimated") in dom
    steps = _own_events(heapcast.load(out, clock_steps=True))   # the times as recorded
    spread = _own_events(trace)                                # as read: spread between readings
    assert len(steps) == len(spread) == THREADS
    for ev, sp in zip(steps, spread):
        ts = ev["ts"].astype(np.int64)
        assert (np.diff(ts) >= 0).all()   # a thread's times never go back
        # readings: one in EVERY events, a few more after ticks and new chunks; never all
        readings = len(np.unique(ts))
        assert len(ev) / EVERY <= readings * 1.05 and readings < len(ev) / 4
        # Each pause shows where it was, at the first event after it: that event read the clock
        # afresh (the tick moved while the thread slept), not up to EVERY - 1 events later.
        gaps = np.flatnonzero(np.diff(ts) >= PAUSE_US * 1000 * 3 // 4) + 1
        assert len(gaps) >= PHASES - 1
        for g in gaps[:PHASES - 1]:
            assert ev["op"][g - 1] == OP["free"] and ev["op"][g] == OP["malloc"]
            assert ev["size"][g] == 16   # phases.c's first malloc of a phase
        # Spread: the same events, most with a time of their own, none before its reading nor
        # at or after the next one, never back; the pauses where they were (no run is spread
        # over more than the 100 us tick).
        assert (sp["seq"] == ev["seq"]).all()
        t = sp["ts"].astype(np.int64)
        assert (np.diff(t) >= 0).all() and len(np.unique(t)) > len(t) / 2   # steps: 1 in 16
        assert (t >= ts).all() and (t - ts).max() < 100_000
        nxt = np.searchsorted(np.unique(ts), ts, side="right")   # the next reading's index
        later = nxt < readings
        assert (t[later] < np.unique(ts)[nxt[later]]).all()
        assert (np.flatnonzero(np.diff(t) >= PAUSE_US * 1000 * 3 // 4) + 1).tolist() == \
            gaps.tolist()


def test_times_are_those_of_every_event_by_default_and_without_a_drainer(build, tmp_path):
    """Without `record`'s drainer no tick bounds how old a reading may be: the recorder then
    reads the clock for every event, whatever HEAPCAST_CLOCK_EVERY says."""
    prog = [str(build("phases")), "1", "2", "5000", "1000"]
    out = tmp_path / "raw"
    out.mkdir()
    env = {**os.environ, "LD_PRELOAD": str(recorder_library()), "HEAPCAST_DIR": str(out),
           "HEAPCAST_CLOCK_EVERY": str(EVERY)}
    subprocess.run(prog, env=env, check=True, capture_output=True, timeout=60)
    finalize(out, progress=False)
    default = tmp_path / "default"
    heapcast.record(prog, output=default, progress=False)
    for path in (out, default):
        trace = heapcast.load(path)
        assert [p.clock_every for p in trace.processes] == [1]
        assert heapcast.stats(trace)["clock_every"] == 1
        (ev,) = [e for e in [trace.events[trace.events["tid"] == t]
                             for t in np.unique(trace.events["tid"])] if len(e) >= 20_000]
        assert len(np.unique(ev["ts"])) >= 0.99 * len(ev)


@pytest.mark.parametrize("every", [0, -1, 1025])
def test_clock_every_out_of_range_is_an_error_before_the_program_runs(tmp_path, every):
    marker = tmp_path / "ran"
    with pytest.raises(ValueError, match="clock_every must be between 1 and 1024"):
        heapcast.record(["touch", str(marker)], output=tmp_path / "t", clock_every=every)
    assert not marker.exists() and not (tmp_path / "t").exists()
    done = subprocess.run([sys.executable, "-m", "heapcast", "record", "--clock-every",
                           str(every), "-o", str(tmp_path / "c"), "--", "touch", str(marker)],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "clock_every must be between 1 and 1024" in done.stderr
    assert not marker.exists()


def test_without_the_drainer_record_says_that_every_event_read_the_clock(build, tmp_path,
                                                                         monkeypatch):
    from heapcast.recorder import session

    def fails(self):
        raise OSError(24, "Too many open files")
    monkeypatch.setattr(session.Drainer, "start", fails)
    r = heapcast.record([build("phases"), "1", "1", "1000", "0"], output=tmp_path / "t",
                        clock_every=EVERY, progress=False)
    assert r.exit_code == 0 and r.events >= 2000
    assert any(f"--clock-every {EVERY}: the chunk drainer" in p and "every event read the clock"
               in p for p in r.problems)
    assert [p.clock_every for p in heapcast.load(tmp_path / "t").processes] == [1]


def test_record_suggests_clock_every_where_reading_the_clock_is_much_of_the_run(build, tmp_path,
                                                                            monkeypatch):
    """A recording of a million events or more whose clock readings (one an event, at what one
    takes on this machine) are a fifth of the program's run or more ends with a hint naming
    --clock-every; not with --clock-every itself, nor where the clock is fast or the recording
    short. The reading's cost is measured (drain.c): a plausible number of ns."""
    from heapcast.recorder import drain
    from heapcast.recorder.session import RecordResult, clock_hint
    assert 0.1 < drain.clock_read_ns() < 10_000

    def run(every, pairs):
        r = heapcast.record([build("phases"), "1", "1", str(pairs), "0"], output=tmp_path / "t",
                            clock_every=every, progress=False)
        assert r.exit_code == 0
        return r

    monkeypatch.setattr(drain, "clock_read_ns", lambda: 1e4)   # 10 us a reading: always much
    r = run(1, 600_000)
    assert r.events >= 1_200_000 and len(r.hints) == 1 and "--clock-every 16" in r.hints[0]
    assert "heapcast: hint: reading the clock takes 10000 ns" in r.summary()
    assert run(EVERY, 600_000).hints == []
    assert run(1, 100_000).hints == []   # 200,000 events
    monkeypatch.setattr(drain, "clock_read_ns", lambda: 1.0)
    assert run(1, 600_000).hints == []

    r = RecordResult(0, tmp_path, ["x"])
    r.events, r.wall_s = 20_000_000, 1.0
    assert "20 ns on this machine: 0.40 s at one reading an event, in a program's run of " \
           "1.00 s" in clock_hint(r, read_ns=20.0)[0]
    assert clock_hint(r, read_ns=9.0) == []   # a clock under CLOCK_HINT_NS a reading
    r.wall_s = 2.5
    assert clock_hint(r, read_ns=20.0) == []   # 16% of a slower program's run
