"""Block matching (heapcast.trace.blocks.match, native/codec/match.c) against a replay written
apart: every acquisition and release applied in position order to a dict of the live blocks."""
import numpy as np
import pytest

from heapcast.trace.blocks import INHERITED, NEVER, UNKNOWN, match
from heapcast.trace.format import ALLOC_OPS, EVENT_DTYPE, FREE, OPS, REALLOC, REALLOCARRAY


def replay(ev, inherited_addrs=(), inherited_sizes=None):
    """The rules of docs/trace-format.md, one action at a time."""
    n = len(ev)
    acquires = np.zeros(n, bool)
    releases = np.zeros(n, bool)
    actions = [(-1, 1, j, "inh", int(a)) for j, a in enumerate(inherited_addrs)]
    for i, e in enumerate(ev):
        op, addr, old = int(e["op"]), int(e["addr"]), int(e["old_addr"])
        resize = op in (REALLOC, REALLOCARRAY)
        if old and (op == FREE or (resize and (addr or int(e["size"]) == 0))):
            releases[i] = True
            lag = int(e["free_lag"]) if (addr != old and op != FREE) else 0
            actions.append((int(e["seq"]) - lag, 0, len(actions), i, old))
        if op in ALLOC_OPS and addr:
            acquires[i] = True
            actions.append((int(e["seq"]), 1, len(actions), i, addr))
    live, alloc_of = {}, np.full(n, UNKNOWN, np.int64)
    release_of, released_size = np.full(n, NEVER, np.int64), np.zeros(n, np.uint64)
    inh_release_of = np.full(len(inherited_addrs), NEVER, np.int64)
    unknown = doubles = 0
    for pos, kind, row, who, addr in sorted(actions):
        if kind == 1:
            doubles += addr in live
            live[addr] = ("inh", row) if who == "inh" else who
        elif addr not in live:
            unknown += 1
        else:
            src = live.pop(addr)
            if isinstance(src, tuple):
                alloc_of[who] = INHERITED
                inh_release_of[src[1]] = who
                if inherited_sizes is not None:
                    released_size[who] = inherited_sizes[src[1]]
            else:
                alloc_of[who], release_of[src] = src, who
                released_size[who] = ev["size"][src]
    return acquires, releases, alloc_of, release_of, released_size, inh_release_of, unknown, doubles


def random_events(rng, n, addresses=12):
    ev = np.zeros(n, EVENT_DTYPE)
    ev["seq"] = np.cumsum(rng.integers(1, 3, n))
    ev["op"] = rng.integers(0, len(OPS), n)
    ev["addr"] = np.where(rng.random(n) < 0.85, rng.integers(1, addresses, n) * 16, 0)
    ev["old_addr"] = np.where(rng.random(n) < 0.7, rng.integers(0, addresses, n) * 16, 0)
    ev["size"] = rng.choice([0, 8, 24, 100], n)
    ev["free_lag"] = rng.integers(0, 3, n)
    return ev


@pytest.mark.parametrize("seed", range(60))
def test_match_equals_a_replay_of_the_live_blocks(seed):
    """Random ops over a dozen addresses: double frees and acquisitions, reallocs released
    before their seq (free_lag), a forked child's inherited blocks (with and without sizes)."""
    rng = np.random.default_rng(seed)
    ev = random_events(rng, int(rng.integers(0, 300)))
    k = int(rng.integers(0, 4))
    inh = rng.integers(1, 12, k).astype(np.uint64) * 16
    sizes = rng.integers(1, 100, k).astype(np.uint64) if seed % 2 else None
    b = match(ev, inh, sizes)
    acq, rel, alloc_of, release_of, released_size, inh_rel, unknown, doubles = \
        replay(ev, inh, sizes)
    assert np.array_equal(b.acquires, acq) and np.array_equal(b.releases, rel)
    assert np.array_equal(b.alloc_of, alloc_of) and np.array_equal(b.release_of, release_of)
    assert np.array_equal(b.released_size, released_size)
    assert np.array_equal(b.inherited_release_of, inh_rel)
    assert (b.unknown_releases, b.double_acquires) == (unknown, doubles)
    assert b.inherited_live == int(np.count_nonzero(inh_rel == NEVER))


def test_match_takes_a_strided_view_and_checks_the_inheritance():
    rng = np.random.default_rng(1)
    ev = random_events(rng, 400)
    every_other = ev[::2]
    assert np.array_equal(match(every_other).alloc_of, match(every_other.copy()).alloc_of)
    with pytest.raises(ValueError, match="2 inherited addresses but 1 sizes"):
        match(ev, np.array([16, 32], np.uint64), np.array([8], np.uint64))
