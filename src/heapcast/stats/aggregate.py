"""One streaming pass over a trace's events that computes every aggregate stats and the report use.

Events arrive through `Trace.chunks`-sized blocks of one process at a time; blocks are matched
across chunks by matching.LiveMap, so memory is bounded by the live blocks of a process plus
per-location and per-time-bucket tables, never by the number of events. Processes are separate
heaps: a forked child starts with the blocks (and live bytes) its parent had at the fork, which the
parent's pass snapshots when it reaches the fork's seq.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..trace.format import FREE, MMAP, MREMAP, MUNMAP, OPS
from .classes import size_classes
from .matching import LiveMap
from .quantiles import StreamingPercentiles

CHUNK = 1 << 20
TIME_BUCKETS = 2000     # per process: memory-over-time points (each keeps its bucket's max)
RANGE_BUCKETS = 200     # per process: coarse buckets for filtering by a time range
NCLASS = 65
LOC_RANGE_CELLS = 1 << 22   # per process: allocations per (coarse bucket, location) while this small


def _sum_by(keys: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Exact uint64 sums of `values` per integer key. bincount's float64 weights are exact while
    every partial sum stays below 2**53, which holds for chunks of sizes below 2**32."""
    if not len(values):
        return np.zeros(n, np.uint64)
    if len(values) <= CHUNK and int(values.max()) < (1 << 32):
        return np.bincount(keys, weights=values.astype(np.float64), minlength=n).astype(np.uint64)
    out = np.zeros(n, np.uint64)
    np.add.at(out, keys, values.astype(np.uint64))
    return out


def _grow(a: np.ndarray, n: int, fill=0) -> np.ndarray:
    """`a` extended with `fill` to at least n entries."""
    if len(a) >= n:
        return a
    return np.concatenate([a, np.full(n - len(a), fill, a.dtype)])


