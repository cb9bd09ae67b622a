"""`heapcast simulate`: the allocator lab's subcommand (registered by heapcast.cli)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from .names import ALL_POLICIES, LAYERED_FITS, LEARNED_OVER, LabError


def _cmd_simulate(a) -> int:
    from ..stats.plot import PlotError
    from .replay import simulate
    from .report import (format_simulation, is_report_replay, keep_for_report,
                         plot_simulation, report_view)
    if a.plot:   # fail before a long replay, not after it
        from ..stats.plot import check_plot_file
        try:
            check_plot_file(a.plot)
        except PlotError as e:
            raise LabError(str(e)) from None
    from ..trace.reader import load
    trace = load(a.trace)
    for_report = is_report_replay(a.policy, a.train, a.model, a.align, a.learned_over)
    d = simulate(trace, policies=a.policy, train=a.train, model=a.model, checked=a.check,
                 series=a.plot is not None or for_report, grain=a.align,
                 learned_over=a.learned_over)
    if a.plot:
        plot_simulation(d, a.plot)
        print(f"heapcast: wrote {a.plot}", file=sys.stderr)
    if for_report:
        keep_for_report(trace.path, report_view(d, trace))
    d.pop("series", None)
    print(json.dumps(d, indent=2) if a.json else format_simulation(d))
    return 0


def add_parsers(subparsers) -> None:
    """Adds `simulate` to the `heapcast` command's subparsers."""
    s = subparsers.add_parser(
        "simulate", help="replay a trace through allocation policies and compare their footprint",
        description="Replays every allocation, realloc and free of TRACE through simulated "
                    "allocators and reports peak footprint, fragmentation and replay speed "
                    "(docs/policies.md).")
    s.add_argument("trace", type=Path)
    s.add_argument("--policy", metavar="P[,P...]",
                   help=f"policies to run (default: all): {', '.join(ALL_POLICIES)}")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.add_argument("--plot", type=Path, metavar="PNG",
                   help="draw the footprint over time of every policy into this PNG")
    s.add_argument("--train", type=Path, metavar="TRACE",
                   help="seed learned-lifetime's call-site predictor with another recording")
    s.add_argument("--model", type=Path, metavar="MODEL",
                   help="learned-lifetime: use a lifetime model (heapcast train --task lifetime)")
    s.add_argument("--learned-over", choices=LAYERED_FITS, default=LEARNED_OVER, metavar="FIT",
                   help="learned-lifetime: the placement its lifetime classes are layered over, "
                        f"one of {', '.join(LAYERED_FITS)} (default {LEARNED_OVER}: heapcast's "
                        "packer, as heapcast run places a compiled policy's classes)")
    s.add_argument("--align", type=int, choices=(16, 8), default=16,
                   help="heapcast: the packer's alignment to model, 16 (default) or 8 (size "
                        "classes every 8 bytes, heapcast run --align 8)")
    s.add_argument("--check", action="store_true",
                   help="verify the invariants at every op (no overlap, inside the footprint)")
    s.set_defaults(func=_cmd_simulate)
