"""Reads the raw files the recorder writes while a program runs (native/recorder/raw_format.h).

A raw file holds per-thread chunks of 32-byte slots in no global order. `RawProcess` scans it once
(chunk table, location definitions, clock pairs, seq range per chunk) and then yields the events in
seq order in bounded windows, so that converting a trace larger than memory stays in memory bounds.
The slots are read by native code (native/codec/raw_decode.c, through heapcast.trace.native_raw).
"""
from __future__ import annotations

import errno
import functools
import mmap
import os
import struct
from array import array
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from . import format as F
from . import native_raw
from .base import RAW_HEADER_SIZE as HEADER_SIZE, RAW_MAGIC
from .format import TraceError
from .model import PY_FRAME_TAG, LocationTable, ModuleSnapshot, Process, PyFrame
from .mods import ModsFile

RAW_VERSION = 1
SLOT = 32
CHUNK_MAGIC = 0x4B434348
CHUNK_DRAINED = 0x44434348   # recycled: its records were copied to a later chunk of the file
CHUNK_MAX = 1 << 20
CHUNK_KEPT = 0x80000000        # os_tid bit: left in place by its thread, never changes again
CHUNK_ENDED = 0x40000000       # os_tid bit, with CHUNK_KEPT: its thread's last chunk, once ended
OP_LOCX, OP_TIME, OP_LOC, OP_EXT = 0xFC, 0xFD, 0xFE, 0xFF
FLAG_MMAP, FLAG_TSC, FLAG_CLEAN_EXIT, FLAG_TRUNCATED = 1, 2, 4, 8
SLOT_DTYPE = np.dtype([("head", "<u8"), ("ts", "<u4"), ("loc", "<u4"), ("a", "<u8"), ("b", "<u8")])
_HEADER = struct.Struct("<8sIIIIiiiIQQQQQQQII")  # up to `clock_every`, see raw_format.h
_COUNTERS = struct.Struct("<QQQIIQ")            # at offset 192: file_end .. locs (seq is at 128)
_CHUNK = struct.Struct("<IIIIQQ")
CLOCK_OFFSET = 2432                           # clock_set, clock_slope, clock_t0, clock_n0
CLOCK = struct.Struct("<Qdqq")
CLOCK_SET = 0x4B434F4C43434800
LOC_UNASSIGNED = 1 << 31                      # LocationAssigner: raw id not yet numbered
# Seq numbers per window of the conversion (iter_events; heapcast.recorder.live converts the same
# windows while the program runs), and so events per EVENTS section of a recorded trace. A
# quarter of writer.BLOCK_EVENTS: a window's decoded columns (62 bytes an event) are 18 MB, not
# 72, and a window completes sooner for the conversion while the program runs. `heapcast
# record`'s whole wait, against 1 << 20 (bench/record_ab.py): ring 0.85x, threads 0.88x,
# py_dicts 0.97x. Bytes, on the same raw files: ring +0.4-0.6%, threads +1.5%, sqlite3 +1.1%,
# py_dicts -1.6% (each section's zstd frame starts without history). 1 << 19 gained nothing over
# 1 << 20; 1 << 17 about what 1 << 18 gains, for more bytes.
WINDOW = 1 << 18


@dataclass
class Chunk:
    offset: int
    size: int
    tid: int
    n: int            # valid slots (after the header)
    seq_min: int
    seq_max: int
    tsc: int = 0      # the chunk's first time base (its header's tsc)
    events: int = 0   # events among the n slots
    ordered: bool = False   # its events' seqs increase in slot order (decoded window by window
                            # from where the last one stopped: native_raw.CHUNK_DTYPE)


