"""`heapcast report`: its command-line parser, added to the `heapcast` command by cli.py."""
from __future__ import annotations

import sys
from pathlib import Path


def _cmd_report(a) -> int:
    from .._outputs import prepare_output, show_progress
    from . import report
    if a.output is not None:   # before the page's work, not when it is written
        prepare_output(a.output)
    out = report(a.trace, output=a.output, model=a.model, lab=a.lab, diff=a.diff,
                 progress=show_progress())
    size = out.stat().st_size
    print(f"heapcast: wrote {out} ({size / 1e6:.1f} MB, open it in a browser)", file=sys.stderr)
    return 0


def add_parsers(sub) -> None:
    """Adds the `report` subcommand."""
    r = sub.add_parser("report", help="write one self-contained interactive HTML page of a trace",
                       usage="heapcast report TRACE [--model MODEL|POLICY] [--lab] [--diff OTHER] "
                             "[-o report.html]")
    r.add_argument("trace", type=Path)
    r.add_argument("-o", "--output", type=Path, metavar="HTML",
                   help="the page to write (default: TRACE.report.html)")
    r.add_argument("--model", type=Path, metavar="MODEL", action="append",
                   help="also score this forecasting model (.safetensors) or compiled POLICY "
                        "(through the native runtime) on the trace; repeat it to compare models "
                        "(e.g. the default model, the n-gram baseline, the compiled policy)")
    r.add_argument("--lab", action="store_true",
                   help="also replay the trace through every allocator-lab policy")
    r.add_argument("--diff", type=Path, metavar="OTHER", help="compare with another trace")
    r.set_defaults(func=_cmd_report)
