"""Chunk recycling (native/recorder/drain.c, raw_format.h "Recycling"): the drainer copies full
chunks away and the recorder reuses them, and no record is lost or read twice, whatever moment
the drainer or the program is killed at."""
from __future__ import annotations

import os
import signal
import struct
import subprocess
import time

import numpy as np

import heapcast
from heapcast.recorder.drain import ENV as DRAIN_ENV, Drainer
from heapcast.trace.blocks import match
from heapcast.recorder.session import finalize, recorder_library
from heapcast.trace.format import OP
from heapcast.trace.raw import (CHUNK_DRAINED, CHUNK_MAGIC, CHUNK_MAX, HEADER_SIZE, RawProcess,
                                raw_files)

# 2 threads x 8 phases x 40,000 pairs: 1.28M own events, about 40 MiB of slots in 1 MiB chunks.
THREADS, PHASES, PAIRS, PAUSE_US = 2, 8, 40_000, 20_000
FILE_END = 192   # offset of header.file_end (raw_format.h)


def _run_drained(prog, out, drain=True):
    """Runs phases.c under the recorder (and a drainer); returns the drainer (or None)."""
    out.mkdir()
    env = {**os.environ, "LD_PRELOAD": str(recorder_library()), "HEAPCAST_DIR": str(out)}
    drainer = None
    if drain:
        env.update(DRAIN_ENV)
        drainer = Drainer(out).start()
    try:
        subprocess.run([prog, str(THREADS), str(PHASES), str(PAIRS), str(PAUSE_US)], env=env,
                       check=True, capture_output=True, timeout=120)
    finally:
        if drainer is not None:
            drainer.stop()
    return drainer


def _chunk_magics(raw) -> list:
    """(offset, magic, size) of every chunk header, walked as the reader walks them."""
    data = raw.read_bytes()
    end = min(struct.unpack_from("<Q", data, FILE_END)[0], len(data))
    found, off = [], HEADER_SIZE
    while off + 32 <= end:
        magic, _tid, size = struct.unpack_from("<III", data, off)
        if magic in (CHUNK_MAGIC, CHUNK_DRAINED):
            found.append((off, magic, size))
            off += size
        else:
            off += 4096
    return found


def _events(raw) -> np.ndarray:
    rp = RawProcess(raw)
    try:
        return np.concatenate([b["seq"] for b in rp.iter_events()])
    finally:
        rp.close()


def _check_exact(proc, own, pairs=THREADS * PHASES * PAIRS):
    """Every malloc and free of the program's own code is there, no seq is missing or twice, and
    the heap replays exactly."""
    ev = own(proc)
    assert int(np.count_nonzero(ev["op"] == OP["malloc"])) == pairs
    assert int(np.count_nonzero(ev["op"] == OP["free"])) == pairs
    seq = proc.events["seq"]
    assert proc.lost_events == 0
    assert np.array_equal(seq, np.arange(seq[0], seq[0] + len(seq))), "a seq gap or a duplicate"
    blocks = match(proc.events)
    assert blocks.unknown_releases == 0 and blocks.double_acquires == 0


def test_drainer_recycles_chunks_and_every_event_is_kept(build, own, tmp_path):
    out = tmp_path / "t"
    drainer = _run_drained(build("phases"), out)
    assert drainer.failures == 0
    assert drainer.chunks >= 10, f"only {drainer.chunks} chunks were recycled"
    raw, = raw_files(out)
    magics = [m for _, m, size in _chunk_magics(raw) if size == CHUNK_MAX]
    # Chunks handed back but not reused by the time the program ended stay marked drained.
    assert magics.count(CHUNK_MAGIC) >= drainer.chunks
    finalize(out)
    proc, = heapcast.load(out).processes
    _check_exact(proc, own)


def test_times_run_on_across_chunk_switches(build, tmp_path):
    """The recorder reads an event's clock before it takes its seq and claims its slot; a claim
    that opens a new chunk starts that chunk's time base later than the event's clock, so an
    HC_TIME slot moves the base back. Per thread, times never go back, across every chunk."""
    out = tmp_path / "t"
    _run_drained(build("phases"), out)
    raw, = raw_files(out)
    rp = RawProcess(raw)
    try:
        switches = len([c for c in rp.chunks if c.events])
        blocks = list(rp.iter_events())
    finally:
        rp.close()
    assert switches >= 2 * 10
    ts = np.concatenate([b["ts"] for b in blocks]).astype(np.int64)
    tid = np.concatenate([b["tid"] for b in blocks])
    for t in np.unique(tid):
        assert (np.diff(ts[tid == t]) >= 0).all(), f"thread {t}: a time went back"
    finalize(out)
    proc, = heapcast.load(out).processes
    assert proc.start_ns <= int(ts.min()) and int(ts.max()) <= proc.end_ns


def test_a_paused_drainer_copies_nothing_more_and_still_gives_its_copies(build, own, tmp_path):
    """record pauses the drainer when the program has exited: no more copies (a chunk still
    sealed is complete in place), while the copies made stay available to the converter; the
    trace is complete."""
    out = tmp_path / "t"
    out.mkdir()
    env = {**os.environ, "LD_PRELOAD": str(recorder_library()), "HEAPCAST_DIR": str(out),
           **DRAIN_ENV}
    drainer = Drainer(out).start()
    subprocess.run([build("phases"), str(THREADS), str(PHASES), str(PAIRS), str(PAUSE_US)],
                   env=env, check=True, capture_output=True, timeout=120)
    drainer.pause()
    drainer.pause()   # again: nothing happens
    raw, = raw_files(out)
    before = raw.read_bytes()
    copies, lost = drainer.copies()
    assert copies and lost == 0
    time.sleep(0.05)
    assert raw.read_bytes() == before, "the drainer wrote after its pause"
    drainer.stop()
    assert drainer.chunks >= len(copies) and drainer.failures == 0
    finalize(out)
    proc, = heapcast.load(out).processes
    _check_exact(proc, own)


