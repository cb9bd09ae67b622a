"""`heapcast import seed`: the article's libtracemalloc text log -> a heapcast trace directory.

The log has one line per call, written by `sprintf("%ld.%06ld\\t%ld\\t%zu\\t%p\\n")`:

    0.000047<TAB>140132355127680<TAB>120<TAB>0x2874270     malloc(120) returned 0x2874270
    0.000079<TAB>140132355127680<TAB>-1<TAB>0x2874270      free(0x2874270)

(time `sec.usec`, `pthread_self()`, size or -1 for free, pointer or `(nil)`). Runs of blanks are
accepted between fields too, as in copies of the article's listing. Plain or gzip (told by the
magic bytes). Logs of tens of millions of lines stream through in blocks of text parsed with numpy
(no Python loop per line) and reach the writer as blocks of events: memory stays bounded.
"""
from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from .format import EVENT_DTYPE, FREE, MALLOC, TRACE_SUFFIX, TraceError
from .model import LocationTable, Process
from .writer import write_process_file, write_session

#: Bytes of text parsed at a time (about 200k lines of a typical log).
BLOCK_BYTES = 8 << 20

GZIP_MAGIC = b"\x1f\x8b"
GZIP_INPUT = 1 << 20                   # compressed bytes read at a time
MAX_SEC = (2**64 - 1) // 10**9 - 1     # the largest `sec` whose ns timestamp fits in u64
_POW10 = 10 ** np.arange(20, dtype=np.uint64)
# Hex digit values by byte (255: not a hex digit).
_HEX = np.full(256, 255, dtype=np.uint8)
_HEX[48:58] = np.arange(10)
_HEX[97:103] = _HEX[65:71] = np.arange(10, 16)
_TAB, _NL, _CR, _SPACE, _DOT, _MINUS = 9, 10, 13, 32, 46, 45


class SeedLogError(TraceError):
    """A line of a seed log that cannot be read: names the file, the line and its byte offset."""

    def __init__(self, path, line: int, offset: int, message: str):
        super().__init__(f"{path}, line {line}", offset, message)
        self.path, self.line = str(path), line


@dataclass
class SeedLog:
    """What `iter_seed_events` learned while streaming a log (complete once it is exhausted)."""

    lines: int = 0
    threads: dict = field(default_factory=dict)    # pthread_self value -> small sequential tid
    first_ts: int = 0
    last_ts: int = 0


def import_seed(log_path, out_path, pid: int = 0) -> Path:
    """Converts a libtracemalloc log (plain or gzip) into a trace directory at `out_path`.

    One process (`pid`, no executable or argv known); each line becomes one event: a size >= 0 a
    malloc returning the pointer, -1 a free of it. seq is the line number (from 1), ts the logged
    time in ns, tid numbers pthread_self values by first appearance (the values are kept in
    the process's `pthread_ids`), loc 0 (no call sites).
    Returns `out_path`, which must not exist or be an empty directory. Raises SeedLogError (a
    TraceError) naming the first unreadable line, and then leaves nothing behind.
    """
    out = Path(out_path)
    created = not out.exists()
    if not created and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out}: already exists (expected a new or empty directory)")
    out.mkdir(parents=True, exist_ok=True)
    process = Process(index=0, pid=pid, locations=LocationTable.from_lists([[]]))  # 0: unknown
    info = SeedLog()

    def blocks():
        for block in iter_seed_events(log_path, info):
            yield block
        # The writer stores the metadata after it has consumed the events.
        process.threads = len(info.threads)
        # The article concatenates its threads in pthread_self order (sorted(threads.items())):
        # keep the values, so that per-thread streams can be laid out the same way.
        process.pthread_ids = sorted(info.threads, key=info.threads.get)
        process.start_ns, process.end_ns = info.first_ts, info.last_ts

    try:
        write_process_file(out / f"{pid}{TRACE_SUFFIX}", process, blocks())
        write_session(out, {"command": ["heapcast", "import", "seed", str(log_path)],
                            "imported_from": str(log_path), "format": "libtracemalloc",
                            "exit_code": None, "truncated": False, "problems": []})
    except BaseException:
        for leftover in out.iterdir():  # the directory was empty: everything in it is ours
            leftover.unlink()
        if created:
            out.rmdir()
        raise
    return out