class RawProcess:
    """One raw file (and its .mods companion), scanned and ready to yield events in seq order.

    `skip`: offsets of chunks not to scan (chunks that heapcast.recorder.live converted already:
    their events, location definitions and clock pairs are not read again). `known`: offset ->
    Chunk of chunks that never change and were scanned before (chunks that
    heapcast.recorder.live read but did not wholly convert): taken as they are, their location
    definitions not read again (the caller has them) nor their clock pairs (give `known` only
    for a file whose clock is frozen in its header). `mods`: the file's .mods as the caller
    parsed it so far (heapcast.trace.mods), read on from there."""

    def __init__(self, path: Path, skip=frozenset(), known: dict | None = None,
                 mods: ModsFile | None = None):
        self.path = Path(path)
        self._skip = skip
        self._known = known or {}
        self._file = open(self.path, "rb")
        size = os.fstat(self._file.fileno()).st_size
        if size < HEADER_SIZE:
            raise TraceError(self.path, 0, f"raw file is {size} bytes, expected at least a "
                             f"{HEADER_SIZE}-byte header")
        self._mm = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        self._parse_header(size)
        self._scan()
        self.release_pages()
        self._read_mods(mods)

    def release_pages(self) -> None:
        """Lets go of the mapping's pages read so far. They are the page cache that the program
        wrote, but mapped here they count in the converting process's RSS, up to the whole raw
        file (`heapcast record` of a small Python program: 290-345 MB of RSS for 80 MB of its
        own); what is read again comes back from the cache."""
        if not self._mm.closed:
            self._mm.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        if not self._mm.closed:
            self._mm.close()
        self._file.close()

    # ------------------------------------------------------------------ header and chunks

    def _parse_header(self, size: int) -> None:
        h = _HEADER.unpack_from(self._mm, 0)
        (magic, version, header_size, record_size, self.stack_depth, self.pid, self.ppid,
         self.forked_from, self.image, self.fork_seq, self.start_mono, self.start_real,
         self.start_tsc, self.end_mono, self.end_tsc, self.peak_rss, unwind, clock_every) = h
        if magic != RAW_MAGIC:
            raise TraceError(self.path, 0, f"expected raw magic {RAW_MAGIC!r}, found {magic!r} "
                             "(the process may have died before its header was written)")
        if version != RAW_VERSION or header_size != HEADER_SIZE or record_size != SLOT:
            raise TraceError(self.path, 8, f"raw version {version} (header {header_size}, slot "
                             f"{record_size}) is not the version {RAW_VERSION} this heapcast reads")
        self.unwind = "dwarf" if unwind == 1 else "fp"
        self.clock_every = max(clock_every, 1)   # (0 in files of recorders before it)
        self.next_seq = struct.unpack_from("<Q", self._mm, 128)[0]
        (self.file_end, _reserved, self.lost, self.threads, self.flags,
         self.loc_count) = _COUNTERS.unpack_from(self._mm, 192)
        self.limit = min(self.file_end, size)
        set_, slope, t0, n0 = CLOCK.unpack_from(self._mm, CLOCK_OFFSET)
        self.frozen_clock = (slope, t0, n0) if set_ == CLOCK_SET else None

    def _scan(self) -> None:
        """One pass over the chunks: valid slots, seq range, location definitions, clock pairs."""
        self.chunks: list[Chunk] = []
        self.locs: dict[int, bytes] = {}   # raw id -> frames_key
        pairs = [(self.start_tsc, self.start_mono)]
        buf = self._buffer()
        address, length = buf.ctypes.data, len(buf)
        del buf   # the mapping stays: self._mm holds it
        seen, found = set(), []
        holes, k = self._holes(), 0
        off = HEADER_SIZE
        while off + SLOT <= self.limit:
            while k < len(holes) and holes[k][1] <= off:
                k += 1
            if k < len(holes) and holes[k][0] <= off:
                off = max(off + 4096, holes[k][1] & ~4095)   # past it, without reading it
                continue
            magic, tid, size, _os_tid, tsc, mono = _CHUNK.unpack_from(self._mm, off)
            if magic not in (CHUNK_MAGIC, CHUNK_DRAINED):
                # a chunk claimed by a thread killed before it wrote the header, a drainer's
                # copy that it did not finish, or a hole that _holes could not see (a file
                # system without SEEK_HOLE): on to the file's next data at once
                off = self._next_data(off)
                continue
            if size < 4096 or size % 4096 or size > 64 * CHUNK_MAX or off + size > self.limit:
                raise TraceError(self.path, off, f"chunk size {size} is not a multiple of 4096 "
                                 f"that fits in the file ({self.limit} bytes)")
            if magic == CHUNK_DRAINED or (tid, tsc, mono) in seen or off in self._skip:
                off += size   # recycled, or a drainer's copy of a chunk it had not marked yet
                continue
            seen.add((tid, tsc, mono))
            pairs.append((tsc, mono))
            # in file order, with the chunk read before (known) or None: scanned below, at once
            found.append((off, size, tid, tsc, self._known.get(off)))
            off += size
        todo = [f for f in found if f[4] is None]
        scans = iter(native_raw.scan_chunks(address, length, [f[0] for f in todo],
                                            [f[1] for f in todo]).tolist())
        for off, size, tid, tsc, known in found:
            if known is not None:
                if known.events:
                    self.chunks.append(known)
                continue
            n, events, seq_min, seq_max, locs, bad, ordered = next(scans)
            if bad != 2**64 - 1:
                i = off + SLOT * (bad + 1)
                raise TraceError(self.path, i, f"slot has op {self._mm[i]}, expected an operation "
                                 f"code 0..{F.MREMAP} or a marker 0xFC..0xFF")
            if events:
                self.chunks.append(Chunk(off, size, tid, n, seq_min, seq_max, tsc, events,
                                         bool(ordered)))
            if locs:
                slots = np.frombuffer(self._mm, SLOT_DTYPE, n, off + SLOT)
                self.locs.update(location_definitions(self.path, slots, off)[0])
        if self.end_mono:
            pairs.append((self.end_tsc, self.end_mono))
        self._fit_clock(pairs)

    def _holes(self) -> list:
        """The file's holes below its limit, (start, end) in order: the copies that `heapcast
        record`'s converter punched out once converted. The scan passes them by without reading
        them: a read of a hole through the mapping faults in pages of zeros, with readahead
        (12 ms of py_dicts' 80 ms after its exit). [] where the file system cannot tell."""
        fd, holes, off = self._file.fileno(), [], HEADER_SIZE
        try:
            while off < self.limit:
                hole = os.lseek(fd, off, os.SEEK_HOLE)
                if hole >= self.limit:
                    break
                try:
                    data = os.lseek(fd, hole, os.SEEK_DATA)
                except OSError as e:
                    if e.errno != errno.ENXIO:
                        raise
                    data = self.limit   # a hole to the end
                if data <= hole:        # (a file that changed meanwhile: no more holes)
                    break
                holes.append((hole, min(data, self.limit)))
                off = data
        except OSError:
            return []
        return holes

    def _next_data(self, off: int) -> int:
        """The next 4 KiB boundary after off that may hold a chunk: past a hole, its end."""
        if any(self._mm[off:off + 4]):
            return off + 4096
        try:
            data = os.lseek(self._file.fileno(), off, os.SEEK_DATA)
        except OSError as e:   # ENXIO: no data after off; else no SEEK_DATA here
            data = self.limit if e.errno == errno.ENXIO else off
        return max(off + 4096, data & ~4095)

    def _fit_clock(self, pairs: list) -> None:
        """Ticks -> CLOCK_MONOTONIC ns: the conversion frozen in the header by a conversion
        while the program ran, else fit_clock over every clock pair."""
        if not self.flags & FLAG_TSC:
            self._slope, self._t0, self._n0 = 1.0, 0, 0
        elif self.frozen_clock is not None:
            self._slope, self._t0, self._n0 = self.frozen_clock
        else:
            self._slope, self._t0, self._n0 = fit_clock(pairs, self.start_tsc, self.start_mono)

    def _clock(self) -> native_raw.Clock:
        """The fitted ticks -> ns conversion, for the native decoder: identity, or
        n0 + rint((ticks - t0) * slope) (float64 product, int64 sum)."""
        identity = self._slope == 1.0 and self._t0 == 0
        return native_raw.Clock(self._slope, self._t0, self._n0, identity, 0)

    def _ext_error(self, c: Chunk, slot: int) -> TraceError:
        return TraceError(self.path, c.offset + SLOT * (slot + 1),
                          "expected the second slot (marker 0xFF) of a two-slot event")

    def _buffer(self) -> np.ndarray:
        """The file's bytes. Callers drop it at once (close() cannot close a mapping that a
        buffer exports) and pass its address: the mapping lasts until close()."""
        if self._mm.closed:
            raise ValueError(f"{self.path} is closed")
        return np.frombuffer(self._mm, np.uint8)

    # ------------------------------------------------------------------ events

    def _decode_chunk(self, c: Chunk) -> dict:
        """The events of one chunk as columns (EVENT_DTYPE fields but `proc`; `loc` still raw
        ids), in slot order."""
        buf = self._buffer()
        address, length = buf.ctypes.data, len(buf)
        del buf
        try:
            return native_raw.decode_chunk(address, length, native_raw.chunk_table([c]),
                                           self._clock())
        except native_raw.ExtError as e:
            raise self._ext_error(c, e.slot) from None

    def iter_events(self, window: int = WINDOW, remap: np.ndarray | None = None,
                    start: int | None = None, assigner: "LocationAssigner | None" = None
                    ) -> Iterator[dict]:
        """Yields this process's events in seq order as column blocks ({field: array}: EVENT_DTYPE
        fields but `proc`), each covering `window` seq numbers, the first starting at the lowest
        seq (blocks without events are left out). `loc`: the raw location ids, or with `remap`
        (from location_table) remap[id], 0 for ids beyond it, or with `assigner` its numbering.
        `start`: yield only the windows from this one on (a seq where a window starts)."""
        if not self.chunks:
            return
        if window < 1:
            raise ValueError(f"window must be at least 1, not {window}")
        table = native_raw.chunk_table(self.chunks)
        mins = np.array([c.seq_min for c in self.chunks], np.uint64)
        maxs = np.array([c.seq_max for c in self.chunks], np.uint64)
        lo_all, hi_all = int(mins.min()), int(maxs.max())
        clock = self._clock()
        buffers = native_raw.SHARED   # the memory of the conversion while the program ran
        lo = lo_all if start is None else start
        if assigner is not None:
            assigner.add_definitions(self.locs)
            remap = assigner.remap
        while lo <= hi_all:
            hi = lo + window
            ks = np.flatnonzero((mins < hi) & (maxs >= lo))
            if not len(ks):   # skip to the first window that a chunk overlaps
                lo += (int(mins[mins >= lo].min()) - lo) // window * window
                continue
            buf = self._buffer()   # checks that the file is still open (the caller may close it)
            address, length = buf.ctypes.data, len(buf)
            del buf
            rows = table[ks]   # (a copy: its cursors go back into the table)
            try:
                block = native_raw.decode_window(address, length, rows, clock, lo, hi, remap,
                                                 buffers)
            except native_raw.ExtError as e:
                raise self._ext_error(self.chunks[int(ks[e.chunk])], e.slot) from None
            table[ks] = rows
            self.release_pages()
            if len(block["seq"]):
                if assigner is not None:
                    assigner.number(block)
                yield block
            del block   # its memory is reused for the next window once the caller lets go too
            lo = hi

    # ------------------------------------------------------------------ metadata

    def _read_mods(self, mods: ModsFile | None) -> None:
        """The .mods file's metadata: `mods` parsed so far by the caller, or the whole file."""
        mods = mods if mods is not None else ModsFile(self.path.with_suffix(".mods"))
        mods.update(final=True)
        self.exe, self.argv, self.cwd = mods.exe, mods.argv, mods.cwd
        self.modules: list[ModuleSnapshot] = mods.modules
        self.python_frames: dict[int, PyFrame] = mods.python_frames
        self.pymalloc_seq = mods.pymalloc_seq
        self.python_malloc = mods.python_malloc
        self._canon = None

    def location_table(self) -> tuple[LocationTable, np.ndarray]:
        """The merged location table and the map from raw location ids to table ids."""
        uniq: dict[bytes, int] = {b"": 0}
        remap = np.zeros(max(self.locs, default=0) + 1, np.uint32)
        items = sorted(self.locs.items())
        keys = [k for _, k in items]
        canon = self._moving_python_ids()
        if canon and keys:   # each Python frame id -> the first one of its (file, function, line)
            lengths, flat = key_rows(keys)
            if _canonical_python_ids(flat, canon):
                keys = _split_keys(lengths, flat)
        for (raw_id, _), frames in zip(items, keys):
            remap[raw_id] = uniq.setdefault(frames, len(uniq))
        return LocationTable.from_lengths(*key_rows(list(uniq))), remap

    def _python_ids(self) -> dict:
        """Python frame id -> the first id defined with the same (file, function, line): threads
        and forks define their own. (Computed once: the frames are read with the file.)"""
        if self._canon is None:   # (tuples, not PyFrames: their hash is Python code)
            first: dict = {}
            self._canon = {fid: first.setdefault((fr.file, fr.function, fr.line), fid)
                           for fid, fr in sorted(self.python_frames.items())}
        return self._canon

    def canonical_python_ids(self, flats: list) -> bool:
        """Replaces, in place, each Python frame id among these frames (writable uint64 arrays:
        a location table's, in parts) by the first id defined with the same (file, function,
        line): threads, forks and a cleared location cache define their own, and process()
        keeps the first ids only. A part of each array at a time (its temporaries stay small);
        whether an id moves at all (none where one thread of one process defined every
        frame: no pass over them)."""
        canon = self._moving_python_ids()
        if not canon:
            return False
        lut = _canonical_lut(canon)
        for flat in flats:
            for at in range(0, len(flat), CANON_PART):
                _canonical_python_ids(flat[at:at + CANON_PART], canon, lut)
        return True

    def _moving_python_ids(self) -> dict:
        """_python_ids' ids that move: none where one thread of one process defined every
        frame."""
        return {fid: first for fid, first in self._python_ids().items() if fid != first}

    def process(self) -> Process:
        """A Process with this file's metadata (no events, no RSS: the caller adds them)."""
        return Process(
            index=0, pid=self.pid, ppid=self.ppid, forked_from=self.forked_from,
            fork_seq=self.fork_seq, image=self.image, exe=self.exe, argv=self.argv, cwd=self.cwd,
            start_ns=self.start_mono, end_ns=self.end_mono, start_unix_ns=self.start_real,
            clean_exit=bool(self.flags & FLAG_CLEAN_EXIT), peak_rss_bytes=self.peak_rss,
            threads=self.threads, lost_events=self.lost,
            truncated=bool(self.flags & FLAG_TRUNCATED), stack_depth=self.stack_depth,
            unwind=self.unwind, clock_every=self.clock_every,
            mmap_recorded=bool(self.flags & FLAG_MMAP),
            pymalloc_seq=self.pymalloc_seq, python_malloc=self.python_malloc,
            modules=self.modules,
            python_frames={fid: self.python_frames[fid]
                           for fid, first in self._python_ids().items() if first == fid})


