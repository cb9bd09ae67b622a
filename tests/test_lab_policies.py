"""The allocator lab on hand-made traces whose footprint under each policy is computed by hand
(docs/policies.md gives each policy's chunk format). Every replay runs in checked mode: no two
live chunks overlap, every chunk lies inside the footprint, every block is aligned as asked."""
import random
from pathlib import Path

import numpy as np
import pytest

from heapcast import EVENT_DTYPE, Process, Trace
from heapcast.lab import ALL_POLICIES, CLASSIC, simulate
from heapcast.lab.report import format_simulation
from heapcast.trace.format import FREE, MALLOC, POSIX_MEMALIGN, REALLOC
from heapcast.trace.model import LocationTable


class Events:
    """Builds a process's events the way the recorder numbers them (a realloc takes two seqs,
    its old block released at the first)."""

    def __init__(self):
        self.rows, self.seq = [], 0

    def add(self, op, addr=0, old=0, size=0, arg=0, loc=1, lag=None, tid=0, seq=None):
        moved = op == REALLOC and old and addr and addr != old
        self.seq = seq if seq is not None else self.seq + (2 if moved else 1)
        lag = lag if lag is not None else (1 if moved else 0)
        self.rows.append((self.seq, op, addr, old, size, arg, loc, lag, tid))
        return self

    def malloc(self, addr, size, loc=1, **kw):
        return self.add(MALLOC, addr=addr, size=size, loc=loc, **kw)

    def free(self, addr, **kw):
        return self.add(FREE, old=addr, **kw)

    def realloc(self, old, addr, size, **kw):
        return self.add(REALLOC, addr=addr, old=old, size=size, **kw)

    def memalign(self, addr, size, align, **kw):
        return self.add(POSIX_MEMALIGN, addr=addr, size=size, arg=align, **kw)

    def array(self) -> np.ndarray:
        a = np.zeros(len(self.rows), EVENT_DTYPE)
        for i, (seq, op, addr, old, size, arg, loc, lag, tid) in enumerate(self.rows):
            a[i] = (seq, 1000 * seq, addr, old, size, arg, loc, tid, lag, 0, op, 0)
        return a

    def trace(self) -> Trace:
        a = self.array()
        sites = LocationTable.from_lists([[]] + [[0x400000 + 0x100 * i] for i in range(1, 8)])
        p = Process(index=0, pid=1, _events=a, event_count=len(a), locations=sites)
        return Trace(Path("hand-made"), [p])


def footprints(result) -> dict:
    return {name: v["peak_footprint_bytes"] for name, v in result["policies"].items()}


def fragmentation_pattern() -> Events:
    """The classic pattern: short- and long-lived blocks interleaved, the short ones freed, then
    bigger long-lived blocks that no hole can hold. 17 short (S, call site 1) and 17 long (L,
    site 2) blocks of 216 bytes, then 4 blocks of 1000 bytes (M, site 3), never freed."""
    e = Events()
    for i in range(17):
        e.malloc(0x10000 + 0x1000 * i, 216, loc=1)
        e.malloc(0x80000 + 0x1000 * i, 216, loc=2)
    for i in range(17):
        e.free(0x10000 + 0x1000 * i)
    for i in range(4):
        e.malloc(0x200000 + 0x1000 * i, 1000, loc=3)
    return e


def test_first_fit_chunks_by_hand():
    # dlmalloc chunks: 100 -> 112, 200 -> 208, 50 -> 64; the 50 reuses A's hole at the front.
    e = Events().malloc(0x1000, 100).malloc(0x2000, 200).free(0x1000).malloc(0x3000, 50)
    r = simulate(e.trace(), policies="first-fit", checked=True)
    v = r["policies"]["first-fit"]
    assert r["peak_live_bytes"] == 300
    assert v["peak_footprint_bytes"] == 112 + 208
    assert v["internal_bytes_at_peak"] == 20 and v["external_bytes_at_peak"] == 0
    assert v["fragmentation"] == pytest.approx(320 / 300)
    assert v["peak_pages_4k"] == 1 and v["peak_pages_2m"] == 1


