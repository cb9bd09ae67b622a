"""Reads traces: `load(path)` for a trace directory or one .hct file (docs/trace-format.md).

Loading reads the small sections (metadata, locations, modules, RSS) and indexes the EVENTS blocks;
events are decoded when first asked for (`Process.events`, `Trace.chunks()`). Anything that does not
match the format raises TraceError naming the file, the offset and what was expected.
"""
from __future__ import annotations

import json
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import zstandard

from . import codec
from .format import (EVENT_DTYPE, RSS_DTYPE, SESSION_FILE, TRACE_MAGIC, TRACE_READ_VERSIONS, TRACE_SUFFIX,
                     TraceError)
from .model import LocationTable, Module, ModuleSnapshot, Process, PyFrame, Trace
from .steps import interpolate_steps
from .writer import (BLOCK_EVENTS, COLUMN, END, EVENTS, FILE_HEADER, LOCATIONS, META, MODULES, PYFRAMES, RSS,
                     SECTION, STORED_FIELDS, CODEC_STORED, CODEC_ZSTD)

KNOWN = {META, LOCATIONS, MODULES, RSS, EVENTS, PYFRAMES, END}
NAMES = {META: "META", LOCATIONS: "LOCATIONS", MODULES: "MODULES", RSS: "RSS", EVENTS: "EVENTS",
         PYFRAMES: "PYFRAMES"}


@dataclass
class _Block:
    offset: int        # of the section header
    stored_len: int
    raw_len: int
    crc: int
    count: int
    codec: int
    version: int       # of the file (1: every byte plane stored)


def load(path, clock_steps: bool = False) -> Trace:
    """Loads a trace directory (every process in it) or a single .hct file. `clock_steps`: in
    a recording of `record --clock-every N`, the times as recorded (each event its thread's
    latest reading) rather than spread between a thread's readings (heapcast.trace.steps)."""
    path = Path(path)
    if not path.exists():
        raise TraceError(path, None, "no such trace (expected a directory made by `heapcast record`"
                         " or a .hct file)")
    session = {}
    if path.is_dir():
        files = sorted(path.glob("*" + TRACE_SUFFIX))
        s = path / SESSION_FILE
        if s.exists():
            try:
                session = json.loads(s.read_text())
            except (ValueError, UnicodeDecodeError) as e:
                raise TraceError(s, None, f"expected a JSON object: {e}") from None
        if not files:
            if any(path.glob("*.raw")):
                raise TraceError(path, None, "holds raw recordings that were never converted; run "
                                 f"`heapcast finalize {path}`")
            raise TraceError(path, None, f"no {TRACE_SUFFIX} files in this directory")
    else:
        files = [path]
    procs = [read_process(f, clock_steps) for f in files]
    procs.sort(key=lambda p: (p.start_ns, p.pid, p.image))
    for i, p in enumerate(procs):
        p.index = i
    return Trace(path, procs, session)


def _read_exact(f, n: int, path: Path, offset: int, what: str) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise TraceError(path, offset, f"file ends after {len(data)} of the {n} bytes of {what} "
                         "(the file was cut short)")
    return data


def _payload(f, path: Path, off: int, stored_len: int, raw_len: int, crc: int, codec_id: int,
             what: str) -> bytes:
    f.seek(off + SECTION.size)
    data = _read_exact(f, stored_len, path, off + SECTION.size, what)
    if zlib.crc32(data) & 0xFFFFFFFF != crc:
        raise TraceError(path, off, f"{what}: CRC-32 mismatch (the file is corrupt)")
    if codec_id == CODEC_STORED:
        raw = data
    elif codec_id == CODEC_ZSTD:
        try:
            raw = zstandard.ZstdDecompressor().decompress(data, max_output_size=raw_len)
        except zstandard.ZstdError as e:
            raise TraceError(path, off, f"{what}: zstd data does not decompress: {e}") from None
    else:
        raise TraceError(path, off + 4, f"{what}: unknown codec {codec_id}, expected 0 or 1")
    if len(raw) != raw_len:
        raise TraceError(path, off, f"{what}: {len(raw)} bytes after decompression, expected {raw_len}")
    return raw


