"""Bounded memory and time of `heapcast stats` and `heapcast report` on large traces (issue 11).

Records ring.c (../shared/workloads) with 40M iterations (80M events) and 5M iterations (10M
events), then runs, interleaved and repeated (medians): reading the trace alone (iterating
Trace.chunks, the floor any pass pays), `heapcast stats --json`, and `heapcast report`. Each run is
its own process: wall and CPU seconds and its peak RSS (wait4's rusage). The targets: stats and report
of the 80M-event trace under 1 GB peak RSS and under 40 s on 2 cores; the 10M-event report bounded.

    python bench/report_scale.py [--repeats 3] [--iterations 40000000] [--keep DIR]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import (RESULTS_DIR, compile_c, format_table, interleaved, machine_info,
                     measured, median, workload, write_json)

READ_ONLY = ("import sys, heapcast\n"
             "n = sum(len(b) for b in heapcast.load(sys.argv[1]).chunks(1 << 20))\n")


def record_ring(exe: Path, iterations: int, out: Path) -> Path:
    if not out.exists():
        print(f"recording ring {iterations} 100 -> {out}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "heapcast", "record", "-o", str(out), "--",
                        str(exe), str(iterations), "100"], check=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=40_000_000,
                    help="ring iterations of the large trace (2 events each; default 40M)")
    ap.add_argument("--small-iterations", type=int, default=5_000_000)
    ap.add_argument("--keep", type=Path, help="keep (and reuse) the traces in this directory")
    ap.add_argument("--json", type=Path, default=RESULTS_DIR / "report_scale.json")
    a = ap.parse_args()

    work = a.keep or Path(tempfile.mkdtemp(prefix="heapcast-report-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    exe = compile_c(workload("ring.c"), work / "ring")
    py = sys.executable      # the environment heapcast is installed in (not a traced program)
    rows, results = [], {"machine": machine_info(), "repeats": a.repeats, "traces": {}}
    for iterations in (a.iterations, a.small_iterations):
        trace = record_ring(exe, iterations, work / f"ring{iterations}.trace")
        html = work / f"ring{iterations}.html"
        trials = {
            "read chunks": lambda: measured([py, "-c", READ_ONLY, str(trace)]),
            "stats --json": lambda: measured([py, "-m", "heapcast", "stats", str(trace), "--json"]),
            "report": lambda: measured([py, "-m", "heapcast", "report", str(trace), "-o", str(html)]),
        }
        runs = interleaved(trials, a.repeats, label=f"ring {iterations}")
        events = 2 * iterations
        base = median(r["cpu_seconds"] for r in runs["read chunks"])
        entry = {"events": events, "trace_bytes": sum(f.stat().st_size for f in trace.iterdir()),
                 "html_bytes": html.stat().st_size, "runs": runs}
        for name, rs in runs.items():
            s, m = median(r["seconds"] for r in rs), median(r["peak_rss_mb"] for r in rs)
            c = median(r["cpu_seconds"] for r in rs)
            entry[name] = {"seconds": s, "cpu_seconds": c, "peak_rss_mb": m, "cpu_vs_read": c / base}
            rows.append([f"{events / 1e6:.0f}M", name, f"{s:.1f}", f"{c:.1f}", f"{c / base:.2f}x",
                         f"{m:.0f}"])
        results["traces"][str(events)] = entry
        print(f"ring {events:,} events: page {html.stat().st_size / 1e6:.1f} MB", file=sys.stderr)
    print(format_table(["events", "command", "wall s", "CPU s", "CPU vs reading", "peak RSS MB"],
                       rows))
    print(f"wrote {write_json(a.json, results)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
