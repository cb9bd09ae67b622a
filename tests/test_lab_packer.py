"""The lab's model of heapcast's packer (native/lab/pol_pack.c) on hand-made traces whose resident
pages are computed by hand. Every replay runs in checked mode (no overlap, every block aligned as
asked: 8 bytes for the 24-byte blocks of the 8-byte grain)."""
import pytest

from heapcast.lab import LabError, simulate
from test_lab_policies import Events, fragmentation_pattern

PAGE = 4096
BUDGET = 256 * 1024   # the packer's free-but-resident pages, counted as held at every moment


def kernel(r: dict, name: str) -> dict:
    """A kernel's metrics in the trace's one process (kernel names: native.POLICY_IDS)."""
    return r["per_process"][0]["policies"][name]


def test_footprint_is_the_pages_holding_live_bytes_plus_the_dirty_budget():
    # 64 blocks of 4000 bytes (class 4000: every 16 bytes to 8 KiB): 16 per 64 KiB span, 64000
    # bytes each, on 16 pages; four spans. All freed, then one block of 100,000 bytes: class
    # 65536 + 17 * 2048 = 100,352 (32 classes per doubling), 25 pages.
    e = Events()
    for i in range(64):
        e.malloc(0x100000 + 0x1000 * i, 4000)
    for i in range(64):
        e.free(0x100000 + 0x1000 * i)
    e.malloc(0x900000, 100000)
    r = simulate(e.trace(), policies="heapcast", checked=True)
    v = r["policies"]["heapcast"]
    assert v["peak_footprint_bytes"] == 64 * PAGE + BUDGET
    assert v["peak_pages_4k"] == 64
    m = kernel(r, "heapcast")
    assert m["chunk_bytes"] == 100352 and m["live_bytes"] == 100000


def test_lifetime_groups_never_share_a_page():
    # 17 short-lived and 17 never-freed blocks of 216 bytes (class 224), interleaved: in one group
    # they alternate over 7616 bytes (2 pages), and the long ones keep both pages when the short
    # ones go; the four 1000-byte blocks (class 1008) then take a third page. By lifetime group
    # (the oracle's classes: the short ones are class 1, group 1; the others group 0), the short
    # ones fill a page of their own span, which empties: the peak is 2 pages.
    r = simulate(fragmentation_pattern().trace(), policies="heapcast,oracle-lifetime",
                 checked=True)
    assert kernel(r, "heapcast")["peak_footprint"] == 3 * PAGE + BUDGET
    assert kernel(r, "oracle-lifetime@heapcast")["peak_footprint"] == 2 * PAGE + BUDGET
    # the clairvoyant result is the best candidate, the packer's included
    cands = [m["peak_footprint"] for n, m in r["per_process"][0]["policies"].items()]
    assert r["policies"]["oracle-lifetime"]["peak_footprint_bytes"] == min(cands)


def test_the_eight_byte_grain_packs_24_byte_blocks_at_8_byte_alignment():
    e = Events()
    for i in range(1000):
        e.malloc(0x100000 + 0x40 * i, 24)
    e.memalign(0x900000, 24, 16)     # an aligned request skips to a class that gives it: 32
    v16 = kernel(simulate(e.trace(), policies="heapcast", checked=True), "heapcast")
    v8 = kernel(simulate(e.trace(), policies="heapcast", checked=True, grain=8), "heapcast")
    assert v16["chunk_bytes"] == 1001 * 32
    assert v8["chunk_bytes"] == 1000 * 24 + 32
    assert v16["peak_pages4k"] == 8           # 32,000 bytes, then the 32-byte class's own span
    assert v8["peak_pages4k"] == 6 + 1        # 24,000 bytes on 6 pages, and the same
    with pytest.raises(LabError, match="grain=4"):
        simulate(e.trace(), policies="heapcast", grain=4)


def test_realloc_in_place_within_its_class_or_its_mapping():
    # 100 -> 110: both class 112, in place; -> 200 (class 208): moved. 300,000 bytes: a mapping
    # of its own (over 256 KiB), page-rounded; grown to 400,000 by mremap, in place.
    e = (Events().malloc(0x1000, 100).realloc(0x1000, 0x1000, 110).realloc(0x1000, 0x2000, 200)
         .malloc(0x100000, 300000).realloc(0x100000, 0x100000, 400000))
    r = simulate(e.trace(), policies="heapcast", checked=True)
    m = kernel(r, "heapcast")
    assert m["inplace"] == 2 and m["moves"] == 1
    assert m["peak_mmapped"] == 98 * PAGE              # 400,000 bytes on 98 pages
    assert m["chunk_bytes"] == 208 + 98 * PAGE
    assert m["peak_pages4k"] == 1 + 98


def test_alignment_beyond_a_page_gets_a_mapping():
    e = Events().memalign(0x1000, 100, 8192).memalign(0x10000, 5000, 1024)
    r = simulate(e.trace(), policies="heapcast", checked=True)
    m = kernel(r, "heapcast")
    # 100 bytes at 8 KiB: a mapping of one page; 5000 at 1 KiB: the first class that is a
    # multiple of 1024 (5120), in a span
    assert m["peak_mmapped"] == PAGE
    assert m["chunk_bytes"] == PAGE + 5120


def test_a_forked_child_starts_from_a_copy_of_the_packer():
    from heapcast import Process, Trace
    from heapcast.trace.model import LocationTable
    from pathlib import Path
    parent = Events().malloc(0x1000, 100).malloc(0x2000, 100)
    child = Events().add(0, seq=3, addr=0x3000, size=100)   # MALLOC after the fork
    sites = LocationTable.from_lists([[]] + [[0x400000 + 0x100 * i] for i in range(1, 8)])
    p = Process(index=0, pid=1, _events=parent.array(), event_count=2, locations=sites)
    c = Process(index=1, pid=2, _events=child.array(), event_count=1, locations=sites,
                forked_from=1, fork_seq=3)
    r = simulate(Trace(Path("hand-made"), [p, c]), policies="heapcast", checked=True)
    # the child has the parent's two blocks (inherited at the fork) and its own: three of 112
    kid = r["per_process"][1]["policies"]
    assert kid["heapcast"]["chunk_bytes"] == 3 * 112
    # its peak starts from the heap it inherits, counted as the parent's is: resident pages
    assert kid["heapcast"]["peak_footprint"] == PAGE + BUDGET


def test_freed_big_mappings_are_kept_until_the_heap_grows():
    # 1 MiB freed is kept (256 pages, resident): a 4 MiB request does not fit it (more than a
    # quarter smaller), so both are resident at once; the next 1 MiB takes the kept one; a small
    # block opens a span, which gives the kept mappings back.
    mib = 1 << 20
    e = (Events().malloc(0x1000000, mib).free(0x1000000).malloc(0x2000000, 4 * mib)
         .free(0x2000000).malloc(0x3000000, mib - 100))
    r = simulate(e.trace(), policies="heapcast", checked=True)
    assert kernel(r, "heapcast")["peak_footprint"] == 5 * mib + BUDGET
    m = kernel(r, "heapcast")
    assert m["chunk_bytes"] == mib                  # the kept 1 MiB mapping, reused whole
    e.malloc(0x4000000, 100).free(0x3000000)       # a span: the kept 4 MiB go; then 1 MiB kept
    r = simulate(e.trace(), policies="heapcast", series=True, checked=True)
    assert kernel(r, "heapcast")["peak_footprint"] == 5 * mib + BUDGET
    ext = r["series"][0]["policies"]["heapcast"]["extent"]
    assert int(ext[-1]) == mib + PAGE + BUDGET      # the last block live, the 1 MiB kept
