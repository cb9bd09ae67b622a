"""`heapcast import seed`: the article's libtracemalloc text logs, plain and gzip, good and bad."""
import gzip
import json
import random
import re

import numpy as np
import pytest

import heapcast
from heapcast.trace.blocks import match
from heapcast.trace.format import EVENT_DTYPE, FREE, MALLOC, TraceError
from heapcast.trace.seed_import import SeedLogError, import_seed, iter_seed_events

# The listing of the article (its threads, sizes and pointers), with the tabs the tracer writes.
ARTICLE_LOG = """\
0.000000\t140132355127680\t552\t0x2874040
0.000047\t140132355127680\t120\t0x2874270
0.000052\t140132355127680\t1024\t0x28742f0
0.000079\t140132355127680\t-1\t0x2874270
0.000089\t140132355127680\t-1\t0x28742f0
0.000092\t140132355127680\t-1\t0x2874040
0.000093\t140132355127680\t-1\t(nil)
0.000101\t140132355127680\t37\t0x2874040
0.000133\t140132355127680\t32816\t0x2874070
0.000157\t140132355127680\t-1\t0x2874070
0.000162\t140132355127680\t8\t0x2874070
"""

# Every kind of field the tracer can write; blank separators, CRLF and trailing blank lines too.
EDGE_LOG = (
    "1500.000001\t140132355127680\t0\t0x10\n"                        # malloc(0)
    "1500.000002\t140132346734976\t18446744073709551615\t(nil)\n"     # failed malloc(SIZE_MAX)
    "1500.000003\t140132355127680\t-1\t0x10\n"
    "1500.000004   -5   7   0x7FFFffffABCD\r\n"                        # spaces, %ld < 0, CRLF
    "1501.999999\t140132346734976\t-1\t(nil)\n"                       # free(NULL)
    "18446744072.5\t-5\t1\t0xffffffffffffffff\n"                      # largest values
    "\n\r\n\n"
)


def expected_edge_events():
    rows = [  # seq, ts, op, addr, old_addr, size, tid
        (1, 1500_000_001_000, MALLOC, 0x10, 0, 0, 0),
        (2, 1500_000_002_000, MALLOC, 0, 0, 2**64 - 1, 1),
        (3, 1500_000_003_000, FREE, 0, 0x10, 0, 0),
        (4, 1500_000_004_000, MALLOC, 0x7FFFFFFFABCD, 0, 7, 2),
        (5, 1501_999_999_000, FREE, 0, 0, 0, 1),
        (6, 18446744072_500_000_000, MALLOC, 2**64 - 1, 0, 1, 2),
    ]
    ev = np.zeros(len(rows), EVENT_DTYPE)
    for i, (seq, ts, op, addr, old, size, tid) in enumerate(rows):
        ev[i] = (seq, ts, addr, old, size, 0, 0, tid, 0, 0, op, 0)
    return ev


def write_log(path, text, gz=False):
    data = text.encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def test_every_field_of_every_event(tmp_path):
    log = write_log(tmp_path / "edge.log", EDGE_LOG)
    out = import_seed(log, tmp_path / "trace", pid=4242)
    trace = heapcast.load(out)
    assert len(trace.processes) == 1
    p = trace.processes[0]
    assert (p.pid, p.exe, p.argv, p.threads, p.event_count) == (4242, "", [], 3, 6)
    assert (p.start_ns, p.end_ns) == (1500_000_001_000, 18446744072_500_000_000)
    np.testing.assert_array_equal(trace.events, expected_edge_events())
    session = json.loads((out / "session.json").read_text())
    assert session["imported_from"] == str(log) and session["truncated"] is False


def test_article_log_replays_cleanly(tmp_path):
    """The article's own listing: every free matches a malloc, two blocks stay live."""
    trace = heapcast.load(import_seed(write_log(tmp_path / "a.log", ARTICLE_LOG), tmp_path / "t"))
    ev = trace.events
    assert list(ev["op"]) == [MALLOC] * 3 + [FREE] * 4 + [MALLOC] * 2 + [FREE, MALLOC]
    assert list(ev["ts"][:3]) == [0, 47_000, 52_000]
    blocks = match(ev)
    assert blocks.unknown_releases == 0 and blocks.double_acquires == 0
    assert list(ev["size"][blocks.leaked]) == [37, 8]


