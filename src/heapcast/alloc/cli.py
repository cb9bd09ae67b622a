"""`heapcast run`: the allocator's subcommand (registered by heapcast.cli)."""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path


def _cmd_run(a) -> int:
    from .._outputs import prepare_output
    from .runner import environment, run
    from .summary import format_summary
    if a.log is not None:   # before the program runs, not when its log is written
        prepare_output(a.log)
    cmd = a.command[1:] if a.command and a.command[0] == "--" else a.command
    if a.env:
        env = environment(a.policy, a.log, backend=a.backend, align=a.align)
        for name, value in env.items():
            print(f"{name}={shlex.quote(value)}")
        if not env:
            print(f"heapcast: {a.policy} runs programs on glibc's malloc (its placement, the "
                  f"allocator lab's verdict): nothing to preload", file=sys.stderr)
        return 0
    if not cmd:
        raise ValueError("no command to run (heapcast run [--policy P] -- CMD ARGS...)")
    from ..recorder.session import RecordError
    from .runner import family
    if family(a.policy) == "glibc":
        print(f"heapcast: {a.policy}'s placement is glibc's own malloc (the allocator lab's "
              f"verdict at compile): running the program on it, nothing preloaded"
              + (" (--align and --backend apply to heapcast's allocator: `heapcast compile "
                 "--placement one` puts a policy on it)"
                 if a.align not in (None, 16) or a.backend != "pack" else ""),
              file=sys.stderr)
    try:
        result = run(cmd, policy=a.policy, log=a.log, backend=a.backend, align=a.align)
    except RecordError as e:   # the program could not be started
        raise ValueError(str(e)) from None
    if result.summary is not None:
        print(format_summary(result.summary), file=sys.stderr)
        print(f"heapcast: wrote {a.log}", file=sys.stderr)
    return result.exit_code


def add_parsers(subparsers) -> None:
    """Adds `run` to the `heapcast` command's subparsers."""
    r = subparsers.add_parser(
        "run", help="run a program under heapcast's allocator (blocks placed by predicted lifetime)",
        description="Runs CMD with heapcast's allocator preloaded: its packer (or mimalloc's "
                    "heaps), spans of their own per lifetime group, fed by a compiled POLICY, "
                    "placed as the POLICY's placement "
                    "says (by lifetime class, in one group, or on glibc's own malloc, which "
                    "preloads nothing; docs/allocator.md). Exits with CMD's status (128+N for "
                    "signal N).")
    r.add_argument("--policy", default="none", metavar="P",
                   help="none (the allocator without predictions), a POLICY file (heapcast "
                        "compile --kind table), or oracle:TRACE (the true classes from a "
                        "recording of the same command)")
    r.add_argument("--backend", choices=("pack", "mimalloc"), default="pack",
                   help="what serves the blocks: heapcast's own packer (default: 16-byte size "
                        "classes, spans per lifetime group, free pages given back; blocks over "
                        "256 KiB in a mapping each) or mimalloc's heaps, one per group")
    r.add_argument("--align", type=int, choices=(16, 8), default=None,
                   help="16: every block 16-byte aligned, glibc's guarantee; 8: the packer's "
                        "size classes every 8 bytes, so a block whose size is not a multiple of "
                        "16 is 8-byte aligned, as mimalloc's small blocks are (less memory; "
                        "requests for an alignment still get it). Default: the POLICY's "
                        "(heapcast compile --align), else 16")
    r.add_argument("--log", type=Path, metavar="JSON", nargs="?", const=Path("heapcast-run.json"),
                   help="write the per-class summary here (default heapcast-run.json) and print "
                        "it; with --env: the prefix of the per-process files (PREFIX.PID.json)")
    r.add_argument("--env", action="store_true",
                   help="print the environment (NAME=VALUE lines) that runs a program under the "
                        "allocator without heapcast in between, and exit")
    r.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    r.set_defaults(func=_cmd_run)
