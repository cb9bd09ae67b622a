"""The native raw-file decoder (native/codec/raw_decode.c via heapcast.trace.native_raw) against the
numpy decoder it replaced, kept here as the reference: the chunk scan, each chunk's events, and
the windows of events that RawProcess.iter_events yields must be identical (same blocks, same
order, same values and types), on real recordings and on raw files built here slot by slot (time
base slots, two-slot events, location definitions, interleaved and out-of-order threads, damage)."""
from __future__ import annotations

import mmap
import os
import struct
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import assigner_table

from heapcast.recorder.session import recorder_library
from heapcast.trace import format as F
from heapcast.trace import native_raw
from heapcast.trace.format import TraceError
from heapcast.trace.raw import (CHUNK_DRAINED, CHUNK_MAGIC, CHUNK_MAX, FLAG_CLEAN_EXIT, FLAG_TSC, HEADER_SIZE, OP_EXT,
                                OP_LOC, OP_LOCX, OP_TIME, RAW_MAGIC, SLOT, SLOT_DTYPE, Chunk,
                                RawProcess, frames_key, raw_files)

_HEADER = struct.Struct("<8sIIIIiiiIQQQQQQQI")
_COUNTERS = struct.Struct("<QQQIIQ")
_CHUNK = struct.Struct("<IIIIQQ")
_SLOT = struct.Struct("<QIIQQ")
U64 = 2**64 - 1

# ---------------------------------------------------------------- the numpy reference (before C)

EXT_OPS = np.array([F.CALLOC, F.REALLOC, F.REALLOCARRAY, F.POSIX_MEMALIGN, F.ALIGNED_ALLOC,
                    F.MEMALIGN, F.VALLOC, F.PVALLOC, F.MMAP, F.MUNMAP, F.MREMAP])