def test_gzip_is_detected_by_content_not_name(tmp_path):
    plain = heapcast.load(import_seed(write_log(tmp_path / "a.log", EDGE_LOG), tmp_path / "p"))
    # Two gzip members, as `cat a.gz b.gz` makes, under a name that does not end in .gz.
    half = EDGE_LOG.index("1500.000004")
    gz = tmp_path / "log.bin"
    gz.write_bytes(gzip.compress(EDGE_LOG[:half].encode())
                   + gzip.compress(EDGE_LOG[half:].encode()))
    packed = heapcast.load(import_seed(gz, tmp_path / "g"))
    np.testing.assert_array_equal(packed.events, plain.events)
    assert packed.processes[0].meta() == plain.processes[0].meta()


def reference_parse(lines):
    """What each valid line means, by plain Python: the oracle for the vectorized parser."""
    ev = np.zeros(len(lines), EVENT_DTYPE)
    tids = {}
    for i, line in enumerate(lines):
        t, thread, size, ptr = line.split("\t")
        sec, frac = t.split(".")                  # a decimal fraction: usec for 6 digits
        p = 0 if ptr == "(nil)" else int(ptr, 16)
        free = size == "-1"
        ts = int(sec) * 10**9 + int(frac.ljust(9, "0"))
        ev[i] = (i + 1, ts, 0 if free else p, p if free else 0, 0 if free else int(size), 0, 0,
                 tids.setdefault(thread, len(tids)), 0, 0, FREE if free else MALLOC, 0)
    return ev


def random_lines(n, seed):
    rng = random.Random(seed)
    threads = [str(rng.randrange(1, 2**47)) for _ in range(5)]
    t, lines = 0, []
    for _ in range(n):
        t += rng.randrange(0, 3000)
        size = rng.choice(["-1", str(rng.randrange(0, 5000)), str(rng.randrange(0, 2**64))])
        ptr = rng.choice(["(nil)", hex(rng.randrange(1, 2**48)), hex(rng.randrange(1, 2**64))])
        lines.append(f"{t // 10**6}.{t % 10**6:06d}\t{rng.choice(threads)}\t{size}\t{ptr}")
    return lines


@pytest.mark.parametrize("block_bytes", [64, 1000, 1 << 20])
def test_streams_in_bounded_blocks(tmp_path, block_bytes):
    """Lines cut across blocks anywhere; thread ids and seq continue across blocks."""
    lines = random_lines(3000, seed=block_bytes)
    log = write_log(tmp_path / "r.log", "\n".join(lines), gz=block_bytes == 64)   # no final \n
    blocks = list(iter_seed_events(log, block_bytes=block_bytes))
    if block_bytes < 1 << 20:
        assert len(blocks) > 10
        # A block holds one read of text plus the start of a line cut by the previous read.
        shortest, longest = min(map(len, lines)) + 1, max(map(len, lines)) + 1
        assert max(len(b) for b in blocks) <= (block_bytes + longest) // shortest
    np.testing.assert_array_equal(np.concatenate(blocks), reference_parse(lines))


BAD_LINES = [
    ("0.000001\t1\t5", "expected 4 tab-separated fields (time, thread, size, pointer), got 3"),
    ("0.000001\t1\t5\t0x10\t", "got 5"),
    ("", "got a blank line"),
    ("0.000001 1\t5\t0x10\textra", "got 5"),
    ("0,000001\t1\t5\t0x10", "field time: expected a time sec.usec, got '0,000001'"),
    ("1.2.3\t1\t5\t0x10", "field time"),
    ("18446744073.000000\t1\t5\t0x10", "field time"),                   # ns overflow u64
    ("0.000001\t0x1\t5\t0x10", "field thread: expected a thread id (decimal), got '0x1'"),
    ("0.000001\t1\t-2\t0x10", "field size: expected a size (decimal) or -1, got '-2'"),
    ("0.000001\t1\t18446744073709551616\t0x10", "field size"),          # 2**64
    ("0.000001\t1\t99999999999999999999\t0x10", "field size"),
    ("0.000001\t1\t5\t0x", "field pointer: expected a pointer 0x... or (nil), got '0x'"),
    ("0.000001\t1\t5\t10", "field pointer"),
    ("0.000001\t1\t5\t0x10000000000000000", "field pointer"),           # 17 hex digits
    ("0.000001\t1\t5\t0xg1", "field pointer"),
    ("0.000001\t1\t5\tnil", "field pointer"),
]


@pytest.mark.parametrize("line,message", BAD_LINES)
def test_bad_line_is_named(tmp_path, line, message):
    good = "0.000000\t7\t1\t0x1\n0.000002\t7\t-1\t0x1\n"
    log = write_log(tmp_path / "seed.log", good + line + "\n0.000003\t7\t1\t0x1\n")
    with pytest.raises(SeedLogError) as e:
        import_seed(log, tmp_path / "out")
    assert str(e.value).startswith(f"{log}, line 3, offset {len(good)}: ")
    assert message in str(e.value)
    assert isinstance(e.value, TraceError) and e.value.line == 3
    assert not (tmp_path / "out").exists()          # nothing half-written is left behind


