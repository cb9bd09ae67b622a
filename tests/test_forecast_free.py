"""The `free` task's labels: both ends of the recency order, by hand-computed examples (FIFO,
LIFO, per-site pools), and models that learn a queue's frees of its oldest block."""
import numpy as np
import pytest

from heapcast.forecast.features import featurize
from heapcast.forecast.models import create_model
from heapcast.forecast.tasks import (FREE_BEYOND, FREE_YOUNG, free_label, free_label_rank,
                                     make_task)
from heapcast.trace.format import EVENT_DTYPE, FREE, MALLOC
from heapcast.trace.model import LocationTable, Process, Trace

OLDEST = FREE_YOUNG           # the label of the oldest live block


def trace_of(steps):
    """A one-process trace from ("malloc", name, site[, size]) / ("free", name) steps; blocks get
    distinct addresses, sites are location ids 1 and 2 (a block's size: 16 x its site unless
    given)."""
    rows, addr_of = [], {}
    for i, step in enumerate(steps):
        if step[0] == "malloc":
            addr_of[step[1]] = 0x1000 + 0x100 * i
            size = step[3] if len(step) > 3 else 16 * step[2]
            rows.append((MALLOC, size, addr_of[step[1]], 0, step[2]))
        else:
            rows.append((FREE, 0, 0, addr_of[step[1]], 0))
    ev = np.zeros(len(rows), EVENT_DTYPE)
    for k, name in enumerate(("op", "size", "addr", "old_addr", "loc")):
        ev[name] = [r[k] for r in rows]
    ev["seq"] = np.arange(1, len(ev) + 1)
    ev["ts"] = 1000 * ev["seq"]
    locs = LocationTable.from_lists([[], [0x401000], [0x402000]])
    return Trace("steps", [Process(index=0, pid=1, _events=ev, event_count=len(ev),
                                   locations=locs)])


def free_labels(steps):
    data = make_task(featurize([trace_of(steps)], order="process"), "free", "rich")
    return data.labels[data.labels >= 0].tolist()


def test_fifo_frees_the_oldest_block():
    steps = [("malloc", "a", 1), ("malloc", "b", 1), ("malloc", "c", 1), ("free", "a"),
             ("malloc", "d", 1), ("free", "b"), ("free", "c"), ("free", "d")]
    # a: rank 2 of 3 live (the oldest); b: rank 2 of b, c, d; c: rank 1 of c, d (oldest; the
    # young end is farther); d: the only live block, rank 0 (ties go to the young end).
    assert free_labels(steps) == [OLDEST, OLDEST, OLDEST, 0]


def test_lifo_frees_the_youngest_block():
    steps = [("malloc", "a", 1), ("malloc", "b", 1), ("malloc", "c", 1), ("free", "c"),
             ("free", "b"), ("malloc", "d", 1), ("free", "d"), ("free", "a")]
    assert free_labels(steps) == [0, 0, 0, 0]


def test_per_site_pools():
    # Pool 1 is a queue, pool 2 a stack, their allocations interleaved.
    steps = [("malloc", "p1", 1), ("malloc", "q1", 2), ("malloc", "p2", 1), ("malloc", "q2", 2),
             ("malloc", "p3", 1), ("malloc", "q3", 2),
             ("free", "q3"),                 # the youngest of p1 q1 p2 q2 p3 q3
             ("free", "p1"),                 # the oldest of p1 q1 p2 q2 p3
             ("malloc", "p4", 1),
             ("free", "q2"),                 # q1 p2 [q2] p3 p4: rank 2, 2 older: young end
             ("free", "p2")]                 # q1 [p2] p3 p4: rank 2, 1 older: oldest + 1
    assert free_labels(steps) == [0, OLDEST, 2, OLDEST + 1]


def test_label_function_and_its_inverse():
    rank = np.array([0, 99, 1, 70, 200, 5, 0, -1])
    live = np.array([1, 100, 100, 300, 300, 8, 3, -1])
    labels = free_label(rank, live)
    assert labels.tolist() == [0, OLDEST, 1, FREE_BEYOND, FREE_BEYOND, OLDEST + 2, 0, -1]
    back = free_label_rank(labels, live)
    assert back.tolist() == [0, 99, 1, -1, -1, 5, 0, -1]
    # Every block within reach of either end round-trips, over many live counts.
    for n in (1, 2, 63, 64, 65, 127, 128, 129, 500):
        r = np.arange(n)
        lab = free_label(r, np.full(n, n))
        reach = (r < FREE_YOUNG) | (n - 1 - r < FREE_BEYOND - FREE_YOUNG)
        assert ((lab < FREE_BEYOND) == reach).all()
        assert (free_label_rank(lab, np.full(n, n))[reach] == r[reach]).all()


def queue_trace(iterations=700, depth=100):
    """A FIFO queue of `depth` blocks (site 2) with a short-lived temporary (site 1) in every
    iteration: malloc tmp, malloc item, free tmp (rank 1), free the queue's oldest item."""
    steps = []
    for i in range(iterations):
        steps += [("malloc", f"t{i}", 1), ("malloc", f"q{i}", 2), ("free", f"t{i}")]
        if i >= depth:
            steps.append(("free", f"q{i - depth}"))
    return trace_of(steps)


@pytest.mark.parametrize("kind", ["ngram", "gru"])
def test_models_learn_a_queues_frees(kind):
    data = make_task(featurize([queue_trace()], order="process"), "free", "rich")
    rows = np.flatnonzero(data.labels >= 0)
    assert set(data.labels[rows[-20:]].tolist()) == {1, OLDEST}
    if kind == "gru":
        pytest.importorskip("torch")
        cfg = {"hidden": 32, "batch": 8, "bptt": 32, "lr": 0.01, "threads": 1, "embed": 16,
               "site_embed": 8, "site_buckets": 64, "warmup": 32}
        m = create_model("gru", "free", "rich", cfg)
        m.fit(data, np.ones(len(data), bool), epochs=4, progress=False)
    else:
        m = create_model("ngram", "free", "rich")
        m.fit(data, np.ones(len(data), bool))
    rows = rows[rows >= 400]          # once the queue is full
    pred = m.predict(data, rows, 1)[:, 0]
    assert (pred == data.labels[rows]).mean() >= 0.99