def read_log(path, size: int = BLOCK_BYTES) -> Iterator[bytes]:
    """Yields a log's text in pieces of at most `size` bytes, gunzipping it when it starts with
    gzip's magic bytes (several gzip members follow each other, as `cat a.gz b.gz` makes)."""
    with open(path, "rb") as f:
        if f.read(2) != GZIP_MAGIC:
            f.seek(0)
            while chunk := f.read(size):
                yield chunk
            return
        f.seek(0)
        # zlib directly: about twice as fast as the gzip module, which matters at 10M+ lines.
        z, data = zlib.decompressobj(wbits=31), b""
        while True:
            if z.eof:                       # a member ended: another may follow
                data = z.unused_data or f.read(GZIP_INPUT)
                if not data:
                    return
                z = zlib.decompressobj(wbits=31)
            elif not data:
                data = f.read(GZIP_INPUT)
                if not data:
                    if tail := z.flush():       # output held back by the size limit
                        yield tail
                    if not z.eof:
                        raise TraceError(path, f.tell(), "the gzip data ends before its end "
                                         "marker (the file was cut short)")
                    return
            try:
                text = z.decompress(data, size)
            except zlib.error as e:
                raise TraceError(path, f.tell() - len(data), f"corrupt gzip data: {e}") from None
            data = z.unconsumed_tail
            if text:
                yield text


def iter_seed_events(log_path, info: SeedLog | None = None,
                     block_bytes: int = BLOCK_BYTES) -> Iterator[np.ndarray]:
    """Yields the log's events as EVENT_DTYPE blocks in line order (seq = line number from 1).

    Raises SeedLogError at the first line that is not a log record; blank lines are allowed only
    at the end. `info`, when given, collects the line count, thread ids and time span.
    """
    info = info if info is not None else SeedLog()
    for body, first_line, offset in _line_blocks(read_log(log_path, block_bytes)):
        rows = _parse_block(body, log_path, first_line, offset)
        block = _events(rows, first_line, info)
        info.lines = first_line + len(block) - 1
        if first_line == 1:
            info.first_ts = int(block["ts"][0])
        info.last_ts = int(block["ts"][-1])
        yield block


def _line_blocks(chunks: Iterator[bytes]) -> Iterator[tuple[bytes, int, int]]:
    """Yields (text, number of its first line, byte offset of its start) for runs of whole lines.

    Every text ends with a newline. Blank lines at the end of a run are held back until
    something follows them, so that blank lines at the end of the log are dropped.
    """
    carry, line, offset = b"", 1, 0
    for chunk in chunks:
        data = carry + chunk
        whole = data[:data.rfind(b"\n") + 1]
        last = len(whole.rstrip(b"\r\n"))   # end of the last whole line that is not blank
        if last == 0:
            carry = data
            continue
        cut = whole.find(b"\n", last) + 1   # just after that line's newline
        body, carry = data[:cut], data[cut:]
        yield body, line, offset
        line += body.count(b"\n")
        offset += len(body)
    if carry.strip(b"\r\n"):                # the last line may lack its newline
        yield carry.rstrip(b"\r\n") + b"\n", line, offset


