"""The whole-process `heapcast stats` before it streamed (kept as the reference the streaming pass must equal).

Everything is vectorized over the events of one process at a time (numpy; the block matching is
heap.match_trace), so tens of millions of events take seconds. Processes are separate heaps: peaks
are per process and the trace's peak is the largest of them; counts add up over processes.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from heapcast.trace.blocks import match_trace
from heapcast.stats.classes import size_classes
from heapcast.stats.python_lines import program_lines
from heapcast.stats.summary import _larger, rss_peak as _rss_peak
from heapcast.stats.symbolize import UNKNOWN, Symbolizer
from heapcast.trace.format import HEAP_OPS, MMAP, MREMAP, MUNMAP, OPS
from heapcast.trace.model import PY_FRAME_TAG

PERCENTILES = (50, 90, 99)
PLOT_POINTS = 2000   # per process: live-bytes series handed to the plot, peaks kept


def _percentiles(values: np.ndarray) -> dict:
    """p50/p90/p99/max of integer values, each an observed value (inverted-CDF definition)."""
    if not len(values):
        return {f"p{q}": 0 for q in PERCENTILES} | {"max": 0}
    ps = np.percentile(values, PERCENTILES, method="inverted_cdf")
    return {f"p{q}": int(v) for q, v in zip(PERCENTILES, ps)} | {"max": int(values.max())}


def _trace_clock(trace) -> tuple[int, int]:
    """(first, last) CLOCK_MONOTONIC ns of the trace: process starts/ends, or events if unset."""
    starts, ends = [], []
    for p in trace.processes:
        ts = p.events["ts"]
        starts.append(p.start_ns or (int(ts[0]) if len(ts) else 0))
        ends.append(max(p.end_ns, int(ts[-1]) if len(ts) else 0))
    starts = [s for s in starts if s] or [0]
    return min(starts), max(ends, default=0)


def _group_sum(keys: np.ndarray, nkeys: int, values: np.ndarray) -> np.ndarray:
    """Exact uint64 sums of `values` per integer key (np.bincount's weights would be float64)."""
    out = np.zeros(nkeys, np.uint64)
    np.add.at(out, keys, values.astype(np.uint64))
    return out


def _downsample_max(x: np.ndarray, y: np.ndarray, points: int) -> tuple[np.ndarray, np.ndarray]:
    """At most `points` (x, max y) pairs, one per run of consecutive samples: keeps the peaks."""
    if len(x) <= points:
        return x, y
    edges = np.linspace(0, len(x), points + 1).astype(np.int64)[:-1]
    return x[edges], np.maximum.reduceat(y, edges)


class _CallSites:
    """Allocation counts and bytes per call site, merged over processes by (module, offset).

    `frames_of(process)`: the frame that stands for each location id (default: its call site);
    locations where it is 0 are left out when `known_only`."""

    def __init__(self, symbolizer: Symbolizer, frames_of=None, known_only: bool = False):
        self.symbolizer = symbolizer
        self.frames_of = frames_of or (lambda p: p.locations.callsites)
        self.known_only = known_only
        self.sites: dict = {}

    def add(self, p, ev: np.ndarray, acq: np.ndarray) -> None:
        """Adds the acquisitions `acq` (event indices) of process `p`."""
        if not len(acq):
            return
        # Sum per location id first (small dense ints), then per call site (several stacks can
        # share one): no sort over the events.
        locs = ev["loc"][acq].astype(np.int64)
        callsites = self.frames_of(p)
        nloc = max(len(callsites), int(locs.max()) + 1)
        loc_counts = np.bincount(locs, minlength=nloc)
        loc_bytes = _group_sum(locs, nloc, ev["size"][acq])
        loc_first = np.full(nloc, np.iinfo(np.uint64).max, np.uint64)
        np.minimum.at(loc_first, locs, ev["seq"][acq])
        used = np.flatnonzero(loc_counts)
        table = np.zeros(nloc, np.uint64)
        table[:len(callsites)] = callsites
        addrs, inv = np.unique(table[used], return_inverse=True)
        counts = np.bincount(inv, weights=loc_counts[used], minlength=len(addrs)).astype(np.int64)
        nbytes = _group_sum(inv, len(addrs), loc_bytes[used])
        first_seq = np.full(len(addrs), np.iinfo(np.uint64).max, np.uint64)
        np.minimum.at(first_seq, inv, loc_first[used])
        syms = self.symbolizer.symbolize(p, addrs, first_seq)
        for a, c, b, s in zip(addrs.tolist(), counts.tolist(), nbytes.tolist(), syms):
            if self.known_only and a == 0:
                continue
            python = bool(a & PY_FRAME_TAG)
            key = ((s.module, s.offset, s.function) if python and s.module != UNKNOWN
                   else (s.module, s.offset) if s.module != UNKNOWN else (UNKNOWN, p.pid, a))
            site = self.sites.get(key)
            if site is None:
                # A Python call site: module is its file and offset its line.
                self.sites[key] = {"function": s.function, "module": s.module, "address": a,
                                   "offset": s.offset, "count": c, "bytes": b, "python": python}
            else:
                site["count"] += c
                site["bytes"] += b

    def top(self, key: str, n: int) -> list:
        """The `n` call sites with the most `key` ("bytes" or "count")."""
        return sorted(self.sites.values(), key=lambda s: (-s[key], -s["count"], s["address"]))[:n]


def _live_peak(ev, live, initial: int, offset: int, start_s: float, seconds) -> dict:
    """The peak of one process's live bytes and when: seconds, event index in the trace, seq.

    A forked child that never exceeds what it inherited peaks at its start."""
    if len(ev) and int(live.max()) > initial:
        i = int(np.argmax(live))
        return {"bytes": int(live[i]), "seconds": seconds(ev["ts"][i]), "event_index": offset + i,
                "seq": int(ev["seq"][i])}
    return {"bytes": initial, "seconds": start_s, "event_index": offset, "seq": 0}


def stats(trace, top: int = 10, plot: str | Path | None = None) -> dict:
    """Statistics of a trace (a Trace, or a path heapcast.load accepts) as a JSON-ready dict.

    Keys: events, ops (every heap op, zeros included, plus mmap/munmap/mremap when recorded),
    processes, threads, duration_ns, peak_live_bytes and peak_live (when), peak_rss_bytes and
    peak_rss (when), size_classes, lifetimes, leaked_blocks/leaked_bytes, unknown_frees,
    double_acquires, lost_events, truncated, top_callsites_by_bytes/by_count,
    top_program_lines_by_bytes/by_count (Python programs: the innermost line of the program's
    own code under each allocation; empty otherwise), per_process.
    `plot`: also draw the live-bytes/RSS/size-class figure into this PNG (needs matplotlib).
    """
    if plot is not None:
        from .plot import require_matplotlib
        require_matplotlib()
    if not hasattr(trace, "processes"):
        from . import load
        trace = load(trace)
    all_blocks = match_trace(trace)
    t0, t1 = _trace_clock(trace)

    def seconds(ts) -> float:
        return (int(ts) - t0) / 1e9

    ops = np.zeros(len(OPS), np.int64)
    class_counts = np.zeros(65, np.int64)
    class_bytes = np.zeros(65, np.uint64)
    life_ns, life_events = [], []
    symbolizer = Symbolizer()
    sites = _CallSites(symbolizer)
    own_lines = _CallSites(symbolizer, program_lines, known_only=True)
    parents = {p.forked_from for p in trace.processes if p.forked_from}
    live_by_pid = {}             # pid -> (seq, live bytes after each event), for forked children
    per_process, series = [], []
    peak_live = {"bytes": 0, "pid": 0, "seconds": 0.0, "event_index": 0, "seq": 0}
    peak_rss = {"bytes": 0, "pid": 0, "seconds": None, "seq": None, "source": None}
    totals = {"threads": 0, "leaked_blocks": 0, "leaked_bytes": 0, "unknown_frees": 0,
              "double_acquires": 0}
    offset = 0

    for p, b in zip(trace.processes, all_blocks):
        ev = p.events
        n = len(ev)
        ops += np.bincount(ev["op"], minlength=len(OPS))[:len(OPS)]

        # Live requested bytes; a forked child starts with what its parent had live at the fork.
        initial = 0
        parent = live_by_pid.get(p.forked_from) if p.forked_from else None
        if parent is not None:
            k = int(np.searchsorted(parent[0], np.uint64(p.fork_seq), side="left"))
            initial = int(parent[1][k - 1]) if k else 0
        live = np.cumsum(b.live_delta(ev["size"])) + initial
        if p.pid in parents:
            live_by_pid[p.pid] = (ev["seq"], live)
        p_peak = _live_peak(ev, live, initial, offset, seconds(p.start_ns or t0), seconds)
        peak_live = _larger(peak_live, p_peak, p.pid)
        p_rss = _rss_peak(p, seconds)
        peak_rss = _larger(peak_rss, p_rss, p.pid)

        acq = np.flatnonzero(b.acquires)
        sizes = ev["size"][acq]
        cls = size_classes(sizes)
        class_counts += np.bincount(cls, minlength=65)
        class_bytes += _group_sum(cls, 65, sizes)

        freed = acq[b.release_of[acq] >= 0]
        rel = b.release_of[freed]
        # Threads stamp times independently: a release may read the clock a hair "before" its
        # acquisition although it is ordered after it. Such lifetimes count as 0 ns.
        life_ns.append(np.maximum(ev["ts"][rel].astype(np.int64) - ev["ts"][freed].astype(np.int64), 0))
        life_events.append(rel - freed)

        leaked = b.leaked
        threads = max(int(p.threads), int(ev["tid"].max()) + 1 if n else 0)
        p_sum = {"pid": p.pid, "ppid": p.ppid, "forked_from": p.forked_from, "image": p.image,
                 "exe": p.exe, "events": n, "threads": threads,
                 "duration_ns": max(int(p.end_ns) - int(p.start_ns), 0),
                 "peak_live_bytes": p_peak["bytes"], "peak_rss_bytes": p_rss["bytes"],
                 "leaked_blocks": len(leaked), "leaked_bytes": int(ev["size"][leaked].sum(dtype=np.uint64)),
                 "inherited_live_blocks": b.inherited_live, "unknown_frees": b.unknown_releases,
                 "double_acquires": b.double_acquires, "lost_events": p.lost_events,
                 "truncated": bool(p.truncated), "clean_exit": bool(p.clean_exit),
                 "pymalloc_seq": int(p.pymalloc_seq)}
        per_process.append(p_sum)
        for k in totals:
            totals[k] += p_sum[k]
        sites.add(p, ev, acq)
        if p.python_frames:
            own_lines.add(p, ev, acq)
        if plot is not None:
            x, y = _downsample_max((ev["ts"].astype(np.int64) - t0) / 1e9, live, PLOT_POINTS)
            series.append({"pid": p.pid, "live": (x, y),
                           "rss": ((p.rss["ts"].astype(np.int64) - t0) / 1e9, p.rss["rss"])})
        offset += n

    life_ns = np.concatenate(life_ns) if life_ns else np.zeros(0, np.int64)
    life_events = np.concatenate(life_events) if life_events else np.zeros(0, np.int64)
    mmap_seen = any(p.mmap_recorded for p in trace.processes) or ops[[MMAP, MUNMAP, MREMAP]].any()
    op_names = OPS if mmap_seen else HEAP_OPS
    result = {
        "trace": str(trace.path),
        "events": offset,
        "ops": {name: int(ops[OPS.index(name)]) for name in op_names},
        "processes": len(trace.processes),
        "threads": totals["threads"],
        "duration_ns": max(t1 - t0, 0),
        "peak_live_bytes": peak_live["bytes"],
        "peak_live": peak_live,
        "peak_rss_bytes": peak_rss["bytes"],
        "peak_rss": peak_rss,
        "size_classes": [
            {"class": c, "min_size": (1 << (c - 1)) if c else 0, "max_size": (1 << c) - 1,
             "count": int(class_counts[c]), "bytes": int(class_bytes[c])}
            for c in np.flatnonzero(class_counts).tolist()],
        "lifetimes": {"freed_blocks": len(life_ns), "ns": _percentiles(life_ns),
                      "events": _percentiles(life_events)},
        "leaked_blocks": totals["leaked_blocks"],
        "leaked_bytes": totals["leaked_bytes"],
        "unknown_frees": totals["unknown_frees"],
        "pymalloc_recorded": any(p.pymalloc_seq >= 0 for p in trace.processes),
        "clock_every": max((int(p.clock_every) for p in trace.processes), default=1),
        "recording": {k: trace.session[k] for k in ("wall_s", "after_exit_s",
                                                    "converted_while_running")
                      if k in trace.session},
        "double_acquires": totals["double_acquires"],
        "lost_events": int(trace.lost_events),
        "truncated": bool(trace.truncated),
        "top_callsites_by_bytes": sites.top("bytes", top),
        "top_callsites_by_count": sites.top("count", top),
        "top_program_lines_by_bytes": own_lines.top("bytes", top),
        "top_program_lines_by_count": own_lines.top("count", top),
        "per_process": per_process,
    }
    if plot is not None:
        from .plot import draw_stats
        draw_stats(series, result, plot)
    return result
