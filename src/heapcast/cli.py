"""The `heapcast` command: one thin function per subcommand (parse, call the library, print)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .stats.plot import PlotError
from .trace.base import NativeError, TraceError


def _own_process(a) -> None:
    """The `heapcast` command (not main() called from Python) owns its process's environment."""
    if a.own_process:
        from .recorder import session
        session.OWN_PROCESS = True


def _cmd_record(a) -> int:
    from .recorder.session import RecordError, record
    _own_process(a)
    if not a.command:
        raise UsageError("record needs a command: heapcast record [options] -- CMD ARGS...")
    try:
        r = record(a.command, output=a.output, stacks=a.stacks, rss_interval_ms=a.rss_interval,
                   follow_children=a.follow_children, mmap=a.mmap, unwind=a.unwind,
                   python=a.python, policy=a.policy, policy_every=a.policy_every,
                   log_features=a.log_features, live=not a.convert_at_exit,
                   pymalloc=a.pymalloc, clock_every=a.clock_every)
    except RecordError as e:
        print(f"heapcast record: {'error: ' if e.exit_code == 2 else ''}{e}", file=sys.stderr)
        return e.exit_code
    print(r.summary(), file=sys.stderr)
    return r.exit_code


def _cmd_finalize(a) -> int:
    from .recorder.session import finalize, import_quietly
    _own_process(a)
    import_quietly()
    r = finalize(a.trace)
    print(r.summary(), file=sys.stderr)
    return 0


def _cmd_stats(a) -> int:
    if a.trace.suffix == ".json" and a.trace.is_file():   # `heapcast run --log` summary
        from .alloc.summary import format_summary, read_run_log
        d = read_run_log(a.trace)
        print(json.dumps(d, indent=2) if a.json else format_summary(d))
        return 0
    from ._outputs import show_progress
    from .stats import format_stats, stats
    # (stats() checks the plot's file before it reads the trace it is given by its path)
    d = stats(a.trace, top=a.top, plot=a.plot, progress=show_progress())
    print(json.dumps(d, indent=2) if a.json else format_stats(d))
    if a.plot:
        print(f"heapcast: wrote {a.plot}", file=sys.stderr)
    return 0


def _cmd_import(a) -> int:
    from .trace.seed_import import import_seed
    out = import_seed(a.log, a.output, pid=a.pid)
    print(f"heapcast: imported {a.log} -> {out}", file=sys.stderr)
    return 0


def _cmd_export(a) -> int:
    from ._outputs import prepare_output
    from .trace.export import export_parquet
    from .trace.reader import load
    if not a.parquet:
        raise UsageError("export needs a format: heapcast export TRACE --parquet OUT")
    prepare_output(a.parquet)
    export_parquet(load(a.trace), a.parquet)
    print(f"heapcast: wrote {a.parquet}", file=sys.stderr)
    return 0