def test_fragmentation_pattern_first_fit_loses_lifetime_segregation_wins():
    r = simulate(fragmentation_pattern().trace(), checked=True, span=4096)
    f = footprints(r)
    assert r["peak_live_bytes"] == 17 * 216 + 4 * 1000
    # Sequential fits: 34 chunks of 224 bytes, the 17 short ones leave 224-byte holes that no
    # 1008-byte chunk fits, so the four Ms extend the heap.
    for name in ("first-fit", "next-fit", "best-fit"):
        assert f[name] == 34 * 224 + 4 * 1008, name
    ff = r["policies"]["first-fit"]
    assert ff["external_bytes_at_peak"] == 17 * 224          # exactly the holes
    assert ff["internal_bytes_at_peak"] == 17 * (224 - 216) + 4 * (1008 - 1000)
    # Lifetime placement: the Ss (class 1: 18-34 events) get a span, a 4 KiB chunk of the main
    # heap whose payload is page-aligned: it starts at 4088, leaving [8, 4088) free, where the Ls
    # (never freed: main heap) go. The Ss' span empties and merges back into the top, which the
    # Ms then extend from the Ls' end (3816) to 7848. The peak is the span's end: 8184 - 8.
    assert f["oracle-lifetime"] == 8184 - 8
    # buddy: 34 blocks of 256 packed from 0, holes of 256; the Ms (1024 each) come from the free
    # buddies above: 9216, 10240, 11264, and 12288 (split from 4 KiB): highest end 13312.
    assert f["buddy"] == 13312
    # segregated: 216 -> class 224, 128 per lcm(224, 4096) = 28 KiB slab: one slab, not empty
    # when the Ss go; 1000 -> class 1024, a 4 KiB slab after it.
    assert f["segregated"] == 28672 + 4096
    # glibc: the first sbrk takes the chunk + 128 KiB top pad + 32, page-rounded; all fits in it.
    assert f["glibc"] == 135168
    assert r["unknown_frees"] == 0 and r["double_acquires"] == 0
    s = r["summary"]
    assert s["best_classic"] == "first-fit"
    assert s["oracle_gain"] == pytest.approx(1 - 8176 / 11648)


def test_learned_lifetime_trained_on_another_run_closes_the_gap():
    pattern = fragmentation_pattern().trace()
    # (over best-fit, the oracle's placement here: the packer's 64 KiB units and free-page
    # budget would dwarf this 8 KiB heap)
    r = simulate(pattern, policies="first-fit,oracle-lifetime,learned-lifetime",
                 train=fragmentation_pattern().trace(), checked=True, span=4096,
                 learned_over="best-fit")
    f = footprints(r)
    assert f["learned-lifetime"] == f["oracle-lifetime"] == 8176
    assert r["summary"]["learned_gap_closed"] == pytest.approx(1.0)
    assert r["prediction"]["accuracy"] == 1.0
    assert r["predictor"].startswith("call sites, seeded by")


def test_learned_lifetime_online_never_sees_the_future():
    # Without training, the first blocks of each site get the default class (never freed) and
    # later ones what the site's blocks did so far: here every S is still live when the Ls come,
    # so the predictor cannot know the Ss are short-lived: no better than the classic fits.
    r = simulate(fragmentation_pattern().trace(), policies="first-fit,learned-lifetime",
                 checked=True, span=4096, learned_over="best-fit")
    assert r["predictor"] == "call sites, learned online"
    assert footprints(r)["learned-lifetime"] > 8176


def test_a_span_whose_blocks_outlive_their_class_is_reclassified():
    # Site 1's blocks live one event, so the predictor learns class 0; then one of them (X) is
    # never freed, in a class-0 span (a 4 KiB chunk of the main heap at 4088, the first whose
    # payload is page-aligned). Site 2's blocks (new: predicted never freed) go to the main heap
    # below it. 20 events later the span's deadline (X's allocation + 16 events) has passed:
    # when site 1 allocates again, the span is moved to class 1, whose free space class 0 may
    # still use (no class-0 span has room), so no new span is needed.
    e = Events()
    for i in range(40):
        e.malloc(0x1000 + 0x100 * i, 64).free(0x1000 + 0x100 * i)
    e.malloc(0x100000, 64)
    for i in range(20):
        e.malloc(0x200000 + 0x100 * i, 64, loc=2)
    for i in range(40):
        e.malloc(0x8000 + 0x100 * i, 64).free(0x8000 + 0x100 * i)
    r = simulate(e.trace(), policies="learned-lifetime,oracle-lifetime", checked=True, span=4096,
                 learned_over="best-fit")   # spans with deadlines: the fits' segregation
    learned = r["policies"]["learned-lifetime"]
    assert learned["reclassified_spans"] == 1
    assert learned["peak_footprint_bytes"] == 4088 + 4096 - 8
    # The oracle knew: X went to the main heap with site 2's blocks, and the short-lived blocks
    # after them to a span of their own, at the same place; but on this tiny heap a classic
    # policy packs tighter still, and the clairvoyant result is the best placement there is.
    layered = r["per_process"][0]["policies"]["oracle-lifetime@best-fit"]
    assert layered["reclassified"] == 0 and layered["peak_footprint"] == 4088 + 4096 - 8
    oracle = r["policies"]["oracle-lifetime"]
    assert oracle["peak_footprint_bytes"] == 1760 and oracle["placement"] in CLASSIC


