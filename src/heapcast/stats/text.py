"""The text report of `heapcast stats`."""
from __future__ import annotations


def _human(n: int) -> str:
    """Bytes in binary units: 1536 -> '1.5 KiB'."""
    v = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024 or unit == "TiB":
            return f"{int(v)} B" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return f"{n} B"


def _ns(n: int) -> str:
    """A duration in the unit that keeps it short."""
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} ns"


def _when(seconds: float) -> str:
    """A time since the trace began: seconds, or a smaller unit when under 0.1 s."""
    return f"{seconds:.3f} s" if seconds >= 0.1 else _ns(round(seconds * 1e9))


def _table(headers: list, rows: list, indent: str = "  ") -> list:
    """Aligned text rows: numbers (and headers over them) right-aligned, text left-aligned."""
    cells = [[h for h in headers]] + [[c if isinstance(c, str) else f"{c:,}" for c in r] for r in rows]
    numeric = [all(not isinstance(r[i], str) for r in rows) if rows else False
               for i in range(len(headers))]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for r in cells:
        parts = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(r, widths, numeric)]
        lines.append(indent + "  ".join(parts).rstrip())
    return lines


def _site_rows(sites: list) -> list:
    """Table rows of call sites: a Python one as file:line, "python" in the address column."""
    return [[s["bytes"], s["count"], s["function"], f"{s['module']}:{s['offset']}", "python"]
            if s.get("python") else
            [s["bytes"], s["count"], s["function"], s["module"], f"{s['address']:#x}"]
            for s in sites]


def _recording(r: dict, events: int) -> list:
    """The line on how `heapcast record` went (session.json), where the trace says it."""
    if "wall_s" not in r or "after_exit_s" not in r:
        return []
    line = (f"recording   the program ran {r['wall_s']:.2f} s; the trace was complete "
            f"{r['after_exit_s']:.2f} s after its end")
    if "converted_while_running" in r:
        line += (f", {r['converted_while_running']:,} of its {events:,} events converted while "
                 "it ran")
    return [line]


def format_stats(d: dict) -> str:
    """A readable text report of `stats()`'s dict."""
    pl, pr = d["peak_live"], d["peak_rss"]
    rss_when = (f"at {_when(pr['seconds'])} (pid {pr['pid']})" if pr.get("seconds") is not None
                else f"(pid {pr['pid']}, VmHWM at exit)" if pr["bytes"] else "(no samples)")
    out = [
        f"trace       {d['trace']}",
        f"events      {d['events']:,} in {d['processes']} process(es), {d['threads']} thread(s), "
        f"over {_ns(d['duration_ns'])}",
        f"peak live   {d['peak_live_bytes']:,} B ({_human(d['peak_live_bytes'])}) requested, "
        f"at {_when(pl['seconds'])} (pid {pl['pid']}, event {pl['event_index']:,}, seq {pl['seq']:,})",
        f"peak RSS    {d['peak_rss_bytes']:,} B ({_human(d['peak_rss_bytes'])}) {rss_when}",
        f"never freed {d['leaked_blocks']:,} blocks, {d['leaked_bytes']:,} B",
        f"problems    unknown frees {d['unknown_frees']:,}, double acquires "
        f"{d['double_acquires']:,}, lost events {d['lost_events']:,}, "
        f"truncated {'yes' if d['truncated'] else 'no'}",
        *(["pymalloc    recorded from the first Python code on (its earlier objects' frees "
           "are among the unknown frees)"] if d.get("pymalloc_recorded") else []),
        *([f"clock       read once in {d['clock_every']} events of a thread (record "
           "--clock-every): times between two readings up to 100 us apart are spread between "
           "them (estimates), the others steps"]
          if d.get("clock_every", 1) > 1 else []),
        *_recording(d.get("recording") or {}, d["events"]),
        "",
        "events by op",
        *_table(["op", "count"], [[k, v] for k, v in d["ops"].items()]),
        "",
        "size classes (requested size.bit_length())",
        *_table(["class", "sizes", "blocks", "bytes"],
                [[c["class"], f"{c['min_size']}..{c['max_size']}", c["count"], c["bytes"]]
                 for c in d["size_classes"]]),
        "",
        f"lifetimes of {d['lifetimes']['freed_blocks']:,} freed blocks",
        *_table(["", "p50", "p90", "p99", "max"],
                [["ns"] + [d["lifetimes"]["ns"][k] for k in ("p50", "p90", "p99", "max")],
                 ["events"] + [d["lifetimes"]["events"][k] for k in ("p50", "p90", "p99", "max")]]),
    ]
    for key, title in (("top_callsites_by_bytes", "by bytes"), ("top_callsites_by_count", "by count")):
        out += ["", f"top call sites {title}",
                *_table(["bytes", "count", "function", "module", "address"], _site_rows(d[key]))]
    for key, title in (("top_program_lines_by_bytes", "by bytes"),
                       ("top_program_lines_by_count", "by count")):
        if d.get(key):
            out += ["", f"top lines of the program's own Python code {title} (what called the "
                        "library code that allocated)",
                    *_table(["bytes", "count", "function", "line"],
                            [r[:4] for r in _site_rows(d[key])])]
    out += ["", "processes",
            *_table(["pid", "ppid", "events", "threads", "peak live", "peak RSS", "leaked",
                     "unknown frees", "exe"],
                    [[str(p["pid"]), str(p["ppid"]), p["events"], p["threads"], p["peak_live_bytes"],
                      p["peak_rss_bytes"], p["leaked_blocks"], p["unknown_frees"],
                      p["exe"] or "?"] for p in d["per_process"]])]
    return "\n".join(out) + "\n"
