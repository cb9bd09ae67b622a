"""Reads the raw files the recorder writes while a program runs (native/recorder/raw_format.h).

A raw file holds per-thread chunks of 32-byte slots in no global order. `RawProcess` scans it once
(chunk table, location definitions, clock pairs, seq range per chunk) and then yields the events in
seq order in bounded windows, so that converting a trace larger than memory stays in memory bounds.
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from . import format as F
from .format import TraceError
from .model import LocationTable, Module, ModuleSnapshot, Process

RAW_MAGIC = b"HCRAW\0\0\0"
RAW_VERSION = 1
HEADER_SIZE = 4096
SLOT = 32
CHUNK_MAGIC = 0x4B434348
CHUNK_MAX = 1 << 20
OP_LOCX, OP_TIME, OP_LOC, OP_EXT = 0xFC, 0xFD, 0xFE, 0xFF
FLAG_MMAP, FLAG_TSC, FLAG_CLEAN_EXIT, FLAG_TRUNCATED, FLAG_DORMANT = 1, 2, 4, 8, 16
#: Ops whose event takes a second (HC_EXT) slot.
EXT_OPS = np.array([F.CALLOC, F.REALLOC, F.REALLOCARRAY, F.POSIX_MEMALIGN, F.ALIGNED_ALLOC,
                    F.MEMALIGN, F.VALLOC, F.PVALLOC, F.MMAP, F.MUNMAP, F.MREMAP])

SLOT_DTYPE = np.dtype([("head", "<u8"), ("ts", "<u4"), ("loc", "<u4"), ("a", "<u8"), ("b", "<u8")])
_HEADER = struct.Struct("<8sIIIIiiiIQQQQQQQI")  # up to `unwind`, see raw_format.h
_COUNTERS = struct.Struct("<QQQIIQ")            # at offset 192: file_end .. locs (seq is at 128)
_CHUNK = struct.Struct("<IIIIQQ")


@dataclass
class Chunk:
    offset: int
    size: int
    tid: int
    n: int            # valid slots (after the header)
    seq_min: int
    seq_max: int


class RawProcess:
    """One raw file (and its .mods companion), scanned and ready to yield events in seq order."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._file = open(self.path, "rb")
        size = os.fstat(self._file.fileno()).st_size
        if size < HEADER_SIZE:
            raise TraceError(self.path, 0, f"raw file is {size} bytes, expected at least a "
                             f"{HEADER_SIZE}-byte header")
        self._mm = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        self._parse_header(size)
        self._scan()
        self._read_mods()

    def close(self) -> None:
        if not self._mm.closed:
            self._mm.close()
        self._file.close()

    # ------------------------------------------------------------------ header and chunks

    def _parse_header(self, size: int) -> None:
        h = _HEADER.unpack_from(self._mm, 0)
        (magic, version, header_size, record_size, self.stack_depth, self.pid, self.ppid,
         self.forked_from, self.image, self.fork_seq, self.start_mono, self.start_real,
         self.start_tsc, self.end_mono, self.end_tsc, self.peak_rss, unwind) = h
        if magic != RAW_MAGIC:
            raise TraceError(self.path, 0, f"expected raw magic {RAW_MAGIC!r}, found {magic!r} "
                             "(the process may have died before its header was written)")
        if version != RAW_VERSION or header_size != HEADER_SIZE or record_size != SLOT:
            raise TraceError(self.path, 8, f"raw version {version} (header {header_size}, slot "
                             f"{record_size}) is not the version {RAW_VERSION} this heapcast reads")
        self.unwind = "dwarf" if unwind == 1 else "fp"
        self.next_seq = struct.unpack_from("<Q", self._mm, 128)[0]
        (self.file_end, _reserved, self.lost, self.threads, self.flags,
         self.loc_count) = _COUNTERS.unpack_from(self._mm, 192)
        self.limit = min(self.file_end, size)

    def _scan(self) -> None:
        """One pass over the chunks: valid slots, seq range, location definitions, clock pairs."""
        self.chunks: list[Chunk] = []
        self.locs: dict[int, tuple] = {}
        pairs = [(self.start_tsc, self.start_mono)]
        off = HEADER_SIZE
        while off + SLOT <= self.limit:
            magic, tid, size, _os_tid, tsc, mono = _CHUNK.unpack_from(self._mm, off)
            if magic != CHUNK_MAGIC:
                off += 4096   # a chunk claimed by a thread killed before it wrote the header
                continue
            if size < 4096 or size % 4096 or size > 64 * CHUNK_MAX or off + size > self.limit:
                raise TraceError(self.path, off, f"chunk size {size} is not a multiple of 4096 "
                                 f"that fits in the file ({self.limit} bytes)")
            pairs.append((tsc, mono))
            slots = np.frombuffer(self._mm, SLOT_DTYPE, size // SLOT - 1, off + SLOT)
            zero = np.flatnonzero(slots["head"] == 0)
            n = int(zero[0]) if len(zero) else len(slots)
            ops = (slots["head"][:n] & 0xFF).astype(np.uint8)
            ev = ops <= F.MREMAP
            bad = ~ev & (ops < OP_LOCX)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise TraceError(self.path, off + SLOT * (i + 1), f"slot has op {ops[i]}, expected "
                                 f"an operation code 0..{F.MREMAP} or a marker 0xFC..0xFF")
            seqs = slots["head"][:n][ev] >> 8
            if len(seqs):
                self.chunks.append(Chunk(off, size, tid, n, int(seqs.min()), int(seqs.max())))
            for i in np.flatnonzero(ops == OP_LOC):
                self._define_loc(slots, int(i), n, off)
            off += size
        if self.end_mono:
            pairs.append((self.end_tsc, self.end_mono))
        self._fit_clock(pairs)

    def _define_loc(self, slots: np.ndarray, i: int, n: int, off: int) -> None:
        s = slots[i]
        count = int(s["ts"])
        frames = [int(s["a"]), int(s["b"])][:count]
        j = i + 1
        while len(frames) < count and j < n:
            x = slots[j]
            if int(x["head"]) & 0xFF != OP_LOCX:
                raise TraceError(self.path, off + SLOT * (j + 1), "expected the frames of a "
                                 "location definition (marker 0xFC)")
            frames.extend([int(x["ts"]) | (int(x["loc"]) << 32), int(x["a"]), int(x["b"])])
            j += 1
        if len(frames) < count:
            return  # cut short by a kill: events using it will show location 0
        self.locs[int(s["head"]) >> 8] = tuple(frames[:count])

    def _fit_clock(self, pairs: list) -> None:
        """Ticks -> CLOCK_MONOTONIC ns. With the TSC, a least-squares line through the clock pairs."""
        if not self.flags & FLAG_TSC:
            self._slope, self._t0, self._n0 = 1.0, 0, 0
            return
        p = np.array(sorted(set(pairs)), dtype=np.float64)
        self._t0, self._n0 = int(self.start_tsc), int(self.start_mono)
        if len(p) >= 2 and p[-1, 0] - p[0, 0] > 1e6:
            dt = p[:, 0] - self._t0
            dn = p[:, 1] - self._n0
            self._slope = float(np.dot(dt, dn) / np.dot(dt, dt))
        else:
            self._slope = 1.0 / _tsc_ghz()

    def ticks_to_ns(self, ticks: np.ndarray) -> np.ndarray:
        if self._slope == 1.0 and self._t0 == 0:
            return ticks.astype(np.uint64)
        d = (ticks.astype(np.int64) - np.int64(self._t0)).astype(np.float64)
        return (np.int64(self._n0) + np.rint(d * self._slope).astype(np.int64)).astype(np.uint64)

    # ------------------------------------------------------------------ events

    def _decode_chunk(self, c: Chunk) -> dict:
        """The events of one chunk as columns (EVENT_DTYPE fields but `proc`; `loc` still raw
        ids), in slot order. Columns, not a structured array: each is built contiguously."""
        slots = np.frombuffer(self._mm, SLOT_DTYPE, c.n, c.offset + SLOT)
        head = slots["head"]
        ops = (head & 0xFF).astype(np.uint8)
        is_event = ops <= F.MREMAP
        if is_event.all():        # the common chunk: nothing but one-slot events
            ev_idx, s, op = np.arange(c.n), slots, ops
        else:
            ev_idx = np.flatnonzero(is_event)
            s, op = slots[ev_idx], ops[ev_idx]
        # Time base of each slot: the chunk's own, or the latest HC_TIME slot before it.
        tsc = _CHUNK.unpack_from(self._mm, c.offset)[4]
        ticks = s["ts"].astype(np.uint64) + np.uint64(tsc)
        times = np.flatnonzero(ops == OP_TIME)
        if len(times):
            last = np.searchsorted(times, ev_idx) - 1
            rebased = last >= 0
            ticks[rebased] = (s["ts"][rebased].astype(np.uint64)
                              + slots["a"][times[last[rebased]]])
        n = len(ev_idx)
        e = {"seq": s["head"] >> np.uint64(8), "ts": self.ticks_to_ns(ticks), "addr": s["a"].copy(),
             "old_addr": np.zeros(n, np.uint64), "size": s["b"].copy(),
             "arg": np.zeros(n, np.uint64), "loc": s["loc"].copy(),
             "tid": np.full(n, c.tid, np.uint32), "free_lag": np.zeros(n, np.uint32), "op": op,
             "flags": np.zeros(n, np.uint8)}
        released_in_a = (op == F.FREE) | (op == F.MUNMAP)
        e["old_addr"][released_in_a] = e["addr"][released_in_a]
        e["addr"][released_in_a] = 0
        rows = np.flatnonzero(np.isin(op, EXT_OPS))
        if len(rows):
            x_idx = ev_idx[rows] + 1
            bad = (x_idx >= c.n) | (ops[np.minimum(x_idx, c.n - 1)] != OP_EXT)
            if bad.any():
                i = int(x_idx[bad][0])
                raise TraceError(self.path, c.offset + SLOT * (i + 1),
                                 "expected the second slot (marker 0xFF) of a two-slot event")
            x = slots[x_idx]
            old = x["ts"].astype(np.uint64) | (x["loc"].astype(np.uint64) << np.uint64(32))
            not_munmap = op[rows] != F.MUNMAP
            e["old_addr"][rows[not_munmap]] = old[not_munmap]
            e["arg"][rows] = x["a"]
            e["free_lag"][rows] = np.minimum(x["head"] >> np.uint64(8), 0xFFFFFFFF).astype(np.uint32)
        return e

    def iter_events(self, window: int = 1 << 20) -> Iterator[dict]:
        """Yields this process's events in seq order as column blocks ({field: array}), each
        covering `window` seq numbers."""
        if not self.chunks:
            return
        lo_all = min(c.seq_min for c in self.chunks)
        hi_all = max(c.seq_max for c in self.chunks)
        mins = np.array([c.seq_min for c in self.chunks])
        maxs = np.array([c.seq_max for c in self.chunks])
        cache: dict[int, dict] = {}
        for lo in range(lo_all, hi_all + 1, window):
            hi = lo + window
            parts = []
            for k in np.flatnonzero((mins < hi) & (maxs >= lo)):
                k = int(k)
                c = self.chunks[k]
                ev = cache.pop(k, None)
                if ev is None:
                    ev = self._decode_chunk(c)
                if c.seq_max >= hi:
                    cache[k] = ev           # needed again by the next window
                if c.seq_min < lo or c.seq_max >= hi:
                    keep = (ev["seq"] >= lo) & (ev["seq"] < hi)
                    ev = {name: col[keep] for name, col in ev.items()}
                parts.append(ev)
            if not parts:
                continue
            block = parts[0] if len(parts) == 1 else {
                name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
            seq = block["seq"]
            if len(seq) > 1 and not (seq[1:] > seq[:-1]).all():   # threads interleave
                order = np.argsort(seq, kind="stable")
                block = {name: col[order] for name, col in block.items()}
            if len(seq):
                yield block

    # ------------------------------------------------------------------ metadata

    def _read_mods(self) -> None:
        self.exe, self.argv, self.cwd = "", [], ""
        self.modules: list[ModuleSnapshot] = []
        mods = self.path.with_suffix(".mods")
        try:
            text = mods.read_bytes().decode("ascii", "replace")
        except OSError:
            return
        snap = None
        for lineno, line in enumerate(text.splitlines(), 1):
            try:
                if line.startswith("X "):
                    self.exe = _unhex(line[2:])
                elif line.startswith("A "):
                    self.argv = [a for a in _unhex(line[2:]).split("\0")][:-1] if line[2:] else []
                elif line.startswith("C "):
                    self.cwd = _unhex(line[2:])
                elif line.startswith("M "):
                    snap = ModuleSnapshot(int(line[2:], 16), [])
                elif line.startswith("m ") and snap is not None:
                    parts = line.split(" ")
                    path = _unhex(parts[4]) if len(parts) > 4 else ""
                    snap.modules.append(Module(path or self.exe, int(parts[1], 16),
                                               int(parts[2], 16), int(parts[3], 16)))
                elif line == "E" and snap is not None:
                    self.modules.append(snap)
                    snap = None
            except (ValueError, IndexError):
                raise TraceError(mods, None, f"line {lineno}: malformed module map line {line!r}")

    def location_table(self) -> tuple[LocationTable, np.ndarray]:
        """The merged location table and the map from raw location ids to table ids."""
        uniq: dict[tuple, int] = {(): 0}
        remap = np.zeros(max(self.locs, default=0) + 1, np.uint32)
        for raw_id, frames in sorted(self.locs.items()):
            remap[raw_id] = uniq.setdefault(frames, len(uniq))
        return LocationTable.from_lists(list(uniq)), remap

    def process(self) -> Process:
        """A Process with this file's metadata (no events, no RSS: the caller adds them)."""
        return Process(
            index=0, pid=self.pid, ppid=self.ppid, forked_from=self.forked_from,
            fork_seq=self.fork_seq, image=self.image, exe=self.exe, argv=self.argv, cwd=self.cwd,
            start_ns=self.start_mono, end_ns=self.end_mono, start_unix_ns=self.start_real,
            clean_exit=bool(self.flags & FLAG_CLEAN_EXIT), peak_rss_bytes=self.peak_rss,
            threads=self.threads, lost_events=self.lost,
            truncated=bool(self.flags & FLAG_TRUNCATED), stack_depth=self.stack_depth,
            unwind=self.unwind, mmap_recorded=bool(self.flags & FLAG_MMAP),
            modules=self.modules)


def _unhex(s: str) -> str:
    return bytes.fromhex(s.strip()).decode("utf-8", "surrogateescape")


def _tsc_ghz() -> float:
    """Nominal TSC rate, for a process too short to fit its clock pairs."""
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