def test_a_span_pinned_for_long_dissolves_into_the_main_heap():
    # As above, but X outlives every span class: sweeps (every 4096 allocations) move its span
    # to class 1, then 2, then (class 3 and up share the main heap) dissolve it into the main
    # heap, where X is freed at last.
    e = Events()
    for i in range(40):
        e.malloc(0x1000 + 0x100 * i, 64).free(0x1000 + 0x100 * i)
    e.malloc(0x100000, 64)
    for i in range(20000):
        e.malloc(0x1000000 + 0x100 * i, 64, loc=2)
    e.free(0x100000)
    r = simulate(e.trace(), policies="learned-lifetime,oracle-lifetime", checked=True, span=4096,
                 learned_over="best-fit")
    assert r["policies"]["learned-lifetime"]["reclassified_spans"] == 3
    assert r["policies"]["oracle-lifetime"]["reclassified_spans"] == 0
    for v in r["per_process"][0]["policies"].values():
        assert v["live_bytes"] == 20000 * 64


def test_realloc_in_place_and_moved():
    e = (Events().malloc(0x1000, 100).malloc(0x2000, 16)
         .realloc(0x1000, 0x3000, 200)            # moved: B blocks growth in place
         .realloc(0x3000, 0x3000, 40)             # shrink in place: the tail goes back to top
         .malloc(0x4000, 60))                     # first fit into A's old hole
    r = simulate(e.trace(), policies="first-fit,best-fit", checked=True)
    for name in ("first-fit", "best-fit"):
        v = r["policies"][name]
        assert v["peak_footprint_bytes"] == 112 + 32 + 208, name
        assert v["moves"] == 1 and v["in_place_reallocs"] == 1
    assert r["peak_live_bytes"] == 216


def test_realloc_grows_into_the_wilderness_and_frees():
    e = (Events().malloc(0x1000, 100).realloc(0x1000, 0x1000, 1000)
         .add(REALLOC, addr=0, old=0x1000, size=0)     # realloc(p, 0): a free
         .malloc(0x1000, 24).add(REALLOC, addr=0, old=0x1000, size=1 << 40))   # failed: kept
    r = simulate(e.trace(), policies="first-fit,glibc,segregated,buddy", checked=True)
    assert r["policies"]["first-fit"]["peak_footprint_bytes"] == 1008
    assert r["policies"]["first-fit"]["in_place_reallocs"] == 1
    assert r["unknown_frees"] == 0 and r["peak_live_bytes"] == 1000
    assert r["per_process"][0]["policies"]["first-fit"]["live_bytes"] == 24


def test_moved_realloc_whose_old_address_another_thread_reuses():
    # Thread 0's realloc released X at seq 2 (free_lag 2); thread 1 got X at seq 3; the realloc
    # event itself is numbered 4. Replayed in order, the release must come first.
    e = (Events().malloc(0x1000, 100, seq=1)
         .malloc(0x1000, 50, tid=1, seq=3)
         .realloc(0x1000, 0x2000, 300, lag=2, seq=4)
         .free(0x2000, seq=5).free(0x1000, tid=1, seq=6))
    r = simulate(e.trace(), checked=True)
    assert r["unknown_frees"] == 0 and r["double_acquires"] == 0
    assert r["peak_live_bytes"] == 350
    for name, v in r["per_process"][0]["policies"].items():
        assert v["live_bytes"] == 0, name