def _parse_block(body: bytes, path, first_line: int, offset: int) -> dict:
    """Parses whole lines of text into columns; raises SeedLogError naming the first bad line."""
    buf = np.frombuffer(body, dtype=np.uint8)
    ends = np.flatnonzero(buf == _NL)
    starts = np.concatenate(([0], ends[:-1] + 1))
    ends = ends - ((buf[np.maximum(ends - 1, 0)] == _CR) & (ends > starts))   # CRLF lines

    # Field separators: runs of tabs or spaces. A line needs exactly three of them.
    blank = (buf == _TAB) | (buf == _SPACE)
    edges = np.diff(np.concatenate(([False], blank, [False])).astype(np.int8))
    # Three sentinel runs at the end keep the indexing of lines with too few separators in range.
    sentinel = np.full(3, len(buf))
    run_start = np.concatenate((np.flatnonzero(edges == 1), sentinel))
    run_end = np.concatenate((np.flatnonzero(edges == -1), sentinel))
    first, stop = np.searchsorted(run_start, starts), np.searchsorted(run_start, ends)
    ok = (stop - first) == 3
    sep = first[:, None] + np.arange(3)
    field_start = np.column_stack((starts, np.minimum(run_end[sep], ends[:, None])))
    # Fields of lines already known bad may come out reversed: make them empty.
    field_end = np.maximum(np.column_stack((run_start[sep], ends)), field_start)
    (t0, thread0, size0, ptr0), (t1, thread1, size1, ptr1) = field_start.T, field_end.T

    ts, t_ok = _time(buf, t0, t1)
    thread, th_ok = _signed(buf, thread0, thread1)
    is_free = _literal(buf, size0, size1, b"-1")
    size, sz_ok = _decimal(buf, size0, size1, 20)
    is_nil = _literal(buf, ptr0, ptr1, b"(nil)")
    has_0x = _literal(buf, ptr0, np.minimum(ptr0 + 2, ptr1), b"0x")
    ptr, p_ok = _hex(buf, ptr0 + 2, ptr1, 16)
    ok &= t_ok & th_ok & (is_free | sz_ok) & (is_nil | (has_0x & p_ok))
    if not ok.all():
        bad = int(np.argmin(ok))
        line = body[starts[bad]:ends[bad]]
        raise SeedLogError(path, first_line + bad, offset + int(starts[bad]), _diagnose(line))
    ptr[is_nil] = 0
    return {"ts": ts, "thread": thread, "is_free": is_free, "size": size, "ptr": ptr}


def _events(rows: dict, first_line: int, info: SeedLog) -> np.ndarray:
    """Turns parsed columns into events, numbering threads by first appearance across blocks."""
    n = len(rows["ts"])
    ev = np.zeros(n, dtype=EVENT_DTYPE)
    ev["seq"] = np.arange(first_line, first_line + n, dtype=np.uint64)
    ev["ts"] = rows["ts"]
    free = rows["is_free"]
    ev["op"] = np.where(free, FREE, MALLOC)
    ev["addr"] = np.where(free, 0, rows["ptr"])
    ev["old_addr"] = np.where(free, rows["ptr"], 0)
    ev["size"] = np.where(free, 0, rows["size"])
    values, first, inverse = np.unique(rows["thread"], return_index=True, return_inverse=True)
    for i in np.argsort(first):
        info.threads.setdefault(int(values[i]), len(info.threads))
    ids = np.array([info.threads[int(v)] for v in values], dtype=np.uint32)
    ev["tid"] = ids[inverse]
    return ev


def _digits(buf, start, end, maxlen, base) -> tuple[np.ndarray, np.ndarray]:
    """Unsigned base-10 or base-16 numbers in buf[start:end] of every row: (value, ok).

    A number has 1..maxlen digits; the caller makes sure maxlen digits fit (or checks overflow).
    One pass per digit position, from the right, over all rows at once."""
    length = end - start
    ok = (length >= 1) & (length <= maxlen)
    value = np.zeros(len(start), dtype=np.uint64)
    term = np.empty(len(start), dtype=np.uint64)
    pos = end - 1
    weight = 1
    for k in range(min(maxlen, int(length.max(initial=0)))):
        has = length > k
        byte = np.take(buf, pos, mode="clip")      # rows without a k-th digit read anything
        digit = byte - np.uint8(48) if base == 10 else np.take(_HEX, byte)
        ok &= (digit < base) | ~has
        digit *= has
        np.multiply(digit, np.uint64(weight), out=term, casting="unsafe")
        value += term
        pos -= 1
        weight = (weight * base) % 2**64
    return value, ok