#: The hash by which LocationAssigner finds a location's id (Python's own of the frames' bytes;
#: the tests replace it by one that collides).
_frames_hash = hash


class LocationAssigner:
    """Numbers the locations of a process's events as they are converted, in seq order: a
    location's id is the order of its first use (different raw ids with the same frames, which
    different threads defined, share one); definitions no event used come last, in raw id
    order. The conversion while the program runs (heapcast.recorder.live) and the one after it
    number the same events the same way, although the first knows only the definitions written
    so far.

    Its memory is the table's rows and about 100 bytes an id: a definition's frames are kept as
    bytes only until an event uses it, and ids are found by the hash of their frames, checked
    against the rows (pydoc -k: 2.45M locations; frames kept whole as dict keys, and the rows
    beside them, took 1.5 GB)."""

    def __init__(self):
        self.frames: dict[int, bytes] = {}    # raw id -> frames_key, until an event uses it
        self.known = np.zeros(1, bool)        # raw id -> defined
        self.remap = np.zeros(1, np.uint32)   # raw id -> id, or LOC_UNASSIGNED | raw id
        self.defined = array("I")             # raw ids, in the order they came
        self.first_raw = array("I", [0])      # location id -> a raw id defined with its frames
        self._by_hash: dict[int, int] = {_frames_hash(b""): 0}   # hash -> location id
        self._clash: dict[bytes, int] = {}    # frames_key -> id, where another id has its hash
        # the table's rows: each id's end among all frames, and the frames, a list of uint64
        # arrays (the ids from _built on are in _pending, as frames_keys)
        self._flats: list = [np.zeros(0, np.uint64)]
        self._flat_starts = [0]               # index of each _flats array's first frame
        self._ends = array("Q", [0])          # location id -> end of its frames
        self._pending: list = []
        self._built = 1

    def __len__(self) -> int:
        """The number of ids given (id 0, no location, included)."""
        return len(self.first_raw)

    def add_definitions(self, defs: dict) -> None:
        """Learns location definitions (raw id -> frames_key)."""
        if not defs:
            return
        ks = np.fromiter(defs.keys(), np.int64, len(defs))
        top = int(ks.max()) + 1
        if top > len(self.remap):
            size = max(top, 2 * len(self.remap))
            self.remap = np.concatenate([self.remap, np.zeros(size - len(self.remap), np.uint32)])
            self.known = np.concatenate([self.known, np.zeros(size - len(self.known), bool)])
        new = ks[~self.known[ks]]
        if not len(new):
            return
        self.known[new] = True
        self.remap[new] = LOC_UNASSIGNED | new.astype(np.uint32)
        self.defined.frombytes(new.astype(np.uint32).tobytes())
        self.frames.update((k, defs[k]) for k in new.tolist())

    def frames_of(self, loc: int) -> bytes:
        """The frames_key of location id `loc`."""
        if loc >= self._built:
            return self._pending[loc - self._built]
        lo, hi = self._ends[loc - 1] if loc else 0, self._ends[loc]
        part = bisect_right(self._flat_starts, lo) - 1
        at = self._flat_starts[part]
        return self._flats[part][lo - at:hi - at].tobytes()

    def raw_frames(self, raw: int) -> bytes:
        """The frames_key of a defined raw id."""
        got = self.frames.get(raw)
        return got if got is not None else self.frames_of(int(self.remap[raw]))

    def lookup(self, frames: bytes) -> int | None:
        """The id of these frames (a frames_key), or None."""
        got = self._by_hash.get(_frames_hash(frames))
        if got is not None and self.frames_of(got) == frames:
            return got
        return self._clash.get(frames)

    def give(self, frames: bytes, raw: int = 0) -> int:
        """The id of these frames (a frames_key): the next one if they have none yet, `raw`
        being a raw id defined with them."""
        h = _frames_hash(frames)
        got = self._by_hash.get(h)
        new = len(self.first_raw)
        if got is None:
            self._by_hash[h] = new
        elif self.frames_of(got) == frames:
            return got
        else:   # two stacks of one hash: the second and later are kept by their frames
            got = self._clash.get(frames)
            if got is not None:
                return got
            self._clash[frames] = new
        self.first_raw.append(raw)
        self._pending.append(frames)
        return new

    def number(self, block: dict) -> None:
        """Replaces, in place, the raw ids of the block's `loc` column (decoded with `remap`)."""
        loc = block["loc"]
        pending = loc >= LOC_UNASSIGNED
        if not pending.any():
            return
        raw = (loc[pending] & (LOC_UNASSIGNED - 1)).astype(np.intp)   # each < len(remap)
        # each raw id's first row, in one pass (np.unique sorts the rows: 20x as long on 2^20)
        first = np.full(len(self.remap), len(raw), np.intp)
        np.minimum.at(first, raw, np.arange(len(raw)))
        ids = np.flatnonzero(first < len(raw))
        for k in ids[np.argsort(first[ids], kind="stable")].tolist():
            self.remap[k] = self.give(self.frames.pop(k), k)
        loc[pending] = self.remap[raw]
        self._extend()

    def _extend(self) -> None:
        """Builds the table's rows of the ids given since the last call: while the program runs,
        so that table_parts() has little left to do after its exit (py_dicts' 25,000 locations of
        368,000 frames took 13.5-15.7 ms there, now 1.3-1.4 ms)."""
        if not self._pending:
            return
        lengths, flat = key_rows(self._pending)
        self._pending = []
        self._flat_starts.append(self._ends[-1])
        self._ends.frombytes((np.cumsum(lengths) + np.uint64(self._ends[-1])).astype("<u8")
                             .tobytes())
        self._flats.append(flat)
        self._built = len(self.first_raw)

    def table_parts(self) -> tuple[np.ndarray, list]:
        """The location table (the ids given so far, then the definitions no event used): its
        offsets, and its frames as a list of writable uint64 arrays, in order, as they were
        built (a conversion writes them without joining them: pydoc -k's 2.7M Python stacks are
        350 MB of frames, and a copy of them took 0.8 s after the program's exit)."""
        for k in sorted(self.frames):   # (the definitions no event used)
            self.remap[k] = self.give(self.frames.pop(k), k)
        self._extend()
        offsets = np.zeros(len(self._ends) + 1, np.uint64)
        offsets[1:] = np.frombuffer(self._ends, np.uint64)
        return offsets, list(self._flats)