def test_alignment_honoured():
    e = Events().malloc(0x1000, 10).memalign(0x10000, 100, 4096).malloc(0x2000, 3000)
    e.memalign(0x100000, 5000, 65536).memalign(0x200000, 300000, 8192).memalign(0x300000, 24, 32)
    e.free(0x10000).free(0x100000)
    r = simulate(e.trace(), checked=True)       # checked: every payload aligned as asked
    # first-fit: the aligned chunk starts at 4088 (payload 4096), leaving [40, 4088) free, where
    # the 3000-byte chunk then fits.
    small = simulate(Events().malloc(0x1000, 10).memalign(0x10000, 100, 4096)
                     .malloc(0x2000, 3000).trace(), policies="first-fit", checked=True)
    assert small["policies"]["first-fit"]["peak_footprint_bytes"] == 4088 + 112 - 8
    assert r["unknown_frees"] == 0


def test_buddy_merges_back_and_segregated_returns_empty_slabs():
    e = Events()
    for i in range(64):
        e.malloc(0x1000 * (i + 1), 100)
    for i in range(64):
        e.free(0x1000 * (i + 1))
    e.malloc(0x100000, 8000)
    r = simulate(e.trace(), policies="buddy,segregated", checked=True)
    # buddy: 64 blocks of 128 (100 + 16) fill [0, 8192); freed, they merge back into one free
    # region, from which the 8192-byte block (8000 + 16) is carved at 0.
    assert r["policies"]["buddy"]["peak_footprint_bytes"] == 8192
    # segregated: 100 -> class 112, whose slab is lcm(112, 4096) = 28 KiB (256 regions); it
    # empties and goes back; 8000 -> class 8192, a slab of 8 KiB placed at page 0.
    assert r["policies"]["segregated"]["peak_footprint_bytes"] == 28672
    for v in r["per_process"][0]["policies"].values():
        assert v["live_bytes"] == 8000


