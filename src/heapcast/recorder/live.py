"""Converts raw files into .hct files while the program runs (`heapcast record`).

The recorder's threads hand every full 1 MiB chunk to the drainer, which copies it to the end of
the raw file (heapcast.recorder.drain): a copy never changes again, and the drainer logs it. A thread's
first chunks (4 KiB to 512 KiB) are never recycled, so their written slots never change either;
nor does a chunk marked CHUNK_KEPT: left in place by its thread (the drainer's queue was full),
by the drainer (keep mode, below) or by the thread's end (CHUNK_ENDED, set when another thread
of the process found it gone: that thread has no more events). A full one is read as a copy.
A converter thread reads exactly those, and writes the windows of seq numbers that they complete
(decoded, numbered, encoded and compressed as after the exit, on the core the program leaves
free) into `<pid>.hct.tmp`. When the program has ended, `finish` checks that every event below
the converted windows was converted, and converts the rest (the last chunks, a lagging tail)
and the index (heapcast.recorder.session).

What makes a window complete: every event with a seq below its end is in a chunk read. Per
thread, its events after the last chunk read have higher seqs (a thread takes its seq numbers in
order); a thread that gets its id after the poll read the seq counter takes seqs above it. So a
poll converts up to the last event that every thread has written, whatever the counter was at
the poll before (capped there, the first poll converted nothing and every later one lagged a
poll behind the program: ring.c 0.90-0.94x the whole wait without the cap). A thread whose
chunk has not changed for a poll is taken to be idle: its next event takes a seq above the
counter of that poll. That is a guess (a thread could have taken a seq and been descheduled
before writing it, or a signal handler's event written after a seq its thread took but has not
written yet), so the conversion is checked at the end: the events below
the converted windows, counted in the final file, must be the events converted; if not, or on
any error, the conversion goes on from the last checkpoint (below), or without one the whole
file is converted after the exit, as without this module. The converter never waits for the
program nor the program for it: a program faster than the conversion leaves the rest to after
its exit.

Space: a window is certain once every one of its seq numbers is accounted for by a converted
event (its own seq, or the one a realloc took before its call): no event can come later into
it, whatever the guess that converted it. Once the certain windows below a seq are in
`<pid>.hct.tmp`, the converter appends a checkpoint and punches the copies below it out of the
raw file, so that the file stays bounded and its pages are reused rather than fresh
(heapcast.recorder.checkpoint); a conversion that cannot go on from the converter's state (a
failed check, `heapcast record` killed) goes on from the last checkpoint.

Pace: a copy spares the program fresh pages but costs the core the conversion needs; more than
KEEP_ABOVE MiB behind (KEEP_ABOVE_ONE where each process behind has had one thread), the
converter asks the drainer to keep chunks in place instead, and to copy again below COPY_BELOW
(LiveConverter._pace).

Times: the conversion of TSC ticks to ns is fitted over the clock pairs seen in the first 20 ms
(FREEZE_NS) and written into the raw file's header (raw_format.h, clock_set), so that any later
conversion of the file (`heapcast finalize`, or after a failed check) gives the same times.
"""
from __future__ import annotations

import heapq
import mmap
import os
import struct
import threading
from collections import deque
from pathlib import Path

import numpy as np

from ..trace import native_raw
from ..trace.base import RAW_HEADER_SIZE, RAW_MAGIC, TRACE_SUFFIX
from ..trace.format import TraceError
from ..trace.mods import ModsFile
from ..trace.raw import (CHUNK_DRAINED, CHUNK_ENDED, CHUNK_KEPT, CHUNK_MAGIC, CHUNK_MAX, CLOCK,
                         CLOCK_OFFSET, CLOCK_SET, FLAG_TSC, SLOT, SLOT_DTYPE, WINDOW,
                         Chunk, LocationAssigner,
                         RawProcess, _CHUNK, _COUNTERS, _HEADER, fit_clock, location_definitions)
from ..trace.writer import ProcessFileWriter, lower_priority
from . import checkpoint

