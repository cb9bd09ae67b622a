"""`heapcast stats`: what a trace says about a program's heap, as a JSON-ready dict.

Computed by one streaming pass (aggregate.py), so memory stays bounded by the live blocks and the
call sites, whatever the number of events. Processes are separate heaps: peaks are per process and
the trace's peak is the largest of them; counts add up over processes.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .symbolize import UNKNOWN, Symbolizer
from ..trace.format import HEAP_OPS, MMAP, MREMAP, MUNMAP, OPS
from ..trace.model import PY_FRAME_TAG
from .aggregate import CHUNK, aggregate
from .python_lines import program_lines


def trace_clock(trace, aggs) -> tuple[int, int]:
    """(first, last) CLOCK_MONOTONIC ns of the trace: process starts/ends, or events if unset."""
    starts, ends = [], []
    for p, a in zip(trace.processes, aggs):
        starts.append(p.start_ns or (a.first_ts or 0))
        ends.append(max(p.end_ns, a.last_ts))
    starts = [s for s in starts if s] or [0]
    return min(starts), max(ends, default=0)


def site_key(module: str, offset: int, function: str, python: bool, pid: int, address: int) -> tuple:
    """What call sites merge by across processes: (module, offset) of a native frame, (file, line,
    function) of a Python one, and the process and address where the module is unknown."""
    if module == UNKNOWN:
        return (UNKNOWN, pid, address)
    return (module, offset, function) if python else (module, offset)


class CallSites:
    """Per-location aggregates of every process merged into call sites (site_key).

    Each site: function, module, address, offset, python, and the sums of the per-location arrays
    named in `fields` (ProcessAggregate attributes without their `loc_` prefix). A Python site's
    module is its file and its offset its line. `frames_of(process)`: the frame that stands for
    each location id (default: its call site); locations where it is 0 are left out when
    `known_only`."""

    def __init__(self, symbolizer: Symbolizer | None = None,
                 fields=("count", "bytes"), frames_of=None, known_only: bool = False):
        self.symbolizer = symbolizer or Symbolizer()
        self.fields = fields
        self.frames_of = frames_of or (lambda p: p.locations.callsites)
        self.known_only = known_only
        self.sites: dict = {}

    def add(self, p, a) -> None:
        """Adds process `p`'s aggregate `a` (locations that allocated at least once)."""
        nloc = len(a.loc_count) - 1            # the last slot holds inherited blocks
        used = np.flatnonzero(a.loc_count[:nloc])
        if not len(used):
            return
        frames = self.frames_of(p)
        table = np.zeros(nloc, np.uint64)
        table[:min(len(frames), nloc)] = frames[:nloc]
        addrs, inv = np.unique(table[used], return_inverse=True)
        first_seq = np.full(len(addrs), np.iinfo(np.uint64).max, np.uint64)
        np.minimum.at(first_seq, inv, a.loc_first_seq[used])
        sums = {}
        for f in self.fields:
            col = getattr(a, "loc_" + f)[:nloc][used]
            out = np.zeros(len(addrs), np.uint64 if col.dtype == np.uint64 else np.int64)
            np.add.at(out, inv, col)
            sums[f] = out.tolist()
        syms = self.symbolizer.symbolize(p, addrs, first_seq)
        for k, (a_, s) in enumerate(zip(addrs.tolist(), syms)):
            if self.known_only and a_ == 0:
                continue
            python = bool(a_ & PY_FRAME_TAG)
            key = site_key(s.module, s.offset, s.function, python, p.pid, a_)
            site = self.sites.get(key)
            if site is None:
                self.sites[key] = {"function": s.function, "module": s.module, "address": a_,
                                   "offset": s.offset, "python": python} | {
                                       f: sums[f][k] for f in self.fields}
            else:
                for f in self.fields:
                    site[f] += sums[f][k]

    def top(self, key: str, n: int) -> list:
        """The `n` call sites with the most `key` ("bytes" or "count")."""
        return sorted(self.sites.values(), key=lambda s: (-s[key], -s["count"], s["address"]))[:n]


