"""The streaming stats equal the whole-process stats (tests/stats_reference.py, the code stats ran
before it streamed) on random traces, for every chunk size, with forks, moved reallocs whose
release lies chunks back, address reuse, double acquires and unknown frees."""
import random

import numpy as np
import pytest

import stats_reference
from heapcast.stats import stats
from heapcast.stats.matching import LiveMap
from heapcast.stats.quantiles import StreamingPercentiles
from heapcast.trace.format import EVENT_DTYPE, OP, RSS_DTYPE
from heapcast.trace.model import LocationTable, Process, Trace


def random_events(rng, n, live=None, addrs=64, doubles=True):
    """`n` events of a plausible heap over a small address pool (so addresses are reused)."""
    live = dict(live or {})                  # addr -> size
    free_pool = [0x1000 * (i + 1) for i in range(addrs) if 0x1000 * (i + 1) not in live]
    rows, pending = [], []                   # pending: moved reallocs waiting for their record
    while len(rows) < n or pending:       # every moved realloc is recorded before the end
        r = rng.random()
        if pending and (rng.random() < 0.4 or len(rows) >= n):
            old, new, size, at = pending.pop(0)
            live[new] = size               # the new block exists from its record on
            rows.append(dict(op="realloc", old_addr=old, addr=new, size=size,
                             free_lag=2 * (len(rows) - at) + 1, loc=rng.randrange(1, 6)))
        elif r < 0.4 and free_pool:
            a = free_pool.pop(rng.randrange(len(free_pool)))
            size = rng.choice([8, 24, 100, 1000, 5000, rng.randrange(1, 70000)])
            op = rng.choice(["malloc", "malloc", "calloc", "posix_memalign"])
            live[a] = size
            rows.append(dict(op=op, addr=a, size=size, loc=rng.randrange(0, 6),
                             tid=rng.randrange(3)))
        elif r < 0.7 and live:
            a = rng.choice(list(live))
            del live[a]
            free_pool.append(a)
            rows.append(dict(op="free", old_addr=a, tid=rng.randrange(3)))
        elif r < 0.8 and live and free_pool:
            # A moved realloc: the old block is released now (just before the next event's seq),
            # its record comes a few events later (another thread may reuse the address between).
            a = rng.choice(list(live))
            b = free_pool.pop(rng.randrange(len(free_pool)))
            size = rng.randrange(1, 3000)
            del live[a]
            free_pool.append(a)
            pending.append((a, b, size, len(rows)))
        elif r < 0.85 and live:
            a = rng.choice(list(live))
            live[a] = rng.randrange(1, 3000)
            rows.append(dict(op="realloc", old_addr=a, addr=a, size=live[a], loc=3))
        elif r < 0.88:
            rows.append(dict(op="free", old_addr=rng.choice([0, 0xdead0])))    # NULL / unknown
        elif r < 0.9 and live and doubles:
            a = rng.choice(list(live))                                          # double acquire
            rows.append(dict(op="malloc", addr=a, size=7, loc=2))
        else:
            rows.append(dict(op="realloc", old_addr=0, addr=0, size=10 ** 12))  # failed
    return rows, live


def to_process(index, pid, rows, t0, **kw):
    ev = np.zeros(len(rows), EVENT_DTYPE)
    for i, r in enumerate(rows):
        for k, v in r.items():
            ev[i][k] = OP[v] if k == "op" else v
    ev["seq"] = np.arange(len(rows)) * 2 + 5
    ev["ts"] = t0 + np.arange(len(rows)) * 1000 + np.array([r.get("jitter", 0) for r in rows])
    ev["proc"] = index
    locs = LocationTable.from_lists([[]] + [[0x400000 + 16 * i] for i in range(1, 6)])
    rss = np.array([(t0 + 500, 3, 4096), (t0 + 2500, 9, 8192)], RSS_DTYPE)
    return Process(index=index, pid=pid, _events=ev, event_count=len(ev), locations=locs,
                   start_ns=t0, end_ns=t0 + 1000 * len(rows), rss=rss, **kw)


def random_trace(seed):
    rng = random.Random(seed)
    # No double acquire before the fork and no realloc released before it but recorded after:
    # the whole-process stats had the child inherit such blocks (and count a double again in the
    # child); the stream has the child inherit what was live at the fork.
    fork_at = rng.randrange(50, 300)
    rows, live = random_events(rng, fork_at, doubles=False)
    fork_at = len(rows)
    child_rows, _ = random_events(rng, rng.randrange(0, 120), live=live)
    more, _ = random_events(rng, rng.randrange(0, 200), live=live)
    rows += more
    parent = to_process(0, 100, rows, 10 ** 9, threads=3)
    child = to_process(1, 101, child_rows, 10 ** 9 + 7000, ppid=100, forked_from=100,
                       fork_seq=5 + 2 * fork_at)
    other_rows, _ = random_events(rng, rng.randrange(1, 80))
    other = to_process(2, 102, other_rows, 10 ** 9 + 9000)
    return Trace(f"mem://random{seed}", processes=[parent, child, other])


@pytest.mark.parametrize("seed", range(24))
def test_streaming_equals_whole_process(seed):
    trace = random_trace(seed)
    want = stats_reference.stats(trace, top=8)
    for chunk in (1, 2, 5, 16, 1 << 20):
        assert stats(trace, top=8, chunk=chunk) == want, chunk