# Clock pairs must span this long before the clock is fixed and the conversion starts. The
# slope's error at 20 ms is 0.7-2.7e-5 of the time elapsed (ring.c, threads.c, sqlite3 and
# py_dicts, against the TSC's nominal rate; 7.5e-5 to 1.1e-4 at 100 ms before the recorder's
# first clock pair was mended), and nothing is converted before: at 100 ms, a program as fast
# as ring.c left a core idle for a fifth of its run.
FREEZE_NS = 20_000_000
POLL_S = 0.02
NICE = 10                        # the converter takes only CPU time that nothing else wants
NESTED_RESERVE = 32              # recorder.c: slots kept at a chunk's end for signal handlers
KEEP_ABOVE, COPY_BELOW = 512, 128   # chunks behind (MiB): the drainer keeps them / copies again
KEEP_ABOVE_ONE, COPY_BELOW_ONE = 128, 32   # the same where one thread of each process records
# Copies freed at once, in runs of adjacent ones: each punch holds the file's lock, through a
# synchronous discard where the file system is mounted with it (ext4 -o discard), and the
# program's threads wait for that lock when they take fresh chunks.
PUNCH_AT_ONCE = 16
QUIET = 2                        # unchanged polls that still step (quiet())
SEALED_TAIL = 264                # raw_format.h: the header's sealed.tail (chunks ever sealed)


def _runs(entries: list) -> list:
    """The (seq_max, offset) entries of copies grouped into runs of adjacent copies, by offset:
    each run is freed by one punch from its first offset, CHUNK_MAX bytes per entry."""
    runs: list = []
    for entry in sorted(entries, key=lambda e: e[1]):
        if runs and runs[-1][-1][1] + CHUNK_MAX == entry[1]:
            runs[-1].append(entry)
        else:
            runs.append([entry])
    return runs