class UsageError(Exception):
    """A command line that cannot be run."""


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The command's parser; with `verb` one of CORE_VERBS, without the other packages' subcommands."""
    p = argparse.ArgumentParser(prog="heapcast", description="Record, analyse and forecast the "
                                "heap behaviour of Linux programs.")
    sub = p.add_subparsers(dest="verb", required=True, metavar="COMMAND")

    r = sub.add_parser("record", help="run a program and record every heap call",
                       usage="heapcast record [-o PATH] [--stacks N] [--rss-interval MS] "
                             "[--follow-children] [--mmap] [--no-python] [--pymalloc] [--clock-every N] "
                             "[--policy POLICY [--policy-every N] [--log-features]] "
                             "-- CMD ARGS...")
    r.add_argument("-o", "--output", type=Path, help="trace directory to create (default: "
                   "heapcast-<program>-<n> in the current directory)")
    r.add_argument("--stacks", type=int, default=0, metavar="N",
                   help="record up to N frames of stack per event (default 0: call site only)")
    r.add_argument("--unwind", choices=("fp", "dwarf"), default="fp",
                   help="stack walking with --stacks: frame pointers (fast; stops at code built "
                        "without them) or DWARF unwind tables (complete, slower)")
    r.add_argument("--rss-interval", type=float, default=10, metavar="MS",
                   help="sample resident memory every MS milliseconds (default 10)")
    r.add_argument("--follow-children", action="store_true",
                   help="also trace programs started by exec (forked children are always traced)")
    r.add_argument("--mmap", action="store_true", help="also record mmap, munmap and mremap")
    r.add_argument("--python", action=argparse.BooleanOptionalAction, default=True,
                   help="in CPython 3.11-3.13 programs, record the Python file, function and line as "
                        "call sites (and Python frames in stacks); --no-python: native call "
                        "sites only (default: on)")
    r.add_argument("--pymalloc", action="store_true",
                   help="in CPython 3.11-3.13 programs, also record pymalloc's own allocations "
                        "(objects and PyMem_Malloc requests up to 512 bytes, served from "
                        "pymalloc's arenas without calling malloc), from the first Python code "
                        "on; without it, set PYTHONMALLOC=malloc to see them as mallocs")
    r.add_argument("--clock-every", type=int, default=1, metavar="N",
                   help="read the clock for one event in N of each thread (and for the first "
                        "after each 100 us tick), the others taking their thread's latest "
                        "reading: cheaper recording where reading the clock is slow; readers "
                        "estimate the times between two readings (default 1: every event; at "
                        "most 1024)")
    r.add_argument("--policy", type=Path, metavar="POLICY",
                   help="run a compiled policy online on the program's events and log its "
                        "predictions in the trace (heapcast evaluate --online)")
    r.add_argument("--policy-every", type=int, default=1, metavar="N",
                   help="with --policy: predict every N-th event only (default 1)")
    r.add_argument("--log-features", action="store_true",
                   help="with --policy: also log what each decision read and decided "
                        "(<pid>.features, for heapcast train --from-log)")
    r.add_argument("--convert-at-exit", action="store_true",
                   help="convert the trace only once the program has ended, not while it runs")
    r.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments")
    r.set_defaults(func=_cmd_record)

    f = sub.add_parser("finalize", help="convert the raw files of an interrupted recording")
    f.add_argument("trace", type=Path)
    f.set_defaults(func=_cmd_finalize)

    s = sub.add_parser("stats", help="summarize a trace: ops, peaks, sizes, lifetimes, call sites "
                                     "(or a `heapcast run --log` JSON: its per-class summary)")
    s.add_argument("trace", type=Path, metavar="TRACE|RUN.json")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.add_argument("--top", type=int, default=10, help="call sites to list (default 10)")
    s.add_argument("--plot", type=Path, metavar="PNG", help="also draw live bytes and RSS over time")
    s.set_defaults(func=_cmd_stats)

    i = sub.add_parser("import", help="convert another tool's log into a heapcast trace")
    i.add_argument("kind", choices=("seed",), help="seed: the article's libtracemalloc text log")
    i.add_argument("log", type=Path, help="the log (plain or gzip)")
    i.add_argument("-o", "--output", type=Path, required=True, help="trace directory to create")
    i.add_argument("--pid", type=int, default=0, help="pid to give the imported process (default 0)")
    i.set_defaults(func=_cmd_import)

    e = sub.add_parser("export", help="write a trace's events in another format")
    e.add_argument("trace", type=Path)
    e.add_argument("--parquet", type=Path, metavar="OUT", help="Apache Parquet file")
    e.set_defaults(func=_cmd_export)

    if verb not in CORE_VERBS:   # their modules import numpy: only when they may be asked for
        from .alloc.cli import add_parsers as add_alloc_parsers
        from .forecast.cli import add_parsers as add_forecast_parsers
        from .lab.cli import add_parsers as add_lab_parsers
        from .policy.cli import add_parsers as add_policy_parsers
        from .report.cli import add_parsers as add_report_parsers
        add_forecast_parsers(sub)
        add_lab_parsers(sub)
        add_policy_parsers(sub)     # after forecast's: it extends train and evaluate
        add_report_parsers(sub)
        add_alloc_parsers(sub)
    p.subcommands = sub.choices   # (main: an unknown option is the subcommand's error)
    return p


#: The subcommands defined here. `heapcast record ...` builds only these, so that it starts
#: without importing numpy (the recording starts sooner).
CORE_VERBS = ("record", "finalize", "stats", "import", "export")


def _verb(argv) -> str | None:
    """The subcommand of a command line (its first word that is not an option), if any."""
    for word in argv:
        if not word.startswith("-"):
            return word
        if word in ("-h", "--help"):
            return None
    return None


#: Subcommands that build arrays of a trace's size (events, features, tensors) and free them
#: again, many times over: their process runs with glibc's malloc told to keep such blocks.
HEAVY_VERBS = ("stats", "import", "export", "dataset", "train", "evaluate", "simulate", "compile",
               "report")
#: glibc's settings for them: blocks up to 1 GiB come from the heap, not from a mapping of their
#: own, and up to 1 GiB of free heap is kept. By default every block above 32 MiB (a column of
#: 4 million events) is mapped when allocated and unmapped when freed, so that the kernel zeroes
#: fresh pages for each of the hundreds of temporaries that a command makes: `heapcast evaluate`
#: of the main job's GRU took 59 s, 28 of them in the kernel (4.8 million page faults), and 47 s
#: with these (README, "Heavy commands").
MALLOC_TUNABLES = "glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=1073741824"
_TUNED = "HEAPCAST_MALLOC_TUNED"   # in the process run again: "=" + the user's GLIBC_TUNABLES
#: numpy asks for transparent huge pages for every array of 4 MiB or more (madvise), unless this
#: variable, read when numpy is imported, says 0. A huge page is zeroed whole when first touched,
#: and on a virtual machine that reports free memory to its host (this 2-core VM) fresh 2 MiB
#: blocks are the ones the host has taken back: featurizing the main job's trace took 5.7-6.0 s
#: with them and 2.8-3.1 s without, the GRU's evaluation 21-23 s against 18-20 s (README, "Heavy
#: commands").
NUMPY_HUGEPAGE = "NUMPY_MADVISE_HUGEPAGE"


def _tune_malloc(verb) -> None:
    """Runs the `heapcast` command of a heavy subcommand once more, at once, with
    MALLOC_TUNABLES in GLIBC_TUNABLES (glibc reads them only when a program starts: mallopt
    cannot raise the mapping threshold above 32 MiB); in that process, gives GLIBC_TUNABLES back
    its value for the programs it may start. Also has numpy leave huge pages alone (NUMPY_HUGEPAGE
    set to 0 before numpy is imported, and left so for the programs it starts: heapcast's own,
    c++filt) unless the user's environment sets that variable. Nothing
    happens for other subcommands or with HEAPCAST_MALLOC_TUNING=0; GLIBC_TUNABLES is left alone
    without glibc or when the user's already sets these two."""
    env = os.environ
    if _TUNED in env:   # the process run again
        before = env.pop(_TUNED)
        if before.startswith("="):
            env["GLIBC_TUNABLES"] = before[1:]
        else:
            env.pop("GLIBC_TUNABLES", None)
        return
    if verb not in HEAVY_VERBS or env.get("HEAPCAST_MALLOC_TUNING") == "0":
        return
    env.setdefault(NUMPY_HUGEPAGE, "0")
    theirs = env.get("GLIBC_TUNABLES")
    if theirs and ("glibc.malloc.mmap_threshold" in theirs or "glibc.malloc.trim_threshold" in theirs):
        return   # the user's own choice
    try:
        os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError):
        return   # not glibc: nothing reads GLIBC_TUNABLES
    if not sys.executable or not getattr(sys, "orig_argv", None):
        return
    env[_TUNED] = "" if theirs is None else "=" + theirs
    env["GLIBC_TUNABLES"] = f"{theirs}:{MALLOC_TUNABLES}" if theirs else MALLOC_TUNABLES
    try:
        os.execv(sys.executable, sys.orig_argv)
    except OSError:   # run as it is
        env.pop(_TUNED)
        if theirs is None:
            env.pop("GLIBC_TUNABLES")
        else:
            env["GLIBC_TUNABLES"] = theirs