def test_bad_line_deep_in_a_gzip_log(tmp_path):
    """Line numbers and offsets count from the start of the (decompressed) text, across blocks."""
    lines = random_lines(5000, seed=1)
    lines[4321] = lines[4321].replace("\t", " \t", 1).replace(".", ":", 1)
    text = "\n".join(lines) + "\n"
    log = write_log(tmp_path / "big.log.gz", text, gz=True)
    offset = len("\n".join(lines[:4321])) + 1
    with pytest.raises(SeedLogError, match=re.escape(f"{log}, line 4322, offset {offset}: "
                                                     "field time: expected a time sec.usec")):
        for _ in iter_seed_events(log, block_bytes=4096):
            pass


def test_vectorized_parser_agrees_with_the_rules(tmp_path):
    """Random single-byte damage to valid lines: each either parses exactly as the oracle reads
    it, or is rejected with a message naming the field at fault (never the generic one)."""
    rng = random.Random(7)
    alphabet = "0123456789abcdefx.-\t (nil)X"
    for i, line in enumerate(random_lines(300, seed=2)):
        pos = rng.randrange(len(line) + 1)
        damaged = line[:pos] + rng.choice(alphabet) + line[pos + rng.randrange(2):]
        log = write_log(tmp_path / f"{i}.log", damaged + "\n")
        try:
            got = np.concatenate(list(iter_seed_events(log)))
        except SeedLogError as e:
            assert re.search(r"line 1, offset 0: (expected 4 tab|field \w+: expected)", str(e)), e
        else:
            np.testing.assert_array_equal(got, reference_parse([re.sub(r"[ \t]+", "\t", damaged)]))


def test_truncated_gzip_is_an_error_naming_the_file(tmp_path):
    packed = gzip.compress(ARTICLE_LOG.encode())
    log = tmp_path / "cut.gz"
    log.write_bytes(packed[:-12])
    with pytest.raises(TraceError, match=re.escape(str(log)) + ".*cut short"):
        import_seed(log, tmp_path / "out")


def test_output_must_be_new(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("keep me")
    log = write_log(tmp_path / "a.log", ARTICLE_LOG)
    with pytest.raises(FileExistsError, match="taken"):
        import_seed(log, tmp_path / "taken")
    assert (tmp_path / "taken" / "x").read_text() == "keep me"


def test_cli_import_then_stats(tmp_path, cli):
    log = write_log(tmp_path / "a.log.gz", ARTICLE_LOG, gz=True)
    done = cli("import", "seed", log, "-o", tmp_path / "t")
    assert done.returncode == 0, done.stderr
    done = cli("stats", tmp_path / "t", "--json")
    assert done.returncode == 0, done.stderr
    s = json.loads(done.stdout)
    assert (s["events"], s["ops"]["malloc"], s["ops"]["free"]) == (11, 6, 5)
    assert (s["unknown_frees"], s["leaked_blocks"], s["peak_live_bytes"]) == (0, 2, 32853)


def test_cli_bad_log_exits_2_with_the_line(tmp_path, cli):
    log = write_log(tmp_path / "bad.log", ARTICLE_LOG + "garbage\n")
    done = cli("import", "seed", log, "-o", tmp_path / "t")
    assert done.returncode == 2
    assert f"{log}, line 12, offset {len(ARTICLE_LOG)}: expected 4 tab-separated" in done.stderr
    assert "Traceback" not in done.stderr


def test_threads_are_laid_out_in_pthread_order_as_the_article_did(tmp_path):
    from heapcast.forecast.features import featurize
    # Thread 900 appears first, thread 100 second: tids 0 and 1, but the article's
    # sorted(threads.items()) puts thread 100's sequence first.
    log = write_log(tmp_path / "two.log", "0.1\t900\t8\t0x10\n0.2\t100\t16\t0x20\n"
                                          "0.3\t900\t-1\t0x10\n0.4\t100\t-1\t0x20\n"
                                          "0.5\t900\t24\t0x30\n")
    out = import_seed(log, tmp_path / "two.trace")
    p = heapcast.load(out).processes[0]
    assert p.pthread_ids == [900, 100]                  # per tid, kept in the trace
    f = featurize([heapcast.load(out)], "thread", need_ranks=False)
    assert f.offsets.tolist() == [0, 2, 5]               # thread 100 (2 events), then 900 (3)
    assert f.columns["ts"].tolist() == [200_000_000, 400_000_000, 100_000_000, 300_000_000,
                                        500_000_000]
