"""The text report and the chart of `heapcast simulate`."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .names import LEARNED_OVER

MIB = 1024.0 * 1024.0
REPORT_POINTS = 1500    # points of each footprint curve in `heapcast report --lab`


def _mib(x) -> str:
    return "-" if x is None else f"{x / MIB:,.2f}"


def _x(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def format_simulation(d: dict) -> str:
    """The result of simulate() as a plain-text table."""
    lines = [f"{d['trace']}: {d['events']:,} events, {d['processes']} process(es), "
             f"peak live {_mib(d['peak_live_bytes'])} MiB (the lower bound)"]
    head = (f"{'policy':<18} {'footprint MiB':>13} {'frag':>6} {'4K pages MiB':>12} {'frag':>6} "
            f"{'2M pages':>8} {'internal MiB':>12} {'external MiB':>12} {'Mevents/s':>9}")
    lines += [head, "-" * len(head)]
    for name, v in d["policies"].items():
        lines.append(
            f"{name:<18} {_mib(v['peak_footprint_bytes']):>13} {_x(v['fragmentation']):>6} "
            f"{_mib(v['peak_pages_4k'] * 4096):>12} {_x(v['fragmentation_pages_4k']):>6} "
            f"{v['peak_pages_2m']:>8} {_mib(v['internal_bytes_at_peak']):>12} "
            f"{_mib(v['external_bytes_at_peak']):>12} {(v['events_per_s'] or 0) / 1e6:>9.1f}")
    s = d.get("summary") or {}
    if "best_classic" in s:
        line = f"best classic policy: {s['best_classic']}"
        if "oracle_gain" in s:
            line += f"; oracle-lifetime wins {_pct(s['oracle_gain'])} of its footprint"
        if "learned_gain" in s:
            closed = s.get("learned_gap_closed")
            line += (f", learned-lifetime {_pct(s['learned_gain'])}"
                     + (f" ({100 * closed:.0f}% of the gap)" if closed is not None else
                        " (no gap to close)"))
        lines.append(line)
    if "oracle-lifetime" in d["policies"]:
        lines.append(f"oracle-lifetime's placement: {d['policies']['oracle-lifetime']['placement']}"
                     f" (the best a clairvoyant allocator can choose here); lower bound: peak "
                     f"live {_mib(d['peak_live_bytes'])} MiB")
    if "prediction" in d:
        pr = d["prediction"]
        lines.append(f"predictor: {d['predictor']}; exact class for {100 * pr['accuracy']:.1f}% of "
                     f"{pr['blocks']:,} blocks, too short for {100 * pr['predicted_shorter']:.1f}%")
    lines.append(f"{d['unknown_frees']:,} unknown frees, {d['double_acquires']:,} double "
                 f"acquisitions; driver {(d['driver_events_per_s'] or 0) / 1e6:.1f} Mevents/s, "
                 f"policies on {d.get('threads', 1)} thread{'s' if d.get('threads', 1) > 1 else ''}"
                 f", {d['wall_s']:.2f} s in all")
    return "\n".join(lines)


def plot_simulation(d: dict, out: str | Path) -> None:
    """Draws the footprint over time of every policy (heap extent above, resident 4 KiB pages
    below) with the live bytes, for the process with the largest peak live bytes. `d` must come
    from simulate(..., series=True). Needs matplotlib (imported here only)."""
    from ..stats.plot import require_matplotlib
    plt = require_matplotlib()
    series = d.get("series") or []
    if not series:
        raise ValueError("no footprint series in this result: run simulate(..., series=True)")
    main = max(range(len(series)), key=lambda i: d["per_process"][i]["peak_live_bytes"])
    s = series[main]
    t = (s["ts"].astype(np.int64) - int(s["ts"][0])) / 1e9 if len(s["ts"]) else s["ts"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 8), sharex=True)
    for name, ps in s["policies"].items():
        top.plot(t, ps["extent"] / MIB, label=name, linewidth=1.1)
        bottom.plot(t, ps["pages4k"] * 4096 / MIB, label=name, linewidth=1.1)
    for ax in (top, bottom):
        ax.plot(t, s["live"] / MIB, label="live bytes", color="black", linewidth=1.4, linestyle="--")
        ax.set_ylabel("MiB")
        ax.grid(alpha=0.3)
    top.set_title(f"{d['trace']} (pid {s['pid']}): heap footprint (extent) by policy")
    bottom.set_title("resident 4 KiB pages holding a live byte")
    bottom.set_xlabel("seconds since the process's first sample")
    top.legend(loc="best", fontsize="small", ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def report_view(d: dict, trace) -> dict:
    """What `heapcast report --lab` shows of simulate(trace, series=True)'s result `d`: the
    table, and every policy's footprint at REPORT_POINTS moments, in seconds since the trace
    began (as the report's memory chart has them)."""
    raw = d["series"]
    starts = [p.start_ns for p in trace.processes if p.start_ns]
    firsts = [int(s["ts"][0]) for s in raw if len(s["ts"])]
    t0 = min(starts or firsts or [0])
    series = []
    for s in raw:
        n = len(s["ts"])
        keep = np.linspace(0, n - 1, min(n, REPORT_POINTS)).astype(np.int64) if n else np.zeros(0, np.int64)
        t = (np.asarray(s["ts"], np.int64)[keep] - t0) / 1e9
        series.append({"pid": s["pid"], "t": [round(v, 9) for v in t.tolist()],
                       "live": np.asarray(s["live"])[keep].tolist(),
                       "policies": {name: np.asarray(v["extent"])[keep].tolist()
                                    for name, v in s["policies"].items()}})
    return {"policies": d["policies"], "series": series, "peak_live_bytes": d["peak_live_bytes"]}


def is_report_replay(policies, train, model, grain: int, learned_over: str = LEARNED_OVER) -> bool:
    """Whether simulate() with these options is the replay `heapcast report --lab` shows (every
    policy, no other recording or model, the default packer grain and learned placement), whose
    report_view() is kept for it."""
    return (policies in (None, "all") and train is None and model is None and grain == 16
            and learned_over == LEARNED_OVER)


def _report_key(trace_path):
    from ..trace import cache
    from .replay import parse_policies
    return cache.key(trace_path, policies=parse_policies(None), grain=16)


def keep_for_report(trace_path, view: dict) -> None:
    """Keeps report_view() of a replay through every policy, with the default options, in the
    trace's directory (heapcast.trace.cache) for `heapcast report --lab`."""
    from ..trace import cache
    cache.save(trace_path, "lab", _report_key(trace_path), view)


def kept_for_report(trace_path) -> dict | None:
    """report_view() of the trace as keep_for_report() left it, or None."""
    from ..trace import cache
    return cache.load(trace_path, "lab", _report_key(trace_path))
