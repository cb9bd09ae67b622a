"""heapcast.stats on small in-memory traces whose every number is computed by hand."""
import json
import random

import numpy as np
import pytest

from heapcast.stats import format_stats, size_classes, stats
from heapcast.trace.format import EVENT_DTYPE, HEAP_OPS, OP, OPS, RSS_DTYPE
from heapcast.trace.model import LocationTable, ModuleSnapshot, Process, Trace

T = 1_000_000_000  # ts of the parent's first event


def events(rows, proc=0):
    """EVENT_DTYPE array from dicts (op given by name); unset fields are 0."""
    arr = np.zeros(len(rows), EVENT_DTYPE)
    for i, r in enumerate(rows):
        for k, v in r.items():
            arr[i][k] = OP[v] if k == "op" else v
    arr["proc"] = proc
    return arr


def process(index, pid, rows, **kw):
    ev = events(rows, index)
    return Process(index=index, pid=pid, _events=ev, event_count=len(ev), **kw)


def parent_rows():
    """14 events; seq = 10 + 2 i, ts = T + 1000 i; the comments give live bytes after each."""
    rows = [
        dict(op="malloc", size=100, addr=0x1000, loc=1),                           # 100
        dict(op="malloc", size=30, addr=0x2000, loc=2),                            # 130
        dict(op="free", old_addr=0x1000),                                          # 30
        dict(op="realloc", old_addr=0x2000, addr=0x2000, size=50, loc=3),          # 50 (in place)
        dict(op="realloc", old_addr=0x2000, addr=0x3000, size=2000, loc=2,
             free_lag=1),                                                          # 2000 (moved)
        dict(op="realloc", old_addr=0x3000, addr=0, size=0),                       # 0 (realloc(p, 0))
        dict(op="malloc", size=1000, addr=0x4000, loc=1),                          # 1000
        dict(op="realloc", old_addr=0x4000, addr=0, size=5000),                    # 1000 (failed)
        dict(op="free", old_addr=0),                                               # 1000 (free(NULL))
        dict(op="calloc", size=80, arg=10, addr=0x5000),                           # 1080
        dict(op="free", old_addr=0x9999, tid=1),                                   # 1080 (unknown)
        dict(op="malloc", size=7, addr=0x6000, loc=3, tid=1),                      # 1087 (fork after)
        dict(op="free", old_addr=0x6000, tid=1),                                   # 1080
        dict(op="posix_memalign", size=64, arg=16, addr=0x7000, loc=2, tid=1),     # 1144
    ]
    for i, r in enumerate(rows):
        r.update(seq=10 + 2 * i, ts=T + 1000 * i)
    return rows


def family_trace():
    """The parent above and a forked child (fork after the parent's malloc(7), seq 33)."""
    rss = np.array([(T + 1500, 13, 8192), (T + 5500, 20, 40960), (T + 9500, 28, 20480)], RSS_DTYPE)
    parent = process(0, 100, parent_rows(), ppid=1, exe="/bin/parent", threads=2,
                     start_ns=T - 500, end_ns=T + 13100, peak_rss_bytes=36864, rss=rss,
                     locations=LocationTable.from_lists([[], [0xAAA0, 0x1], [0xBBB0], [0xAAA0, 0x2]]))
    child_rows = [dict(op="free", old_addr=0x4000, seq=0, ts=T + 12000),   # inherited: not unknown
                  dict(op="malloc", size=10, addr=0x8000, loc=1, seq=1, ts=T + 13000)]
    child = process(1, 101, child_rows, ppid=100, forked_from=100, fork_seq=33, threads=1,
                    start_ns=T + 11500, end_ns=T + 20000, peak_rss_bytes=12288,
                    locations=LocationTable.from_lists([[], [0xAAA0]]))
    return Trace("mem://family", processes=[parent, child])