def fit_clock(pairs, start_tsc: int, start_mono: int) -> tuple[float, int, int]:
    """(slope, t0, n0) of ns = n0 + rint((ticks - t0) * slope): a least-squares line through the
    (ticks, ns) clock pairs, anchored at the process's start pair."""
    p = np.array(sorted(set(pairs)), dtype=np.float64)
    t0, n0 = int(start_tsc), int(start_mono)
    if len(p) >= 2 and p[-1, 0] - p[0, 0] > 1e6:
        dt = p[:, 0] - t0
        dn = p[:, 1] - n0
        return float(np.dot(dt, dn) / np.dot(dt, dt)), t0, n0
    return 1.0 / _tsc_ghz(), t0, n0


#: Frames canonical_python_ids takes at a time (8 MB of them, and of each temporary).
CANON_PART = 1 << 20


def _canonical_lut(canon: dict):
    """canon (Python frame id -> canonical id) as an array indexed by id, or None where its ids
    are too sparse for one (the recorder numbers the frames it defines from 0)."""
    top = max(canon) + 1
    if top > 4 * len(canon) + (1 << 22):
        return None
    lut = np.arange(top, dtype=np.uint64)
    lut[np.fromiter(canon.keys(), np.int64, len(canon))] = \
        np.fromiter(canon.values(), np.uint64, len(canon))
    return lut