def ref_scan(rp: RawProcess) -> tuple[list, dict]:
    """RawProcess._scan as numpy code: the chunks (without tsc) and the location definitions."""
    chunks, locs, seen = [], {}, set()
    off = HEADER_SIZE
    while off + SLOT <= rp.limit:
        magic, tid, size, _os_tid, tsc, mono = _CHUNK.unpack_from(rp._mm, off)
        if magic not in (CHUNK_MAGIC, CHUNK_DRAINED):
            off += 4096
            continue
        if size < 4096 or size % 4096 or size > 64 * (1 << 20) or off + size > rp.limit:
            raise TraceError(rp.path, off, f"chunk size {size} is not a multiple of 4096 "
                             f"that fits in the file ({rp.limit} bytes)")
        if magic == CHUNK_DRAINED or (tid, tsc, mono) in seen:
            off += size
            continue
        seen.add((tid, tsc, mono))
        slots = np.frombuffer(rp._mm, SLOT_DTYPE, size // SLOT - 1, off + SLOT)
        written = np.flatnonzero(slots["head"] != 0)   # zero heads are skipped, not an end
        n = int(written[-1]) + 1 if len(written) else 0
        ops = (slots["head"][:n] & 0xFF).astype(np.uint8)
        record = slots["head"][:n] != 0
        ev = (ops <= F.MREMAP) & record
        bad = ~ev & (ops < OP_LOCX) & record
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise TraceError(rp.path, off + SLOT * (i + 1), f"slot has op {ops[i]}, expected "
                             f"an operation code 0..{F.MREMAP} or a marker 0xFC..0xFF")
        seqs = slots["head"][:n][ev] >> 8
        if len(seqs):
            chunks.append((off, size, tid, n, int(seqs.min()), int(seqs.max())))
        for i in np.flatnonzero(ops == OP_LOC):
            found = ref_location_definition(rp.path, slots, int(i), n, off)
            if found:
                locs[found[0]] = found[1]
        off += size
    return chunks, locs


def ref_location_definition(path, slots, i: int, n: int, off: int):
    """(location id, frames) of the HC_LOC slot i, one slot at a time (raw.py reads them all at
    once: raw.location_definitions); None when the definition was cut short."""
    s = slots[i]
    count = int(s["ts"])
    frames = [int(s["a"]), int(s["b"])][:count]
    j = i + 1
    while len(frames) < count and j < n:
        x = slots[j]
        if int(x["head"]) & 0xFF != OP_LOCX:
            raise TraceError(path, off + SLOT * (j + 1), "expected the frames of a location "
                             "definition (marker 0xFC)")
        frames.extend([int(x["ts"]) | (int(x["loc"]) << 32), int(x["a"]), int(x["b"])])
        j += 1
    if len(frames) < count:
        return None
    return int(s["head"]) >> 8, frames_key(frames[:count])


def ref_ticks_to_ns(rp: RawProcess, ticks: np.ndarray) -> np.ndarray:
    if rp._slope == 1.0 and rp._t0 == 0:
        return ticks.astype(np.uint64)
    d = (ticks.astype(np.int64) - np.int64(rp._t0)).astype(np.float64)
    return (np.int64(rp._n0) + np.rint(d * rp._slope).astype(np.int64)).astype(np.uint64)


def ref_decode_chunk(rp: RawProcess, c: Chunk) -> dict:
    slots = np.frombuffer(rp._mm, SLOT_DTYPE, c.n, c.offset + SLOT)
    head = slots["head"]
    ops = (head & 0xFF).astype(np.uint8)
    is_event = (ops <= F.MREMAP) & (head != 0)
    if is_event.all():
        ev_idx, s, op = np.arange(c.n), slots, ops
    else:
        ev_idx = np.flatnonzero(is_event)
        s, op = slots[ev_idx], ops[ev_idx]
    tsc = _CHUNK.unpack_from(rp._mm, c.offset)[4]
    ticks = s["ts"].astype(np.uint64) + np.uint64(tsc)
    times = np.flatnonzero(ops == OP_TIME)
    if len(times):
        last = np.searchsorted(times, ev_idx) - 1
        rebased = last >= 0
        ticks[rebased] = (s["ts"][rebased].astype(np.uint64)
                          + slots["a"][times[last[rebased]]])
    n = len(ev_idx)
    e = {"seq": s["head"] >> np.uint64(8), "ts": ref_ticks_to_ns(rp, ticks), "addr": s["a"].copy(),
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
            raise TraceError(rp.path, c.offset + SLOT * (i + 1),
                             "expected the second slot (marker 0xFF) of a two-slot event")
        x = slots[x_idx]
        old = x["ts"].astype(np.uint64) | (x["loc"].astype(np.uint64) << np.uint64(32))
        not_munmap = op[rows] != F.MUNMAP
        e["old_addr"][rows[not_munmap]] = old[not_munmap]
        e["arg"][rows] = x["a"]
        e["free_lag"][rows] = np.minimum(x["head"] >> np.uint64(8), 0xFFFFFFFF).astype(np.uint32)
    return e


def ref_iter_events(rp: RawProcess, window: int = 1 << 20, remap=None):
    """RawProcess.iter_events as numpy code, with the recorder session's location remap after it."""
    if not rp.chunks:
        return
    lo_all = min(c.seq_min for c in rp.chunks)
    hi_all = max(c.seq_max for c in rp.chunks)
    mins = np.array([c.seq_min for c in rp.chunks])
    maxs = np.array([c.seq_max for c in rp.chunks])
    cache: dict[int, dict] = {}
    for lo in range(lo_all, hi_all + 1, window):
        hi = lo + window
        parts = []
        for k in np.flatnonzero((mins < hi) & (maxs >= lo)):
            k = int(k)
            c = rp.chunks[k]
            ev = cache.pop(k, None)
            if ev is None:
                ev = ref_decode_chunk(rp, c)
            if c.seq_max >= hi:
                cache[k] = ev
            if c.seq_min < lo or c.seq_max >= hi:
                keep = (ev["seq"] >= lo) & (ev["seq"] < hi)
                ev = {name: col[keep] for name, col in ev.items()}
            parts.append(ev)
        if not parts:
            continue
        block = parts[0] if len(parts) == 1 else {
            name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
        seq = block["seq"]
        if len(seq) > 1 and not (seq[1:] > seq[:-1]).all():
            order = np.argsort(seq, kind="stable")
            block = {name: col[order] for name, col in block.items()}
        if len(seq):
            if remap is not None:
                loc = block["loc"]
                known = loc < len(remap)
                block["loc"] = np.where(known, remap[np.where(known, loc, 0)], 0)
            yield block


# ---------------------------------------------------------------- comparisons


def assert_same_columns(got: dict, want: dict, what: str = "") -> None:
    assert list(got) == list(want), what
    for name in want:
        assert got[name].dtype == want[name].dtype, f"{what} {name}"
        np.testing.assert_array_equal(got[name], want[name], err_msg=f"{what} {name}")


def outcome(fn):
    """fn()'s result, or its exception as (type, message, offset)."""
    try:
        return "ok", fn()
    except (TraceError, ValueError) as e:
        return "error", (type(e), str(e), getattr(e, "offset", None))


def compare_process(path, windows=(1 << 20, 1000, 37, 1), max_windows=200_000) -> int:
    """Checks a raw file's scan, chunk decoding and windows against the reference; returns the
    number of events."""
    state, rp = outcome(lambda: RawProcess(path))
    if state == "error":
        # the reference fails in the same way on the same file (the header must then be readable)
        ref = RawProcess.__new__(RawProcess)
        ref.path = path
        ref._file = open(path, "rb")
        try:
            ref._mm = mmap.mmap(ref._file.fileno(), 0, access=mmap.ACCESS_READ)
            ref._parse_header(os.fstat(ref._file.fileno()).st_size)
            assert outcome(lambda: ref_scan(ref)) == (state, rp)
        finally:
            ref._mm.close()
            ref._file.close()
        return 0
    try:
        chunks, locs = ref_scan(rp)
        assert [(c.offset, c.size, c.tid, c.n, c.seq_min, c.seq_max) for c in rp.chunks] == chunks
        assert rp.locs == locs
        for c in rp.chunks:
            assert c.tsc == _CHUNK.unpack_from(rp._mm, c.offset)[4]
            got, want = outcome(lambda: rp._decode_chunk(c)), outcome(lambda: ref_decode_chunk(rp, c))
            if got[0] == "ok" and want[0] == "ok":
                assert_same_columns(got[1], want[1], f"chunk at {c.offset}")
            else:
                assert got == want
        _, remap = rp.location_table()
        events = 0
        span = max((c.seq_max for c in rp.chunks), default=0) - min(
            (c.seq_min for c in rp.chunks), default=0)
        for window in windows:
            if span // window > max_windows:
                continue   # the reference would loop over too many windows
            for rm in (None, remap):
                got = outcome(lambda: list(rp.iter_events(window, remap=rm)))
                want = outcome(lambda: list(ref_iter_events(rp, window, remap=rm)))
                if got[0] == "ok" and want[0] == "ok":
                    assert len(got[1]) == len(want[1]), f"window {window}"
                    for k, (g, w) in enumerate(zip(got[1], want[1])):
                        assert_same_columns(g, w, f"window {window} block {k}")
                    events = sum(len(b["seq"]) for b in got[1])
                else:
                    assert got == want
    finally:
        rp.close()
    return events


# ---------------------------------------------------------------- raw files built slot by slot


class RawBuilder:
    """Builds a raw file: chunks of slots, written in the order they are added."""

    def __init__(self, tsc=True, start_tsc=10**12, start_mono=5 * 10**9, end=True):
        self.flags = (FLAG_TSC if tsc else 0) | (FLAG_CLEAN_EXIT if end else 0)
        self.start_tsc, self.start_mono = (start_tsc, start_mono) if tsc else (0, start_mono)
        self.end = end
        self.body = bytearray()
        self.seq = 0
        self.last_pair = (self.start_tsc, self.start_mono)

    def chunk(self, tid, slots, size=None, tsc=None, mono=None, magic=CHUNK_MAGIC):
        """slots: (head, ts, loc, a, b) tuples; the rest of the chunk stays zero."""
        size = size or 4096 * -(-(len(slots) + 1) * SLOT // 4096)
        if tsc is None:
            tsc = self.last_pair[0] + 3_000_000
            mono = self.last_pair[1] + 1_000_000
        self.last_pair = (tsc, mono)
        data = bytearray(size)
        _CHUNK.pack_into(data, 0, magic, tid, size, 1000 + tid, tsc, mono)
        for i, s in enumerate(slots[:size // SLOT - 1]):
            _SLOT.pack_into(data, SLOT * (i + 1), *s)
        self.body += data

    def write(self, path, truncate=None, file_end=None):
        end_tsc, end_mono = (self.last_pair[0] + 10**6, self.last_pair[1] + 333_333) \
            if self.end else (0, 0)
        head = bytearray(HEADER_SIZE)
        _HEADER.pack_into(head, 0, RAW_MAGIC, 1, HEADER_SIZE, SLOT, 4, 4242, 1, 0, 0, 0,
                          self.start_mono, 1_700_000_000 * 10**9, self.start_tsc, end_mono, end_tsc,
                          1 << 20, 0)
        struct.pack_into("<Q", head, 128, self.seq)
        data = head + self.body
        _COUNTERS.pack_into(data, 192, file_end if file_end is not None else len(data),
                            len(data), 0, 8, self.flags, 100)
        if truncate is not None:
            data = data[:truncate]
        path.write_bytes(bytes(data))
        return path


def ev(seq, op, ts=0, loc=0, a=0, b=0):
    assert seq or op, "a zero head is not a record"
    return ((seq << 8) | op, ts, loc, a, b)


def ext(old=0, arg=0, lag=0):
    return ((lag << 8) | OP_EXT, old & 0xFFFFFFFF, old >> 32, arg, 0)


def pick(rng, values):
    return values[int(rng.integers(len(values)))]


def random_raw(rng, path, threads=4, events=3000, tsc=True, disorder=False, gaps=False):
    """A raw file of random events of every kind, in per-thread chunks of random sizes, with
    location definitions, time base slots and unused pages among them. `gaps`: seq numbers that
    no event took among them (a realloc's second, lost events)."""
    b = RawBuilder(tsc=tsc, end=bool(rng.integers(2)))
    owner = rng.integers(0, threads, events)
    seqs = np.arange(events, dtype=np.uint64) + int(rng.integers(0, 1 << 30))
    if gaps:   # runs of missing seqs, short and long
        seqs += np.cumsum(rng.choice([0, 0, 0, 1, 5, 70], events)).astype(np.uint64)
    if disorder:   # out-of-order and repeated seq numbers within a thread
        swap = rng.integers(0, events, events // 20)
        seqs[swap] = seqs[rng.integers(0, events, len(swap))]
    b.seq = int(seqs.max()) + 1
    streams = {t: [] for t in range(threads)}
    next_loc = 1
    for i in range(events):
        t = int(owner[i])
        out = streams[t]
        if rng.random() < 0.05:   # a location definition, with more frames in HC_LOCX slots
            count = int(rng.integers(0, 9))
            out.append((next_loc << 8 | OP_LOC, count, 0, int(rng.integers(1 << 40)),
                        int(rng.integers(1 << 40))))
            for _ in range(max(0, -(-(count - 2) // 3))):
                out.append((OP_LOCX, *(int(v) for v in rng.integers(0, 1 << 32, 2)),
                            int(rng.integers(1 << 62)), int(rng.integers(1 << 62))))
            next_loc += 1
        if rng.random() < 0.03:   # a new time base
            out.append((OP_TIME, 0, 0, int(rng.integers(0, 1 << 50)), 0))
        op = int(rng.integers(0, F.MREMAP + 1))
        slot = ev(int(seqs[i]), op, int(rng.integers(0, 1 << 32)),
                  int(rng.integers(0, next_loc + 3)), int(rng.integers(0, 1 << 48)),
                  pick(rng, [0, 1, 4096, U64, int(rng.integers(1 << 40))]))
        out.append(slot)
        if op not in (F.MALLOC, F.FREE):
            out.append(ext(int(rng.integers(0, 1 << 64, dtype=np.uint64)),
                           int(rng.integers(0, 1 << 64, dtype=np.uint64)),
                           pick(rng, [0, 1, 2**32 - 1, 2**32, 2**56 - 1])))
    # chunk the streams (a two-slot event may not straddle two chunks) and interleave them
    pending = {t: list(s) for t, s in streams.items()}
    while any(pending.values()):
        t = pick(rng, [t for t, s in pending.items() if s])
        size = 4096 * pick(rng, [1, 1, 2, 3])
        cap = size // SLOT - 1
        take = min(len(pending[t]), int(rng.integers(1, cap + 1)))
        if take < len(pending[t]) and pending[t][take][0] & 0xFF == OP_EXT:
            take = take - 1 or 2
        if rng.random() < 0.05:
            b.body += bytes(4096)   # a page claimed by a thread killed before its header
        b.chunk(t, pending[t][:take], size=size)
        pending[t] = pending[t][take:]
    return b.write(path)


def _mapped_rss_kb(path) -> int:
    """The resident kB of this process's mappings of `path` (/proc/self/smaps)."""
    rss, inside = 0, False
    for line in open("/proc/self/smaps"):
        if line[:1] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
            inside = line.rstrip("\n").endswith(" " + str(path))
        elif inside and line.startswith("Rss:"):
            rss += int(line.split()[1])
    return rss


def test_a_raw_file_read_through_leaves_none_of_its_pages_mapped(tmp_path):
    """RawProcess lets go of the pages it has read (MADV_DONTNEED): they are page cache that the
    program wrote, but mapped in the converting process they counted in `heapcast record`'s
    RSS, up to the whole raw file's size; read again, they come back from the cache."""
    path = random_raw(np.random.default_rng(3), tmp_path / "1.raw", events=60_000)
    rp = RawProcess(path)
    try:
        assert path.stat().st_size > 1 << 20 and _mapped_rss_kb(path) <= 64
        n = sum(len(b["seq"]) for b in rp.iter_events(window=4096))
        assert n > 50_000 and _mapped_rss_kb(path) <= 64, _mapped_rss_kb(path)
        again = sum(len(b["seq"]) for b in rp.iter_events(window=1 << 20))
        assert again == n
    finally:
        rp.close()


@pytest.mark.parametrize("seed", range(12))
def test_random_raw_files_decode_as_the_reference(tmp_path, seed):
    rng = np.random.default_rng(seed)
    path = random_raw(rng, tmp_path / "1.raw", threads=1 + seed % 5, events=500 + 300 * seed,
                      tsc=seed % 3 != 0, disorder=seed % 4 == 3)
    assert compare_process(path, windows=(1 << 20, 1000, 37) + ((1,) if seed < 3 else ())) > 0


@pytest.mark.parametrize("seed", range(6))
def test_interleaved_threads_with_unused_seq_numbers_decode_as_the_reference(tmp_path, seed):
    """Windows of interleaved threads whose seqs have gaps: each event goes straight to its
    seq's row, then the rows move down over the gaps (raw_decode.c, decode_direct)."""
    rng = np.random.default_rng(100 + seed)
    path = random_raw(rng, tmp_path / "1.raw", threads=2 + seed % 4, events=2000 + 500 * seed,
                      tsc=seed % 2 == 0, gaps=True)
    assert compare_process(path, windows=(1 << 20, 4096, 1000, 64, 37, 1)) > 0


def test_time_base_slots_move_the_time_of_the_events_after_them(tmp_path):
    b = RawBuilder(tsc=False, start_mono=0)
    b.chunk(0, [ev(1, F.MALLOC, ts=5, a=0x1000, b=8),
                (OP_TIME, 0, 0, 1 << 40, 0),
                ev(2, F.FREE, ts=7, a=0x1000),
                (OP_TIME, 0, 0, 1 << 41, 0),
                (OP_TIME, 0, 0, 1 << 42, 0),
                ev(3, F.CALLOC, ts=9, a=0x2000, b=30), ext(arg=3)], tsc=100, mono=0)
    b.seq = 4
    path = b.write(tmp_path / "1.raw")
    compare_process(path)
    rp = RawProcess(path)
    block, = rp.iter_events()
    assert block["ts"].tolist() == [105, (1 << 40) + 7, (1 << 42) + 9]
    assert block["old_addr"].tolist() == [0, 0x1000, 0] and block["addr"].tolist() == [0x1000, 0, 0x2000]
    assert block["arg"].tolist() == [0, 0, 3]
    rp.close()


def test_a_chunk_in_seq_order_is_read_from_where_the_last_window_stopped(tmp_path):
    """An ordered chunk's cursor: each window starts where the one before stopped, with the time
    base in force there; a window below the cursor (a table given again from an earlier window)
    reads the chunk from its start, and a chunk whose events are not in seq order never uses it."""
    b = RawBuilder(tsc=False, start_mono=0)
    b.chunk(0, [ev(1, F.MALLOC, ts=1, a=0x1000, b=8), ev(2, F.MALLOC, ts=2, a=0x2000, b=8),
                (OP_TIME, 0, 0, 1 << 40, 0),
                ev(3, F.FREE, ts=3, a=0x1000), ev(4, F.CALLOC, ts=4, a=0x3000, b=8), ext(arg=1),
                ev(6, F.FREE, ts=6, a=0x2000)], tsc=100, mono=0)
    b.chunk(1, [ev(7, F.MALLOC, ts=7, a=0x4000, b=8), ev(5, F.MALLOC, ts=5, a=0x5000, b=8)],
            tsc=200, mono=0)
    b.seq = 8
    path = b.write(tmp_path / "1.raw")
    rp = RawProcess(path)
    assert [c.ordered for c in rp.chunks] == [True, False]
    table = native_raw.chunk_table(rp.chunks)
    buf = rp._buffer()
    mapping = buf.ctypes.data, len(buf)

    def window(lo, hi):
        got = native_raw.decode_window(*mapping, table, rp._clock(), lo, hi)
        return got["seq"].tolist(), got["ts"].tolist()

    assert window(1, 3) == ([1, 2], [101, 102])
    assert table["next_slot"].tolist() == [3, 0] and table["next_seq"].tolist() == [3, 0]
    assert table["next_tsc"][0] == 1 << 40   # the time base slot before the cursor
    assert window(3, 6) == ([3, 4, 5], [(1 << 40) + 3, (1 << 40) + 4, 205])
    assert table["next_slot"].tolist() == [6, 0]
    assert window(1, 8) == ([1, 2, 3, 4, 5, 6, 7],   # below the cursor: from the start
                            [101, 102, (1 << 40) + 3, (1 << 40) + 4, 205, (1 << 40) + 6, 207])
    assert table["next_slot"].tolist() == [7, 0] and table["next_seq"].tolist() == [8, 0]
    assert window(8, 9) == ([], [])
    del buf
    compare_process(path, windows=(1 << 20, 3, 2, 1))
    rp.close()


def test_two_slot_events(tmp_path):
    b = RawBuilder()
    b.chunk(3, [ev(1, F.REALLOC, a=0x2000, b=64), ext(old=0x1234_5678_9abc, arg=0, lag=2**40),
                ev(2, F.MUNMAP, a=0x7000, b=4096), ext(old=0x5555, arg=1, lag=7),
                ev(3, F.MREMAP, a=0x9000, b=8192), ext(old=0x7000_0000_0000, arg=4096, lag=3),
                ev(4, F.MMAP, a=0xa000, b=4096), ext(old=0, arg=3 << 32 | 0x22)])
    b.seq = 5
    path = b.write(tmp_path / "1.raw")
    compare_process(path)
    rp = RawProcess(path)
    block, = rp.iter_events()
    assert block["old_addr"].tolist() == [0x1234_5678_9abc, 0x7000, 0x7000_0000_0000, 0]
    assert block["addr"].tolist() == [0x2000, 0, 0x9000, 0xa000]
    assert block["free_lag"].tolist() == [2**32 - 1, 7, 3, 0]
    assert block["arg"].tolist() == [0, 1, 4096, 3 << 32 | 0x22]
    assert block["tid"].tolist() == [3] * 4 and block["flags"].tolist() == [0] * 4
    rp.close()


@pytest.mark.parametrize("where", ["end of chunk", "other marker", "event"])
def test_missing_second_slot_is_reported_at_its_offset(tmp_path, where):
    b = RawBuilder()
    b.chunk(0, [ev(1, F.MALLOC), ev(2, F.MALLOC)])
    tail = {"end of chunk": [], "other marker": [(OP_TIME, 0, 0, 5, 0)],
            "event": [ev(3, F.MALLOC)]}[where]
    b.chunk(1, [ev(4, F.CALLOC, b=10), *tail])
    b.seq = 4
    path = b.write(tmp_path / "1.raw")
    compare_process(path)
    rp = RawProcess(path)
    with pytest.raises(TraceError, match="second slot") as e:
        list(rp.iter_events())
    assert e.value.offset == HEADER_SIZE + 4096 + 2 * SLOT
    rp.close()
    rp = RawProcess(path)
    with pytest.raises(TraceError, match="second slot") as e2:
        rp._decode_chunk(rp.chunks[1])
    assert str(e2.value) == str(e.value)
    rp.close()


def test_bad_op_is_reported_at_its_offset(tmp_path):
    b = RawBuilder()
    b.chunk(0, [ev(1, F.MALLOC), ev(2, F.MALLOC), ev(3, 0x80)])
    path = b.write(tmp_path / "1.raw")
    compare_process(path)
    with pytest.raises(TraceError, match="slot has op 128, expected") as e:
        RawProcess(path)
    assert e.value.offset == HEADER_SIZE + 3 * SLOT


def test_threads_interleave_and_repeat_seq_numbers(tmp_path):
    """Rows of equal seq keep their order (chunk, then slot): a stable sort."""
    b = RawBuilder()
    b.chunk(0, [ev(s, F.MALLOC, a=0x100 + s) for s in (2, 4, 6, 8, 9)])
    b.chunk(1, [ev(s, F.MALLOC, a=0x200 + s) for s in (1, 3, 5, 7, 9, 4)])
    b.chunk(2, [ev(s, F.FREE, a=0x300 + s) for s in (10, 5, 12)])
    b.seq = 13
    path = b.write(tmp_path / "1.raw")
    compare_process(path, windows=(1 << 20, 5, 4, 3, 2, 1))
    rp = RawProcess(path)
    block, = rp.iter_events()
    assert block["seq"].tolist() == [1, 2, 3, 4, 4, 5, 5, 6, 7, 8, 9, 9, 10, 12]
    assert block["tid"].tolist() == [1, 0, 1, 0, 1, 1, 2, 0, 1, 0, 0, 1, 2, 2]
    rp.close()


def test_far_apart_seq_numbers_skip_the_empty_windows(tmp_path):
    b = RawBuilder()
    b.chunk(0, [ev(1, F.MALLOC), ev(2, F.MALLOC)])
    b.chunk(1, [ev(2**55, F.MALLOC), ev(2**55 + 5, F.MALLOC)])
    path = b.write(tmp_path / "1.raw")
    rp = RawProcess(path)
    assert [b["seq"].tolist() for b in rp.iter_events(1000)] == [[1, 2], [2**55, 2**55 + 5]]
    # windows start at 1 + k * 3: 2**55 - 2 is one of them (2**55 = 2 mod 3)
    assert [b["seq"].tolist() for b in rp.iter_events(3)] == [[1, 2], [2**55], [2**55 + 5]]
    rp.close()


def test_damaged_and_truncated_files(tmp_path):
    """Flipped bytes and cut files: the same blocks, or the same error, as the reference."""
    rng = np.random.default_rng(7)
    path = random_raw(rng, tmp_path / "base.raw", threads=3, events=1500)
    data = path.read_bytes()
    for trial in range(60):
        d = bytearray(data)
        if trial % 3 == 0:
            d = d[:int(rng.integers(HEADER_SIZE, len(d)))]
        else:
            for pos in rng.integers(HEADER_SIZE, len(d), int(rng.integers(1, 20))):
                d[pos] = int(rng.integers(256))
        p = tmp_path / f"{trial}.raw"
        p.write_bytes(bytes(d))
        compare_process(p, windows=(1 << 20, 333), max_windows=10_000)


def test_the_file_can_be_closed_between_blocks(tmp_path):
    """No block holds the file's mapping: closing it while blocks are out is fine, and asking
    for the next block then is an error, not a crash."""
    b = RawBuilder()
    b.chunk(0, [ev(s, F.MALLOC, a=0x100 + s) for s in range(1, 11)])
    rp = RawProcess(b.write(tmp_path / "1.raw"))
    blocks = rp.iter_events(4)
    first = next(blocks)
    rp.close()
    assert first["seq"].tolist() == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="is closed"):
        next(blocks)


def test_block_memory_is_reused_only_when_no_view_of_it_is_left(tmp_path, monkeypatch):
    """iter_events reuses a block's memory once nothing refers to it: blocks taken one at a
    time and dropped, or kept whole, or only through views derived from them, stay intact."""
    monkeypatch.setattr(native_raw, "SHARED", native_raw.Buffers())   # none taken by other tests
    rng = np.random.default_rng(3)
    path = random_raw(rng, tmp_path / "1.raw", threads=3, events=4000)
    rp = RawProcess(path)
    want = [{k: v.copy() for k, v in b.items()} for b in ref_iter_events(rp, 300)]
    assert len(want) > 10
    memories = set()
    for k, block in enumerate(rp.iter_events(300)):   # dropped at once: reused
        assert_same_columns(block, want[k], f"block {k}")
        memories.add(id(block["seq"].base))
    assert len(memories) <= 4 < len(want)   # Buffers keeps 4 sets
    kept, derived = [], []
    for k, block in enumerate(rp.iter_events(300)):
        if k % 3 == 0:
            kept.append((k, block))
        elif k % 3 == 1:
            derived.append((k, block["ts"][1:].view(np.int64), block["op"][::2]))
    for k, block in kept:
        assert_same_columns(block, want[k], f"kept block {k}")
    for k, ts, op in derived:
        np.testing.assert_array_equal(ts, want[k]["ts"][1:].view(np.int64))
        np.testing.assert_array_equal(op, want[k]["op"][::2])
    rp.close()


def test_a_conversion_decodes_every_window_into_one_set_of_columns(tmp_path, monkeypatch):
    """finalize encodes each window before it decodes the next (the trace writer encodes in the
    caller's thread), so one set of decoded columns serves every window: the memory that the
    kernel zeroes once per recording stays one window's. The trace is the events, exactly."""
    import heapcast
    from heapcast.recorder import live
    from heapcast.recorder.session import finalize
    monkeypatch.setattr(native_raw, "SHARED", native_raw.Buffers())   # none taken by other tests
    monkeypatch.setattr(live, "WINDOW", 250)   # every window overlaps 3 chunks of 100 events
    b = RawBuilder()
    slots = [ev(s, F.MALLOC if s % 2 else F.FREE, ts=s, a=0x1000 + 16 * (s // 2), b=s)
             for s in range(1, 4001)]
    for k in range(0, len(slots), 100):
        b.chunk(0, slots[k:k + 100])
    b.seq = len(slots) + 1
    path = b.write(tmp_path / "4242.raw")
    want = [{k: v.copy() for k, v in w.items()} for w in ref_iter_events(RawProcess(path), 250)]
    finalize(tmp_path)
    assert len(native_raw.SHARED.sets) == 1
    events = heapcast.load(tmp_path).processes[0].events
    assert len(events) == 4000
    for name in ("seq", "op", "addr", "size"):
        np.testing.assert_array_equal(events[name], np.concatenate([w[name] for w in want]))


def test_threads_never_share_a_set_of_block_memory(tmp_path, monkeypatch):
    """The decoding memory is shared by the process's threads (the converter's, then the main
    thread's): two threads reading at once never get the same set of columns."""
    monkeypatch.setattr(native_raw, "SHARED", native_raw.Buffers(keep=2))
    rng = np.random.default_rng(5)
    path = random_raw(rng, tmp_path / "1.raw", threads=3, events=6000)
    rps = [RawProcess(path) for _ in range(3)]
    want = [{k: v.copy() for k, v in b.items()} for b in ref_iter_events(rps[0], 200)]
    start = threading.Barrier(3)

    def read(rp):
        start.wait()
        got = []
        for block in rp.iter_events(200):
            got.append({k: v.copy() for k, v in block.items()})
            time.sleep(0)   # let the others decode into whatever they were given meanwhile
        return got

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(read, rps))
    for got in results:
        assert len(got) == len(want)
        for k, (g, w) in enumerate(zip(got, want)):
            assert_same_columns(g, w, f"block {k}")
    for rp in rps:
        rp.close()


def test_chunks_outside_the_mapping_are_refused():
    buf = np.zeros(HEADER_SIZE + 4096, np.uint8)
    mapping = buf.ctypes.data, len(buf)
    assert native_raw.scan_chunk(*mapping, HEADER_SIZE, 4096)[0] == 0
    with pytest.raises(native_raw.NativeError):
        native_raw.scan_chunk(*mapping, HEADER_SIZE + 4096, 4096)
    chunk = np.zeros(1, native_raw.CHUNK_DTYPE)
    chunk["offset"], chunk["size"], chunk["n"] = HEADER_SIZE, 4096, 128   # one slot too many
    clock = native_raw.Clock(1.0, 0, 0, 1, 0)
    with pytest.raises(native_raw.NativeError):
        native_raw.decode_chunk(*mapping, chunk, clock)
    with pytest.raises(native_raw.NativeError):
        native_raw.decode_window(*mapping, chunk, clock, 0, 10)
    chunk["n"] = 127   # the slots it is told to read: all zero heads, so no event
    assert native_raw.decode_window(*mapping, chunk, clock, 0, 10)["seq"].tolist() == []


def test_records_after_an_unwritten_slot_are_read(tmp_path):
    """A signal handler's records after the slot of the event it interrupted, which a SIGKILL
    left unwritten: the zero head is skipped, the records after it are read."""
    hole = (0, 0, 0, 0, 0)
    b = RawBuilder()
    b.chunk(0, [ev(1, F.MALLOC, a=0x1000, b=8), hole, ev(3, F.MALLOC, a=0x2000, b=16),
                ev(4, F.FREE, a=0x2000), hole, hole, ev(5, F.CALLOC, a=0x3000, b=6), ext(arg=2)])
    b.seq = 6
    path = b.write(tmp_path / "1.raw")
    compare_process(path)
    rp = RawProcess(path)
    c, = rp.chunks
    assert c.n == 8 and (c.seq_min, c.seq_max) == (1, 5)
    block, = rp.iter_events()
    assert block["seq"].tolist() == [1, 3, 4, 5] and block["arg"].tolist() == [0, 0, 0, 2]
    rp.close()


def test_drained_and_duplicated_chunks_are_read_once(tmp_path):
    """A recycled chunk (marked drained) is skipped; a chunk the drainer copied but had not yet
    marked (same tid, tsc and mono_ns twice) is read once."""
    b = RawBuilder()
    b.chunk(0, [ev(1, F.MALLOC, a=0x1000, b=8)], tsc=10**12 + 5, mono=6 * 10**9,
            magic=CHUNK_DRAINED)
    b.chunk(0, [ev(2, F.MALLOC, a=0x2000, b=8)], tsc=10**12 + 9, mono=6 * 10**9 + 4)
    b.chunk(0, [ev(1, F.MALLOC, a=0x1000, b=8)], tsc=10**12 + 5, mono=6 * 10**9)   # the copy
    b.chunk(0, [ev(2, F.MALLOC, a=0x2000, b=8)], tsc=10**12 + 9, mono=6 * 10**9 + 4)
    b.seq = 3
    path = b.write(tmp_path / "1.raw")
    compare_process(path)
    rp = RawProcess(path)
    block, = rp.iter_events()
    assert block["seq"].tolist() == [1, 2] and block["addr"].tolist() == [0x1000, 0x2000]
    rp.close()


# ---------------------------------------------------------------- real recordings


def record_raw(directory, cmd, **env):
    """Runs cmd under the recorder, leaving the raw files (not finalized)."""
    directory.mkdir()
    env = {**os.environ, "LD_PRELOAD": str(recorder_library()), "HEAPCAST_DIR": str(directory),
           **{k: str(v) for k, v in env.items()}}
    subprocess.run([str(c) for c in cmd], env=env, capture_output=True, timeout=120)
    raws = raw_files(directory)
    assert raws
    return raws


def test_the_first_clock_pair_lies_on_the_line_of_the_chunks_pairs(build, tmp_path):
    """The process's first (ticks, ns) pair anchors the conversion of ticks to ns (fit_clock).
    The first clock_gettime of a process maps the vDSO's data page: read for the pair, its ns
    came about 7 us late on the development VM, which tilted the fitted slope (by 7.6e-5 over
    the first 100 ms of ring.c). Against the line through the chunks' own pairs it now lies
    within 3 us."""
    raw, = record_raw(tmp_path / "raw", [build("phases"), "1", "60", "3000", "20000"])
    rp = RawProcess(raw)
    with open(raw, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
        pairs = np.array(sorted({struct.unpack_from("<QQ", mm, c.offset + 16)
                                 for c in rp.chunks}), np.float64)
    rp.close()
    assert len(pairs) >= 8 and pairs[-1, 1] - pairs[0, 1] > 1e6
    # the chunks' line, fitted robustly (a pair whose thread was preempted between its two
    # reads is an outlier): the median of the pairwise slopes, then of the offsets
    t, n = pairs[:, 0] - rp.start_tsc, pairs[:, 1] - rp.start_mono
    i, j = np.triu_indices(len(t), 1)
    apart = t[j] - t[i] > 1e5
    slope = np.median((n[j] - n[i])[apart] / (t[j] - t[i])[apart])
    offset = np.median(n - slope * t)
    assert abs(offset) < 3000, f"the first pair lies {offset:.0f} ns off the chunks' line"


def test_the_scan_passes_holes_by_without_reading_them(build, tmp_path, monkeypatch):
    """A copy that `record`'s converter punched out is a hole: the scan finds the file's holes
    first (SEEK_HOLE) and reads no chunk header inside one through its mapping, where each
    read faulted in pages of zeros with readahead (12 ms of py_dicts' tail). The same chunks and
    events as a file with zeros written in the hole's place."""
    import shutil
    from heapcast.recorder.checkpoint import punch
    from heapcast.trace import raw as raw_module
    raw, = record_raw(tmp_path / "raw", [build("phases"), "1", "60", "3000", "20000"])
    holed, zeroed = tmp_path / "holed.raw", tmp_path / "zeroed.raw"
    shutil.copyfile(raw, zeroed)
    rp = RawProcess(raw)
    victim = [c for c in rp.chunks if c.size == CHUNK_MAX][2]
    rp.close()
    with open(zeroed, "r+b") as f:   # its content, as a claimed chunk never written
        f.seek(victim.offset)
        f.write(bytes(CHUNK_MAX))
    shutil.copyfile(zeroed, holed)
    fd = os.open(holed, os.O_RDWR)
    try:
        assert punch(fd, victim.offset, CHUNK_MAX)   # as the converter frees a copy
    finally:
        os.close(fd)
    real, read = raw_module._CHUNK, []

    class Spy:   # the chunk headers the scan reads, by offset
        size = real.size

        def unpack_from(self, buffer, offset=0):
            read.append(offset)
            return real.unpack_from(buffer, offset)

    monkeypatch.setattr(raw_module, "_CHUNK", Spy())
    a = RawProcess(holed)
    in_hole = [o for o in read if victim.offset <= o < victim.offset + CHUNK_MAX]
    read.clear()
    b = RawProcess(zeroed)
    try:
        assert a._holes() == [(victim.offset, victim.offset + CHUNK_MAX)] and b._holes() == []
        assert not in_hole, f"the scan read {len(in_hole)} headers in the hole"
        assert victim.offset in read   # (the zeroed file's chunk is read, and passed by)
        assert a.chunks == b.chunks and victim.offset not in {c.offset for c in a.chunks}
        blocks = [list(rp.iter_events()) for rp in (a, b)]
        assert len(blocks[0]) == len(blocks[1]) and sum(len(x["seq"]) for x in blocks[0]) > 0
        for x, y in zip(*blocks):
            assert x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
    finally:
        a.close()
        b.close()


def test_chunks_scanned_on_two_threads_read_as_scanned_one_by_one(build, tmp_path, monkeypatch):
    """scan_chunks splits a file's chunks between threads in parts of about the same bytes: the
    results are scan_chunk's, chunk by chunk, in order, and RawProcess finds the same chunks
    with one thread or two."""
    raw, = record_raw(tmp_path / "raw", [build("phases"), "3", "4", "20000", "0"])
    one = RawProcess(raw)
    try:
        offsets = np.array([c.offset for c in one.chunks], np.uint64)
        sizes = np.array([c.size for c in one.chunks], np.uint64)
        assert len(offsets) >= 20 and len(set(sizes.tolist())) > 3
        buf = one._buffer()
        mapping = buf.ctypes.data, len(buf)
        started = []
        real_thread = native_raw.threading.Thread

        def thread(*args, **kwargs):
            started.append(kwargs.get("args"))
            return real_thread(*args, **kwargs)

        monkeypatch.setattr(native_raw.threading, "Thread", thread)
        got = native_raw.scan_chunks(*mapping, offsets, sizes, threads=2)
        assert len(started) == 1 and 0 < started[0][0] < len(offsets)   # two non-empty parts
        for row, off, size in zip(got.tolist(), offsets.tolist(), sizes.tolist()):
            n, events, lo, hi, locs, bad, ordered = native_raw.scan_chunk(*mapping, off, size)
            assert row == [n, events, lo, hi, locs, 2**64 - 1 if bad is None else bad,
                           int(ordered)]
        assert native_raw.scan_chunks(*mapping, offsets[:0], sizes[:0]).shape == (0, 7)
        del buf
        monkeypatch.setattr(native_raw, "PARALLEL_SCAN", 10**9)   # one thread
        started.clear()
        alone = RawProcess(raw)
        assert not started and alone.chunks == one.chunks and alone.locs == one.locs
        alone.close()
        with pytest.raises(native_raw.NativeError):   # a chunk past the end of the mapping
            native_raw.scan_chunks(*mapping, np.append(offsets, mapping[1]),
                                   np.append(sizes, 4096), threads=1)
    finally:
        one.close()


@pytest.mark.parametrize("program, env, windows", [
    ("ops", {"HEAPCAST_STACKS": 3}, (1 << 20, 1000, 61, 1)),
    ("threads", {}, (1 << 20, 4096, 1000)),            # 16 threads: interleaved chunks
    ("threads", {"HEAPCAST_STACKS": 12}, (1 << 20, 777)),
    ("fork", {"HEAPCAST_STACKS": 5, "HEAPCAST_MMAP": 1}, (1 << 20, 61, 1)),
    ("signal", {}, (1 << 20, 100_000)),  # 2M events; a handler's event may precede in its chunk
])
def test_recordings_decode_as_the_reference(build, tmp_path, program, env, windows):
    events = 0
    for raw in record_raw(tmp_path / "raw", [build(program)], **env):
        events += compare_process(raw, windows=windows)
    assert events > 0


def test_finalize_writes_the_events_the_reference_decodes(build, tmp_path):
    """Through recording.finalize: the .hct holds exactly the reference's events, remapped."""
    import heapcast
    from heapcast.recorder.session import finalize
    raws = record_raw(tmp_path / "t", [build("threads")], HEAPCAST_STACKS=4)
    want = {}
    for raw in raws:
        rp = RawProcess(raw)
        _, remap = rp.location_table()
        blocks = list(ref_iter_events(rp, remap=remap))
        want[rp.pid] = {name: np.concatenate([b[name] for b in blocks]) for name in blocks[0]}
        rp.close()
    finalize(tmp_path / "t", progress=False)
    for proc in heapcast.load(tmp_path / "t").processes:
        got = proc.events
        for name, col in want[proc.pid].items():
            np.testing.assert_array_equal(got[name], col, err_msg=name)


@pytest.mark.parametrize("few", [16, 0])
def test_location_definitions_read_at_once_and_stop_at_one_cut_short(few, monkeypatch):
    """raw.location_definitions, against the one-slot-at-a-time reference: every definition
    before the one that is cut short, where a later read (start=) resumes; both ways (one by
    one for a few definitions, vectorized for more)."""
    from heapcast.trace import raw
    from heapcast.trace.raw import location_definitions
    monkeypatch.setattr(raw, "FEW_DEFINITIONS", few)
    slots = np.zeros(9, SLOT_DTYPE)

    def head(i, loc_id, count, a, b):
        slots[i]["head"], slots[i]["ts"], slots[i]["a"], slots[i]["b"] = \
            (loc_id << 8) | OP_LOC, count, a, b

    def extra(i, f0, a, b):
        slots[i]["head"], slots[i]["ts"], slots[i]["loc"] = OP_LOCX, f0 & 0xFFFFFFFF, f0 >> 32
        slots[i]["a"], slots[i]["b"] = a, b

    head(0, 7, 1, 0x1000, 0)                      # one frame
    head(1, 8, 4, 0x11, 0x12)                     # 4 frames: 2 + one HC_LOCX slot
    extra(2, (5 << 32) | 0x13, 0x14, 0x15)
    head(4, 9, 2, 0x21, 0x22)                     # slot 3 is an event (ignored)
    slots[3]["head"] = (42 << 8) | F.MALLOC
    head(5, 10, 9, 0x31, 0x32)                    # 9 frames need 3 HC_LOCX slots: 2 written
    extra(6, 0x33, 0x34, 0x35)
    extra(7, 0x36, 0x37, 0x38)
    defs, stop = location_definitions("f", slots[:8], 0)
    assert defs == {7: frames_key([0x1000]), 8: frames_key([0x11, 0x12, (5 << 32) | 0x13, 0x14]),
                    9: frames_key([0x21, 0x22])}
    assert stop == 5
    for i in (0, 1, 4):
        assert ref_location_definition("f", slots[:8], i, 8, 0)[1] == defs[slots[i]["head"] >> 8]
    extra(8, 0x39, 0x3A, 0x3B)
    defs, stop = location_definitions("f", slots, 0, start=5)
    assert defs == {10: frames_key(range(0x31, 0x3A))} and stop == 9
    slots[7]["head"] = F.MALLOC                   # not an HC_LOCX slot where one must be
    with pytest.raises(TraceError, match="marker 0xFC"):
        location_definitions("f", slots, 64)


def test_python_frames_that_no_thread_defined_twice_leave_the_table_as_it_is():
    """One thread of one process defined each (file, function, line) once: no id moves, and the
    frames are left as they are (no pass over them after the program's exit)."""
    from heapcast.trace.model import PY_FRAME_TAG as TAG, LocationTable, PyFrame
    rp = RawProcess.__new__(RawProcess)
    rp._canon = None
    rp.python_frames = {0: PyFrame("x.py", "f", 3), 1: PyFrame("x.py", "g", 9),
                        2: PyFrame("y.py", "f", 3)}
    table = LocationTable.from_lists([[], [TAG | 2, 0x401000, TAG | 1], [TAG | 0]])
    flat = table.flat.copy()
    assert rp.canonical_python_ids([flat]) is False and flat.tolist() == table.flat.tolist()
    rp._canon, rp.python_frames[7] = None, PyFrame("x.py", "g", 9)   # a second thread's id
    flat = LocationTable.from_lists([[], [TAG | 7, 0x10]]).flat
    assert rp.canonical_python_ids([flat]) is True and flat.tolist() == [TAG | 1, 0x10]


@pytest.mark.parametrize("sparse", [False, True])
def test_python_frame_ids_become_the_first_id_of_their_line(sparse):
    """Threads and forks define their own id for a (file, function, line): the table keeps the
    first; an id the file does not define stays itself; ids far apart take the dict path."""
    from heapcast.trace.model import PY_FRAME_TAG as TAG, LocationTable, PyFrame
    a, b = PyFrame("x.py", "f", 3), PyFrame("x.py", "g", 9)
    rp = RawProcess.__new__(RawProcess)   # the frames only, as _read_mods leaves them
    rp._canon = None
    far = 1 << 31 if sparse else 6
    rp.python_frames = {0: a, 1: b, 2: a, 5: b, far: a}
    table = LocationTable.from_lists([[], [TAG | 2, 0x401000, TAG | 5], [TAG | 7, TAG | far],
                                      [TAG | 1, TAG | 0]])
    flat = table.flat   # (in place, in parts: the second holds the last two frames)
    assert rp.canonical_python_ids([flat[:5], flat[5:]])
    assert flat.tolist() == [TAG | 0, 0x401000, TAG | 1, TAG | 7, TAG | 0, TAG | 1, TAG | 0]


def test_locations_are_numbered_by_first_use_across_blocks():
    """LocationAssigner: a location's id is the order of its first use in seq order; raw ids of
    different threads with the same frames share one; definitions no event used come last."""
    from heapcast.trace.raw import LocationAssigner
    a = LocationAssigner()
    a.add_definitions({k: frames_key([f]) for k, f in
                       ((1, 0x10), (2, 0x20), (3, 0x30), (7, 0x20), (9, 0x90))})

    def block(raw_ids):   # the loc column as the decoder gives it: remap[raw id]
        return {"loc": a.remap[np.array(raw_ids, np.int64)].copy()}

    b1 = block([3, 3, 0, 2, 7, 3, 2])
    a.number(b1)
    assert b1["loc"].tolist() == [1, 1, 0, 2, 2, 1, 2]      # 0x30 first, then 0x20 (2 and 7)
    b2 = block([9, 1, 3, 9])
    a.number(b2)
    assert b2["loc"].tolist() == [3, 4, 1, 3]               # new ones continue the numbering
    a.add_definitions({12: frames_key([0x120])})
    assert list(assigner_table(a).flat) == [0x30, 0x20, 0x90, 0x10, 0x120]   # unused 12 last


@pytest.mark.parametrize("collide", [False, True])
def test_ids_are_found_by_their_frames_whatever_their_hash(monkeypatch, collide):
    """LocationAssigner keeps a definition's frames only until an event uses it, and finds ids
    by the hash of their frames, checked against the table's rows: with every hash the same
    (stacks of one hash kept by their frames), ids are still one per distinct stack, raw ids of
    the same frames share one (before and after the rows are built), and the checkpoint's view
    of every definition (raw_frames) is its frames."""
    from heapcast.trace import raw as R
    if collide:
        monkeypatch.setattr(R, "_frames_hash", lambda b: 7)
    rng = np.random.default_rng(9)
    stacks = [frames_key(rng.integers(1, 2**40, int(rng.integers(1, 5)))) for _ in range(60)]
    a = R.LocationAssigner()
    defs = {k + 1: s for k, s in enumerate(stacks)}
    defs.update({100 + k: stacks[k] for k in range(0, 60, 3)})   # other threads' ids, same frames
    a.add_definitions(defs)
    a.number({"loc": a.remap[np.arange(1, 31)].copy()})
    assert len(a.frames) == len(defs) - 30                  # used ones: their rows keep them
    a.add_definitions({200: stacks[4], 201: frames_key([0x77])})   # after the rows were built
    loc = a.remap[np.array([200, 100, 31, 201, 130, 59], np.int64)].copy()
    a.number({"loc": loc})
    assert loc.tolist() == [5, 1, 31, 32, 31, 33]
    for k in [*defs, 200, 201]:
        assert a.raw_frames(k) == ({**defs, 200: stacks[4], 201: frames_key([0x77])})[k]
    table = assigner_table(a)
    assert len(table) == len(a) == 62                       # 60 stacks, 0x77, and id 0
    ids = [a.lookup(s) for s in stacks]
    assert None not in ids and len(set(ids)) == 60 and a.lookup(frames_key([0x78])) is None
    for s in stacks:
        assert table.frames(a.lookup(s)).astype("<u8").tobytes() == s


def test_the_location_table_built_as_ids_are_given_is_the_table_of_every_id():
    """LocationAssigner builds its table's rows as number() gives ids (while the program runs):
    with ids given in several blocks, ids set directly (as a checkpoint's assigner does),
    definitions no event used, and stacks of every length, table() is the table of its ids in
    order, whenever it is asked."""
    from heapcast.trace.model import LocationTable
    from heapcast.trace.raw import LocationAssigner
    rng = np.random.default_rng(5)
    a = LocationAssigner()
    defs = {k: frames_key(rng.integers(1, 2**40, int(rng.integers(0, 6))))
            for k in range(1, 400)}
    defs[400] = defs[3]                            # another thread's id for the same frames
    a.add_definitions(defs)
    a.give(frames_key([0xABC, 0xDEF]))   # given directly, before any block

    def reference():
        return LocationTable.from_lists([np.frombuffer(a.frames_of(i), "<u8").tolist()
                                         for i in range(len(a))])
    for step in range(6):
        raw = rng.integers(1, 300 if step < 5 else 401, 500)
        a.number({"loc": a.remap[raw].copy()})
        if step == 2:
            mid = assigner_table(a)
            ref = reference()
            assert mid.offsets.tolist() == ref.offsets.tolist()
            assert mid.flat.tolist() == ref.flat.tolist()
    a.add_definitions({500: frames_key([0x500])})
    table = assigner_table(a)
    assert len(a) > len(defs) // 2 and a.lookup(frames_key([0x500])) is not None
    ref = reference()
    assert table.offsets.dtype == ref.offsets.dtype and table.flat.dtype == ref.flat.dtype
    assert table.offsets.tolist() == ref.offsets.tolist() and table.flat.tolist() == ref.flat.tolist()
    again = assigner_table(a)
    assert again.flat.tolist() == table.flat.tolist() and len(again) == len(table)
