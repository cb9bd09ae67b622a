"""Conversion while the program runs (heapcast.recorder.live): a trace converted while its program ran
is identical, event for event, to the same raw files converted after the exit; killing the
program or `heapcast record` at any point of it loses nothing; a wrong guess is caught."""
from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import heapcast
from heapcast.recorder import session as recording
from heapcast.recorder.session import finalize, record
from heapcast.recorder import checkpoint, live


@pytest.fixture
def small_windows(monkeypatch):
    """Windows of 4096 seqs, a clock fixed after 5 ms and copies freed two at a time, so that a
    test program of a few hundred thousand events is mostly converted while it runs."""
    monkeypatch.setattr(live, "WINDOW", 4096)
    monkeypatch.setattr(live, "FREEZE_NS", 5_000_000)
    monkeypatch.setattr(live, "PUNCH_AT_ONCE", 2)
    monkeypatch.setattr(live, "POLL_S", 0.005)


@pytest.fixture
def punches(monkeypatch):
    """Every copy that the converter punches out of a raw file once converted, saved first:
    raw file name -> [(offset, bytes)]."""
    real, saved = checkpoint.punch, {}

    def punch(fd, offset, size):
        path = os.readlink(f"/proc/self/fd/{fd}")
        with open(path, "rb") as f:
            f.seek(offset)
            saved.setdefault(Path(path).name, []).append((offset, f.read(size)))
        return real(fd, offset, size)

    monkeypatch.setattr(checkpoint, "punch", punch)
    return saved


@pytest.fixture
def keep_raw(monkeypatch, tmp_path, punches):
    """Copies the trace directory (raw files complete, converter stopped) just before record's
    finalize, as the recorder alone would have left it: the copies that the converter punched
    out are put back, and its converted part and checkpoints left out, so that the copy converts
    after the exit on its own. Returns the list of (copy, live processes) it made."""
    real, kept = recording.finalize, []

    def spy(path, result=None, sampler=None, progress=None, live=None, **options):
        copy = tmp_path / f"raw-copy-{len(kept)}"
        shutil.copytree(path, copy)
        for name, regions in punches.items():
            with open(copy / name, "r+b") as f:
                for offset, data in regions:
                    f.seek(offset)
                    f.write(data)
        for done in (*copy.glob("*.hct.tmp"), *copy.glob("*.hct.ckpt")):
            done.unlink()
        kept.append((copy, live))
        return real(path, result, sampler, progress, live, **options)

    monkeypatch.setattr(recording, "finalize", spy)
    return kept


def assert_same_trace(a: Path, b: Path) -> None:
    """Every process of a and b: the same events, locations, and metadata."""
    ta, tb = heapcast.load(a), heapcast.load(b)
    assert len(ta.processes) == len(tb.processes)
    for pa, pb in zip(ta.processes, tb.processes):
        assert pa.event_count == pb.event_count > 0
        ea, eb = pa.events, pb.events
        for name in ea.dtype.names:
            assert np.array_equal(ea[name], eb[name]), f"field {name} differs"
        la, lb = pa.locations, pb.locations
        assert np.array_equal(la.offsets, lb.offsets) and np.array_equal(la.flat, lb.flat)
        assert (pa.pid, pa.threads, pa.lost_events) == (pb.pid, pb.threads, pb.lost_events)
        # the .mods read as it grew (while the program ran) as the whole file read afterwards
        assert (pa.exe, pa.argv, pa.cwd, pa.pymalloc_seq) == (pb.exe, pb.argv, pb.cwd,
                                                              pb.pymalloc_seq)
        assert pa.modules == pb.modules and pa.python_frames == pb.python_frames


def test_live_conversion_equals_conversion_after_exit(build, small_windows, keep_raw, tmp_path,
                                                     monkeypatch):
    polls = []   # (what poll returned, whether it converted events)
    real_poll = live.LiveConverter.poll

    def poll(self):
        before = sum(lp.emitted for lp in self.processes.values())
        got = real_poll(self)
        polls.append((got, sum(lp.emitted for lp in self.processes.values()) > before))
        return got

    monkeypatch.setattr(live.LiveConverter, "poll", poll)
    out = tmp_path / "t"
    r = record([build("phases"), "4", "40", "2000", "10000"], output=out, progress=False)
    assert r.exit_code == 0 and not r.problems
    assert r.events >= 4 * 40 * 2000 * 2
    # (how much depends on the machine's load: the converter never makes the program wait)
    assert r.live_events > 0, "nothing was converted while the program ran"
    assert all(got == converted for got, converted in polls) and (True, True) in polls
    (copy, lives), = keep_raw
    assert any(lp.emitted for lp in lives.values())
    again = finalize(copy, progress=False)          # the same raw files, converted after exit
    assert again.live_events == 0 and again.events == r.events
    assert not list(copy.glob("*.raw")) and not list(copy.glob("*.tmp"))
    assert_same_trace(out, copy)
    # the same EVENTS blocks, so the same bytes per event (the copy has no RSS samples)
    size = lambda d: sum(b.stored_len for p in heapcast.load(d).processes  # noqa: E731
                         for b in p._blocks)
    assert size(out) == size(copy)