def read_process(path, clock_steps: bool = False) -> Process:
    """Reads one .hct file's metadata, locations, modules and RSS, and indexes its event blocks.
    `clock_steps`: times as recorded where the process read the clock once in N events (record
    --clock-every), not spread between its readings (heapcast.trace.steps)."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        magic, version, _flags, _ = FILE_HEADER.unpack(
            _read_exact(f, FILE_HEADER.size, path, 0, "the file header"))
        if magic != TRACE_MAGIC:
            raise TraceError(path, 0, f"expected magic {TRACE_MAGIC!r}, found {magic!r}: "
                             "not a heapcast trace file")
        if version not in TRACE_READ_VERSIONS:
            raise TraceError(path, 8, f"trace format version {version} is not supported; this "
                             f"heapcast reads versions {', '.join(map(str, TRACE_READ_VERSIONS))}")
        off = FILE_HEADER.size
        blocks, found = [], {}
        while True:
            f.seek(off)
            hdr = f.read(SECTION.size)
            if len(hdr) != SECTION.size:
                raise TraceError(path, off, "expected a section header (the file has no END "
                                 "section: it was cut short)")
            kind, codec_id, stored_len, raw_len, crc, count = SECTION.unpack(hdr)
            if kind not in KNOWN:
                raise TraceError(path, off, f"unknown section kind {kind:#x}, expected one of "
                                 "1 META, 2 LOCATIONS, 3 MODULES, 4 RSS, 5 EVENTS, 6 PYFRAMES, "
                                 "0xffff END")
            if off + SECTION.size + stored_len > size:
                raise TraceError(path, off, f"section of {stored_len} bytes runs past the end of "
                                 f"the file ({size} bytes)")
            if codec_id == CODEC_STORED and raw_len != stored_len:
                raise TraceError(path, off + 16, f"stored section of {stored_len} bytes claims "
                                 f"{raw_len} bytes of content")
            if kind != EVENTS and raw_len > (1 << 20) + 4096 * stored_len:
                raise TraceError(path, off + 16, f"implausible section length {raw_len}")
            if kind == END:
                break
            if kind == EVENTS:
                if count > BLOCK_EVENTS:
                    raise TraceError(path, off + 28, f"EVENTS block of {count} events, expected at "
                                     f"most {BLOCK_EVENTS}")
                full = _events_payload_len(count)
                # from version 2 on, any byte plane may be left out (all zero)
                least = full if version < 2 else COLUMN.size * len(STORED_FIELDS)
                most = full + 8 * count * len(codec.PARTNER)   # every address an escape
                if not least <= raw_len <= most:
                    raise TraceError(path, off + 16, f"EVENTS block of {count} events has "
                                     f"{raw_len} bytes, expected {least} to {most}")
                blocks.append(_Block(off, stored_len, raw_len, crc, count, codec_id, version))
            else:
                if kind in found:
                    raise TraceError(path, off, f"section kind {kind} appears twice")
                found[kind] = _payload(f, path, off, stored_len, raw_len, crc, codec_id,
                                       f"{NAMES[kind]} section")
            off += SECTION.size + stored_len
    if META not in found:
        raise TraceError(path, None, "no META section")
    p = _process_from_meta(path, found[META])
    p.locations = _locations(path, found.get(LOCATIONS, b""))
    p.modules = _modules(path, found.get(MODULES, b"[]"))
    p.python_frames = _python_frames(path, found.get(PYFRAMES, b"[]"))
    rss = found.get(RSS, b"")
    if len(rss) % RSS_DTYPE.itemsize:
        raise TraceError(path, None, f"RSS section of {len(rss)} bytes is not a whole number of "
                         f"{RSS_DTYPE.itemsize}-byte samples")
    p.rss = np.frombuffer(rss, RSS_DTYPE).copy()
    total = sum(b.count for b in blocks)
    if total != p.event_count:
        raise TraceError(path, None, f"EVENTS blocks hold {total} events, META says {p.event_count}")
    p.source = str(path)
    p._blocks = blocks
    p._clock_steps = clock_steps
    return p


def _events_payload_len(count: int) -> int:
    """Bytes of an EVENTS payload of `count` events with every byte plane, without BACKREF
    escapes (at most 8 more per event and address column)."""
    n = COLUMN.size * len(STORED_FIELDS)
    for name in STORED_FIELDS:
        enc = codec.COLUMN_ENCODING[name]
        n += count * (EVENT_DTYPE[name].itemsize if enc == codec.PLAIN else 8)
    return n


def _process_from_meta(path: Path, raw: bytes) -> Process:
    try:
        meta = json.loads(raw)
        if not isinstance(meta, dict):
            raise ValueError("not an object")
        p = Process(index=0, pid=int(meta["pid"]))
        for key, default in p.meta().items():
            if key in meta:
                value = meta[key]
                setattr(p, key, type(default)(value) if not isinstance(default, list) else list(value))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise TraceError(path, None, f"META section: expected a JSON object with process fields "
                         f"(pid, ...): {e}") from None
    return p


def _locations(path: Path, raw: bytes) -> LocationTable:
    if not raw:
        return LocationTable()
    if len(raw) < 16 or len(raw) % 8:
        raise TraceError(path, None, f"LOCATIONS section of {len(raw)} bytes is malformed")
    n = struct.unpack_from("<Q", raw)[0]
    words = np.frombuffer(raw, "<u8", offset=8)
    if n + 1 > len(words):
        raise TraceError(path, None, f"LOCATIONS section announces {n} locations but holds "
                         f"{len(words)} words")
    offsets = words[:n + 1].astype(np.uint64)
    flat = words[n + 1:].astype(np.uint64)
    if (np.diff(offsets.astype(np.int64)) < 0).any() or int(offsets[-1]) != len(flat) or offsets[0] != 0:
        raise TraceError(path, None, "LOCATIONS section: offsets are not increasing or do not "
                         "match the number of frames")
    return LocationTable(offsets, flat)


def _modules(path: Path, raw: bytes) -> list:
    try:
        return [ModuleSnapshot(int(s["seq"]), [Module(str(m[0]), int(m[1]), int(m[2]), int(m[3]))
                                               for m in s["modules"]])
                for s in json.loads(raw)]
    except (ValueError, KeyError, TypeError, IndexError, UnicodeDecodeError) as e:
        raise TraceError(path, None, f"MODULES section: expected a list of snapshots: {e}") from None


def _python_frames(path: Path, raw: bytes) -> dict:
    try:
        return {int(k): PyFrame(str(file), str(func), int(line))
                for k, file, func, line in json.loads(raw)}
    except (ValueError, TypeError, UnicodeDecodeError) as e:
        raise TraceError(path, None, "PYFRAMES section: expected a list of [id, file, function, "
                         f"line]: {e}") from None


def _decode_block(path: Path, f, b: _Block, proc: int, out: np.ndarray | None = None,
                  every: int = 1) -> np.ndarray:
    """An EVENTS block's events, into `out` (b.count zeroed rows) if given; `every` > 1: the
    process read the clock once in `every` events of a thread, and its times are spread between
    the readings (heapcast.trace.steps)."""
    raw = _payload(f, path, b.offset, b.stored_len, b.raw_len, b.crc, b.codec, "EVENTS block")
    if out is None:
        out = np.zeros(b.count, EVENT_DTYPE)
    columns = []   # (name, encoding, omitted planes, sparse, bytes)
    pos, view = 0, memoryview(raw)
    for name in STORED_FIELDS:
        if pos + COLUMN.size > len(raw):
            raise TraceError(path, b.offset, f"EVENTS block ends before column {name}")
        field_idx, enc, omitted, n = COLUMN.unpack_from(raw, pos)
        pos += COLUMN.size
        sparse = bool(enc & codec.SPARSE)
        enc &= ~codec.SPARSE
        if sparse and b.version < 3:
            raise TraceError(path, b.offset, f"EVENTS block: column {name} is sparse (encoding "
                             f"flag {codec.SPARSE:#x}), which a version {b.version} file has not")
        if field_idx != EVENT_DTYPE.names.index(name):
            raise TraceError(path, b.offset, f"EVENTS block: column {field_idx} where column "
                             f"{EVENT_DTYPE.names.index(name)} ({name}) was expected")
        allowed = codec.ALLOWED_ENCODINGS.get(name, codec.GENERIC_ENCODINGS)
        if enc not in allowed:
            raise TraceError(path, b.offset, f"EVENTS block: column {name} has encoding {enc}, "
                             f"expected one of {sorted(allowed)}")
        if omitted and b.version < 2:
            raise TraceError(path, b.offset, f"EVENTS block: column {name} leaves byte planes out "
                             f"(mask {omitted:#06x}), expected 0 in a version {b.version} file")
        columns.append((name, enc, omitted, sparse, view[pos:pos + n]))
        pos += n
    # The op column first: from version 4 on, sparse columns' presence bits are predicted from it.
    columns.sort(key=lambda c: c[0] != "op")
    masked = b.version >= 4
    pairs = {}
    held = {"ts": None, "tid": None}
    batch, names = [], []   # decoded together, below: codec.decode_columns_into's columns
    ops = None
    for name, enc, omitted, sparse, data in columns:
        how = codec.Sparse(masked, ops) if sparse else None
        try:
            if name in codec.PARTNER:     # the address pair: decoded together, below
                pairs[name] = (data, enc, omitted, how)
                continue
            if every > 1 and name in held:   # (spread below, while contiguous)
                into = held[name] = np.empty(b.count, EVENT_DTYPE[name])
            else:                            # (straight into the rows' field)
                into = out[name]
            if name == "op":   # first, alone and contiguous: the sparse columns' presence bits
                ops = np.empty(b.count, np.uint8)   # are predicted from it, row by row (and
                # again in the tile pass below, into the rows: cheaper than a strided copy
                # through every row's cache line)
                codec.decode_into(data, enc, EVENT_DTYPE[name], b.count, omitted, how, ops)
            batch.append((data, enc, EVENT_DTYPE[name], omitted, how, into))
            names.append(name)
        except ValueError as e:
            raise TraceError(path, b.offset, f"EVENTS block, column {name}: {e}") from None
    try:
        codec.decode_columns_into(batch, b.count)   # a tile of rows at a time through them all
    except codec.ColumnError as e:
        raise TraceError(path, b.offset, f"EVENTS block, column {names[e.column]}: {e}") from None
    try:
        codec.decode_pair_into(pairs["addr"], pairs["old_addr"], b.count, out["addr"],
                               out["old_addr"])
    except codec.ColumnError as e:
        raise TraceError(path, b.offset, f"EVENTS block, column {('addr', 'old_addr')[e.column]}: "
                                         f"{e}") from None
    if proc:   # (the rows are zeroed: a trace's first process, often its only one, is 0)
        out["proc"] = proc
    if every > 1:
        # the estimates' pass over the two columns before they go into the rows (64-byte
        # strided rows of a section do not fit in the cache: 9 ns an event against 6)
        interpolate_steps(held["ts"], held["tid"], every)
        out["ts"], out["tid"] = held["ts"], held["tid"]
    return out


def _every(p: Process) -> int:
    """The clock_every that a process's blocks are decoded with: 1 for the times as recorded."""
    return 1 if p._clock_steps else int(p.clock_every)


