"""The learned model's in-run memory: what followed the latest earlier occurrence of a context in
the same stream, computed causally, and a model that adapts with it to a run whose sizes differ
from the run it learned from."""
import numpy as np
import pytest

from heapcast.forecast.features import featurize
from heapcast.forecast.models import create_model
from heapcast.forecast.models.ngram import NGram
from heapcast.forecast.tasks import TaskData, make_task
from heapcast.trace.format import EVENT_DTYPE, FREE, MALLOC
from heapcast.trace.model import LocationTable, Process, Trace

A, B, C = 10, 20, 30


def stream_data(streams, task="next"):
    tokens = np.concatenate([np.asarray(s, np.uint16) for s in streams])
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in streams])]).astype(np.int64)
    n = len(tokens)
    zeros = np.zeros(n, np.uint32)
    return TaskData(task, "rich", tokens, zeros, zeros.astype(np.uint8), tokens.astype(np.int64),
                    offsets, np.arange(n, dtype=np.uint64), zeros.astype(np.uint16),
                    np.full(n, -1, np.int64))


def test_recent_continuations_by_hand():
    data = stream_data([[A, B, A, C, A, B], [A, B]])
    got = NGram("next", "rich", {"sites": True}).recent_continuations(data, [1, 2])
    # Order 1: the context of row j is the token of row j-1.
    #   row 3 (after A): A was last followed by B (row 1); row 5 (after A): by C (row 3).
    assert got[1].tolist() == [-1, -1, -1, B, -1, C, -1, -1]   # stream 2 starts empty
    # Order 2: contexts (B, A) at rows 3 and... only (x, A) pairs: (PAD,A) row1, (B,A) row3,
    # (C,A) row5: all different.
    assert got[2].tolist() == [-1] * 8


def test_recent_continuations_are_causal():
    rng = np.random.default_rng(0)
    toks = rng.integers(0, 4, 500)
    data = stream_data([toks])
    ng = NGram("next", "rich", {"sites": True})
    before = ng.recent_continuations(data, [3])[3]
    j = 300
    changed = toks.copy()
    changed[j:] = (changed[j:] + 1) % 4                 # a different future from row j on
    after = ng.recent_continuations(stream_data([changed]), [3])[3]
    assert (before[:j] == after[:j]).all()              # rows before j cannot tell
    # And it is what a plain scan back finds (padding before the stream's start).
    padded = [None] * 3 + toks.tolist()
    for row in range(len(toks)):
        ctx = padded[row:row + 3]
        want = next((toks[i] for i in range(row - 1, -1, -1) if padded[i:i + 3] == ctx), -1)
        assert before[row] == want, row


def sorted_continuations(ctx, labels, offsets):
    """The in-run memory as numpy computed it before the native pass: rows sorted by (context,
    stream), the latest labelled row before each by running maxima. The reference."""
    from heapcast.forecast.features import mix64
    stream = np.repeat(np.arange(len(offsets) - 1, dtype=np.uint64), np.diff(offsets))
    key = mix64(ctx ^ (stream * np.uint64(0x9E3779B97F4A7C15)))
    order = np.argsort(key, kind="stable")
    k = key[order]
    first = np.ones(len(k), bool)
    first[1:] = k[1:] != k[:-1]
    group_start = np.maximum.accumulate(np.where(first, np.arange(len(k)), 0))
    latest = np.maximum.accumulate(np.where(labels[order] >= 0, np.arange(len(k)), -1))
    before = np.concatenate([[-1], latest[:-1]])
    found = before >= group_start
    res = np.full(len(k), -1, np.int64)
    res[found] = labels[order[before[found]]]
    out = np.empty(len(k), np.int64)
    out[order] = res
    return out


@pytest.mark.parametrize("distinct", [7, 300_000])
def test_native_continuations_equal_the_sorted_ones(distinct):
    """The native pass finds what the sort found: on few contexts (a table in the cache) and
    on more than its first table holds (it grows), across streams of any length (empty ones
    too), with unlabelled rows that are never remembered; bad offsets are refused."""
    from heapcast.forecast.native import recent_continuations
    rng = np.random.default_rng(distinct)
    n = 400_000
    ctx = rng.integers(0, distinct, n).astype(np.uint64) * np.uint64(0x10001)
    labels = rng.integers(-1, 50, n).astype(np.int64)       # about 2% without a label
    cuts = np.sort(rng.integers(0, n, 30))
    offsets = np.concatenate([[0], cuts, cuts[:3], [n]]).astype(np.int64)
    offsets.sort()
    got = recent_continuations(ctx, labels, offsets)
    want = sorted_continuations(ctx, labels, offsets)
    assert np.array_equal(got, want) and (got >= 0).sum() > n // 40
    assert len(recent_continuations(ctx[:0], labels[:0], np.zeros(1, np.int64))) == 0
    for bad in (np.array([0, n - 1]), np.array([1, n]), np.array([0, 10, 5, n])):
        with pytest.raises(ValueError, match="offsets do not run from 0"):
            recent_continuations(ctx, labels, bad)


def test_ngram_refuses_more_labels_than_its_keys_hold():
    """The n-gram's table keys hold a label index in 16 bits: rows with more distinct labels
    would mix contexts, so they are refused, saying so (no vocabulary comes near)."""
    data = stream_data([np.arange(70_000) % 65_535])
    data.labels = np.arange(70_000, dtype=np.int64)
    with pytest.raises(ValueError, match="at most 65,536 distinct labels.*have 70,000"):
        NGram("next", "rich").fit(data, np.ones(70_000, bool))


def phase_trace(name, sizes, periods=120):
    """malloc 16 (site 1), malloc X (site 2), free, free; X changes by phase."""
    rows, addr = [], 0x10000
    for size in sizes:
        for _ in range(periods):
            a, b = addr, addr + 0x1000
            addr += 0x2000
            rows += [(MALLOC, 16, a, 0, 1), (MALLOC, size, b, 0, 2), (FREE, 0, 0, a, 3),
                     (FREE, 0, 0, b, 4)]
    ev = np.zeros(len(rows), EVENT_DTYPE)
    for k, field in enumerate(("op", "size", "addr", "old_addr", "loc")):
        ev[field] = [r[k] for r in rows]
    ev["seq"] = np.arange(1, len(ev) + 1)
    ev["ts"] = 1000 * ev["seq"]
    locs = LocationTable.from_lists([[]] + [[0x400000 + 0x10 * i] for i in range(1, 5)])
    p = Process(index=0, pid=1, _events=ev, event_count=len(ev), locations=locs)
    return Trace(name, [p])


def test_model_adapts_to_another_runs_sizes():
    pytest.importorskip("torch")
    run_a = phase_trace("a", [100, 300, 1000, 300, 100, 1000])   # learns three sizes
    run_b = phase_trace("b", [1000, 100])                        # meets them in another order
    da = make_task(featurize([run_a], "thread", False), "next", "rich")
    db = make_task(featurize([run_b], "thread", False), "next", "rich")
    cfg = {"hidden": 32, "batch": 4, "bptt": 32, "lr": 0.01, "threads": 1, "embed": 16,
           "site_embed": 8, "site_buckets": 64, "warmup": 32}
    m = create_model("gru", "next", "rich", cfg)
    m.fit(da, np.ones(len(da), bool), epochs=6, progress=False)
    rows = np.arange(1, len(db), 4)[2:]                  # the size-X mallocs, after the first ones
    rows = rows[(rows % 480) >= 8]                       # and after each phase's first period
    assert (m.predict(db, rows, 1)[:, 0] == db.labels[rows]).mean() >= 0.97