class LiveProcess:
    """One raw file converted while its process runs."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        self.ino = os.fstat(self.fd).st_ino
        self.mm = None
        head = os.pread(self.fd, RAW_HEADER_SIZE, 0)
        if len(head) < RAW_HEADER_SIZE or head[:8] != RAW_MAGIC:
            os.close(self.fd)
            raise ValueError(f"{self.path}: header not written yet")
        h = _HEADER.unpack_from(head, 0)
        self.pid = h[5]
        self.start_tsc, self.start_mono = h[12], h[10]
        self.copies: dict[int, Chunk] = {}     # offset -> a drainer's copy, read, not retired
        # Copies whose events are all converted are retired: kept as counts only, so that the
        # work of a poll follows what is not converted yet, not the length of the recording.
        self.retired: set = set()              # their offsets
        self.retired_events = 0
        self.retired_small: set = set()        # offsets of small chunks retired likewise
        self.retired_small_events = 0
        self.retired_tid: dict[int, list] = {}  # tid -> [copies, slots, max seq, max tsc]
        self.to_punch: list = []               # heap of (seq_max, offset): retired, not freed
        self.copy_ids: set = set()             # (tid, tsc) of the copies
        self.small: dict[int, Chunk] = {}      # offset -> a never-recycled chunk, read so far
        self.final: set = set()                # offsets of small chunks that no longer change
        self.blocked: dict[int, int] = {}      # tid -> tsc of its oldest chunk we may not read
        self.ended: set = set()                # tids whose last chunk says they have ended
        self.walked = False                    # the last walk saw every chunk of the file
        self.locs_done: dict[int, int] = {}      # chunk offset -> slot where parsing stopped
        self.pairs = [(self.start_tsc, self.start_mono)]
        self.assigner = LocationAssigner()
        self.buffers = native_raw.SHARED
        self.clock = None
        self.writer = None
        self.next_lo = None                    # the next window to convert
        self.emitted = 0
        self.idle: dict[int, tuple] = {}       # tid -> what its chunks looked like last poll
        self.counter = 0                       # the seq counter at the last poll
        self.failed = None
        self.threads = 0                       # thread ids its recorder handed out (last poll)
        self.skipped = frozenset()             # set by finalize: done_chunks()
        self.checked = False                   # set by finalize: the check passed
        self.log = checkpoint.CheckpointLog(self.path.with_suffix(TRACE_SUFFIX))
        # its .mods parsed as it grows (finalize reads on from there); None once it failed
        self.mods: ModsFile | None = ModsFile(self.path.with_suffix(".mods"))
        self.marks: deque = deque()            # after each window: (next_lo, emitted, ids,
                                               # prev_seq, last_ts), not yet checkpointed
        self.ends: dict[int, int] = {}         # events in .hct.tmp -> its size then
        self.punched: dict[int, int] = {}      # offset -> seq_max of the copies freed
        self.frontier = RAW_HEADER_SIZE        # every chunk below it was seen: a copy, or in
        self.inplace: dict[int, int] = {}      # here (offset -> size) while it may change
        self.wfd = -1                          # the raw file, to punch copies (-2: cannot)
        self.grid = None                       # the first window's lo
        self.accounted: dict[int, int] = {}    # window (from grid) -> its seqs known used
        self.sure = 0                          # windows below it: every seq accounted for
        self.seen = None                       # (seq counter, file end) at the last poll
        self.unchanged = 0                     # polls since they last moved (quiet())

    # ------------------------------------------------------------------ reading

    def _map(self) -> None:
        size = os.fstat(self.fd).st_size
        if self.mm is None or size > len(self.mm):
            if self.mm is not None:
                self.mm.close()
            self.mm = mmap.mmap(self.fd, size, access=mmap.ACCESS_READ)

    def _read(self, off: int, size: int, tid: int, tsc: int) -> Chunk | None:
        """Scans the chunk at off: its events' range, its location definitions and clock pair."""
        mm = self.mm
        buf = np.frombuffer(mm, np.uint8)
        address, length = buf.ctypes.data, len(buf)
        del buf
        n, events, seq_min, seq_max, locs, bad, ordered = native_raw.scan_chunk(address, length,
                                                                                off, size)
        if bad is not None:
            raise ValueError(f"{self.path}: bad slot in chunk at {off}")
        if locs:
            # A small chunk is read again at every poll until it is final: its definitions
            # before `done` were parsed at an earlier poll (a thread writes its chunk in order,
            # so only the last one can have been cut short).
            slots = np.frombuffer(mm, SLOT_DTYPE, n, off + SLOT)
            defs, self.locs_done[off] = location_definitions(self.path, slots, off,
                                                             self.locs_done.get(off, 0))
            self.assigner.add_definitions(defs)
            del slots
        return Chunk(off, size, tid, n, seq_min, seq_max, tsc, events, ordered)

    def add_copies(self, offsets) -> None:
        """Reads the drainer's completed copies at these offsets."""
        self._map()
        for off in offsets:
            self._add_copy(off)

    def _add_copy(self, off: int) -> None:
        """Reads a full chunk that never changes again: a drainer's copy, or a chunk its thread
        left in place (CHUNK_KEPT)."""
        magic, tid, size, _, tsc, mono = _CHUNK.unpack_from(self.mm, off)
        if magic != CHUNK_MAGIC or size != CHUNK_MAX or off + size > len(self.mm):
            raise ValueError(f"{self.path}: no complete chunk copy at {off}")
        self.copies[off] = self._read(off, size, tid, tsc)
        self.copy_ids.add((tid, tsc))
        if self.clock is None:
            self.pairs.append((tsc, mono))

    def _walk(self, file_end: int) -> None:
        """Reads the chunks in place that are never recycled (smaller than 1 MiB), and notes per
        thread the oldest 1 MiB chunk in place, which the drainer may zero at any moment. Only
        the chunks in place seen so far and the file past the frontier are looked at: a poll's
        work does not grow with the copies behind it."""
        self.blocked = {}
        limit = min(file_end, len(self.mm))
        for off in list(self.inplace):
            if off in self.copies or off in self.retired:   # a copy seen before its log
                del self.inplace[off]
            elif self._visit(off, limit) is None:
                del self.inplace[off]   # (cannot happen: a chunk's header stays)
        off, frontier = self.frontier, None
        self.walked = limit >= file_end   # every chunk of the file seen (but being claimed)
        while off + SLOT <= limit:
            if off in self.copies or off in self.retired:
                off += CHUNK_MAX
                continue
            if off in self.inplace:   # visited above
                off += self.inplace[off]
                continue
            size = self._visit(off, limit)
            if size is None:   # being claimed: its header is not written yet
                frontier = off if frontier is None else frontier
                off += 4096
                continue
            if size < 0:
                self.walked = False
                break   # the file grew past the mapping (or the counters) since: next poll
            self.inplace[off] = size
            off += size
        self.frontier = off if frontier is None else frontier
        # A small chunk no longer changes once its thread has a later one (it was unmapped).
        newest = {tid: r[3] for tid, r in self.retired_tid.items()}
        for c in (*self.small.values(), *self.copies.values()):
            newest[c.tid] = max(newest.get(c.tid, 0), c.tsc)
        for tid, tsc in self.blocked.items():
            newest[tid] = max(newest.get(tid, 0), tsc)
        newly = [off for off, c in self.small.items()
                 if off not in self.final and c.tsc < newest[c.tid]]
        for off in newly:   # read before its thread's last writes to it, maybe: once more
            c = self.small[off]
            self.small[off] = self._read(off, c.size, c.tid, c.tsc)
        self.final.update(newly)
        for off in [off for off in self.inplace if off in self.final]:
            del self.inplace[off]   # no longer changes: below the frontier for good

    def _visit(self, off: int, limit: int) -> int | None:
        """Looks at the chunk at off: its size, None without a header, -1 past the mapping."""
        magic, tid, size, os_tid, tsc, mono = _CHUNK.unpack_from(self.mm, off)
        if magic not in (CHUNK_MAGIC, CHUNK_DRAINED):
            return None
        if magic == CHUNK_MAGIC and os_tid & CHUNK_ENDED:
            self.ended.add(tid)
        if size < 4096 or size % 4096 or size > CHUNK_MAX:
            raise ValueError(f"{self.path}: chunk size {size} at {off}")
        if off + size > limit:
            return -1
        if magic == CHUNK_DRAINED:
            pass
        elif size == CHUNK_MAX:
            if os_tid & CHUNK_KEPT:   # full, left in place (the drainer was behind): a copy
                self._add_copy(off)
            elif (tid, tsc) not in self.copy_ids:
                self.blocked[tid] = min(self.blocked.get(tid, tsc), tsc)
        elif off not in self.final:
            if off not in self.small and self.clock is None:
                self.pairs.append((tsc, mono))
            self.small[off] = self._read(off, size, tid, tsc)
            if os_tid & CHUNK_KEPT:   # its thread left it (moved on, or ended): as it stays
                self.final.add(off)
        return size

    def _bound(self, threads: int, seq: int) -> int:
        """A seq below which every event is in a chunk read (see the module's docstring).
        `seq`: the counter read at this poll before `threads`, which a thread that has no id yet
        takes its seqs above."""
        sources: dict[int, list] = {}
        for c in (*self.copies.values(), *self.small.values()):
            sources.setdefault(c.tid, []).append(c)
        bound = seq
        idle = {}
        for tid in range(threads):
            cs = sources.get(tid, [])
            # its retired copies: older than its chunks in place (not than its small chunks)
            copies, slots, retired_max, retired_tsc = self.retired_tid.get(tid, (0, 0, -1, -1))
            if tid in self.blocked:   # its events from that chunk on are unknown
                before = [c.seq_max for c in cs if c.events and c.tsc < self.blocked[tid]]
                bound = min(bound, max(before + [retired_max]) + 1)
                continue
            if tid in self.ended and self.walked:   # its events are all in chunks read
                continue
            top = max(cs, key=lambda c: c.tsc, default=None)
            last = max([c.seq_max for c in cs if c.events] + [retired_max]) + 1
            state = (len(cs) + copies, sum(c.n for c in cs) + slots)
            # Idle: unchanged since the last poll, in a chunk with room (not in a chunk switch).
            room = top is not None and top.tsc > retired_tsc and top.size < CHUNK_MAX and \
                top.n + 2 + NESTED_RESERVE < top.size // SLOT
            if room and self.idle.get(tid) == state:   # idle since the poll before
                lb = max(last, self.counter)
            else:
                lb = last
            idle[tid] = state
            bound = min(bound, lb)
        self.idle = idle
        return bound

    # ------------------------------------------------------------------ converting

    def _freeze_clock(self, flags: int) -> bool:
        if self.clock is not None:
            return True
        if not flags & FLAG_TSC:
            self.clock = native_raw.Clock(1.0, 0, 0, True, 0)
            return True
        span = max(m for _, m in self.pairs) - self.start_mono
        if span < FREEZE_NS:
            return False
        slope, t0, n0 = fit_clock(self.pairs, self.start_tsc, self.start_mono)
        wfd = os.open(self.path, os.O_WRONLY | os.O_CLOEXEC)
        try:   # the values, then the mark that makes them valid
            os.pwrite(wfd, CLOCK.pack(0, slope, t0, n0)[8:], CLOCK_OFFSET + 8)
            os.pwrite(wfd, struct.pack("<Q", CLOCK_SET), CLOCK_OFFSET)
        finally:
            os.close(wfd)
        self.clock = native_raw.Clock(slope, t0, n0, False, 0)
        return True

    def quiet(self) -> bool:
        """Whether a poll can pass this file by: its seq counter and file end have not moved
        for the last QUIET polls (a process that has ended, or sleeps). The polls before that
        still step, the second one taking its threads as idle (_bound). With thousands of short
        processes, stepping every one at every poll took the converter's core (2,000 processes:
        1.3 s of CPU)."""
        if self.mm is None:
            return False
        now = struct.unpack_from("<Q", self.mm, 128)[0], _COUNTERS.unpack_from(self.mm, 192)[0]
        if now != self.seen:
            self.seen, self.unchanged = now, 0
            return False
        self.unchanged += 1
        return self.unchanged > QUIET

    def gone(self, released: bool) -> bool:
        """Whether nothing will write to this file any more: its process is gone (exited and
        reaped), and the drainer has let go of it (`released`) or none of its threads ever
        sealed a full chunk, which the drainer would copy. Then the whole file can be converted
        at once (LiveConverter.on_ended): the copies not read yet are scanned as any chunk."""
        if self.mm is None or not released and struct.unpack_from("<Q", self.mm, SEALED_TAIL)[0]:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except OSError:
            pass
        return False

    def step(self, copies, stop: threading.Event, between=None) -> None:
        """One poll: reads what is new, converts the windows it completes, calling `between()`
        after each one."""
        self._map()
        if self.mods is not None:
            try:
                self.mods.update(final=False)
            except (OSError, TraceError):   # finalize reads it whole, and reports it
                self.mods = None
        if copies:
            self.add_copies(copies)
        seq, = struct.unpack_from("<Q", self.mm, 128)
        file_end, _, _, threads, flags, _ = _COUNTERS.unpack_from(self.mm, 192)
        self.threads = threads
        self._walk(file_end)
        bound = self._bound(threads, seq)
        self.counter = seq
        if not self._freeze_clock(flags):
            return
        chunks = [c for c in (*self.copies.values(), *self.small.values()) if c.events]
        if not chunks:
            return
        mins = np.array([c.seq_min for c in chunks], np.uint64)
        maxs = np.array([c.seq_max for c in chunks], np.uint64)
        if self.next_lo is None:
            if int(mins.min()) >= bound:
                return
            # the window grid starts at the first event
            self.next_lo = self.grid = int(mins.min())
        table = None
        while self.next_lo + WINDOW <= bound and not stop.is_set():
            lo, hi = self.next_lo, self.next_lo + WINDOW
            ks = np.flatnonzero((mins < hi) & (maxs >= lo))
            if not len(ks):   # as iter_events: on to the first window that a chunk overlaps
                later = mins[mins >= lo]
                if not len(later):
                    return
                self.next_lo += (int(later.min()) - lo) // WINDOW * WINDOW
                continue
            if table is None:
                table = native_raw.chunk_table(chunks)
                # A chunk still being written may yet fill a slot it skipped, below events
                # written after it (a signal handler's): read whole, never from a cursor.
                table["ordered"] &= [c.offset in self.copies or c.offset in self.final
                                     for c in chunks]
            buf = np.frombuffer(self.mm, np.uint8)
            address, length = buf.ctypes.data, len(buf)
            del buf
            rows = table[ks]   # (a copy: its cursors go back into the table)
            block = native_raw.decode_window(address, length, rows, self.clock, lo, hi,
                                             self.assigner.remap, self.buffers)
            table[ks] = rows
            if len(block["seq"]):
                self._account(block, lo)
                self.assigner.number(block)
                if self.writer is None:
                    self.writer = ProcessFileWriter(self.path.with_suffix(TRACE_SUFFIX), nice=NICE)
                self.writer.add(block)
                self.emitted += len(block["seq"])
            del block
            self.next_lo = hi
            if self.writer is not None:
                self.marks.append((hi, self.emitted, len(self.assigner),
                                   self.writer.prev_seq, self.writer.last_ts))
            if between is not None:
                between()
        self._retire()
        self._checkpoint()
        # the pages read count in `record`'s RSS (RawProcess.release_pages): let go of them
        self.mm.madvise(mmap.MADV_DONTNEED)

    def _retire(self) -> None:
        """Retires the copies, and the small chunks that no longer change, whose events are all
        below next_lo (converted): their thread keeps their counts."""
        if self.next_lo is None:
            return
        done = lambda c: not c.events or c.seq_max < self.next_lo  # noqa: E731
        for off in [off for off, c in self.copies.items() if done(c)]:
            c = self.copies.pop(off)
            self.retired.add(off)
            self.retired_events += c.events
            self._count_retired(c)
            heapq.heappush(self.to_punch, (c.seq_max if c.events else -1, off))
        for off in [off for off, c in self.small.items() if off in self.final and done(c)]:
            c = self.small.pop(off)
            self._count_retired(c)
            self.retired_small.add(off)
            self.retired_small_events += c.events
            self.locs_done.pop(off, None)

    def _count_retired(self, c: Chunk) -> None:
        r = self.retired_tid.setdefault(c.tid, [0, 0, -1, -1])
        r[0] += 1
        r[1] += c.n
        if c.events:
            r[2] = max(r[2], c.seq_max)
        r[3] = max(r[3], c.tsc)

    def _account(self, block, lo: int) -> None:
        """Counts the seqs that the block (the window at lo) used, in the windows they fall in:
        each event's own, and the seq a realloc (or mremap) took before its call (seq -
        free_lag). A window whose every seq is accounted for was converted whole, whatever the
        guess that converted it: no event can come later with a seq in it. `sure` moves past
        such windows. A seq never accounted for (a lost event's) stops it for good."""
        if self.sure is None:
            return
        w0 = (lo - self.grid) // WINDOW
        self.accounted[w0] = self.accounted.get(w0, 0) + len(block["seq"])
        lag = block["free_lag"]
        moved = np.flatnonzero(lag)
        if len(moved):
            seq, lag = block["seq"][moved], lag[moved]
            if (lag == 0xFFFFFFFF).any() or (lag > seq).any():
                self.sure = None    # a saturated lag: its seq is unknown
                return
            before = seq - lag
            before = before[before >= self.grid]
            windows, counts = np.unique((before - np.uint64(self.grid)) // np.uint64(WINDOW),
                                        return_counts=True)
            for w, n in zip(windows.tolist(), counts.tolist()):
                self.accounted[w] = self.accounted.get(w, 0) + n
        while self.sure is not None and self.accounted.get(self.sure, 0) >= WINDOW:
            if self.accounted.pop(self.sure) > WINDOW:
                self.sure = None   # a seq counted twice: trust no window from here on
                break
            self.sure += 1

    def _checkpoint(self) -> None:
        """Checkpoints the latest window below `sure` whose blocks are in .hct.tmp, then frees
        the copies whose events all lie below it (heapcast.recorder.checkpoint)."""
        if self.writer is None or self.wfd == -2 or self.sure is None:
            self.marks.clear()   # (no checkpoint will come)
            return
        sure = self.grid + self.sure * WINDOW
        for events, end in self.writer.written():
            self.ends[events] = end
        best = None
        while self.marks and self.marks[0][0] <= sure and self.marks[0][1] in self.ends:
            best = self.marks.popleft()
        if best is None:
            return
        lo, emitted, ids, prev_seq, last_ts = best
        self.ends = {e: b for e, b in self.ends.items() if e >= emitted}
        if sum(1 for seq_max, _ in self.to_punch if seq_max < lo) < PUNCH_AT_ONCE:
            return
        self.log.append(lo, emitted, self.ends[emitted], prev_seq, last_ts, self.assigner, ids)
        if self.wfd == -1:
            self.wfd = os.open(self.path, os.O_WRONLY | os.O_CLOEXEC)
        ready = []
        while self.to_punch and self.to_punch[0][0] < lo:
            ready.append(heapq.heappop(self.to_punch))
        runs = _runs(ready)
        for i, run in enumerate(runs):
            if not checkpoint.punch(self.wfd, run[0][1], len(run) * CHUNK_MAX):
                os.close(self.wfd)
                self.wfd = -2    # this file system cannot: the copies stay
                for entry in (e for rest in runs[i:] for e in rest):
                    heapq.heappush(self.to_punch, entry)
                return
            self.punched.update((off, seq_max) for seq_max, off in run)

    # ------------------------------------------------------------------ after the exit

    def done_chunks(self) -> frozenset:
        """Offsets of the chunks that no longer change (copies, kept chunks, small chunks whose
        thread moved on) and whose every event is converted: the final scan skips them."""
        if self.next_lo is None:
            return frozenset()
        done = lambda c: not c.events or c.seq_max < self.next_lo  # noqa: E731
        return frozenset(self.retired).union(
            self.retired_small, (off for off, c in self.copies.items() if done(c)),
            (off for off, c in self.small.items() if off in self.final and done(c)))

    def known_chunks(self) -> dict:
        """The chunks read that no longer change but are not (wholly) converted, by offset, for
        the final scan to take as they are (RawProcess's `known`): none while the clock is not
        frozen in the header."""
        if self.clock is None:
            return {}
        known = {off: c for off, c in self.copies.items() if off not in self.skipped}
        known.update((off, c) for off, c in self.small.items()
                     if off in self.final and off not in self.skipped)
        return known

    def check(self, rp: RawProcess, skipped: frozenset) -> bool:
        """Whether the final file (rp, scanned without `skipped`) holds below next_lo exactly the
        events converted."""
        if self.next_lo is None:
            return self.emitted == 0
        read = {**self.small, **self.copies}
        count = self.retired_events + self.retired_small_events + sum(
            read[off].events for off in skipped if off in read)
        lo = self.next_lo
        for c in rp.chunks:
            if c.seq_max < lo:
                count += c.events
            elif c.seq_min < lo:   # a chunk that holds both sides: count its events below lo
                buf = rp._buffer()
                address, length = buf.ctypes.data, len(buf)
                del buf
                block = native_raw.decode_chunk(address, length, native_raw.chunk_table([c]),
                                                rp._clock(), 0, lo)
                count += len(block["seq"])
        return count == self.emitted

    def abandon(self) -> None:
        """Stops converting: the converted part is dropped, but kept for finalize where a
        checkpoint needs it."""
        if self.writer is not None:
            self.writer.abort(remove=self.log.last is None)
            self.writer = None

    def close(self) -> None:
        """Closes the files; a writer not taken by finalize is abandoned."""
        self.abandon()
        self.log.close()
        if self.wfd >= 0:
            os.close(self.wfd)
            self.wfd = -1
        if self.mm is not None:
            self.mm.close()
            self.mm = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class LiveConverter:
    """Converts the trace directory's raw files while the program runs (see the module's
    docstring): run() polls until `stop` is set; `processes` then maps each raw file's path to
    its LiveProcess, which heapcast.recorder.session.finalize completes."""

    def __init__(self, directory, drainer=None, stop: threading.Event | None = None):
        self.directory = Path(directory)
        self.drainer = drainer
        self.stop = stop or threading.Event()
        self.processes: dict[Path, LiveProcess] = {}
        self._waiting: dict[int, list] = {}      # copies logged, not read yet, by inode
        self._lost = 0                           # copies the drainer could not log (_take)
        self.keeping = False                     # the drainer keeps chunks in place (_pace)
        self._names: set = set()                 # raw file names opened (processes' keys)
        # Called with (path, LiveProcess) for a file whose process has ended (LiveProcess.gone),
        # which the converter then forgets: heapcast record converts it whole at once, so that a
        # program that runs many short ones leaves little to convert after its exit.
        self.on_ended = None
        self.root = None                         # the program's pid: converted after its exit
        self._released: set = set()              # (inode, pid) of files the drainer let go of

    def run(self) -> None:
        """Polls every POLL_S seconds until `stop` is set, at a low priority (NICE): on a busy
        machine it must not take CPU time from the program or the drainer."""
        lower_priority(NICE)
        while not self.stop.wait(POLL_S):
            # Converted something: the windows the program completed meanwhile are polled at
            # once (a program faster than the conversion left it idle a poll in two).
            while self.poll() and not self.stop.is_set():
                pass

    def _pace(self) -> None:
        """Far behind the program (full chunks read but not converted, and copies logged but
        not read yet), asks the drainer to keep the chunks sealed from now on in place
        rather than copy them; back near, to copy them again. A copy spares the program fresh
        pages, but it costs the core that the conversion needs, and a recording longer than the
        conversion can follow then doubles the dirty pages that the kernel writes back to disk
        for nothing (ring.c ten times as long: 18 s with copies, 12 s without;
        bench/record_ab.py --workloads ring_long).
        Sooner (KEEP_ABOVE_ONE) where every process behind has had a single thread: its fresh
        pages then cost that thread alone, while the drainer's copies take the core the
        conversion needs (ring: 0.88x the whole wait against KEEP_ABOVE while fresh pages were
        slow on the development VM, no gain while they were not). Several threads of a
        process fault their pages against each other, and the cores are theirs anyway (threads:
        1.03-1.07x with the lower threshold, so it keeps KEEP_ABOVE)."""
        if self.drainer is None:
            return
        behind = [lp for lp in self.processes.values() if lp.copies]
        backlog = sum(len(lp.copies) for lp in behind) + \
            sum(len(offsets) for offsets in self._waiting.values())
        one = all(lp.threads <= 1 for lp in behind)
        keep_above, copy_below = (KEEP_ABOVE_ONE, COPY_BELOW_ONE) if one else \
            (KEEP_ABOVE, COPY_BELOW)
        if not self.keeping and backlog > keep_above:
            self.keeping = True
            self.drainer.keep(True)
        elif self.keeping and backlog < copy_below:
            self.keeping = False
            self.drainer.keep(False)

    def _take(self) -> None:
        """Takes the copies that the drainer logged since, for the next poll to read."""
        if self.drainer is None:
            return
        copies, lost = self.drainer.copies()
        for ino, off in copies:
            self._waiting.setdefault(ino, []).append(off)
        self._lost += lost

    def _between(self) -> None:
        """Between two windows of a poll: the pace is decided on the copies logged meanwhile.
        A poll may convert for a long time (ring.c: 0.2 s of windows that the first poll found
        complete); with the decision at the next poll only, the drainer went on copying
        meanwhile, on the core the conversion needs (ring 0.83 s against 0.69-0.75 s)."""
        self._take()
        self._pace()

    def poll(self) -> bool:
        """Opens new raw files, hands each its new copies, converts what is complete, then hands
        on_ended the files of the processes that have ended for good. Returns whether it
        converted any window."""
        emitted = sum(lp.emitted for lp in self.processes.values())
        # The files the drainer let go of are taken before its copies: every copy of such a file
        # is then among these (it logs a file's copies before it lets go of it).
        if self.drainer is not None and self.on_ended is not None:
            self._released.update(self.drainer.released())
        self._take()
        self._pace()
        lost, self._lost = self._lost, 0
        try:
            entries = [e for e in os.scandir(self.directory) if e.name.endswith(".raw")]
        except OSError:
            entries = []
        for e in entries:
            if e.name in self._names:
                continue
            path = Path(e.path)
            try:
                self.processes[path] = LiveProcess(path)
            except (OSError, ValueError):
                continue   # its header is not written yet: next poll
            self._names.add(e.name)
        for lp in self.processes.values():
            if lost:      # a copy we will never hear of: its file waits for the exit
                lp.failed = lp.failed or "the drainer could not log a copy"
            if lp.failed:
                continue
            new = self._waiting.pop(lp.ino, [])
            if not new and lp.quiet():
                continue
            try:
                lp.step(new, self.stop, self._between)
            except Exception as e:   # never disturb the recording: convert after the exit
                lp.failed = f"{type(e).__name__}: {e}"
                lp.abandon()
        progress = sum(lp.emitted for lp in self.processes.values()) > emitted
        if self.on_ended is not None and not lost:
            self._convert_gone()
        return progress

    def _convert_gone(self) -> None:
        """Hands on_ended the files of the processes that have ended for good (LiveProcess.gone),
        and forgets them. Their copies not read yet are dropped: the conversion scans them as
        any chunk."""
        for path, lp in list(self.processes.items()):
            if self.stop.is_set():
                break
            if lp.pid != self.root and not lp.failed and \
                    lp.gone((lp.ino, lp.pid) in self._released):
                del self.processes[path]
                self._released.discard((lp.ino, lp.pid))
                self._waiting.pop(lp.ino, None)
                self.on_ended(path, lp)