def iter_process_blocks(p: Process, size: int = 1 << 20) -> Iterator[np.ndarray]:
    """Yields a process's events in blocks of at most `size` rows (bounded memory). The file's
    next EVENTS block is decoded on a thread of its own while the caller works on the one
    before (zstd and numpy release the GIL): at most two decoded blocks at a time."""
    if p._events is not None:
        yield from _cut(p._events, size)
        return
    path = Path(p.source)
    blocks = list(getattr(p, "_blocks", []))
    with open(path, "rb") as f:
        if len(blocks) < 2:
            for b in blocks:
                yield from _cut(_decode_block(path, f, b, p.index, every=_every(p)), size)
            return
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(1, thread_name_prefix="heapcast-read") as ahead:
            # (only the worker reads the file; leaving the loop early waits for its block)
            nxt = ahead.submit(_decode_block, path, f, blocks[0], p.index, None, _every(p))
            for k in range(len(blocks)):
                block = nxt.result()
                if k + 1 < len(blocks):
                    nxt = ahead.submit(_decode_block, path, f, blocks[k + 1], p.index, None,
                                       _every(p))
                yield from _cut(block, size)
                del block


def _cut(block: np.ndarray, size: int) -> Iterator[np.ndarray]:
    for i in range(0, len(block), size):
        yield block[i:i + size]