def main(argv=None) -> int:
    """Entry point of the `heapcast` command."""
    command = argv is None   # the command itself, not a call from Python code
    argv = sys.argv[1:] if argv is None else list(argv)
    if command:
        _tune_malloc(_verb(argv))
    parser = build_parser(_verb(argv))
    a, unknown = parser.parse_known_args(argv)
    if unknown:   # with the subcommand's usage, not only `heapcast [-h] COMMAND ...`
        parser.subcommands[a.verb].error(f"unrecognized arguments: {' '.join(unknown)}")
    a.own_process = command
    if a.verb == "record" and a.command and a.command[0] == "--":
        a.command = a.command[1:]
    try:
        code = a.func(a)
        if command and a.verb in ("record", "finalize"):
            _exit_now(code)
        return code
    except BrokenPipeError:  # `heapcast stats ... | head`
        sys.stderr.close()
        return 0
    except (TraceError, UsageError, ValueError, OSError, PlotError, NativeError) as e:   # ReportError too
        print(f"heapcast {a.verb}: error: {_message(e)}", file=sys.stderr)
        return 2


def _message(e: Exception) -> str:
    """An error as the user reads it: a system error as "FILE: what went wrong" (not Python's
    "[Errno 2] No such file or directory: 'FILE'")."""
    if isinstance(e, OSError) and e.strerror and e.filename is not None:
        where = f"{e.filename} -> {e.filename2}" if e.filename2 is not None else f"{e.filename}"
        return f"{where}: {e.strerror}"
    return str(e)


def _exit_now(code: int) -> None:
    """Ends `heapcast record` or `finalize` once its trace is complete (every file written,
    closed and renamed; every thread joined), without the interpreter's teardown of numpy and
    the conversion's modules: 15-30 ms of a user's wait for nothing."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code & 0xFF if code >= 0 else 1)


if __name__ == "__main__":
    sys.exit(main())