def _decimal(buf, start, end, maxlen) -> tuple[np.ndarray, np.ndarray]:
    """Unsigned decimals of up to maxlen (<= 20) digits that fit in u64: (value, ok)."""
    value, ok = _digits(buf, start, end, maxlen, 10)
    if maxlen == 20:
        # 20 digits may wrap: with a leading 1 the number fits iff no wrap happened (value stays
        # >= 10**19), with a leading 2..9 it never fits.
        wide = (end - start) == 20
        lead = buf[np.where(wide, start, 0)] - np.uint8(48)
        ok &= ~wide | (lead == 0) | ((lead == 1) & (value >= _POW10[19]))
    return value, ok


def _hex(buf, start, end, maxlen) -> tuple[np.ndarray, np.ndarray]:
    """Unsigned hexadecimals (either case) of up to maxlen digits: (value, ok)."""
    return _digits(buf, start, end, maxlen, 16)


def _signed(buf, start, end) -> tuple[np.ndarray, np.ndarray]:
    """Decimals with an optional minus sign (`%ld`), as u64 two's complement: (value, ok)."""
    neg = (end > start) & (buf[np.minimum(start, len(buf) - 1)] == _MINUS)
    value, ok = _decimal(buf, start + neg, end, 20)
    return np.where(neg, np.uint64(0) - value, value), ok


def _literal(buf, start, end, text: bytes) -> np.ndarray:
    """Rows whose buf[start:end] is exactly `text`."""
    match = (end - start) == len(text)
    for j, c in enumerate(text):
        match &= buf[np.where(match, start + j, 0)] == c
    return match


def _time(buf, start, end) -> tuple[np.ndarray, np.ndarray]:
    """`sec.frac` (frac: 1..9 digits, a fraction of a second; usec with %06ld) as ns: (ts, ok)."""
    dots = np.flatnonzero(buf == _DOT)
    lo, hi = np.searchsorted(dots, start), np.searchsorted(dots, end)
    ok = (hi - lo) == 1
    dot = dots[np.minimum(lo, max(len(dots) - 1, 0))] if len(dots) else start
    dot = np.where(ok, dot, start)
    sec, sec_ok = _decimal(buf, start, dot, 11)
    frac, frac_ok = _decimal(buf, dot + 1, end, 9)
    flen = np.clip(end - dot - 1, 0, 9)
    ok &= sec_ok & frac_ok & (sec <= MAX_SEC)
    return sec * np.uint64(10**9) + frac * _POW10[9 - flen], ok


_LINE_RULES = (
    ("time", re.compile(rb"(\d{1,11})\.\d{1,9}"), "a time sec.usec"),
    ("thread", re.compile(rb"-?(\d{1,20})"), "a thread id (decimal)"),
    ("size", re.compile(rb"-1|(\d{1,20})"), "a size (decimal) or -1"),
    ("pointer", re.compile(rb"\(nil\)|0x[0-9a-fA-F]{1,16}"), "a pointer 0x... or (nil)"),
)


def _diagnose(line: bytes) -> str:
    """Says what is wrong with a line (without its newline) that the vectorized parser rejected:
    the same rules, checked field by field with regular expressions to name the culprit."""
    if not line:
        return "expected a record, got a blank line (blank lines may only end the log)"
    fields = re.split(rb"[ \t]+", line)
    if len(fields) != 4:
        return f"expected 4 tab-separated fields (time, thread, size, pointer), got {len(fields)}"
    for (name, rule, what), text in zip(_LINE_RULES, fields):
        m = rule.fullmatch(text)
        number = int(m.group(1)) if m and m.lastindex and m.group(1) else 0  # a number to bound
        limit = MAX_SEC if name == "time" else 2**64 - 1
        if not m or number > limit:
            shown = text[:40].decode("utf-8", "replace")
            return f"field {name}: expected {what}, got {shown!r}"
    return "expected a libtracemalloc record"
