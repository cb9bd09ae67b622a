"""Fuzz-style test of the trace reader: cut, flipped and re-checksummed .hct files.

Every damaged file must either load with exactly the original content (the damage hit a byte the
format does not use) or raise TraceError naming the file: never another exception, never a hang,
never different data without an error.
"""
import signal
import zlib
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import zstandard

import heapcast
from heapcast.trace.format import EVENT_DTYPE, OPS, RSS_DTYPE, TraceError
from heapcast.trace.model import LocationTable, Module, ModuleSnapshot, Process
from heapcast.trace.writer import CODEC_ZSTD, FILE_HEADER, SECTION, write_process_file


def sample_events(n=400):
    rng = np.random.default_rng(3)
    ev = np.zeros(n, EVENT_DTYPE)
    ev["seq"] = np.cumsum(rng.integers(1, 4, n))
    ev["ts"] = 5 * 10**9 + np.cumsum(rng.integers(0, 2000, n))
    ev["op"] = rng.integers(0, len(OPS), n)
    ev["addr"] = 0x55550000 + 16 * rng.integers(0, 1000, n)
    ev["old_addr"] = np.where(rng.random(n) < 0.4, 0x55550000 + 16 * rng.integers(0, 1000, n), 0)
    ev["size"] = rng.integers(0, 1 << 20, n)
    ev["arg"] = rng.integers(0, 64, n)
    ev["loc"] = rng.integers(0, 4, n)
    ev["tid"] = rng.integers(0, 3, n)
    ev["free_lag"] = rng.integers(0, 2, n)
    return ev


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    """(bytes of a valid .hct file, what reading it gives)."""
    path = tmp_path_factory.mktemp("orig") / "1234.hct"
    p = Process(index=0, pid=1234, ppid=1, exe="/usr/bin/prog", argv=["prog", "-v"], threads=3,
                locations=LocationTable.from_lists([[], [0x401000], [0x401010, 0x402000],
                                                    [0x7F0000001234, 0x401020, 0x401030]]),
                modules=[ModuleSnapshot(0, [Module("/usr/bin/prog", 0, 0x400000, 0x404000)]),
                         ModuleSnapshot(200, [Module("/usr/bin/prog", 0, 0x400000, 0x404000),
                                              Module("/lib/libx.so", 0x7F0000000000,
                                                     0x7F0000000000, 0x7F0000010000)])],
                rss=np.array([(5 * 10**9 + i, 10 * i, 4096 * (i + 1)) for i in range(20)],
                             RSS_DTYPE))
    # Two event arrays: the writer may keep them as one EVENTS block or several.
    ev = sample_events()
    write_process_file(path, p, iter([ev[:150], ev[150:]]))
    return path.read_bytes(), content(heapcast.load(path))


def content(trace):
    """Everything a reader gives for a one-process trace, in comparable form."""
    (p,) = trace.processes
    return (p.meta(), p.events.tobytes(), p.locations.offsets.tolist(), p.locations.flat.tolist(),
            [(s.seq, [vars(m) for m in s.modules]) for s in p.modules], p.rss.tobytes())


class Hang(Exception):
    pass


@contextmanager
def deadline(seconds):
    """Raises Hang in the test if the body runs longer than `seconds` (a reader loop that
    never ends would otherwise stall the test run)."""
    def _raise(*_):
        raise Hang
    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def check(path, data, expected, exact=True):
    """Reads a damaged file: either the original content or a TraceError naming the file.

    With exact=False (damage behind a valid checksum) other content is allowed too: the reader
    cannot know, it must only not fail in any other way."""
    path.write_bytes(data)
    try:
        with deadline(5):
            got = content(heapcast.load(path))
    except TraceError as e:
        assert str(path) in str(e), f"error does not name the file: {e}"
        return "error"
    if exact:
        assert got == expected, "damaged file read without error but with different content"
    return "same" if got == expected else "other"


def section_offsets(data):
    """Offsets of the section headers of a .hct file."""
    out, off = [], FILE_HEADER.size
    while off < len(data):
        out.append(off)
        off += SECTION.size + SECTION.unpack_from(data, off)[2]
    return out


def test_truncated_at_many_offsets(original, tmp_path):
    """Every cut near a header (where lengths and kinds are read), every 7th byte elsewhere."""
    data, expected = original
    path = tmp_path / "cut.hct"
    near = {n for off in [0, *section_offsets(data)] for n in range(off - 40, off + 48)}
    cuts = sorted(n for n in near | set(range(0, len(data), 7)) if 0 <= n < len(data))
    assert len(cuts) > 1000
    results = [check(path, data[:n], expected) for n in cuts]
    assert results == ["error"] * len(cuts)       # every cut loses END at least


def test_flipped_bytes(original, tmp_path):
    data, expected = original
    rng = np.random.default_rng(11)
    path = tmp_path / "flip.hct"
    results = []
    for _ in range(400):
        damaged = bytearray(data)
        for pos in rng.choice(len(data), size=rng.integers(1, 4), replace=False):
            damaged[pos] ^= int(rng.integers(1, 256))
        results.append(check(path, bytes(damaged), expected))
    assert results.count("error") > 300