def rss_peak(p, seconds) -> dict:
    """The largest RSS sample of a process and when, or VmHWM at exit when that is larger (its
    time is then unknown: seconds and seq are None)."""
    peak = {"bytes": 0, "seconds": None, "seq": None, "source": None}
    if len(p.rss):
        j = int(np.argmax(p.rss["rss"]))
        peak = {"bytes": int(p.rss["rss"][j]), "seconds": seconds(p.rss["ts"][j]),
                "seq": int(p.rss["seq"][j]), "source": "sample"}
    if p.peak_rss_bytes > peak["bytes"]:
        peak = {"bytes": int(p.peak_rss_bytes), "seconds": None, "seq": None, "source": "vmhwm"}
    return peak


def _larger(best: dict, candidate: dict, pid: int) -> dict:
    """The trace-wide peak so far: `candidate` (of process `pid`) if it has more bytes."""
    if candidate["bytes"] <= best["bytes"]:
        return best
    return {"bytes": candidate["bytes"], "pid": pid} | {k: v for k, v in candidate.items()
                                                        if k != "bytes"}


def summarize(trace, aggs, shared, top: int = 10, sites: CallSites | None = None) -> dict:
    """The stats dict from one pass's aggregates (see stats()). `sites`: call sites already merged
    (the report merges more fields); default: merged here."""
    t0, t1 = trace_clock(trace, aggs)

    def seconds(ts) -> float:
        return (int(ts) - t0) / 1e9

    if sites is None:
        sites = CallSites()
        for p, a in zip(trace.processes, aggs):
            sites.add(p, a)
    own_lines = CallSites(sites.symbolizer, frames_of=program_lines, known_only=True)
    for p, a in zip(trace.processes, aggs):
        if p.python_frames:
            own_lines.add(p, a)
    ops = sum((a.ops for a in aggs), np.zeros(len(OPS), np.int64))
    per_process = []
    peak_live = {"bytes": 0, "pid": 0, "seconds": 0.0, "event_index": 0, "seq": 0}
    peak_rss = {"bytes": 0, "pid": 0, "seconds": None, "seq": None, "source": None}
    totals = {"threads": 0, "leaked_blocks": 0, "leaked_bytes": 0, "unknown_frees": 0,
              "double_acquires": 0}
    offset = 0
    for p, a in zip(trace.processes, aggs):
        pk = a.peak
        when = seconds(pk["ts"]) if pk["ts"] is not None else seconds(p.start_ns or t0)
        p_peak = {"bytes": pk["bytes"], "seconds": when, "event_index": offset + pk["event_index"],
                  "seq": pk["seq"]}
        peak_live = _larger(peak_live, p_peak, p.pid)
        p_rss = rss_peak(p, seconds)
        peak_rss = _larger(peak_rss, p_rss, p.pid)
        p_sum = {"pid": p.pid, "ppid": p.ppid, "forked_from": p.forked_from, "image": p.image,
                 "exe": p.exe, "events": a.events, "threads": max(int(p.threads), a.threads),
                 "duration_ns": max(int(p.end_ns) - int(p.start_ns), 0),
                 "peak_live_bytes": pk["bytes"], "peak_rss_bytes": p_rss["bytes"],
                 "leaked_blocks": a.leaked_blocks, "leaked_bytes": a.leaked_bytes,
                 "inherited_live_blocks": a.inherited_blocks - a.inherited_released,
                 "unknown_frees": a.unknown_frees, "double_acquires": a.double_acquires,
                 "lost_events": p.lost_events, "truncated": bool(p.truncated),
                 "clean_exit": bool(p.clean_exit), "pymalloc_seq": int(p.pymalloc_seq)}
        per_process.append(p_sum)
        for k in totals:
            totals[k] += p_sum[k]
        offset += a.events

    mmap_seen = any(p.mmap_recorded for p in trace.processes) or ops[[MMAP, MUNMAP, MREMAP]].any()
    op_names = OPS if mmap_seen else HEAP_OPS
    cc, cb = shared.class_count, shared.class_bytes
    return {
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
             "count": int(cc[c]), "bytes": int(cb[c])} for c in np.flatnonzero(cc).tolist()],
        "lifetimes": {"freed_blocks": shared.life_ns.n, "ns": shared.life_ns.result(),
                      "events": shared.life_events.result()},
        "leaked_blocks": totals["leaked_blocks"],
        "leaked_bytes": totals["leaked_bytes"],
        "unknown_frees": totals["unknown_frees"],
        "pymalloc_recorded": any(p.pymalloc_seq >= 0 for p in trace.processes),
        "clock_every": max((int(p.clock_every) for p in trace.processes), default=1),
        "recording": {k: trace.session[k] for k in RECORDING_KEYS if k in trace.session},
        "double_acquires": totals["double_acquires"],
        "lost_events": int(trace.lost_events),
        "truncated": bool(trace.truncated),
        "top_callsites_by_bytes": sites.top("bytes", top),
        "top_callsites_by_count": sites.top("count", top),
        "top_program_lines_by_bytes": own_lines.top("bytes", top),
        "top_program_lines_by_count": own_lines.top("count", top),
        "per_process": per_process,
    }