def test_copies_read_but_not_converted_are_not_scanned_again(build, small_windows, keep_raw,
                                                              tmp_path, monkeypatch):
    """A converter that falls behind has read copies whose events it did not convert: the final
    scan takes them as they were read (the file's clock is frozen), and the trace is the same."""
    from heapcast.trace import raw as raw_module
    real_step, given = live.LiveProcess.step, []

    def step(self, copies, stop, between=None):   # one poll's windows, then only reads
        if self.emitted:
            self._map()
            self.add_copies(copies)
        else:
            real_step(self, copies, stop, between)

    real_init = raw_module.RawProcess.__init__

    def init(self, path, skip=frozenset(), known=None, mods=None):
        given.append(len(known or {}))
        real_init(self, path, skip, known, mods)

    monkeypatch.setattr(live.LiveProcess, "step", step)
    monkeypatch.setattr(raw_module.RawProcess, "__init__", init)
    out = tmp_path / "t"
    r = record([build("phases"), "4", "40", "2000", "10000"], output=out, progress=False)
    assert r.exit_code == 0 and not r.problems and r.live_events > 0
    assert given and given[0] > 0, "no copy was taken as read"
    (copy, _), = keep_raw
    finalize(copy, progress=False)
    assert_same_trace(out, copy)


def test_a_chunk_past_the_mapping_waits_for_the_next_poll(build, keep_raw, tmp_path):
    """The raw file grows while the converter reads it: a chunk whose header it sees but whose
    end lies past its mapping is read at a later poll, never taken for a damaged file (which made
    the converter give up and leave the whole file to after the exit)."""
    import mmap

    from heapcast.trace.base import RAW_HEADER_SIZE
    from heapcast.trace.raw import _CHUNK, CHUNK_MAGIC
    record([build("phases"), "2", "10", "2000", "2000"], output=tmp_path / "t", progress=False)
    (copy, _), = keep_raw
    raw, = copy.glob("*.raw")
    lp = live.LiveProcess(raw)
    lp._map()
    whole = len(lp.mm)
    off, cut = RAW_HEADER_SIZE, None
    while off + _CHUNK.size <= whole:
        magic, _, size, _, _, _ = _CHUNK.unpack_from(lp.mm, off)
        if magic == CHUNK_MAGIC and size > 4096:
            cut = off + 4096        # this chunk's header is mapped, its end is not
            break
        off += size if magic == CHUNK_MAGIC and size else 4096
    assert cut is not None
    full = lp.mm
    lp.mm = mmap.mmap(lp.fd, cut, access=mmap.ACCESS_READ)
    lp._walk(whole)
    assert all(c < off for c in lp.small), "a chunk past the mapping was read"
    lp.mm.close()
    lp.mm = full
    lp._walk(whole)
    assert off in lp.small or any(c.off == off for c in lp.copies.values())
    lp.close()


def test_without_live_conversion_the_trace_is_the_same(build, small_windows, keep_raw, tmp_path):
    r = record([build("phases"), "2", "10", "2000", "2000"], output=tmp_path / "t", live=False,
               progress=False)
    assert r.live_events == 0 and r.events >= 2 * 10 * 2000 * 2
    (copy, lives), = keep_raw
    assert lives is None
    finalize(copy, progress=False)
    assert_same_trace(tmp_path / "t", copy)


def test_a_wrong_guess_is_caught_and_the_file_converted_again(build, small_windows, keep_raw,
                                                              tmp_path, monkeypatch):
    """The check at the end counts the events below the converted windows: one missing (here:
    one pretended too many) makes finalize drop the converted part and convert the whole file."""
    real_step = live.LiveProcess.step

    def step(self, copies, stop, between=None):
        real_step(self, copies, stop, between)
        if self.emitted:
            self.emitted += 1

    monkeypatch.setattr(live.LiveProcess, "step", step)
    out = tmp_path / "t"
    r = record([build("phases"), "2", "20", "2000", "3000"], output=out, progress=False)
    assert r.live_events == 0
    assert any("converted again" in p for p in r.problems)
    (copy, _), = keep_raw
    finalize(copy, progress=False)
    assert_same_trace(out, copy)


def test_program_killed_while_converting(build, small_windows, keep_raw, tmp_path):
    """sigkill.c's four threads allocate until it SIGKILLs itself (200,000 mallocs): the conversion
    while it ran and the rest after it agree with converting everything after the kill."""
    out = tmp_path / "t"
    r = record([build("sigkill")], output=out, progress=False)
    assert r.exit_code == 128 + signal.SIGKILL
    (copy, lives), = keep_raw
    finalize(copy, progress=False)
    assert_same_trace(out, copy)
    assert r.events >= 200000


def _seqs_complete(ev) -> bool:
    """Every seq from the first event's to the last's is an event, or the seq that a realloc
    takes before its call (phases.c and libc's start make no other gaps)."""
    seq = ev["seq"].astype(np.int64)
    reallocs = int(np.isin(ev["op"], (2, 3)).sum())
    return (np.diff(seq) > 0).all() and int(seq[-1] - seq[0]) + 1 == len(seq) + reallocs