def _canonical_python_ids(flat: np.ndarray, canon: dict, lut=None) -> bool:
    """Replaces, in place, the id of each Python frame among `flat` (uint64 frames) by canon's
    (an id it lacks stays itself), looked up in `lut` (_canonical_lut) where given; whether
    there was one."""
    py = np.flatnonzero(flat & np.uint64(PY_FRAME_TAG))
    if not len(py):
        return False
    ids = (flat[py] & np.uint64(0xFFFFFFFF)).astype(np.int64)
    if lut is None:
        lut = _canonical_lut(canon)
    if lut is not None:   # (ids beyond it are not in canon: themselves)
        inside = ids < len(lut)
        new = ids.astype(np.uint64)
        new[inside] = lut[ids[inside]]
    else:   # a dict lookup per frame where ids are sparse
        new = np.array([canon.get(i, i) for i in ids.tolist()], np.uint64)
    flat[py] = np.uint64(PY_FRAME_TAG) | new
    return True


def frames_key(frames) -> bytes:
    """A location definition's frames as the conversion keeps them: their little-endian uint64
    bytes (a tuple of Python ints took about 2 KB a stack of 37 frames: 1 GB for 524,288 of
    them, where these take a sixth)."""
    return np.asarray(frames, "<u8").tobytes()