def test_glibc_mmaps_large_blocks_and_raises_its_threshold():
    e = (Events().malloc(0x1000, 200000).free(0x1000)     # mmapped; freeing raises the threshold
         .malloc(0x2000, 200000))                          # now below it: from the heap
    r = simulate(e.trace(), policies="glibc", checked=True)
    v = r["policies"]["glibc"]
    assert v["peak_mmapped_bytes"] == 200704                 # 200016 + 16, page-rounded
    # The second block comes from the top: sbrk of chunk (200016) + 128 KiB pad + 32, rounded.
    assert v["peak_footprint_bytes"] == ((200016 + 131072 + 32 + 4095) // 4096) * 4096


def test_unknown_policy_is_refused():
    from heapcast.lab import LabError
    with pytest.raises(LabError, match="unknown policy nope"):
        simulate(Events().malloc(0x1000, 1).trace(), policies="first-fit,nope")


def test_the_clairvoyant_result_is_a_bound_never_worse_than_a_classic_policy():
    """oracle-lifetime is the best of lifetime segregation layered over each fit and the classic
    policies themselves; the lower bound (peak live bytes) is reported beside it."""
    for events in (fragmentation_pattern(), Events().malloc(0x1000, 100).malloc(0x2000, 200)
                   .free(0x1000).malloc(0x3000, 50)):
        r = simulate(events.trace(), checked=True, span=4096)
        f = footprints(r)
        assert f["oracle-lifetime"] <= min(f[n] for n in CLASSIC)
        assert r["summary"]["lower_bound_bytes"] == r["peak_live_bytes"] <= f["oracle-lifetime"]
        assert r["policies"]["learned-lifetime"]["placement"] == "lifetime over heapcast"
        assert set(r["policies"]) == set(ALL_POLICIES)
    assert "lower bound: peak live" in format_simulation(r)


def dl_chunk(n):
    return max(32, (n + 8 + 15) // 16 * 16)

class RefHeap:
    """The fit policies' free ranges as docs/policies.md states them, with plain Python lists:
    the lowest-addressed (first-fit), the lowest at or after the rover (next-fit) or the
    smallest, then lowest (best-fit) free range that fits, split at its front when 32 bytes or
    more are left; coalescing on release; the wilderness [top, inf) when nothing fits."""

    def __init__(self, mode):
        self.mode, self.free, self.top, self.rover = mode, {}, 8, 8

    def alloc(self, need):
        cands = [(s, l) for s, l in self.free.items() if l >= need]
        pick = None
        if cands and self.mode == "best":
            pick = min(cands, key=lambda c: (c[1], c[0]))
        elif cands:
            after = [c for c in cands if c[0] >= self.rover] if self.mode == "next" else []
            pick = min(after) if after else min(cands)
        if pick is None:
            s = self.top
            self.top += need
            self.rover = self.top
            return s, need
        f, flen = pick
        del self.free[f]
        got = need
        if flen - need >= 32:
            self.free[f + need] = flen - need
        else:
            got = flen
        self.rover = f + got
        return f, got

    def release(self, s, ln):
        start = next((a for a, l in self.free.items() if a + l == s), None)
        e = s + ln
        if e == self.top:
            if start is not None:
                del self.free[start]
            self.top = start if start is not None else s
            self.rover = min(self.rover, self.top)
            return
        if start is None:
            start = s
        total = e - start
        if e in self.free:
            total += self.free.pop(e)
        self.free[start] = total

    def extend(self, s, ln, newlen):
        e, extra = s + ln, newlen - ln
        if e == self.top:
            self.top = s + newlen
            return newlen
        v = self.free.get(e)
        if v is None or v < extra:
            return None
        del self.free[e]
        if v - extra >= 32:
            self.free[e + extra] = v - extra
            return newlen
        return ln + v

def reference(ops, mode):
    """The peak extent of a fit policy over ops (("a", id, size), ("f", id), ("r", old, new,
    size)), realloc as pol_fit.c does it: in place when smaller or when the next range or the
    wilderness can grow it, else moved (allocated, then the old chunk released)."""
    h, where, peak = RefHeap(mode), {}, 0
    for op in ops:
        if op[0] == "a":
            where[op[1]] = h.alloc(dl_chunk(op[2]))
        elif op[0] == "f":
            h.release(*where.pop(op[1]))
        else:   # ("r", old, new, size)
            s, ln = where.pop(op[1])
            need = dl_chunk(op[3])
            if need <= ln:
                if ln - need >= 32:
                    h.release(s + need, ln - need)
                    ln = need
                where[op[2]] = (s, ln)
            else:
                got = h.extend(s, ln, need)
                if got is not None:
                    where[op[2]] = (s, got)
                else:
                    where[op[2]] = h.alloc(need)
                    h.release(s, ln)
        peak = max(peak, h.top - 8)
    return peak

def random_ops(seed, n):
    """n random mallocs (small, medium and up to 5000 bytes), frees and reallocs."""
    rng = random.Random(seed)
    ops, live, nid = [], [], 0
    for _ in range(n):
        r = rng.random()
        if live and r < 0.4:
            i = rng.randrange(len(live))
            live[i], live[-1] = live[-1], live[i]
            ops.append(("f", live.pop()))
        elif live and r < 0.55:
            i = rng.randrange(len(live))
            ops.append(("r", live[i], nid, rng.randint(1, 3000)))
            live[i] = nid
            nid += 1
        else:
            size = rng.choice([rng.randint(1, 64), rng.randint(1, 600), rng.randint(1, 5000)])
            ops.append(("a", nid, size))
            live.append(nid)
            nid += 1
    return ops

@pytest.mark.parametrize("seed", range(4))
def test_fit_policies_match_a_plain_reference_on_random_traces(seed):
    """first-fit, next-fit and best-fit (native/lab/fitheap.c: hash maps and treaps, their
    ranges changed in place where an order allows it) give the footprint of RefHeap on random
    traces of mallocs, frees and reallocs; checked mode (a broken invariant raises) verifies
    the trees' order and subtree lengths against the maps."""
    ops = random_ops(seed, 3000)
    e = Events()
    for op in ops:
        at = [0x100000 + 0x10000 * i for i in op[1:3] if isinstance(i, int)]
        if op[0] == "a":
            e.malloc(at[0], op[2])
        elif op[0] == "f":
            e.free(at[0])
        else:
            e.realloc(at[0], at[1], op[3])
    r = simulate(e.trace(), policies="first-fit,next-fit,best-fit", checked=True)
    assert footprints(r) == {f"{m}-fit": reference(ops, m) for m in ("first", "next", "best")}