def test_converted_copies_are_freed_and_the_trace_is_the_same(build, small_windows, keep_raw,
                                                               punches, tmp_path, monkeypatch):
    """The copies whose events are converted and checkpointed are punched out of the raw file
    while the program runs, PUNCH_AT_ONCE or more at a time, adjacent ones in one call; the
    trace equals the conversion after the exit of the whole file."""
    real_append, appended = checkpoint.CheckpointLog.append, []

    def append(self, *args):
        appended.append(args[0])
        real_append(self, *args)

    monkeypatch.setattr(checkpoint.CheckpointLog, "append", append)
    out = tmp_path / "t"
    r = record([build("phases"), "1", "60", "3000", "20000"], output=out, progress=False)
    assert r.exit_code == 0 and not r.problems
    assert punches, "no converted copy was freed while the program ran"
    assert not list(out.glob("*.ckpt")) and not list(out.glob("*.tmp"))
    (copy, lives), = keep_raw
    lp, = lives.values()
    assert lp.punched and lp.log.last is not None
    assert all(seq_max < lp.log.last.next_lo for seq_max in lp.punched.values())
    assert set(lp.punched) <= lp.retired and not set(lp.punched) & set(lp.copies)
    # each call frees copies that the converter counts as freed, adjacent ones together, and
    # a checkpoint (one before each freeing) comes for two copies or more (PUNCH_AT_ONCE)
    calls = next(iter(punches.values()))
    assert sum(len(data) for _, data in calls) == len(lp.punched) * live.CHUNK_MAX
    assert {off + k * live.CHUNK_MAX for off, data in calls
            for k in range(len(data) // live.CHUNK_MAX)} == set(lp.punched)
    assert len(calls) < len(lp.punched), "no adjacent copies were freed in one call"
    assert 0 < len(appended) <= len(lp.punched) // 2
    # what a poll looks at is what is not converted yet: the copies converted are retired, the
    # small chunks that no longer change too, and the walk starts past them
    assert len(lp.copies) < len(lp.retired) and len(lp.small) < len(lp.final)
    assert not set(lp.inplace) & (lp.retired | set(lp.copies) | lp.final)
    assert lp.frontier > max(lp.retired)
    finalize(copy, progress=False)
    assert_same_trace(out, copy)
    p, = heapcast.load(out).processes
    assert _seqs_complete(p.events)


def test_a_file_system_that_cannot_free_copies_keeps_them(build, small_windows, tmp_path,
                                                          monkeypatch):
    """A file system without hole punching: the first run of copies fails to be freed, the
    converter stops trying (one call in all) and the copies stay; the trace is whole."""
    calls = []

    def punch(fd, offset, size):
        calls.append((offset, size))
        return False

    monkeypatch.setattr(checkpoint, "punch", punch)
    out = tmp_path / "t"
    r = record([build("phases"), "1", "60", "3000", "20000"], output=out, progress=False)
    assert r.exit_code == 0 and not r.problems
    assert len(calls) == 1 and calls[0][1] >= live.CHUNK_MAX
    p, = heapcast.load(out).processes
    assert _seqs_complete(p.events) and r.live_events > 0


def test_processes_that_end_are_converted_while_the_program_runs(tmp_path, monkeypatch):
    """A shell running 120 short programs, followed: each one, once it has ended, is converted
    whole while the shell goes on (before, every one waited for the shell's exit: 200 of them
    left 0.17 s of conversion), and its trace equals the one converted after the exit
    (`live=False`), program for program: the same programs, with the same events."""
    if shutil.which("sh") is None:
        pytest.skip("no sh")
    loop = "for i in $(seq 120); do /bin/true; done"
    # then the shell waits (10 s at most) until 60 of them are converted: the converter runs at
    # a low priority, and on a loaded machine it may not get the core while the loop runs
    done = tmp_path / "done"
    wait = f"; for j in $(seq 200); do [ -e {done} ] && break; sleep 0.05; done"
    real, ended = recording._Converter._ended, []

    def spy(self, raw, lp):
        real(self, raw, lp)
        ended.append(raw.name)
        if len(ended) >= 60:
            done.touch()

    monkeypatch.setattr(recording._Converter, "_ended", spy)
    r = record(["sh", "-c", loop + wait], output=tmp_path / "t", follow_children=True,
               progress=False)
    assert r.exit_code == 0 and not r.problems, r.problems
    assert len(ended) >= 60, f"{len(ended)} programs converted while the shell ran"
    assert r.live_events > 0
    after = record(["sh", "-c", loop], output=tmp_path / "after", follow_children=True,
                   progress=False, live=False)
    assert after.live_events == 0 and after.processes >= 121
    ta, tb = heapcast.load(tmp_path / "t"), heapcast.load(tmp_path / "after")
    runs = lambda t: sorted((os.path.basename(p.exe), p.event_count,  # noqa: E731
                             tuple(np.bincount(p.events["op"], minlength=16)))
                            for p in t.processes if os.path.basename(p.exe) == "true")
    assert runs(ta) == runs(tb) and len(runs(ta)) == 120
    assert all(p.lost_events == 0 and not p.truncated for p in ta.processes)
    session = json.loads((tmp_path / "t" / "session.json").read_text())
    assert session["processes"] == r.processes and session["events"] == r.events


def test_ended_processes_whose_chunks_the_drainer_copied_are_converted_too(build, tmp_path,
                                                                           monkeypatch):
    """Programs that fill full chunks, which the drainer copies: once one has ended and the
    drainer has let go of its file, it is converted whole while the shell goes on; every
    program's events are there, the copies the converter had not read included."""
    if shutil.which("sh") is None:
        pytest.skip("no sh")
    from heapcast.recorder.live import SEALED_TAIL
    real, sealed = recording._Converter._ended, []

    def spy(self, raw, lp):
        with open(raw, "rb") as f:
            sealed.append(struct.unpack("<Q", os.pread(f.fileno(), 8, SEALED_TAIL))[0])
        real(self, raw, lp)

    monkeypatch.setattr(recording._Converter, "_ended", spy)
    prog = build("phases")
    r = record(["sh", "-c", f"for i in 1 2 3 4 5 6; do {prog} 1 4 40000 20000 >/dev/null; done"],
               output=tmp_path / "t", follow_children=True, progress=False)
    assert r.exit_code == 0 and not r.problems, r.problems
    assert sum(n > 0 for n in sealed) >= 2, f"chunks sealed by the programs converted: {sealed}"
    runs = [p for p in heapcast.load(tmp_path / "t").processes
            if os.path.basename(p.exe).startswith("phases")]
    assert len(runs) == 6
    for p in runs:
        ev = p.events
        own = (ev["op"] == 0) & (ev["size"] >= 16) & (ev["size"] < 80)
        assert int(own.sum()) == 4 * 40000 and p.lost_events == 0 and _seqs_complete(ev)


def test_an_ended_process_whose_trace_cannot_be_written_is_reported(tmp_path, monkeypatch):
    """The conversion of an ended process while the program runs fails: where its raw file is
    still there, finalize converts it again and says what happened; where it is gone (a full
    disk: the trace was left in the temporary directory), record says so and where."""
    conv = recording._Converter(tmp_path, live=False)
    conv.stop()
    kept, gone = tmp_path / "1.raw", tmp_path / "2.raw"
    for raw in (kept, gone):
        raw.write_bytes(b"")

    def scan(raw, lp, problems):
        return raw, None, lp

    def finish(raw, rp, lp, sampler, bar, problems):
        problems.append(f"could not write the trace of {raw.name}: left at /tmp/x")
        if raw == gone:
            raw.unlink()
        return None

    monkeypatch.setattr(recording, "_scan_raw", scan)
    monkeypatch.setattr(recording, "_finish_raw", finish)
    conv._ended(kept, None)
    assert conv.problems == [] and not conv.truncated and not conv.early
    conv._ended(gone, None)
    assert conv.problems == ["could not write the trace of 2.raw: left at /tmp/x"]
    assert conv.truncated and not conv.early


def test_finalize_after_record_was_killed_counts_the_processes_converted_before(tmp_path):
    """`heapcast record` SIGKILLed while a shell runs short programs, some of them converted
    already: `heapcast finalize` converts the rest, and session.json counts every process,
    those converted before the kill too."""
    if shutil.which("sh") is None:
        pytest.skip("no sh")
    out = tmp_path / "t"
    rec = subprocess.Popen([sys.executable, "-m", "heapcast", "record", "--follow-children",
                            "-o", str(out), "--", "sh", "-c",
                            "echo $$; for i in $(seq 400); do /bin/true; done"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid = int(rec.stdout.readline())
    deadline = time.monotonic() + 30
    while len(list(out.glob("*.hct"))) < 40 and time.monotonic() < deadline:
        time.sleep(0.002)
    rec.kill()
    rec.wait()
    _wait_for_exit(pid)
    before = len(list(out.glob("*.hct")))
    assert before >= 40 and list(out.glob("*.raw"))
    r = finalize(out, progress=False)
    trace = heapcast.load(out)
    assert r.processes == len(trace.processes) > before
    assert r.events == sum(p.event_count for p in trace.processes)
    assert sum(os.path.basename(p.exe) == "true" for p in trace.processes) == 400
    session = json.loads((out / "session.json").read_text())
    assert session["processes"] == r.processes and session["events"] == r.events


def _full_chunks(raw: Path) -> list:
    """(offset, kept) of every 1 MiB chunk header in a raw file (copies included)."""
    from heapcast.trace.raw import CHUNK_KEPT, CHUNK_MAGIC, CHUNK_MAX, _CHUNK
    data = raw.read_bytes()
    out = []
    for off in range(4096, len(data) - 32, 4096):
        magic, _tid, size, os_tid, _tsc, _mono = _CHUNK.unpack_from(data, off)
        if magic == CHUNK_MAGIC and size == CHUNK_MAX:
            out.append((off, bool(os_tid & CHUNK_KEPT)))
    return out


def test_chunks_left_in_place_are_converted_while_the_program_runs(build, small_windows,
                                                                   keep_raw, tmp_path,
                                                                   monkeypatch):
    """Without a drainer, a thread leaves each full chunk where it is and marks it kept: the
    converter reads it as a copy (before, the first one stopped the conversion until the exit),
    and frees it once converted; the trace equals the whole file's conversion after the exit."""
    def no_drainer(self):
        raise OSError("no drainer in this test")

    monkeypatch.setattr(recording.Drainer, "start", no_drainer)
    out = tmp_path / "t"
    r = record([build("phases"), "1", "60", "3000", "20000"], output=out, progress=False)
    assert r.exit_code == 0 and not r.problems
    (copy, lives), = keep_raw
    lp, = lives.values()
    # most of it converted while it ran (1.2 s of pauses for 360,000 events; a quarter leaves
    # room for a loaded machine, and 8% was all before kept chunks were read)
    assert r.live_events > r.events // 4, (r.live_events, r.events)
    assert lp.punched, "no kept chunk was freed once converted"
    raw, = copy.glob("*.raw")
    full = _full_chunks(raw)
    assert len(full) >= 8 and all(kept for _, kept in full[:-1])
    finalize(copy, progress=False)
    assert_same_trace(out, copy)
    p, = heapcast.load(out).processes
    assert _seqs_complete(p.events)


def test_ended_threads_do_not_stop_the_conversion(build, small_windows, keep_raw, tmp_path):
    """Threads that end one after another, each with its last 1 MiB chunk in place: the
    recorder reaps them (recorder.c, threads' mappings) and marks those chunks kept, so the
    conversion goes on past them (before, the first one stopped it until the exit)."""
    out = tmp_path / "t"
    r = record([build("thread_churn"), "10", "100000", "150000"], output=out, progress=False)
    assert r.exit_code == 0 and not r.problems
    # (10% before: the first ended thread stopped the conversion; a quarter leaves room for load)
    assert r.live_events > r.events // 4, (r.live_events, r.events)
    (copy, _), = keep_raw
    finalize(copy, progress=False)
    assert_same_trace(out, copy)


def test_chunks_read_while_nothing_was_converted_are_not_scanned_again(build, keep_raw,
                                                                       tmp_path, monkeypatch):
    """3,000 threads, each with one small chunk, and fewer events than a window: nothing is
    converted while the program runs, but the final scan takes the chunks that the converter
    read and that no longer change as they were read (before: all scanned again, 20 us each);
    the trace is the same as the whole file's conversion after the exit."""
    from heapcast.trace import raw as raw_module
    monkeypatch.setattr(live, "FREEZE_NS", 5_000_000)
    monkeypatch.setattr(live, "POLL_S", 0.005)
    real_init, given = raw_module.RawProcess.__init__, []

    def init(self, path, skip=frozenset(), known=None, mods=None):
        given.append(len(known or {}))
        real_init(self, path, skip, known, mods)

    monkeypatch.setattr(raw_module.RawProcess, "__init__", init)
    out = tmp_path / "t"
    r = record([build("thread_churn"), "3000", "2", "20"], output=out, progress=False)
    assert r.exit_code == 0 and not r.problems and r.live_events == 0
    assert given and given[0] > 1000, given
    (copy, _), = keep_raw
    finalize(copy, progress=False)
    assert_same_trace(out, copy)


def test_a_drainer_asked_to_keep_chunks_leaves_them_in_place(build, small_windows, keep_raw,
                                                             tmp_path, monkeypatch, capfd):
    """A drainer in keep mode marks each sealed chunk kept instead of copying it, and hands it
    back for its thread to unmap (HC_FREE_UNMAP): no copy in the file, no mapping left behind,
    the conversion while the program runs reads the kept chunks, and the trace is the same."""
    from heapcast.recorder.drain import Drainer
    real_start = Drainer.start

    def keeping(self):
        real_start(self)
        self.keep(True)
        return self

    monkeypatch.setattr(recording.Drainer, "start", keeping)
    out = tmp_path / "t"
    # the main thread waits 20 ms after its thread: a chunk that the thread sealed just before
    # the program's exit is left as it is when `record` pauses the drainer (complete in place,
    # not marked), and the drainer takes a sealed chunk within 2 ms when it is idle
    r = record([build("thread_churn"), "1", "2000000", "20000"], output=out, progress=False)
    assert r.exit_code == 0 and not r.problems
    maps = int(capfd.readouterr().out.split()[1])
    assert maps < 80, maps   # (about 30 untraced; 120 chunk mappings if they stayed)
    assert r.live_events > 0
    (copy, _), = keep_raw
    raw, = copy.glob("*.raw")
    kept = [k for _, k in _full_chunks(raw)]
    assert len(kept) > 100 and all(kept[:-1]), kept
    from heapcast.trace.raw import CHUNK_DRAINED
    data = raw.read_bytes()
    assert not any(int.from_bytes(data[o:o + 4], "little") == CHUNK_DRAINED
                   for o in range(4096, len(data), 4096)), "a chunk was copied (marked drained)"
    finalize(copy, progress=False)
    assert_same_trace(out, copy)
    p, = heapcast.load(out).processes
    ev = p.events
    assert int(np.count_nonzero((ev["op"] == 0) & (ev["size"] == 777))) == 2000000


def test_the_drainer_keeps_chunks_while_the_conversion_is_far_behind():
    """LiveConverter._pace: keep mode above KEEP_ABOVE chunks behind, copies again below
    COPY_BELOW, nothing asked in between (hysteresis); KEEP_ABOVE_ONE and COPY_BELOW_ONE where
    every process behind has had one thread; copies of files not opened yet count."""
    asked = []

    class FakeDrainer:
        def keep(self, on):
            asked.append(on)

    class Behind:   # what _pace reads of a LiveProcess
        def __init__(self, threads):
            self.threads, self.copies = threads, {}

    def pace(backlogs, threads):
        asked.clear()
        conv = live.LiveConverter("/nonexistent", FakeDrainer())
        proc = conv.processes["1.raw"] = Behind(threads)
        conv.processes["2.raw"] = Behind(7)   # nothing behind: its threads do not count
        for backlog in backlogs:
            proc.copies = dict.fromkeys(range(backlog - 3))
            conv._waiting = {9: [0, 4096, 8192]}   # copies logged, not read yet: they count
            conv._pace()
        return list(asked)

    assert live.COPY_BELOW_ONE < live.KEEP_ABOVE_ONE <= live.COPY_BELOW < live.KEEP_ABOVE
    several = (10, live.KEEP_ABOVE, live.KEEP_ABOVE + 1, 1000, live.COPY_BELOW,
               live.COPY_BELOW - 1, 10, live.KEEP_ABOVE + 1)
    assert pace(several, threads=4) == [True, False, True]
    one = (10, live.KEEP_ABOVE_ONE, live.KEEP_ABOVE_ONE + 1, 1000, live.COPY_BELOW_ONE,
           live.COPY_BELOW_ONE - 1, 10, live.KEEP_ABOVE_ONE + 1)
    assert pace(one, threads=1) == [True, False, True]
    assert pace((live.KEEP_ABOVE_ONE + 1, live.KEEP_ABOVE), threads=2) == []


def test_the_pace_is_decided_between_the_windows_of_a_long_poll():
    """A poll may convert for a long time: between its windows the converter takes the copies
    logged meanwhile and decides on them whether the drainer keeps chunks in place (before, it
    went on copying until the next poll); a copy it could not log fails its file at that poll."""
    asked = []

    class FakeDrainer:
        logged = 0

        def keep(self, on):
            asked.append(on)

        def copies(self):
            self.logged += 50
            return [(7, 4096 * k) for k in range(self.logged - 50, self.logged)], \
                int(self.logged == 150)

    conv = live.LiveConverter("/nonexistent", FakeDrainer())
    for _ in range(live.KEEP_ABOVE_ONE // 50):
        conv._between()
    assert asked == [] and len(conv._waiting[7]) == live.KEEP_ABOVE_ONE // 50 * 50
    conv._between()
    assert asked == [True] and len(conv._waiting[7]) > live.KEEP_ABOVE_ONE
    assert conv._lost == 1   # (poll() fails every file for it)


def test_processes_that_have_ended_are_passed_by(build, small_windows, keep_raw, tmp_path,
                                                monkeypatch):
    """A shell running 40 short programs, followed: a raw file whose counters stay still is
    stepped QUIET more polls, then passed by (before: every file at every poll, 1.3 s of the
    converter's CPU for 2,000 processes); the trace is the same as after the exit. The shell
    waits for a poll after each program (a line from a FIFO that each poll opens and writes,
    without blocking, when the shell waits on it), so that every file but the last few sees many polls
    however slow a loaded machine makes the converter. (It waited in a loop of `sleep 0.01`,
    each a followed process: beside two CPU hogs the converter fell behind them, polled 19 times
    in 14 minutes, and the trace took 30 GB.)"""
    real_step, steps = live.LiveProcess.step, {}
    real_poll, polls = live.LiveConverter.poll, [0]
    fifo = tmp_path / "polls"
    os.mkfifo(fifo, 0o600)

    def step(self, copies, stop, between=None):
        steps[self.path.name] = steps.get(self.path.name, 0) + 1
        real_step(self, copies, stop, between)

    def poll(self):
        progress = real_poll(self)
        polls[0] += 1
        try:   # (no reader waiting: ENXIO)
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            return progress
        try:
            os.write(fd, f"{polls[0]}\n".encode())
        finally:
            os.close(fd)
        return progress

    monkeypatch.setattr(live.LiveProcess, "step", step)
    monkeypatch.setattr(live.LiveConverter, "poll", poll)
    out = tmp_path / "t"
    # (a read that opened while a poll's write end was still open may meet its end alone: again)
    script = (f"for i in $(seq 40); do /bin/true; a=; "
              f"while [ -z \"$a\" ]; do read a < {fifo}; done; done")
    r = record(["sh", "-c", script], output=out, follow_children=True, progress=False)
    assert r.exit_code == 0 and not r.problems
    (copy, lives), = keep_raw
    assert polls[0] >= 40   # (one at least after each program)
    short = sorted(steps.values())[:-1]   # (the most stepped: the shell's)
    assert len(short) >= 40 and short[len(short) // 2] <= live.QUIET + 3, (polls, short)
    finalize(copy, progress=False)
    ta, tb = heapcast.load(out), heapcast.load(copy)   # (a /bin/true may have no event)
    assert [p.pid for p in ta.processes] == [p.pid for p in tb.processes]
    for pa, pb in zip(ta.processes, tb.processes):
        assert pa.event_count == pb.event_count
        for name in pa.events.dtype.names:
            assert np.array_equal(pa.events[name], pb.events[name]), name


def test_a_full_drain_queue_leaves_chunks_kept_in_place(build, small_windows, keep_raw, tmp_path,
                                                        monkeypatch):
    """A drainer that stops copying: its queue takes 64 sealed chunks (not kept: it may still
    copy and zero them), then every full chunk stays in place marked kept."""
    from heapcast.recorder.drain import Drainer
    real_start = Drainer.start

    def paused(self):
        real_start(self)
        self.pause()
        return self

    monkeypatch.setattr(recording.Drainer, "start", paused)
    out = tmp_path / "t"
    r = record([build("phases"), "1", "8", "600000", "0"], output=out, progress=False)
    assert r.exit_code == 0 and not r.problems
    (copy, _), = keep_raw
    raw, = copy.glob("*.raw")
    kept = [k for _, k in _full_chunks(raw)]
    assert len(kept) > 64 + 8
    assert not any(kept[:64]) and all(kept[64:-1]), kept
    finalize(copy, progress=False)
    assert_same_trace(out, copy)


def test_a_failed_check_goes_on_from_the_last_checkpoint(build, small_windows, keep_raw,
                                                         punches, tmp_path, monkeypatch):
    """A check that fails after copies were freed cannot convert the whole file again: the
    conversion goes on from the last checkpoint, and the trace is still the whole file's."""
    monkeypatch.setattr(live.LiveProcess, "check", lambda self, rp, skipped: False)
    out = tmp_path / "t"
    r = record([build("phases"), "1", "60", "3000", "20000"], output=out, progress=False)
    assert punches
    assert any("converted again from its last checkpoint" in p for p in r.problems), r.problems
    assert 0 < r.live_events < r.events
    assert not list(out.glob("*.ckpt")) and not list(out.glob("*.tmp"))
    (copy, _), = keep_raw
    finalize(copy, progress=False)
    assert_same_trace(out, copy)


def test_a_full_disk_while_going_on_from_a_checkpoint_keeps_its_part(build, small_windows,
                                                                      keep_raw, punches,
                                                                      tmp_path, monkeypatch):
    """The disk fills while the conversion goes on from a checkpoint: the trace is written in
    the temporary directory first, from the checkpointed part (which the raw file no longer
    holds) on, then moved into place; nothing is lost."""
    import errno

    from heapcast.trace.writer import ProcessFileWriter
    armed = []

    def check(self, rp, skipped):
        armed.append("check")
        return False

    real_add = ProcessFileWriter.add

    def add(self, events):
        if armed == ["check"]:       # the first block written after the check
            armed.append("full")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_add(self, events)

    monkeypatch.setattr(live.LiveProcess, "check", check)
    monkeypatch.setattr(ProcessFileWriter, "add", add)
    out = tmp_path / "t"
    r = record([build("phases"), "1", "60", "3000", "20000"], output=out, progress=False)
    assert punches and armed == ["check", "full"]
    assert any("from its last checkpoint" in p for p in r.problems), r.problems
    assert not list(out.glob("*.ckpt")) and not list(out.glob("*.tmp"))
    (copy, _), = keep_raw
    finalize(copy, progress=False)
    assert_same_trace(out, copy)


#: A Python program with 200 call sites in as many functions, called in turn from two callers
#: (400 stacks), in phases: Python frames, whose location numbering a checkpoint must keep.
MANY_STACKS = """
import time
src = "\\n".join(f"def f{i}(n):\\n    return [bytearray(16 + {i}) for _ in range(n)]"
                  for i in range(200))
space = {}
exec(compile(src, "generated.py", "exec"), space)
fs = [space[f"f{i}"] for i in range(200)]
def one(f): return f(20)
def two(f): return one(f) + f(10)
for phase in range(30):
    kept = [(one if i % 2 else two)(f) for i, f in enumerate(fs * 4)]
    time.sleep(0.01)
"""


def test_python_locations_go_on_from_a_checkpoint(small_windows, keep_raw, punches, tmp_path,
                                                   monkeypatch):
    """A Python program's hundreds of stacks: going on from a checkpoint (a failed check forces
    it) numbers the locations as the whole file's conversion does."""
    from heapcast.trace import raw as raw_module
    monkeypatch.setattr(live.LiveProcess, "check", lambda self, rp, skipped: False)
    real_init, read_before = raw_module.RawProcess.__init__, []

    def init(self, path, skip=frozenset(), known=None, mods=None):
        read_before.append(mods._offset if mods is not None else 0)
        real_init(self, path, skip, known, mods)

    monkeypatch.setattr(raw_module.RawProcess, "__init__", init)
    out = tmp_path / "t"
    r = record([sys.executable, "-c", MANY_STACKS], output=out, progress=False,
               env={"PYTHONMALLOC": "malloc"})
    assert r.exit_code == 0 and punches
    assert read_before[0] > 1000, "finalize did not go on from the .mods parsed while it ran"
    assert any("from its last checkpoint" in p for p in r.problems), r.problems
    (copy, _), = keep_raw
    finalize(copy, progress=False)
    assert_same_trace(out, copy)
    p, = heapcast.load(out).processes
    assert len(p.python_frames) >= 200 and len(p.locations) >= 400


def test_events_written_out_of_order_are_checkpointed_right(build, small_windows, keep_raw,
                                                            punches, tmp_path):
    """signal.c's handler allocates while the code it interrupted holds a seq it has not
    written: the handler's events, with larger seqs, are written first. The idle guess can
    then convert a window without the late event; a window is checkpointed only once all its
    seqs are accounted for, so the trace is still the whole file's."""
    out = tmp_path / "t"
    r = record([build("signal")], output=out, progress=False)
    assert r.exit_code == 0
    (copy, lives), = keep_raw
    lp, = lives.values()
    assert lp.sure is not None and lp.sure > 0, "no window was accounted for"
    finalize(copy, progress=False)
    assert_same_trace(out, copy)
    p, = heapcast.load(out).processes
    assert _seqs_complete(p.events)


@pytest.mark.parametrize("when", ["clock", "converting", "late", "freed", "keeping"])
def test_record_killed_while_converting_loses_nothing(build, tmp_path, when):
    """`heapcast record` SIGKILLed at five points of the conversion while the program runs: the
    program runs on, and `heapcast finalize` then gives every event: the converted part left
    behind (*.hct.tmp) is replaced, or, once copies were freed, gone on from its checkpoint.
    "keeping": the drainer keeps chunks in place from the start (killed once some were freed)."""
    out = tmp_path / "t"
    prog = build("phases")
    pairs, phases_n = 3000, 40
    # `heapcast record` with small_windows's settings
    keep = ("live.KEEP_ABOVE = live.KEEP_ABOVE_ONE = -1; live.COPY_BELOW = live.COPY_BELOW_ONE "
            "= -1; ") if when == "keeping" else ""
    code = ("import sys; from heapcast.recorder import live; live.WINDOW = 4096; "
            f"live.FREEZE_NS = 5_000_000; live.POLL_S = 0.005; live.PUNCH_AT_ONCE = 2; {keep}"
            "from heapcast.cli import main; sys.exit(main())")
    rec = subprocess.Popen([sys.executable, "-c", code, "record", "-o", str(out), "--", str(prog),
                            "1", str(phases_n), str(pairs), "20000"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid = int(rec.stdout.readline())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        raws = list(out.glob("*.raw"))
        tmp = list(out.glob("*.hct.tmp"))
        if when == "clock" and raws and _clock_set(raws[0]):
            break
        if when == "converting" and tmp:
            break
        if when == "late" and tmp and tmp[0].stat().st_size > 8192:
            break
        # a checkpoint is written only just before copies are freed
        if when in ("freed", "keeping") and any(c.stat().st_size for c in out.glob("*.ckpt")):
            break
        time.sleep(0.002)
    rec.kill()
    rec.wait()
    _wait_for_exit(pid)
    assert list(out.glob("*.raw")), "the raw files are kept"
    assert not list(out.glob("*.hct")), "nothing may look complete"
    checkpointed = any(c.stat().st_size for c in out.glob("*.ckpt"))
    if when == "keeping":
        raw, = out.glob("*.raw")
        assert any(kept for _, kept in _full_chunks(raw)), "no chunk was kept in place"
    if when in ("freed", "keeping"):
        assert checkpointed, "no copy was freed before the deadline"
        again = tmp_path / "again"   # the same state, for a finalize killed after its rename
        shutil.copytree(out, again)
    r = finalize(out, progress=False)
    assert not list(out.glob("*.tmp")) and not list(out.glob("*.raw"))
    assert not list(out.glob("*.ckpt"))
    # the part converted while the program ran counts as such where a checkpoint kept it
    assert (r.live_events > 0) == checkpointed
    p, = heapcast.load(out).processes
    ev = p.events
    assert r.events == len(ev) and (np.diff(ev["seq"].astype(np.int64)) > 0).all()
    own = (ev["op"] == 0) & (ev["size"] >= 16) & (ev["size"] < 80)   # phases.c's mallocs
    assert own.sum() >= phases_n * pairs
    assert _seqs_complete(ev)
    if when == "freed":
        # finalize killed after it renamed the trace into place, before it removed the raw
        # file: the raw file lacks the checkpointed part, so the trace must be kept as it is
        hct, = out.glob("*.hct")
        (again / hct.name).write_bytes(hct.read_bytes())
        for tmp in again.glob("*.hct.tmp"):
            tmp.unlink()
        r2 = finalize(again, progress=False)
        assert r2.events == r.events and not r2.problems
        assert not list(again.glob("*.raw")) and not list(again.glob("*.ckpt"))
        assert_same_trace(out, again)


def _clock_set(raw: Path) -> bool:
    try:
        with open(raw, "rb") as f:
            f.seek(live.CLOCK_OFFSET)
            return int.from_bytes(f.read(8), "little") == live.CLOCK_SET
    except OSError:
        return False


def _wait_for_exit(pid: int) -> None:
    """Waits until the program (orphaned: record is dead) has ended, or is a zombie."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.01)
    raise AssertionError(f"program {pid} did not end")


def test_the_converter_polls_again_at_once_while_it_converts(monkeypatch):
    """LiveConverter.run: a poll that converted a window is followed by another at once (the
    program may have completed more meanwhile); one that converted nothing waits POLL_S."""
    calls = []

    class Stop:   # what run() asks of its stop event, logged
        def wait(self, timeout):
            calls.append("wait")
            return calls.count("poll") >= 6

        def is_set(self):
            return False

    results = iter([False, True, True, False, True, False])

    def poll():
        calls.append("poll")
        return next(results)

    monkeypatch.setattr(live, "lower_priority", lambda nice: None)
    conv = live.LiveConverter("/nonexistent", None, Stop())
    conv.poll = poll
    conv.run()
    assert calls == ["wait", "poll", "wait", "poll", "poll", "poll", "wait", "poll", "poll",
                     "wait"]


def test_the_first_poll_converts_what_every_thread_has_written(build, tmp_path, monkeypatch):
    """A poll converts the windows below the last event that every thread has written, the first
    poll too: capped at the seq counter of the poll before, the first poll converted nothing and
    every later one lagged a poll behind the program."""
    monkeypatch.setattr(live, "WINDOW", 4096)
    monkeypatch.setattr(live, "FREEZE_NS", 0)
    d = tmp_path / "raw"
    d.mkdir()
    env = {**os.environ, "LD_PRELOAD": str(recording.recorder_library()), "HEAPCAST_DIR": str(d)}
    subprocess.run([build("free_pools"), "100000", "1"], env=env, check=True)
    raw, = d.glob("*.raw")
    lp = live.LiveProcess(raw)
    between = []   # next_lo at each call: after each window
    try:
        lp.step([], threading.Event(), lambda: between.append(lp.next_lo))
        assert between == list(range(lp.grid + 4096, lp.next_lo + 1, 4096))
        # Without a drainer the thread left its full chunks in place, kept: every window below
        # its last chunk (in place, 32,768 slots at most) is converted.
        assert lp.blocked, "its last chunk, in place, is the one not read"
    finally:
        lp.close()
    from heapcast.trace.raw import RawProcess
    rp = RawProcess(raw)
    total = sum(c.events for c in rp.chunks)
    rp.close()
    assert total - 32768 - 4096 <= lp.emitted < total, (lp.emitted, total)


def test_copies_punched_out_are_not_reserved_again(build, small_windows, punches, tmp_path,
                                                   monkeypatch):
    """A thread that starts after the converter punched copies out takes fresh space: the
    recorder's reservation for it starts above the copies (the drainer moves the frontier past
    each copy it places there), not over them, which had fallocated the punched copies again
    (unwritten extents: disk space held again, and pages the final scan walked one by one)."""
    held = {}
    real = recording.finalize

    def spy(path, *args, **kwargs):
        for raw in Path(path).glob("*.raw"):
            st = raw.stat()
            held[raw.name] = (st.st_size, st.st_blocks * 512)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(recording, "finalize", spy)
    go = tmp_path / "go"
    punched = lambda: sum(len(d) for regions in list(punches.values())  # noqa: E731
                          for _, d in list(regions))

    def release():   # the late thread starts once 32 MiB of copies were punched out (or 20 s)
        deadline = time.monotonic() + 20
        while punched() < 32 << 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        go.touch()

    waiter = threading.Thread(target=release, daemon=True)
    waiter.start()
    r = record([build("late_thread"), "12", "60000", "20000", str(go)], output=tmp_path / "t",
               progress=False)
    waiter.join()
    assert r.exit_code == 0 and not r.problems and r.lost_events == 0
    assert r.events >= 13 * 60000 * 2
    (name, (size, allocated)), = held.items()
    freed = sum(len(data) for _, data in punches.get(name, []))
    if not freed:
        pytest.skip("this file system did not punch copies out")
    assert freed >= 32 << 20, f"only {freed >> 20} MiB of copies were punched out"
    # what the file holds is what was not punched out (the reservation ahead of the chunks is in
    # its size too); a few blocks more for the file system's own (extent tree). Before: 11-30 MiB
    # more, the punched copies reserved again.
    assert allocated <= size - freed + (8 << 20), \
        f"{allocated >> 20} MiB allocated of {size >> 20}, {freed >> 20} MiB punched out"