def key_rows(keys: list) -> tuple[np.ndarray, np.ndarray]:
    """Each frames_key's length and all their frames in order, as uint64 arrays: the rows of a
    LocationTable (from_lengths)."""
    lengths = np.fromiter((len(k) >> 3 for k in keys), np.uint64, len(keys))
    # (joined into a bytearray: the array is its memory, writable, not a copy of it)
    return lengths, np.frombuffer(bytearray().join(keys), np.uint64)


def _split_keys(lengths: np.ndarray, flat: np.ndarray) -> list:
    """frames_keys of the rows (lengths, flat)."""
    buf = flat.astype("<u8").tobytes()
    ends = (np.cumsum(lengths.astype(np.int64)) * 8).tolist()
    starts = [0] + ends[:-1]
    return [buf[b:e] for b, e in zip(starts, ends)]


def location_definitions(path, slots: np.ndarray, off: int, start: int = 0) -> tuple[dict, int]:
    """The location definitions (id -> frames) of the HC_LOC slots at index >= start among a
    chunk's written slots (the chunk at `off`), their extra frames read from the HC_LOCX slots
    after each, and the index of the first definition that a kill or a thread still writing cut
    short (its events show location 0), or len(slots) if none. Vectorized: a Python stack of 16
    frames takes 6 slots, and a Python program defines thousands of them."""
    n = len(slots)
    head = slots["head"]
    heads = np.flatnonzero((head[start:] & 0xFF) == OP_LOC) + start
    if not len(heads):
        return {}, n
    if len(heads) <= FEW_DEFINITIONS:
        return _few_definitions(path, slots, off, heads.tolist())
    count = slots["ts"][heads].astype(np.int64)
    extra = (np.maximum(count - 2, 0) + 2) // 3            # HC_LOCX slots after each head
    cut = np.flatnonzero(heads + extra >= n)
    stop = int(heads[cut[0]]) if len(cut) else n
    if len(cut):
        heads, count, extra = heads[:cut[0]], count[:cut[0]], extra[:cut[0]]
    if not len(heads):
        return {}, stop
    # Every slot of every definition: the head then its HC_LOCX slots.
    per = 1 + extra
    first = np.repeat(np.cumsum(per) - per, per)
    idx = np.repeat(heads, per) + (np.arange(int(per.sum())) - first)
    is_x = idx != np.repeat(heads, per)
    bad = idx[is_x][(head[idx[is_x]] & 0xFF) != OP_LOCX]
    if len(bad):
        raise TraceError(path, off + SLOT * (int(bad[0]) + 1), "expected the frames of a "
                         "location definition (marker 0xFC)")
    sl = slots[idx]
    three = np.empty((len(idx), 3), np.uint64)
    three[:, 0] = np.where(is_x, sl["ts"].astype(np.uint64) | (sl["loc"].astype(np.uint64) << 32),
                           sl["a"].astype(np.uint64))
    three[:, 1] = np.where(is_x, sl["a"], sl["b"]).astype(np.uint64)
    three[:, 2] = np.where(is_x, sl["b"], 0).astype(np.uint64)
    # A head carries 2 frames (its third column is padding), an HC_LOCX slot 3.
    keep = np.ones((len(idx), 3), bool)
    keep[~is_x, 2] = False
    flat = three[keep].astype("<u8").tobytes()
    ids = (head[heads] >> 8).tolist()
    starts = np.cumsum(2 + 3 * extra) - (2 + 3 * extra)
    out = {}
    for k, (b, c) in enumerate(zip(starts.tolist(), count.tolist())):
        out[ids[k]] = flat[8 * b:8 * (b + c)]
    return out, stop