#: What `heapcast record` says of its own run in session.json: the program's run (wall_s), the
#: wait after its end until the trace was complete (after_exit_s) and the events converted
#: while it ran.
RECORDING_KEYS = ("wall_s", "after_exit_s", "converted_while_running")


def stats(trace, top: int = 10, plot: str | Path | None = None, progress: bool = False,
          chunk: int = CHUNK) -> dict:
    """Statistics of a trace (a Trace, or a path heapcast.load accepts) as a JSON-ready dict.

    Keys: events, ops (every heap op, zeros included, plus mmap/munmap/mremap when recorded),
    processes, threads, duration_ns, peak_live_bytes and peak_live (when), peak_rss_bytes and
    peak_rss (when), size_classes, lifetimes, leaked_blocks/leaked_bytes, unknown_frees,
    clock_every (record --clock-every's N, the largest of the processes': above 1, one event in N
    of a thread read the clock, and times and lifetimes in ns between readings are estimates:
    heapcast.trace.steps),
    recording (from a recorded trace's session.json: RECORDING_KEYS, those it has; else empty),
    pymalloc_recorded (record --pymalloc: its frees of objects pymalloc served before the
    recording of it began are among unknown_frees; per process: pymalloc_seq),
    double_acquires, lost_events, truncated, top_callsites_by_bytes/by_count (a Python call site:
    python true, module its file, offset its line), top_program_lines_by_bytes/by_count (Python
    programs: the innermost line of the program's own code under each allocation; empty
    otherwise), per_process.
    Lifetime percentiles are exact up to 4M freed blocks, then within 0.1% (quantiles.py).
    `plot`: also draw the live-bytes/RSS/size-class figure into this PNG (needs matplotlib).
    `progress`: a progress bar on stderr. One streaming pass in chunks of `chunk` events.
    """
    if top < 0:
        raise ValueError(f"top must be 0 or more call sites, not {top}")
    if plot is not None:   # fail before the pass over the trace, not after it
        from .plot import check_plot_file
        check_plot_file(plot)
    if not hasattr(trace, "processes"):
        from ..trace.reader import load
        trace = load(trace)
    aggs, shared = aggregate(trace, detail=plot is not None, chunk=chunk, progress=progress)
    result = summarize(trace, aggs, shared, top)
    if plot is not None:
        from .plot import draw_stats
        t0 = trace_clock(trace, aggs)[0]
        series = []
        for p, a in zip(trace.processes, aggs):
            s = a.series
            x = (s["ts"].astype(np.int64) - t0) / 1e9
            series.append({"pid": p.pid, "live": (x, s["live_max"]),
                           "rss": ((p.rss["ts"].astype(np.int64) - t0) / 1e9, p.rss["rss"])})
        draw_stats(series, result, plot)
    return result