def sections(data):
    """[(kind, codec, stored bytes, count)] of a .hct file's sections."""
    out = []
    for off in section_offsets(data):
        kind, codec, stored_len, _raw, _crc, count = SECTION.unpack_from(data, off)
        out.append((kind, codec, data[off + SECTION.size:off + SECTION.size + stored_len], count))
    return out


def rebuild(data, secs):
    """A .hct file with these sections, each with a correct checksum and lengths."""
    parts = [data[:FILE_HEADER.size]]
    for kind, codec, raw, count in secs:
        stored = zstandard.ZstdCompressor().compress(raw) if codec == CODEC_ZSTD else raw
        parts.append(SECTION.pack(kind, codec, len(stored), len(raw), zlib.crc32(stored), count))
        parts.append(stored)
    return b"".join(parts)


def test_damage_behind_valid_checksums(original, tmp_path):
    """Payload bytes changed and re-checksummed, so that only the reader's structural checks
    stand between the damage and the caller: TraceError or a successful read, nothing else."""
    data, expected = original
    decoded = [(kind, codec, zstandard.ZstdDecompressor().decompress(stored) if codec else stored,
                count) for kind, codec, stored, count in sections(data)]
    assert check(tmp_path / "same.hct", rebuild(data, decoded), expected) == "same"
    rng = np.random.default_rng(5)
    path = tmp_path / "deep.hct"
    results = []
    for _ in range(300):
        i = int(rng.integers(0, len(decoded) - 1))            # any section but END
        kind, codec, raw, count = decoded[i]
        raw = bytearray(raw)
        if raw and rng.random() < 0.8:
            for pos in rng.choice(len(raw), size=min(len(raw), rng.integers(1, 4)), replace=False):
                raw[pos] ^= int(rng.integers(1, 256))
        else:                                                 # cut or extend the payload
            raw = raw[:int(rng.integers(0, len(raw) + 1))] + bytes(int(rng.integers(0, 9)))
        secs = list(decoded)
        secs[i] = (kind, codec, bytes(raw), count)
        results.append(check(path, rebuild(data, secs), expected, exact=False))
    assert results.count("error") > 100


def seven_blocks(path: Path, pid: int):
    """A .hct file of 2,000 sample events in seven EVENTS blocks of up to 300: (its events as
    written, the blocks, its Process)."""
    ev = sample_events(2000)
    parts = [ev[i:i + 300] for i in range(0, len(ev), 300)]
    write_process_file(path, Process(index=0, pid=pid, locations=LocationTable.from_lists([[]])),
                       iter(parts))
    (p,) = heapcast.load(path).processes
    return ev, parts, p


def test_blocks_are_read_ahead_in_order_and_an_early_stop_or_a_bad_block_is_clean(tmp_path):
    """iter_process_blocks decodes the next EVENTS block on a thread while the caller works on
    the one before: the blocks come whole and in order, a caller that stops early leaves no
    thread and no open file behind, and a damaged later block raises TraceError where the
    reading reaches it, after the blocks before it."""
    import threading
    from heapcast.trace.reader import iter_process_blocks
    path = tmp_path / "77.hct"
    ev, parts, p = seven_blocks(path, 77)
    assert len(p._blocks) == len(parts)
    got = list(iter_process_blocks(p, 128))
    assert max(len(b) for b in got) == 128
    assert np.concatenate(got)[list(EVENT_DTYPE.names)].tobytes() == \
        np.concatenate(parts).tobytes()
    before = threading.active_count()
    it = iter_process_blocks(p, 1000)
    next(it)
    it.close()
    assert threading.active_count() == before
    # The fifth block's stored bytes damaged (its CRC then fails): four blocks, then the error.
    data = bytearray(path.read_bytes())
    data[p._blocks[4].offset + 7] ^= 0xFF
    path.write_bytes(bytes(data))
    (p,) = heapcast.load(path).processes
    seen = []
    with pytest.raises(TraceError, match="77.hct"):
        for block in iter_process_blocks(p, 1 << 20):
            seen.append(len(block))
    assert seen == [300] * 4


def test_events_read_whole_decode_their_blocks_side_by_side_into_one_array(tmp_path):
    """Process.events (read_process_events) decodes a file's EVENTS blocks on threads, each
    straight into its rows of the result: the same rows as the blocks read in order; a damaged
    block raises TraceError naming the file, and a block count that disagrees with META too."""
    from heapcast.trace.reader import iter_process_blocks, read_process_events
    path = tmp_path / "78.hct"
    _, parts, p = seven_blocks(path, 78)
    whole = read_process_events(p)
    assert len(p._blocks) == 7 and whole.flags.c_contiguous
    assert whole.tobytes() == np.concatenate(list(iter_process_blocks(p, 1 << 20))).tobytes()
    assert whole[list(EVENT_DTYPE.names)].tobytes() == np.concatenate(parts).tobytes()
    p.event_count += 1   # (as a META that disagrees with the blocks)
    with pytest.raises(TraceError, match="78.hct.*EVENTS blocks hold 2000 events, expected 2001"):
        read_process_events(p)
    data = bytearray(path.read_bytes())
    data[p._blocks[5].offset + 7] ^= 0xFF
    path.write_bytes(bytes(data))
    (p,) = heapcast.load(path).processes
    with pytest.raises(TraceError, match="78.hct, offset [0-9]+: EVENTS block"):
        p.events