#: Up to this many definitions in a chunk, location_definitions reads them one by one: the
#: vectorized way costs some 40 us of array calls whatever their number (a program that starts
#: and ends threads by the thousand has a chunk of one or two definitions per thread).
FEW_DEFINITIONS = 16


def _few_definitions(path, slots: np.ndarray, off: int, heads: list) -> tuple[dict, int]:
    """location_definitions of the HC_LOC slots at `heads`, one at a time."""
    n = len(slots)
    out = {}
    for i in heads:
        h, count, _, a, b = slots[i].item()
        extra = (max(count - 2, 0) + 2) // 3
        if i + extra >= n:
            return out, i
        frames = [a, b]
        for j in range(i + 1, i + 1 + extra):
            xh, x0, x1, xa, xb = slots[j].item()
            if xh & 0xFF != OP_LOCX:
                raise TraceError(path, off + SLOT * (j + 1), "expected the frames of a "
                                 "location definition (marker 0xFC)")
            frames += (x0 | (x1 << 32), xa, xb)
        out[h >> 8] = frames_key(frames[:count])
    return out, n


@functools.cache
def _tsc_ghz() -> float:
    """Nominal TSC rate, for a process too short to fit its clock pairs (read once: a shell's
    short programs each need it, and /proc/cpuinfo takes 35 us to read)."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("cpu MHz"):
                return float(line.split(":")[1]) / 1000.0
    except OSError:
        pass
    return 1.0


def raw_files(directory: Path) -> list:
    """The raw files of a trace directory, in name order."""
    return sorted(Path(directory).glob("*.raw"))