def test_a_pause_leaves_a_backlog_of_sealed_chunks_in_place(build, own, tmp_path):
    """A pause stops the drainer between two chunks: the sealed chunks it has not copied yet
    (up to 64 MiB at a program's exit, copied into fresh page-cache pages for nothing) stay
    complete in place, and the trace holds every event."""
    out = tmp_path / "t"
    out.mkdir()
    env = {**os.environ, "LD_PRELOAD": str(recorder_library()), "HEAPCAST_DIR": str(out),
           **DRAIN_ENV}
    # phase 1 without a drainer: ~73 chunks sealed, the queue full (64); then 1.5 s of sleep
    threads, phases, pairs = 2, 2, 600_000
    prog = subprocess.Popen([build("phases"), str(threads), str(phases), str(pairs), "1500000"],
                            env=env, stdout=subprocess.PIPE)
    try:
        prog.stdout.readline()   # its pid: it runs
        time.sleep(0.7)
        drainer = Drainer(out).start()
        copies = []
        deadline = time.monotonic() + 10
        while not copies and time.monotonic() < deadline:   # it has begun on the backlog
            copies += drainer.copies()[0]
            time.sleep(0.0002)
        drainer.pause()
        copies += drainer.copies()[0]
        drainer.stop()
    finally:
        assert prog.wait(timeout=60) == 0
    assert 1 <= len(copies) < 32, f"{len(copies)} of the 64 queued chunks copied despite the pause"
    finalize(out)
    proc, = heapcast.load(out).processes
    _check_exact(proc, own, threads * phases * pairs)


def test_a_copy_the_drainer_did_not_finish_or_mark_is_read_once(build, tmp_path):
    """The drainer killed after writing a copy but before marking the original drained leaves the
    chunk twice; killed while writing it leaves a copy without its magic. Both read as once."""
    out = tmp_path / "t"
    _run_drained(build("phases"), out)
    raw, = raw_files(out)
    want = _events(raw)
    data = bytearray(raw.read_bytes())
    end = struct.unpack_from("<Q", data, FILE_END)[0]
    live = [off for off, magic, size in _chunk_magics(raw)
            if magic == CHUNK_MAGIC and size == CHUNK_MAX]
    chunk = bytes(data[live[0]:live[0] + CHUNK_MAX])
    torn = b"\0\0\0\0" + chunk[4:CHUNK_MAX // 2] + bytes(CHUNK_MAX // 2)
    data[end:] = chunk + torn            # at the file's end, where the drainer writes copies
    struct.pack_into("<Q", data, FILE_END, end + 2 * CHUNK_MAX)
    raw.write_bytes(bytes(data))
    got = _events(raw)
    assert len(got) == len(want) and np.array_equal(np.sort(got), np.sort(want))


def test_recording_goes_on_when_record_itself_is_killed(build, own, cli_argv, tmp_path):
    """SIGKILL to `heapcast record` kills its drainer mid-run: the program runs on (its threads
    stop recycling and take fresh chunks), and `heapcast finalize` later reads every event."""
    out = tmp_path / "t"
    rec = subprocess.Popen([*cli_argv, "record", "-o", out, "--", build("phases"), str(THREADS),
                            str(PHASES), str(PAIRS), str(PAUSE_US)],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        pid = int(rec.stdout.readline())
        time.sleep(0.05)   # a few phases in: some chunks recycled, more to come
        rec.send_signal(signal.SIGKILL)
        rec.wait(timeout=30)
        deadline = time.monotonic() + 60
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not os.path.exists(f"/proc/{pid}"), "the program did not finish"
    finally:
        if rec.poll() is None:
            rec.kill()
    finalize(out)
    proc, = heapcast.load(out).processes
    assert proc.pid == pid and proc.clean_exit
    _check_exact(proc, own)


def test_without_a_drainer_the_recorder_takes_fresh_space(build, own, tmp_path):
    """HEAPCAST_DRAIN=1 but no drainer running (or one that was killed): the sealed queue fills
    (128 MiB of slots here, the queue holds 64 chunks) and the recorder goes on with fresh
    chunks, as if recycling were off."""
    out = tmp_path / "t"
    out.mkdir()
    env = {**os.environ, "LD_PRELOAD": str(recorder_library()), "HEAPCAST_DIR": str(out),
           **DRAIN_ENV}
    subprocess.run([build("phases"), "2", "5", "200000", "0"], env=env, check=True,
                   capture_output=True, timeout=120)
    raw, = raw_files(out)
    chunks = _chunk_magics(raw)
    assert sum(size == CHUNK_MAX for _, _, size in chunks) > 64
    assert all(m == CHUNK_MAGIC for _, m, _ in chunks)
    finalize(out)
    proc, = heapcast.load(out).processes
    _check_exact(proc, own, 2 * 5 * 200_000)