@pytest.mark.parametrize("seed", range(8))
def test_time_range_aggregates_add_up(seed):
    """Per (coarse bucket, location): temporary allocations and bytes never freed add up to the
    run's, and the bucket that holds a process's peak has its bytes live at the peak, whatever
    the chunking (forks, inherited blocks and leaks included)."""
    from heapcast.stats.aggregate import aggregate
    trace = random_trace(seed)
    for chunk in (1, 7, 1 << 20):
        aggs, _ = aggregate(trace, detail=True, chunk=chunk)
        for a in aggs:
            nl = a.loc_peak_by_range.shape[1]
            assert a.loc_temp_by_range.sum(0)[:nl - 1].tolist() == a.loc_temporary[:nl - 1].tolist()
            assert a.loc_leak_by_range.sum(0)[:nl - 1].tolist() == \
                np.maximum(a.loc_leaked_bytes[:nl - 1], 0).tolist()
            if a.range_peak.max() < 0:
                continue
            top = int(np.argmax(a.range_peak))
            assert a.range_peak[top] == a.peak["bytes"]
            assert a.loc_peak_by_range[top][:nl - 1].tolist() == a.loc_at_peak[:nl - 1].tolist()
        assert any(a.loc_leak_by_range.any() for a in aggs)     # the random traces leak


def test_recorded_trace_equals_whole_process(tmp_path, build):
    """A real recording with a fork (churn.c), read back in chunks smaller than a process."""
    import heapcast
    result = heapcast.record([str(build("churn"))], output=tmp_path / "t", stacks=8)
    assert result.exit_code == 0
    trace = heapcast.load(tmp_path / "t")
    assert len(trace.processes) == 2
    want = stats_reference.stats(trace)
    assert stats(trace, chunk=997) == want
    assert stats(trace) == want


def test_live_map_is_bounded_by_live_blocks():
    """100k events over at most 50 live blocks: the map holds the live blocks, no more."""
    rng = random.Random(1)
    rows, live = random_events(rng, 100_000, addrs=50, doubles=False)
    p = to_process(0, 1, rows, 10 ** 9)
    m = LiveMap()
    biggest = 0
    for i in range(0, len(p.events), 1000):
        m.match(p.events[i:i + 1000], i, 0)
        biggest = max(biggest, len(m))
    assert m.ghosts == 0
    assert biggest <= 50
    assert sorted(m.blocks["addr"].tolist()) == sorted(live)


def test_percentiles_exact_then_within_a_tenth_of_a_percent():
    rng = np.random.default_rng(3)
    values = (rng.lognormal(12, 3, 200_000)).astype(np.int64)
    exact = StreamingPercentiles(exact_limit=1 << 30)
    approx = StreamingPercentiles(exact_limit=1000)
    for part in np.array_split(values, 37):
        exact.add(part)
        approx.add(part)
    want = {f"p{q}": int(v) for q, v in zip((50, 90, 99), np.percentile(values, (50, 90, 99),
                                                                        method="inverted_cdf"))}
    assert exact.exact and not approx.exact
    assert exact.result() == want | {"max": int(values.max())}
    got = approx.result()
    assert got["max"] == int(values.max())
    for k, v in want.items():
        assert abs(got[k] - v) <= v / 1000 and got[k] in set(values.tolist()), k


def test_python_call_sites_and_program_lines():
    """Python frames (PY_FRAME_TAG): call sites merge by (file, line, function) whatever the frame
    id; the program's own lines skip the interpreter's library and `<frozen ...>` modules; the
    streaming stats equal the whole-process ones for every chunk size."""
    from heapcast.stats import format_stats
    from heapcast.trace.model import PY_FRAME_TAG, PyFrame
    frames = {1: PyFrame("app.py", "f", 10), 2: PyFrame("app.py", "main", 20),
              3: PyFrame("/usr/lib/python3.11/json/encoder.py", "encode", 5),
              4: PyFrame("<frozen importlib._bootstrap>", "_load", 3),
              5: PyFrame("app.py", "g", 10), 6: PyFrame("app.py", "f", 10)}
    py = {k: PY_FRAME_TAG | k for k in frames}
    stacks = [[], [py[1], py[2]], [py[3], py[1], py[2]], [py[4]], [py[5], py[2]], [py[6]]]
    rng = random.Random(7)
    rows, _ = random_events(rng, 400)
    trace = Trace("mem://python", processes=[to_process(0, 100, rows, 10 ** 9)])
    p = trace.processes[0]
    p.locations, p.python_frames = LocationTable.from_lists(stacks), frames
    want = stats_reference.stats(trace, top=8)
    for chunk in (3, 1 << 20):
        assert stats(trace, top=8, chunk=chunk) == want, chunk
    d = want
    ev = p.events
    acq = ev[(ev["op"] < OP["free"]) & (ev["addr"] != 0)]          # the allocations

    def count(*locs):
        return int(np.isin(acq["loc"], locs).sum())
    sites = {(s["module"], s["offset"], s["function"]): s for s in d["top_callsites_by_count"]
             if s["python"]}
    assert sites[("app.py", 10, "f")]["count"] == count(1, 5)       # frame ids 1 and 6 merged
    assert sites[("app.py", 10, "g")]["count"] == count(4)          # same line, other function
    own = {(s["module"], s["offset"], s["function"]): s["count"]
           for s in d["top_program_lines_by_count"]}
    assert own == {("app.py", 10, "f"): count(1, 2, 5), ("app.py", 10, "g"): count(4)}
    text = format_stats(d)
    assert "top lines of the program's own Python code by bytes" in text
    assert "app.py:10" in text and "python" in text and "<frozen importlib._bootstrap>:3" in text