class _Buckets:
    """Per-bucket reductions of a per-event series over a known number of events."""

    def __init__(self, events: int, buckets: int):
        self.width = max(1, -(-events // buckets)) if events else 1
        self.n = max(1, -(-events // self.width)) if events else 0

    def segments(self, first_index: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(bucket ids, segment starts) of events first_index .. first_index + n - 1."""
        b = (first_index + np.arange(n)) // self.width
        starts = np.flatnonzero(np.r_[True, b[1:] != b[:-1]])
        return b[starts], starts


@dataclass
class ProcessAggregate:
    """Everything one process's pass found. Arrays indexed by location id have an extra last slot
    for blocks inherited at a fork (their acquisition is in the parent)."""

    pid: int
    events: int = 0
    threads: int = 0
    first_ts: int | None = None
    last_ts: int = 0
    initial_live: int = 0
    peak: dict | None = None          # {"bytes", "event_index" (in process), "seq", "ts"}
    leaked_blocks: int = 0
    leaked_bytes: int = 0
    inherited_blocks: int = 0
    inherited_released: int = 0
    unknown_frees: int = 0
    double_acquires: int = 0
    ops: np.ndarray = field(default_factory=lambda: np.zeros(len(OPS), np.int64))
    # per location id
    loc_count: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    loc_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    loc_first_seq: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    loc_temporary: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    loc_leaked_count: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    loc_leaked_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    loc_live: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    loc_at_peak: np.ndarray | None = None
    # over time (report)
    series: dict | None = None
    class_by_range: np.ndarray | None = None     # allocations per (coarse bucket, size class)
    class_bytes_by_range: np.ndarray | None = None   # bytes allocated per (coarse bucket, class)
    # freed blocks per (coarse bucket of the allocation, size class, lifetime octave), sparse:
    # {"ns" | "events": (keys bucket * NCLASS * 66 + class * 66 + octave, sorted; blocks)}
    life_by_range: dict | None = None
    loc_by_range: np.ndarray | None = None       # allocations per (coarse bucket, location id)
    # kept with loc_by_range, per (coarse bucket, location id; the last column takes inherited
    # blocks and ids beyond the table): temporary allocations and bytes never freed, by the bucket
    # of the allocation; bytes live at the bucket's own peak (range_peak: the live bytes then)
    loc_temp_by_range: np.ndarray | None = None
    loc_leak_by_range: np.ndarray | None = None
    loc_peak_by_range: np.ndarray | None = None
    range_peak: np.ndarray | None = None
    range_ts: np.ndarray | None = None           # ts of each coarse bucket's last event


class ProcessPass:
    """The pass over one process: feed it its events in seq order, chunk by chunk, then finish().

    `inherited`: matching.BLOCK_DTYPE blocks live at the start (a forked child's); `forks`: {fork_seq: [child
    pids]} of children to snapshot for; `detail`: also keep what the report needs (series over
    time, call sites at the peak, size classes by time range).
    """

    def __init__(self, p, shared, inherited=None, initial_live: int = 0, forks=None,
                 detail: bool = False):
        self.p, self.shared, self.detail = p, shared, detail
        self.agg = ProcessAggregate(pid=p.pid, initial_live=initial_live)
        nloc = len(p.locations) + 1
        a = self.agg
        a.loc_count, a.loc_bytes = np.zeros(nloc, np.int64), np.zeros(nloc, np.uint64)
        a.loc_first_seq = np.full(nloc, np.iinfo(np.uint64).max, np.uint64)
        a.loc_temporary, a.loc_live = np.zeros(nloc, np.int64), np.zeros(nloc, np.int64)
        a.loc_leaked_count, a.loc_leaked_bytes = np.zeros(nloc, np.int64), np.zeros(nloc, np.int64)
        if inherited is not None and len(inherited):
            inherited = inherited.copy()
            inherited["pos"], inherited["loc"], inherited["limit"] = -1, -1, 0
            a.inherited_blocks = len(inherited)
            a.loc_live[-1] = int(inherited["size"].sum(dtype=np.uint64))
        self.live = LiveMap(inherited)
        self.live_bytes = initial_live
        self.best = initial_live
        self.index = 0
        self.ordinal = 0
        self.forks = sorted((forks or {}).items())
        self.snapshots = {}       # child pid -> (blocks, live bytes)
        if detail:
            n = p.event_count or len(p.events)
            self.fine = _Buckets(n, TIME_BUCKETS)
            self.coarse = _Buckets(n, RANGE_BUCKETS)
            nb = self.fine.n
            a.series = {"live_max": np.full(nb, np.iinfo(np.int64).min, np.int64),
                        "live_min": np.full(nb, np.iinfo(np.int64).max, np.int64),
                        "ts": np.zeros(nb, np.uint64),     # of each bucket's first event
                        "allocs": np.zeros(nb, np.int64),
                        "alloc_bytes": np.zeros(nb, np.uint64), "frees": np.zeros(nb, np.int64)}
            if p.mmap_recorded:      # bytes mapped by mmap/mremap and not unmapped (--mmap)
                a.series["mapped_max"] = np.zeros(nb, np.int64)
                self.mapped = 0
            a.class_by_range = np.zeros((max(self.coarse.n, 1), NCLASS), np.int64)
            a.class_bytes_by_range = np.zeros((max(self.coarse.n, 1), NCLASS), np.int64)
            empty = (np.zeros(0, np.int64), np.zeros(0, np.int64))
            a.life_by_range = {"ns": empty, "events": empty}
            a.range_ts = np.zeros(max(self.coarse.n, 1), np.uint64)
            if max(self.coarse.n, 1) * nloc <= LOC_RANGE_CELLS:
                shape = (max(self.coarse.n, 1), nloc)
                a.loc_by_range = np.zeros(shape, np.int64)
                a.loc_temp_by_range = np.zeros(shape, np.int64)
                a.loc_leak_by_range = np.zeros(shape, np.int64)
                a.loc_peak_by_range = np.zeros(shape, np.int64)
                a.range_peak = np.full(shape[0], -1, np.int64)

    def _loc_arrays(self, need: int) -> None:
        """Grows the per-location arrays for location ids < need (ids beyond the table)."""
        a = self.agg
        n = need + 1
        if len(a.loc_count) >= n:
            return
        inherited_live = a.loc_live[-1]
        a.loc_count, a.loc_bytes = _grow(a.loc_count, n), _grow(a.loc_bytes, n)
        a.loc_first_seq = _grow(a.loc_first_seq, n, np.iinfo(np.uint64).max)
        a.loc_temporary = _grow(a.loc_temporary, n)
        a.loc_leaked_count, a.loc_leaked_bytes = _grow(a.loc_leaked_count, n), _grow(a.loc_leaked_bytes, n)
        live = np.zeros(n, np.int64)
        live[:len(a.loc_live) - 1] = a.loc_live[:-1]
        live[-1] = inherited_live
        a.loc_live = live

    def feed(self, ev: np.ndarray) -> None:
        """Adds the next events of the process (seq order)."""
        # Split at the forks so that a child's snapshot is taken just before its fork seq.
        while self.forks and len(ev):
            fork_seq, children = self.forks[0]
            k = int(np.searchsorted(ev["seq"], np.uint64(fork_seq), side="left"))
            if k == len(ev):
                break
            self._feed(ev[:k])
            ev = ev[k:]
            self._snapshot(children)
            self.forks.pop(0)
        self._feed(ev)

    def _snapshot(self, children) -> None:
        # Live bytes before the process's first event count as 0, as heap.match_trace has them.
        for pid in children:
            self.snapshots[pid] = (self.live.blocks.copy(), self.live_bytes if self.index else 0)

    def _loc_slot(self, loc: np.ndarray) -> np.ndarray:
        """Location ids as indices into the per-location arrays (-1, inherited: the last slot)."""
        return np.where(loc < 0, len(self.agg.loc_count) - 1, loc)

    def _feed(self, ev: np.ndarray) -> None:
        n = len(ev)
        if not n:
            return
        a, sh = self.agg, self.shared
        if a.first_ts is None:
            a.first_ts = int(ev["ts"][0])
        a.last_ts = int(ev["ts"][-1])
        a.ops += np.bincount(ev["op"], minlength=len(OPS))[:len(OPS)]
        a.threads = max(a.threads, int(ev["tid"].max()) + 1)
        self._loc_arrays(int(ev["loc"].max()) + 1)

        m = self.live.match(ev, self.index, self.ordinal)
        acquires = (ev["op"] < FREE) & (ev["addr"] != 0)     # as blocks.match's rows
        acq = np.flatnonzero(acquires)
        sizes = ev["size"][acq]
        locs = ev["loc"][acq].astype(np.int64)
        nl = len(a.loc_count)

        # Live bytes after each event, and the process's peak (the first time it is reached).
        delta = np.zeros(n, np.int64)
        delta[acq] = sizes.astype(np.int64)
        delta -= m.released_size.astype(np.int64)
        live = np.cumsum(delta) + self.live_bytes
        j = int(np.argmax(live))
        src_slot = self._loc_slot(m.released["loc"])
        if live[j] > self.best:
            self.best = int(live[j])
            a.peak = {"bytes": self.best, "event_index": self.index + j, "seq": int(ev["seq"][j]),
                      "ts": int(ev["ts"][j])}
            if self.detail:     # bytes of each location live at that moment
                upto = acq <= j
                gone = m.released_at <= j
                a.loc_at_peak = (a.loc_live
                                 + np.bincount(locs[upto], weights=sizes[upto].astype(np.float64),
                                               minlength=nl).astype(np.int64)
                                 - np.bincount(src_slot[gone], weights=m.released["size"][gone]
                                               .astype(np.float64), minlength=nl).astype(np.int64))
        if a.loc_peak_by_range is not None:
            self._range_peaks(live, acq, locs, sizes, m, src_slot)
        self.live_bytes = int(live[-1])
        a.loc_live += _sum_by(locs, sizes, nl).astype(np.int64)
        a.loc_live -= _sum_by(src_slot, m.released["size"], nl).astype(np.int64)

        # Allocations: size classes and call sites.
        cls = size_classes(sizes)
        sh.class_count += np.bincount(cls, minlength=NCLASS)
        sh.class_bytes += _sum_by(cls, sizes, NCLASS)
        a.loc_count += np.bincount(locs, minlength=nl)
        a.loc_bytes += _sum_by(locs, sizes, nl)
        new = np.flatnonzero(a.loc_first_seq[locs] == np.iinfo(np.uint64).max)
        if len(new):     # locations allocating for the first time (few after the first chunk)
            first_locs, first_at = np.unique(locs[new], return_index=True)
            a.loc_first_seq[first_locs] = ev["seq"][acq[new[first_at]]]

        # Lifetimes of the process's own blocks freed here (inherited ones began in the parent).
        own = m.released["loc"] >= 0
        inherited = len(own) - int(np.count_nonzero(own))
        src, at = (m.released, m.released_at) if not inherited else \
            (m.released[own], m.released_at[own])            # (no copy in the usual case)
        ns = np.maximum(ev["ts"][at].view(np.int64) - src["ts"].view(np.int64), 0)
        life_events = self.index + at - src["index"]
        sh.life_ns.add(ns)
        sh.life_events.add(life_events)
        # Temporary: freed before any other allocation of the process (heaptrack's measure).
        acq_before = self.ordinal + np.cumsum(acquires) - acquires
        temporary = acq_before[at] - src["ordinal"] == 1
        a.loc_temporary += np.bincount(src["loc"][temporary], minlength=nl)
        if a.loc_temp_by_range is not None:
            self._by_range(a.loc_temp_by_range, src["index"][temporary], src["loc"][temporary],
                           np.ones(int(np.count_nonzero(temporary)), np.int64))
        a.inherited_released += inherited
        if self.detail:
            scls = size_classes(src["size"])
            sh.life_ns_by_class += np.bincount(scls * 66 + size_classes(ns.astype(np.uint64)),
                                               minlength=NCLASS * 66).reshape(NCLASS, 66)
            sh.life_events_by_class += np.bincount(
                scls * 66 + size_classes(life_events.astype(np.uint64)),
                minlength=NCLASS * 66).reshape(NCLASS, 66)
            bucket = np.minimum(src["index"] // self.coarse.width, self.coarse.n - 1) * (NCLASS * 66)
            for kind, life in (("ns", ns), ("events", life_events)):
                new, blocks = np.unique(bucket + scls * 66 + size_classes(life.astype(np.uint64)),
                                        return_counts=True)
                keys, counts = a.life_by_range[kind]
                keys, at = np.unique(np.concatenate([keys, new]), return_inverse=True)
                a.life_by_range[kind] = (keys, np.bincount(at.reshape(-1), weights=np.concatenate(
                    [counts, blocks]).astype(np.float64)).astype(np.int64))

        # Blocks shadowed by a double acquire are never freed; last chunk's that were, after all,
        # were no double acquire.
        self._leak(m.shadowed[m.shadowed["loc"] >= 0], 1)
        self._leak(m.revived[m.revived["loc"] >= 0], -1)
        a.unknown_frees += m.unknown_releases
        a.double_acquires += m.double_acquires

        if self.detail:
            self._series(ev, m, acq, sizes, cls, live)
        self.index += n
        self.ordinal += len(acq)
        a.events = self.index

    def _leak(self, blocks: np.ndarray, sign: int) -> None:
        a = self.agg
        if not len(blocks):
            return
        a.leaked_blocks += sign * len(blocks)
        a.leaked_bytes += sign * int(blocks["size"].sum(dtype=np.uint64))
        cls = size_classes(blocks["size"])
        self.shared.leak_class_count += sign * np.bincount(cls, minlength=NCLASS)
        self.shared.leak_class_bytes += sign * _sum_by(cls, blocks["size"], NCLASS).astype(np.int64)
        nl = len(a.loc_count)
        a.loc_leaked_count += sign * np.bincount(blocks["loc"], minlength=nl)
        a.loc_leaked_bytes += sign * _sum_by(blocks["loc"], blocks["size"], nl).astype(np.int64)
        if a.loc_leak_by_range is not None:
            self._by_range(a.loc_leak_by_range, blocks["index"], blocks["loc"],
                           sign * blocks["size"].astype(np.int64))

    def _by_range(self, table: np.ndarray, index: np.ndarray, loc: np.ndarray,
                  values: np.ndarray) -> None:
        """Adds `values` to table[coarse bucket of the event `index`, location (clamped)]."""
        if not len(values):
            return
        nb, nl = table.shape
        b = np.minimum(index.astype(np.int64) // self.coarse.width, nb - 1)
        lo = int(b.min())        # a chunk's blocks fall in few buckets: a small bincount
        key = (b - lo) * nl + np.clip(loc.astype(np.int64), 0, nl - 1)
        span = (int(b.max()) - lo + 1) * nl
        table[lo:lo + span // nl] += np.bincount(key, weights=values, minlength=span).astype(
            np.int64).reshape(-1, nl)

    def _range_peaks(self, live, acq, locs, sizes, m, src_slot) -> None:
        """Per coarse bucket of this chunk: if its live bytes peak here above what the bucket held
        so far, the bytes of each location live at that moment (as loc_at_peak for the run)."""
        a = self.agg
        ids, starts = self.coarse.segments(self.index, len(live))
        ends = np.r_[starts[1:], len(live)]
        nl = a.loc_peak_by_range.shape[1]
        for b, s, e in zip(ids.tolist(), starts.tolist(), ends.tolist()):
            j = s + int(np.argmax(live[s:e]))
            if live[j] <= a.range_peak[b]:
                continue
            a.range_peak[b] = int(live[j])
            upto, gone = acq <= j, m.released_at <= j
            n = len(a.loc_live)
            snap = (a.loc_live + np.bincount(locs[upto], weights=sizes[upto].astype(np.float64),
                                             minlength=n).astype(np.int64)
                    - np.bincount(src_slot[gone], weights=m.released["size"][gone]
                                  .astype(np.float64), minlength=n).astype(np.int64))
            row = snap[:nl].copy()
            row[-1] = snap[nl - 1:].sum()      # inherited blocks, ids beyond the table
            a.loc_peak_by_range[b] = row

    def _series(self, ev, m, acq, sizes, cls, live) -> None:
        """Per time bucket: live bytes max/min, time of its last event, allocations and frees."""
        s = self.agg.series
        ids, starts = self.fine.segments(self.index, len(ev))
        s["live_max"][ids] = np.maximum(s["live_max"][ids], np.maximum.reduceat(live, starts))
        s["live_min"][ids] = np.minimum(s["live_min"][ids], np.minimum.reduceat(live, starts))
        new = s["ts"][ids] == 0
        s["ts"][ids[new]] = ev["ts"][starts[new]]
        acq_b = (self.index + acq) // self.fine.width
        s["allocs"] += np.bincount(acq_b, minlength=self.fine.n)[:self.fine.n]
        s["alloc_bytes"] += _sum_by(acq_b, sizes, self.fine.n)[:self.fine.n]
        rel_b = (self.index + m.released_at) // self.fine.width
        s["frees"] += np.bincount(rel_b, minlength=self.fine.n)[:self.fine.n]
        if "mapped_max" in s:
            op, size, arg = ev["op"], ev["size"].astype(np.int64), ev["arg"].astype(np.int64)
            ok = ev["addr"] != 0
            delta = (np.where((op == MMAP) & ok, size, 0) - np.where((op == MUNMAP) & (arg == 0), size, 0)
                     + np.where((op == MREMAP) & ok, size - arg, 0))
            mapped = np.cumsum(delta) + self.mapped
            self.mapped = int(mapped[-1])
            s["mapped_max"][ids] = np.maximum(s["mapped_max"][ids], np.maximum.reduceat(mapped, starts))
        coarse = (self.index + acq) // self.coarse.width
        nb = len(self.agg.class_by_range)
        self.agg.class_by_range += np.bincount(coarse * NCLASS + cls, minlength=nb * NCLASS)[
            :nb * NCLASS].reshape(nb, NCLASS)
        self.agg.class_bytes_by_range += np.bincount(
            coarse * NCLASS + cls, weights=sizes.astype(np.float64),
            minlength=nb * NCLASS)[:nb * NCLASS].reshape(nb, NCLASS).astype(np.int64)
        ids, starts = self.coarse.segments(self.index, len(ev))
        self.agg.range_ts[ids] = ev["ts"][np.r_[starts[1:], len(ev)] - 1]
        lbr = self.agg.loc_by_range
        if lbr is not None:
            nl = lbr.shape[1]
            locs = np.minimum(ev["loc"][acq].astype(np.int64), nl - 1)
            lbr += np.bincount(coarse * nl + locs, minlength=nb * nl)[:nb * nl].reshape(nb, nl)

    def finish(self) -> ProcessAggregate:
        """Closes the pass: blocks still live are leaks (own) or inherited ones never released."""
        a = self.agg
        for _, children in self.forks:      # forks after the last event
            self._snapshot(children)
        rest = self.live.blocks
        self._leak(rest[rest["loc"] >= 0], 1)
        if a.peak is None:
            a.peak = {"bytes": a.initial_live, "event_index": 0, "seq": 0, "ts": None}
            a.loc_at_peak = a.loc_live * 0
            a.loc_at_peak[-1] = a.initial_live if a.inherited_blocks else 0
        self.live = None
        return a


class SharedAggregate:
    """Trace-wide sums that need no per-process split."""

    def __init__(self, exact_limit: int = 1 << 22):
        self.class_count = np.zeros(NCLASS, np.int64)
        self.class_bytes = np.zeros(NCLASS, np.uint64)
        self.life_ns = StreamingPercentiles(exact_limit)
        self.life_events = StreamingPercentiles(exact_limit)
        self.life_ns_by_class = np.zeros((NCLASS, 66), np.int64)
        self.life_events_by_class = np.zeros((NCLASS, 66), np.int64)
        self.leak_class_count = np.zeros(NCLASS, np.int64)
        self.leak_class_bytes = np.zeros(NCLASS, np.int64)


def aggregate(trace, detail: bool = False, chunk: int = CHUNK, progress: bool = False,
              exact_limit: int = 1 << 22) -> tuple[list, SharedAggregate]:
    """One streaming pass over every process of `trace`: ([ProcessAggregate], SharedAggregate).

    Processes are read in trace order; a forked child listed after its parent starts from the
    parent's live blocks at the fork (as heap.match_trace does). `progress`: a tqdm bar on stderr.
    """
    from tqdm import tqdm
    from ..trace.reader import iter_process_blocks
    shared = SharedAggregate(exact_limit)
    procs = trace.processes
    later_children = {}           # parent pid -> {fork_seq: [child pids]} for children after it
    for i, p in enumerate(procs):
        if p.forked_from:
            later_children.setdefault(p.forked_from, {}).setdefault(int(p.fork_seq), []).append(p.pid)
    snapshots, done = {}, set()
    result = []
    total = sum(p.event_count or len(p.events) for p in procs)
    with tqdm(total=total, unit="ev", unit_scale=True, desc="heapcast: reading trace",
              disable=not progress, leave=False) as bar:
        for p in procs:
            inherited, initial = snapshots.pop(p.pid, (None, 0)) if p.forked_from in done else (None, 0)
            forks = later_children.get(p.pid)
            ps = ProcessPass(p, shared, inherited, initial, forks, detail)
            for block in iter_process_blocks(p, chunk):
                ps.feed(block)
                bar.update(len(block))
            result.append(ps.finish())
            snapshots.update(ps.snapshots)
            done.add(p.pid)
    return result, shared