def assert_plain_json(value, where="stats"):
    """Every number is a Python int/float (numpy scalars would break json or lie about types)."""
    if isinstance(value, dict):
        for k, v in value.items():
            assert isinstance(k, str), where
            assert_plain_json(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            assert_plain_json(v, f"{where}[{i}]")
    else:
        assert value is None or type(value) in (int, float, str, bool), (where, type(value))


def test_family_trace_every_number():
    d = stats(family_trace())
    assert_plain_json(d)
    assert json.loads(json.dumps(d)) == d
    assert d["events"] == 16
    assert d["ops"] == {"malloc": 5, "calloc": 1, "realloc": 4, "reallocarray": 0,
                        "posix_memalign": 1, "aligned_alloc": 0, "memalign": 0, "valloc": 0,
                        "pvalloc": 0, "free": 5}
    assert d["processes"] == 2 and d["threads"] == 3
    assert d["duration_ns"] == 20500
    assert d["peak_live_bytes"] == 2000
    assert d["peak_live"] == {"bytes": 2000, "pid": 100, "seconds": 4500 / 1e9, "event_index": 4,
                              "seq": 18}
    assert d["peak_rss_bytes"] == 40960
    assert d["peak_rss"] == {"bytes": 40960, "pid": 100, "seconds": 6000 / 1e9, "seq": 20,
                             "source": "sample"}
    # Parent never frees 0x4000 (its child does), 0x5000, 0x7000; the child never frees 0x8000.
    assert d["leaked_blocks"] == 4 and d["leaked_bytes"] == 1000 + 80 + 64 + 10
    assert d["unknown_frees"] == 1 and d["double_acquires"] == 0
    assert d["lost_events"] == 0 and d["truncated"] is False
    assert d["size_classes"] == [
        {"class": 3, "min_size": 4, "max_size": 7, "count": 1, "bytes": 7},
        {"class": 4, "min_size": 8, "max_size": 15, "count": 1, "bytes": 10},
        {"class": 5, "min_size": 16, "max_size": 31, "count": 1, "bytes": 30},
        {"class": 6, "min_size": 32, "max_size": 63, "count": 1, "bytes": 50},
        {"class": 7, "min_size": 64, "max_size": 127, "count": 3, "bytes": 100 + 80 + 64},
        {"class": 10, "min_size": 512, "max_size": 1023, "count": 1, "bytes": 1000},
        {"class": 11, "min_size": 1024, "max_size": 2047, "count": 1, "bytes": 2000},
    ]
    # Freed blocks (acquired at -> released at, event index): 0->2, 1->3, 3->4, 4->5, 11->12.
    assert d["lifetimes"] == {"freed_blocks": 5,
                              "ns": {"p50": 1000, "p90": 2000, "p99": 2000, "max": 2000},
                              "events": {"p50": 1, "p90": 2, "p99": 2, "max": 2}}
    parent, child = d["per_process"]
    assert (parent["peak_live_bytes"], parent["leaked_blocks"], parent["unknown_frees"]) == (2000, 3, 1)
    assert (parent["peak_rss_bytes"], parent["threads"], parent["events"]) == (40960, 2, 14)
    # The child starts with the 1087 live bytes of its parent at the fork and never exceeds them.
    assert child["peak_live_bytes"] == 1087 and child["peak_rss_bytes"] == 12288
    assert (child["unknown_frees"], child["leaked_blocks"], child["inherited_live_blocks"]) == (0, 1, 2)


def test_family_trace_call_sites():
    d = stats(family_trace(), top=3)
    # No module map: call sites stay per process, named "?"; locations 1 and 3 share call site 0xAAA0.
    by_bytes = [(s["address"], s["bytes"], s["count"], s["function"], s["module"])
                for s in d["top_callsites_by_bytes"]]
    assert by_bytes == [(0xBBB0, 30 + 2000 + 64, 3, "?", "?"), (0xAAA0, 100 + 50 + 1000 + 7, 4, "?", "?"),
                        (0, 80, 1, "?", "?")]
    by_count = [(s["address"], s["count"]) for s in d["top_callsites_by_count"]]
    assert by_count == [(0xAAA0, 4), (0xBBB0, 3), (0, 1)]
    assert len(stats(family_trace(), top=10)["top_callsites_by_bytes"]) == 4  # + the child's 0xAAA0


def test_call_sites_merge_across_processes_by_module_offset():
    """The same code in two processes loaded at different addresses (ASLR) is one call site."""
    procs = []
    for i, base in enumerate((0x10000, 0x7F0000)):
        rows = [dict(op="malloc", seq=0, ts=T, size=8, addr=0x100, loc=1),
                dict(op="malloc", seq=1, ts=T + 1, size=24, addr=0x200, loc=1)]
        mods = [ModuleSnapshot(0, [["/nonexistent/libfoo.so", base, base, base + 0x10000]])]
        procs.append(process(i, 200 + i, rows, modules=mods,
                             locations=LocationTable.from_lists([[], [base + 0x1234]])))
    d = stats(Trace("mem://two", processes=procs))
    [site] = d["top_callsites_by_count"]
    assert (site["function"], site["module"], site["offset"]) == ("?", "libfoo.so", 0x1234)
    assert (site["count"], site["bytes"], site["address"]) == (4, 64, 0x10000 + 0x1234)


def test_vmhwm_is_a_floor_for_peak_rss_and_mmap_ops_listed_when_recorded():
    rss = np.array([(T, 0, 4096)], RSS_DTYPE)
    p = process(0, 7, [dict(op="mmap", seq=0, ts=T, addr=0x10000, size=4096)], rss=rss,
                peak_rss_bytes=8192, mmap_recorded=True)
    d = stats(Trace("mem://hwm", processes=[p]))
    assert d["peak_rss_bytes"] == 8192
    assert d["peak_rss"] == {"bytes": 8192, "pid": 7, "seconds": None, "seq": None, "source": "vmhwm"}
    assert list(d["ops"]) == list(OPS) and d["ops"]["mmap"] == 1
    assert d["events"] == 1 and d["peak_live_bytes"] == 0 and d["size_classes"] == []


def test_size_classes_are_bit_lengths_of_any_integer_column():
    """One native pass (native/stats/classes.c) against int.bit_length: every power of two and
    its neighbours up to 2**64 - 1, a field read at the rows' stride, int64 as its bits (a cast
    to uint64), narrower integers, a reversed view, two dimensions, nothing."""
    edges = sorted({v for k in range(65) for v in (2**k - 1, 2**k, 2**k + 1) if 0 <= v < 2**64})
    rng = np.random.default_rng(4)
    values = np.array(edges + rng.integers(0, 2**64, 5000, dtype=np.uint64, endpoint=False)
                      .tolist(), np.uint64)
    want = [int(v).bit_length() for v in values]
    got = size_classes(values)
    assert got.dtype == np.int64 and got.tolist() == want
    rows = np.zeros(len(values), EVENT_DTYPE)
    rows["size"] = values
    assert size_classes(rows["size"]).tolist() == want
    assert size_classes(values.view(np.int64)).tolist() == want
    assert size_classes(values[::-1]).tolist() == want[::-1]
    assert size_classes(np.array([0, 1, 255, 256], np.uint16)).tolist() == [0, 1, 8, 9]
    assert size_classes([3, 4]).tolist() == [2, 3]
    assert size_classes(values[:6].reshape(2, 3)).tolist() == [want[:3], want[3:6]]
    assert size_classes(np.zeros(0, np.uint64)).tolist() == []


def test_empty_trace():
    d = stats(Trace("mem://empty", processes=[]))
    assert_plain_json(d)
    assert list(d["ops"]) == list(HEAP_OPS) and not any(d["ops"].values())
    assert (d["events"], d["processes"], d["peak_live_bytes"], d["unknown_frees"]) == (0, 0, 0, 0)
    assert d["lifetimes"]["events"] == {"p50": 0, "p90": 0, "p99": 0, "max": 0}
    assert "events      0" in format_stats(d)


def test_size_classes_exact_for_huge_sizes():
    sizes = np.array([0, 1, 2, 3, 4, 1023, 1024, 2**53 - 1, 2**53, 2**53 + 1, 2**63 - 1, 2**63,
                      2**64 - 1], np.uint64)
    assert size_classes(sizes).tolist() == [int(s).bit_length() for s in sizes.tolist()]


def test_random_heap_matches_a_python_replay():
    """Live bytes, leaks, unknown frees and lifetimes against a plain dict replay."""
    rng = random.Random(5)
    live, rows, addrs = {}, [], iter(range(0x1000, 0x10**9, 0x40))
    for i in range(3000):
        r = rng.random()
        if r < 0.45 or not live:
            a = next(addrs)
            rows.append(dict(op="malloc", size=rng.randint(0, 5000), addr=a))
        elif r < 0.85:
            a = rng.choice(list(live))
            rows.append(dict(op="free", old_addr=a))
        elif r < 0.95:
            a = rng.choice(list(live))
            rows.append(dict(op="realloc", old_addr=a, addr=next(addrs), size=rng.randint(1, 9000),
                             free_lag=1))
        else:
            rows.append(dict(op="free", old_addr=0xDEAD0000 + i))   # never allocated
        rows[-1].update(seq=2 * i, ts=T + 10 * i)
        op = rows[-1]
        if op["op"] != "malloc":
            live.pop(op["old_addr"], None)
        if op.get("addr"):
            live[op["addr"]] = (op["size"], i)
    # Replay again, tracking the peak and lifetimes.
    cur, peak, blocks, lifetimes = 0, 0, {}, []
    for i, op in enumerate(rows):
        if op["op"] != "malloc" and op["old_addr"] in blocks:
            size, born = blocks.pop(op["old_addr"])
            cur -= size
            lifetimes.append(i - born)
        if op.get("addr"):
            blocks[op["addr"]] = (op["size"], i)
            cur += op["size"]
        peak = max(peak, cur)
    d = stats(Trace("mem://random", processes=[process(0, 1, rows)]))
    assert d["peak_live_bytes"] == peak
    assert d["leaked_blocks"] == len(blocks) and d["leaked_bytes"] == sum(s for s, _ in blocks.values())
    assert d["unknown_frees"] == sum(1 for r in rows if r.get("old_addr", 0) >= 0xDEAD0000)
    assert d["lifetimes"]["freed_blocks"] == len(lifetimes)
    assert d["lifetimes"]["events"]["max"] == max(lifetimes)
    lt = sorted(lifetimes)
    assert d["lifetimes"]["events"]["p50"] == lt[(len(lt) + 1) // 2 - 1]


def test_format_stats_report():
    text = format_stats(stats(family_trace()))
    lines = text.splitlines()
    assert "peak live   2,000 B" in text and "at 4.5 us (pid 100, event 4, seq 18)" in text
    assert "unknown frees 1" in text
    ops = lines[lines.index("events by op") + 1:lines.index("events by op") + 12]
    assert ops[0].split() == ["op", "count"] and ops[1].split() == ["malloc", "5"]
    # Right-aligned numbers: every count of the op table ends in the same column.
    assert len({len(line) for line in ops}) == 1
    by_bytes = lines[lines.index("top call sites by bytes") + 2]
    assert by_bytes.split() == ["2,094", "3", "?", "?", "0xbbb0"]


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    from heapcast.stats.plot import plot_stats
    out = tmp_path / "stats.png"
    d = plot_stats(family_trace(), out)
    assert d["peak_live_bytes"] == 2000
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000



def test_recorded_program_end_to_end(tmp_path, cli, build):
    """A real program recorded by heapcast: exact op counts, peak, leaks, named call sites."""
    import heapcast
    exe = build("callsites")
    result = heapcast.record([str(exe)], output=tmp_path / "t")
    assert result.exit_code == 0

    done = cli("stats", tmp_path / "t", "--json", "--top", "3")
    assert done.returncode == 0, done.stderr
    d = json.loads(done.stdout)
    assert d["ops"] == {"malloc": 101, "calloc": 1, "realloc": 2, "reallocarray": 0,
                        "posix_memalign": 0, "aligned_alloc": 0, "memalign": 0, "valloc": 0,
                        "pvalloc": 0, "free": 94}
    assert (d["events"], d["processes"], d["threads"]) == (198, 1, 1)
    assert (d["unknown_frees"], d["double_acquires"], d["lost_events"], d["truncated"]) == (0, 0, 0, False)
    assert d["peak_live_bytes"] == (1 << 20) + sum(range(16, 116))
    assert d["leaked_blocks"] == 10 and d["leaked_bytes"] == sum(16 + i for i in range(0, 100, 10))
    assert d["peak_rss_bytes"] >= 1 << 20        # the megabyte was written to
    # 90 small, big, realloc's 10 bytes (moved), its 100000, calloc's: free(NULL) frees nothing.
    assert d["lifetimes"]["freed_blocks"] == 90 + 1 + 1 + 1 + 1
    top_bytes = d["top_callsites_by_bytes"][0]
    assert (top_bytes["function"], top_bytes["module"], top_bytes["bytes"]) == ("make_big", exe.name, 1 << 20)
    top_count = d["top_callsites_by_count"][0]
    assert (top_count["function"], top_count["module"], top_count["count"]) == ("make_small", exe.name, 100)
    assert len(d["top_callsites_by_count"]) == 3


def test_a_negative_top_is_an_error():
    with pytest.raises(ValueError, match="top must be 0 or more call sites, not -3"):
        stats(family_trace(), top=-3)
    assert stats(family_trace(), top=0)["top_callsites_by_bytes"] == []