def read_process_events(p: Process) -> np.ndarray:
    """All events of a process, in seq order. The file's blocks are decoded side by side, one
    thread per CPU, each straight into its rows of the result: decoded apart and copied, each
    event cost two fresh 64-byte rows, and fresh memory is dear (the main job's trace, 13.7M
    events: 2.3 s, of which the decoding itself 0.8)."""
    blocks = list(getattr(p, "_blocks", []))
    if p._events is not None or len(blocks) < 2:
        out = np.zeros(p.event_count, EVENT_DTYPE)
        pos = 0
        for block in iter_process_blocks(p, 1 << 62):
            if pos + len(block) > p.event_count:
                pos += len(block)
                break
            out[pos:pos + len(block)] = block
            pos += len(block)
        if pos != p.event_count:   # (zero rows where events are missing: garbage, silently)
            more = "more than " if pos > p.event_count else ""
            raise TraceError(p.source, None, f"EVENTS blocks hold {more}{pos} events, expected "
                             f"{p.event_count} (META)")
        return out
    path = Path(p.source)
    starts = np.cumsum([0] + [b.count for b in blocks]).tolist()
    if starts[-1] != p.event_count:
        raise TraceError(path, None, f"EVENTS blocks hold {starts[-1]} events, expected "
                         f"{p.event_count} (META)")
    out = np.zeros(p.event_count, EVENT_DTYPE)

    def decode(k: int) -> None:
        with open(path, "rb") as f:   # (a file object of its own: its own position)
            _decode_block(path, f, blocks[k], p.index, out[starts[k]:starts[k + 1]], _every(p))

    from concurrent.futures import ThreadPoolExecutor
    workers = min(len(blocks), len(os.sched_getaffinity(0)) or 1)
    with ThreadPoolExecutor(workers, thread_name_prefix="heapcast-read") as pool:
        for _ in pool.map(decode, range(len(blocks))):   # (an error raises here)
            pass
    return out
