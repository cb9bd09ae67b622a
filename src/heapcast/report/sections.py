"""The report's optional sections: the allocator lab (--lab), a second recording (--diff) and a
forecasting model (--model)."""
from __future__ import annotations


def lab_section(trace) -> dict:
    """Every lab policy's footprint over time and the lab's table (heapcast simulate), as
    `heapcast simulate` left them in the trace's directory if it ran with every policy."""
    from ..lab.replay import simulate
    from ..lab.report import keep_for_report, kept_for_report, report_view
    kept = kept_for_report(trace.path)
    if kept is not None:
        return kept
    view = report_view(simulate(trace, series=True), trace)
    keep_for_report(trace.path, view)
    return view


def _key(site: dict) -> tuple:
    """A call site of report data as diff_section matches it: Python sites also by function."""
    return (site["module"], site["offset"]) + ((site["function"],) if site.get("python") else ())


def diff_section(this: dict, other: dict, other_path: str, top: int = 40) -> dict:
    """What changed from `other` (another report data dict) to `this`: the summary's peaks, the
    size classes and the call sites (matched by module and offset; Python ones by file,
    line and function) that changed most."""
    keys = ("events", "peak_live_bytes", "peak_rss_bytes", "leaked_bytes", "leaked_blocks",
            "duration_ns", "temporary")
    a, b = this["summary"], other["summary"]
    theirs = {_key(s): s for s in other["sites"]}
    ours = {_key(s): s for s in this["sites"]}
    rows = []
    for key in set(ours) | set(theirs):
        s, o = ours.get(key), theirs.get(key)
        ref = s or o
        rows.append({"function": ref["function"], "module": ref["module"],
                     "offset": ref["offset"], "python": ref.get("python", False),
                     "bytes": s["bytes"] if s else 0, "other_bytes": o["bytes"] if o else 0,
                     "d_bytes": (s["bytes"] if s else 0) - (o["bytes"] if o else 0),
                     "d_count": (s["count"] if s else 0) - (o["count"] if o else 0),
                     "d_leaked_bytes": (s["leaked_bytes"] if s else 0) - (o["leaked_bytes"] if o else 0)})
    rows.sort(key=lambda r: (-abs(r["d_bytes"]), -abs(r["d_count"]), r["function"]))
    ca = {c["class"]: c["count"] for c in this["size_classes"]}
    cb = {c["class"]: c["count"] for c in other["size_classes"]}
    return {"other": other_path, "this": {k: a[k] for k in keys},
            "other_summary": {k: b[k] for k in keys},
            "size_classes": [{"class": c, "this": ca.get(c, 0), "other": cb.get(c, 0)}
                             for c in sorted(set(ca) | set(cb))],
            "sites": rows[:top]}
