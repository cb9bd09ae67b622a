"""Writes .hct trace files (docs/trace-format.md) and the session.json of a trace directory."""
from __future__ import annotations

import json
import os
import struct
import threading
import zlib
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable

import numpy as np
import zstandard

from . import codec, native_codec
from .format import EVENT_DTYPE, RSS_DTYPE, SESSION_FILE, TRACE_MAGIC, TRACE_VERSION
from .model import Process

FILE_HEADER = struct.Struct("<8sHHI")
SECTION = struct.Struct("<IIQQII")  # kind, codec, stored_len, raw_len, crc32, count
META, LOCATIONS, MODULES, RSS, EVENTS, PYFRAMES, END = 1, 2, 3, 4, 5, 6, 0xFFFF
CODEC_STORED, CODEC_ZSTD = 0, 1
BLOCK_EVENTS = 1 << 20
STORED_FIELDS = codec.STORED_FIELDS
COLUMN = struct.Struct("<BBHI")  # an EVENTS column: field index, encoding, planes left out, length


def open_private(path: Path, mode: str = "wb"):
    """Opens a new file readable by its owner only: traces hold addresses."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, mode)


class _SectionWriter:
    """Writes sections in order. An EVENTS block is encoded in the calling thread, then
    compressed on a worker thread (up to two, as the CPUs allow) while the caller produces the
    next block (the native encoder and zstd release the GIL); at most one more block than
    workers is in flight, so memory stays bounded, and blocks are written in the order they
    came. Encoding before handing over lets the caller reuse the block's memory at once: the
    encoded payload is a third of the decoded columns' size, and every buffer a recording's
    conversion keeps is memory that the kernel had to zero once (slow in a virtual machine)."""

    def __init__(self, f, level: int, nice: int = 0):
        self.f = f
        self.level = level
        self.zstd = _SCRATCH.take_compressor(level)   # the other sections', given back by close()
        self.nice = nice
        self.workers = max(1, min(2, len(os.sched_getaffinity(0))))
        self.pending = deque()                   # (future section, its event count)
        self.hint = native_codec.planes_hint()   # this file's blocks are one stream
        self.events_written = 0                  # events of the EVENTS sections in the file
        self.ends: deque = deque()               # (events_written, file offset) after each

    def _section(self, kind: int, raw, count: int, compress: bool, zstd) -> bytes:
        """A section's bytes: `raw` is a bytes-like object, or a list of them that are its
        payload in order (compressed as one stream, never joined: a large table's parts)."""
        parts = raw if isinstance(raw, list) else [raw]
        size = sum(memoryview(p).nbytes for p in parts)
        if compress and size and len(parts) == 1:
            stored, codec_id = zstd.compress(parts[0]), CODEC_ZSTD
        elif compress and size:
            z = zstd.compressobj(size=size)
            stored = b"".join([z.compress(p) for p in parts] + [z.flush()])
            codec_id = CODEC_ZSTD
        else:
            stored = b"".join(parts) if isinstance(raw, list) else raw
            codec_id = CODEC_STORED
        return SECTION.pack(kind, codec_id, len(stored), size,
                            zlib.crc32(stored) & 0xFFFFFFFF, count) + stored

    def write(self, kind: int, raw, count: int = 0, compress: bool = True) -> None:
        self.drain()
        self.f.write(self._section(kind, raw, count, compress, self.zstd))

    def write_events(self, block) -> None:
        count = _length(block)
        dense = native_codec.encode_events(block, _SCRATCH.take_buffer(), sparse=False,
                                           hint=self.hint)

        def work():
            # sparse columns here, beside the next block's encoding: it balances the two threads
            raw = native_codec.sparsify(dense, count)
            zstd = _SCRATCH.take_compressor(self.level)
            # The section is a copy (compressed), so the buffer is free for the next block:
            # fresh pages cost more than the encoding (the kernel zeroes them).
            section = self._section(EVENTS, raw, count, True, zstd)
            _SCRATCH.give(self.level, zstd, raw.obj)
            return section
        self.pending.append((_submit(self.nice, work), count))
        while len(self.pending) > self.workers:
            self._write_next()

    def _write_next(self) -> None:
        fut, count = self.pending.popleft()
        self.f.write(fut.result())
        self.events_written += count
        self.ends.append((self.events_written, self.f.tell()))

    def drain(self) -> None:
        while self.pending:
            self._write_next()

    def full_priority(self) -> None:
        """Goes on with workers of normal priority (a thread cannot raise its own back)."""
        self.drain()
        self.nice = 0

    def close(self) -> None:
        """Drops the blocks not written (a worker still compressing one only makes a section
        that nobody writes)."""
        for fut, _ in self.pending:
            fut.cancel()
        self.pending.clear()
        if self.zstd is not None:
            _SCRATCH.give(self.level, self.zstd)
            self.zstd = None


_POOLS: dict = {}   # (pid, nice) -> ThreadPoolExecutor
_POOLS_LOCK = threading.Lock()


def _submit(nice: int, work):
    """Runs `work` on the compressing workers of every writer of the process at priority `nice`,
    started at the first block (up to two threads, as the CPUs allow): a shell's short programs,
    each its own trace file, took a pool's start and its threads' join apiece (0.1-0.2 ms of the
    1 ms each one's conversion took while the program ran). A forked child starts its own (its
    parent's threads are not in it). Under the lock: a pool that release_workers took is never
    given work."""
    key = (os.getpid(), nice)
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = ThreadPoolExecutor(
                max(1, min(2, len(os.sched_getaffinity(0)))), thread_name_prefix="heapcast-zstd",
                initializer=lower_priority, initargs=(nice,))
        return pool.submit(work)


def release_workers() -> None:
    """Stops this process's compressing workers once they have done the work they were given
    (the next block starts them again): the end of a recording leaves no thread behind in a
    program that called heapcast.record."""
    me = os.getpid()
    with _POOLS_LOCK:
        pools = [_POOLS.pop(key) for key in [key for key in _POOLS if key[0] == me]]
    for pool in pools:
        pool.shutdown(wait=True)


class _Scratch:
    """The EVENTS encoders' zstd compressors and encoding buffers, kept for the next block of any
    writer of the process (the conversion while the program runs, then the one after its exit,
    on other threads): a compressor is not thread-safe, so a block's work takes one and gives it
    back with the buffer it compressed."""

    KEEP = 4

    def __init__(self):
        self.lock = threading.Lock()
        self.compressors: list = []   # (level, compressor)
        self.buffers: list = []       # encoding buffers (uint8 arrays)

    def take_buffer(self):
        """A free encoding buffer, or None (encode_events then makes one)."""
        with self.lock:
            return self.buffers.pop() if self.buffers else None

    def take_compressor(self, level: int):
        with self.lock:
            for i, (lv, zstd) in enumerate(self.compressors):
                if lv == level:
                    del self.compressors[i]
                    return zstd
        return zstandard.ZstdCompressor(level=level)

    def give(self, level: int, zstd, buffer=None) -> None:
        with self.lock:
            if len(self.compressors) < self.KEEP:
                self.compressors.append((level, zstd))
            if buffer is not None and len(self.buffers) < self.KEEP:
                self.buffers.append(buffer)


_SCRATCH = _Scratch()


def lower_priority(nice: int) -> None:
    """Lowers the calling thread's priority by `nice` (Linux schedules threads one by one)."""
    if nice:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
        except OSError:
            pass


def _length(block) -> int:
    return len(block["seq"])


def _blocks(events) -> Iterable:
    """Re-cuts event blocks (EVENT_DTYPE arrays or {field: column} dicts) into blocks of at most
    BLOCK_EVENTS rows."""
    if isinstance(events, (np.ndarray, dict)):
        events = [events]
    for block in events:
        if isinstance(block, np.ndarray) and block.dtype != EVENT_DTYPE:
            raise TypeError(f"events must have heapcast.EVENT_DTYPE, not {block.dtype}")
        n = _length(block)
        for start in range(0, n, BLOCK_EVENTS):
            if start == 0 and n <= BLOCK_EVENTS:
                yield block
            elif isinstance(block, dict):
                yield {k: v[start:start + BLOCK_EVENTS] for k, v in block.items()}
            else:
                yield block[start:start + BLOCK_EVENTS]


def encode_locations(offsets: np.ndarray, flats: list) -> list:
    """The LOCATIONS section's payload of a table of these offsets and frames (a list of arrays,
    in order), as parts: views of the arrays where they are little-endian uint64 already (no
    copy of a large table)."""
    return [struct.pack("<Q", len(offsets) - 1), np.ascontiguousarray(offsets, "<u8").data,
            *(np.ascontiguousarray(f, "<u8").data for f in flats)]


class ProcessFileWriter:
    """Writes one process's trace file as its events come: EVENTS blocks as they are added (in
    seq order; encoded and compressed on worker threads), then, in finish(), the sections that
    are only known at the end (locations, modules, RSS, metadata). Written to `<name>.tmp` and
    renamed by finish(), so a .hct file is either complete or absent; abort() removes it."""

    def __init__(self, path, level: int = 3, nice: int = 0, resume: tuple | None = None):
        """`resume`: (size, count, prev_seq, last_ts) to go on writing an unfinished `<name>.tmp`
        from its first `size` bytes, which hold `count` events up to seq `prev_seq` (a
        checkpoint of the conversion while the program ran: heapcast.recorder.checkpoint)."""
        self.path = Path(path)
        self.tmp = self.path.with_name(self.path.name + ".tmp")
        self.count = 0
        self.last_ts = 0
        self._prev_seq = -1
        if resume is not None:
            self._f = _reopen(self.tmp, resume[0])
            self.count, self._prev_seq, self.last_ts = resume[1:]
        else:
            self._f = open_private(self.tmp)
        try:
            if resume is None:
                self._f.write(FILE_HEADER.pack(TRACE_MAGIC, TRACE_VERSION, 0, 0))
            self._w = _SectionWriter(self._f, level, nice)
        except BaseException:
            self.abort(remove=resume is None)   # a resumed file keeps its checkpointed part
            raise

    def add(self, events) -> None:
        """Adds events: an EVENT_DTYPE array or {field: column} dict, or an iterable of them, in
        strictly increasing seq order, after every event added before."""
        for block in _blocks(events):
            seq = block["seq"]
            if not len(seq):
                continue
            if int(seq[0]) <= self._prev_seq or not (seq[1:] > seq[:-1]).all():
                raise ValueError(f"{self.path}: events must be in strictly increasing seq order")
            self._prev_seq = int(seq[-1])
            self._w.write_events(block)
            self.count += len(seq)
            self.last_ts = max(self.last_ts, int(block["ts"].max()))

    def full_priority(self) -> None:
        """From now on encodes and compresses at normal priority (after a start with `nice`)."""
        self._w.full_priority()

    @property
    def prev_seq(self) -> int:
        """The seq of the last event added (-1 before the first)."""
        return self._prev_seq

    def written(self) -> list:
        """Flushes what the file holds so far and returns, for each EVENTS section written
        since the last call, (events in the file up to it, the file's size after it)."""
        self._f.flush()
        ends = list(self._w.ends)
        self._w.ends.clear()
        return ends

    def finish(self, process: Process, location_parts: tuple | None = None) -> Path:
        """Writes the process's sections and renames the file into place. Sets
        process.event_count (and end_ns when it is 0: the last event's time).
        `location_parts`: (offsets, [frames arrays]), the location table written in place of
        process.locations, its frames never joined."""
        try:
            w = self._w
            table = process.locations
            w.write(LOCATIONS, encode_locations(*(location_parts or (table.offsets, [table.flat]))))
            mods = [{"seq": s.seq, "modules": [[m.path, m.base, m.start, m.end] for m in s.modules]}
                    for s in process.modules]
            w.write(MODULES, json.dumps(mods).encode())
            w.write(RSS, np.ascontiguousarray(process.rss, dtype=RSS_DTYPE).tobytes())
            if process.python_frames:
                w.write(PYFRAMES, json.dumps([[k, f.file, f.function, f.line] for k, f in
                                              sorted(process.python_frames.items())]).encode())
            process.event_count = self.count
            if not process.end_ns:
                process.end_ns = self.last_ts
            w.write(META, json.dumps(process.meta()).encode(), compress=False)
            w.write(END, b"", compress=False)
            w.close()
            self._f.close()
        except BaseException:
            self.abort()
            raise
        os.replace(self.tmp, self.path)
        return self.path

    def abort(self, remove: bool = True) -> None:
        """Stops writing and removes the unfinished file (or, with `remove` False, leaves it for
        a later resume)."""
        w = getattr(self, "_w", None)
        if w is not None:
            w.close()
        self._f.close()
        if remove:
            self.tmp.unlink(missing_ok=True)


def _reopen(tmp: Path, size: int):
    """An unfinished trace file opened to go on writing after its first `size` bytes."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CLOEXEC)
    f = os.fdopen(fd, "wb")
    try:
        have = os.fstat(fd).st_size
        if have < size or size < FILE_HEADER.size:
            raise ValueError(f"{tmp}: {have} bytes, expected at least the {size} bytes that its "
                             "checkpoint says were written")
        with open(tmp, "rb") as r:
            magic = r.read(8)
        if magic != TRACE_MAGIC:
            raise ValueError(f"{tmp}: expected trace magic {TRACE_MAGIC!r} at offset 0, found "
                             f"{magic!r}")
        os.ftruncate(fd, size)
        f.seek(size)
    except BaseException:
        f.close()
        raise
    return f


def write_process_file(path, process: Process, events, level: int = 3) -> Path:
    """Writes one process's trace file.

    `events`: an EVENT_DTYPE array, or an iterable of them or of {field: column} dicts, in seq
    order (bounded memory: blocks are compressed as they come). Sets process.event_count.
    Written to a temporary name and renamed, so a .hct file is either complete or absent.
    """
    w = ProcessFileWriter(path, level)
    try:
        w.add(events)
    except BaseException:
        w.abort()
        raise
    return w.finish(process)


def write_session(directory, session: dict) -> Path:
    """Writes session.json (what was recorded, how it ended) into a trace directory."""
    path = Path(directory) / SESSION_FILE
    with open_private(path, "w") as f:
        json.dump(session, f, indent=2)
        f.write("\n")
    return path
