"""The report's data: everything the page draws, from one streaming pass (stats.aggregate).

Its size is bounded whatever the trace's length: per process a few thousand time buckets, the
call sites that matter (top by each measure), size classes and lifetime octaves.
"""
from __future__ import annotations

import numpy as np

from ..stats.aggregate import NCLASS, aggregate
from ..stats.summary import CallSites, site_key, summarize, trace_clock
from ..stats.symbolize import Symbolizer
from ..trace.model import PY_FRAME_TAG
from .flame import CallTree

TOP_SITES = 500
SITE_FIELDS = ("count", "bytes", "at_peak", "temporary", "leaked_count", "leaked_bytes")


def _seconds(ts, t0) -> list:
    return [round(v, 9) for v in ((np.asarray(ts, np.int64) - t0) / 1e9).tolist()]


def _process_series(p, a, t0) -> dict:
    """Memory over time of one process: live bytes per bucket, RSS samples, allocation rate."""
    s = a.series
    used = s["ts"] > 0
    t = _seconds(s["ts"][used], t0)
    first = s["ts"][used].astype(np.int64)
    width = np.diff(np.r_[first, max(a.last_ts, int(first[-1]) if len(first) else 0) + 1])
    rate = s["allocs"][used] / np.maximum(width, 1) * 1e9
    rss_t, rss = p.rss["ts"], p.rss["rss"]
    if len(rss) > 5000:               # keep every sample's max per bucket
        edges = np.linspace(0, len(rss), 5001).astype(np.int64)[:-1]
        rss_t, rss = rss_t[edges], np.maximum.reduceat(rss, edges)
    out = {"pid": p.pid, "exe": p.exe, "argv": list(p.argv), "events": a.events,
           "t": t, "live_max": s["live_max"][used].tolist(), "live_min": s["live_min"][used].tolist(),
           "allocs": s["allocs"][used].tolist(), "frees": s["frees"][used].tolist(),
           "alloc_rate": [round(v, 1) for v in rate.tolist()],
           "rss_t": _seconds(rss_t, t0), "rss": np.asarray(rss).tolist(),
           "mapped": s["mapped_max"][used].tolist() if "mapped_max" in s else None,
           "range_t": _seconds(a.range_ts, t0),
           # live bytes at each coarse bucket's own peak (-1: no event), to find a range's peak
           "range_peak": a.range_peak.tolist() if a.range_peak is not None else None,
           "class_by_range": {str(c): a.class_by_range[:, c].tolist()
                              for c in np.flatnonzero(a.class_by_range.sum(0)).tolist()},
           "class_bytes_by_range": {str(c): a.class_bytes_by_range[:, c].tolist()
                                    for c in np.flatnonzero(a.class_bytes_by_range.sum(0)).tolist()},
           # freed blocks by the bucket of their allocation: [buckets], [classes], [octaves],
           # [blocks] per lifetime measure
           "life_by_range": {kind: [(keys // (NCLASS * 66)).tolist(), (keys // 66 % NCLASS).tolist(),
                                    (keys % 66).tolist(), blocks.tolist()]
                             for kind, (keys, blocks) in a.life_by_range.items()}}
    out["divergence"] = _divergence(p, a, t0)
    return out


def _divergence(p, a, t0) -> list:
    """Where RSS and live requested bytes differ most, each way, at an RSS sample."""
    if not len(p.rss) or not a.events:
        return []
    s = a.series
    # The live bytes at each RSS sample: the bucket holding the sample's event count.
    width = max(1, -(-a.events // len(s["ts"])))
    k = np.minimum(p.rss["seq"].astype(np.int64) // width, len(s["ts"]) - 1)
    live = s["live_max"][k]
    diff = p.rss["rss"].astype(np.int64) - live
    out = []
    i = int(np.argmax(diff))
    if diff[i] > 0:
        out.append({"kind": "rss_above", "t": _seconds([p.rss["ts"][i]], t0)[0],
                    "rss": int(p.rss["rss"][i]), "live": int(live[i]), "bytes": int(diff[i])})
    j = int(np.argmin(diff))
    if diff[j] < 0:
        out.append({"kind": "live_above", "t": _seconds([p.rss["ts"][j]], t0)[0],
                    "rss": int(p.rss["rss"][j]), "live": int(live[j]), "bytes": int(-diff[j])})
    return out


def _sites(trace, aggs, symbolizer) -> tuple[CallSites, list]:
    """Call sites merged over processes with every measure, and the top ones for the table."""
    sites = CallSites(symbolizer, fields=SITE_FIELDS)
    for p, a in zip(trace.processes, aggs):
        sites.add(p, a)
    keep = {}
    for f in SITE_FIELDS:
        for s in sites.top(f, TOP_SITES):
            if s[f] > 0:
                keep[id(s)] = s
    rows = sorted(keep.values(), key=lambda s: (-s["bytes"], -s["count"]))
    return sites, rows


#: The table's columns that a time range filters, and the per-(bucket, location) aggregate of each.
RANGE_COLUMNS = {"count": "loc_by_range", "temporary": "loc_temp_by_range",
                 "leaked_bytes": "loc_leak_by_range", "at_peak": "loc_peak_by_range"}


def _site_ranges(trace, aggs, sites, rows) -> dict | None:
    """Per process (pid) and filtered column (RANGE_COLUMNS): each table row's non-zero coarse
    time buckets and their values ([buckets], [values]), for filtering the table by a selected
    time range; None where not kept."""
    row_of = {id(r): i for i, r in enumerate(rows)}
    index = {key: row_of[id(site)] for key, site in sites.sites.items() if id(site) in row_of}
    out = {}
    for p, a in zip(trace.processes, aggs):
        lbr = a.loc_by_range
        if lbr is None or any(getattr(a, f) is None for f in RANGE_COLUMNS.values()):
            return None
        nloc = min(lbr.shape[1] - 1, len(p.locations))
        used = np.flatnonzero(lbr[:, :nloc].sum(0))
        if not len(used):
            continue
        addrs = p.locations.callsites[used]
        syms = sites.symbolizer.symbolize(p, addrs, a.loc_first_seq[used])
        row = np.array([index.get(site_key(s.module, s.offset, s.function,
                                           bool(addr & PY_FRAME_TAG), p.pid, addr), -1)
                        for addr, s in zip(addrs.tolist(), syms)], np.int64)
        mine = row >= 0
        out[str(p.pid)] = per = {}
        for column, field in RANGE_COLUMNS.items():
            per_row = np.zeros((len(rows), lbr.shape[0]), np.int64)
            np.add.at(per_row, row[mine], getattr(a, field)[:, used[mine]].T)
            per[column] = {str(r): [nz.tolist(), per_row[r][nz].tolist()]
                           for r in np.flatnonzero(per_row.any(1)).tolist()
                           for nz in [np.flatnonzero(per_row[r])]}
    return out


def _lifetimes(shared) -> dict:
    """Lifetime octaves per size class (counts), in ns and in events, plus never-freed blocks."""
    out = {}
    for key, m in (("ns", shared.life_ns_by_class), ("events", shared.life_events_by_class)):
        classes = np.flatnonzero(m.sum(1))
        octaves = np.flatnonzero(m.sum(0))
        lo, hi = (int(octaves.min()), int(octaves.max())) if len(octaves) else (0, 0)
        out[key] = {"classes": classes.tolist(), "octaves": list(range(lo, hi + 1)),
                    "counts": m[classes][:, lo:hi + 1].tolist()}
    leak = np.flatnonzero(shared.leak_class_count)
    out["never_freed"] = [{"class": int(c), "count": int(shared.leak_class_count[c]),
                           "bytes": int(shared.leak_class_bytes[c])} for c in leak.tolist()]
    return out


def build(trace, progress: bool = False, chunk: int | None = None) -> dict:
    """The report's data for one trace (a loaded Trace): summary, processes over time, call sites
    (table and flame trees), sizes and lifetimes."""
    kw = {"chunk": chunk} if chunk else {}
    aggs, shared = aggregate(trace, detail=True, progress=progress, **kw)
    symbolizer = Symbolizer()
    # Bytes live at the peak: the trace's peak, in the process that reached it.
    top = max(range(len(aggs)), key=lambda i: aggs[i].peak["bytes"], default=None)
    for i, a in enumerate(aggs):
        if i != top and a.loc_at_peak is not None:
            a.loc_at_peak = np.zeros_like(a.loc_at_peak)
    sites, rows = _sites(trace, aggs, symbolizer)
    summary = summarize(trace, aggs, shared, top=20, sites=sites)
    t0 = trace_clock(trace, aggs)[0]
    tree = CallTree(symbolizer)
    for p, a in zip(trace.processes, aggs):
        tree.add(p, a)
    first = trace.processes[0] if trace.processes else None
    summary["program"] = " ".join(first.argv) if first is not None and first.argv else (
        first.exe if first is not None else "")
    summary["stacks"] = max((p.stack_depth for p in trace.processes), default=0)
    summary["temporary"] = int(sum(int(a.loc_temporary.sum()) for a in aggs))
    summary["lifetimes_exact"] = shared.life_ns.exact
    return {
        "summary": summary,
        "processes": [_process_series(p, a, t0) for p, a in zip(trace.processes, aggs)],
        "sites": rows,
        "site_ranges": _site_ranges(trace, aggs, sites, rows),
        "flame": {"top_down": tree.to_json(False), "bottom_up": tree.to_json(True)},
        "size_classes": [{"class": c, "count": int(shared.class_count[c]),
                          "bytes": int(shared.class_bytes[c])}
                         for c in np.flatnonzero(shared.class_count).tolist()],
        "lifetimes": _lifetimes(shared),
        "nclass": NCLASS,
    }
