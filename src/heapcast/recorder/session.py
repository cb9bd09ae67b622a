"""`heapcast record`: run a program under the native recorder, sample its RSS, convert the trace.

The program runs with the recorder preloaded; while it runs, this process samples the resident set
of every traced process from /proc every `rss_interval_ms`, a native thread recycles the
recorder's full chunks (heapcast.recorder.drain), and a converter thread turns the chunks that no longer
change into .hct blocks (heapcast.recorder.live). When the program has ended (however it ended),
`finalize` converts the rest of the raw files (or all of them, when the conversion while the
program ran did not complete a check) and removes them, so a trace cut by SIGKILL still yields
everything that was written.
"""
from __future__ import annotations

import errno
import functools
import gc
import mmap
import os
import select
import shlex
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

from .drain import ENV as DRAIN_ENV, Drainer
from ..trace.base import RAW_HEADER_SIZE as HEADER_SIZE, RAW_MAGIC, SESSION_FILE, TRACE_SUFFIX

# numpy and the trace writer are imported by the converter's thread while the program starts,
# not before it runs: a recording starts sooner (docs/architecture.md, "Fast start").
PAGE = os.sysconf("SC_PAGE_SIZE")


def recorder_library() -> Path:
    """Path of the preload library built by `pip install`."""
    lib = Path(__file__).parent.with_name("libheapcast_recorder.so")
    if not lib.exists():
        raise FileNotFoundError(f"{lib} is missing: reinstall heapcast (`pip install .`) so that "
                                "the native recorder is built")
    return lib


class RecordResult:
    """How a recording went: the program's exit code and what the trace holds. (A plain class:
    `dataclasses`, with the `inspect` it imports, took 8 ms of `record`'s start, before the
    program runs.)"""

    def __init__(self, exit_code: int, path: Path, command: list):
        self.exit_code, self.path, self.command = exit_code, path, command
        self.events = self.processes = self.threads = 0
        self.lost_events = 0
        self.live_events = 0      # events converted while the program ran (heapcast.recorder.live)
        self.truncated = False
        self.trace_bytes = 0
        self.wall_s = 0.0         # the program's run (until its last traced process ended)
        self.ended_at = None      # time.monotonic() then: finalize measures what came after
        self.after_exit_s = None  # from then until the trace was complete (session.json)
        self.problems: list = []
        self.traced = True        # False: the trace directory could not be used, nothing recorded
        # processes the program started that ran untraced (without --follow-children, children
        # that exec'd another program): {"pid", "ppid", "exe", "argv"} each (_untraced)
        self.untraced: list = []
        self.notes: list = []     # what the trace leaves out by design, said at the end
        self.hints: list = []     # how to record faster here, said at the end (clock_hint)

    def __repr__(self) -> str:
        return f"RecordResult({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"

    @property
    def bytes_per_event(self) -> float:
        return self.trace_bytes / self.events if self.events else 0.0

    def summary(self) -> str:
        """The one-line summary `heapcast record` prints at the end."""
        if not self.traced:   # not the summary of a trace: `path` may hold an older one
            return "\n".join(f"heapcast: warning: nothing recorded: {p}" for p in self.problems)
        s = (f"heapcast: {self.events:,} events, {self.processes} process"
             f"{'es' if self.processes != 1 else ''}, {self.threads} thread"
             f"{'s' if self.threads != 1 else ''} -> {self.path} "
             f"({self.bytes_per_event:.2f} bytes/event, {self.lost_events:,} lost")
        s += ", TRUNCATED)" if self.truncated else ")"
        for n in self.notes:
            s += f"\nheapcast: note: {n}"
        for h in self.hints:
            s += f"\nheapcast: hint: {h}"
        for p in self.problems:
            s += f"\nheapcast: warning: {p}"
        return s


#: The most events that may share one clock reading (recorder.c, CLOCK_EVERY_MAX).
CLOCK_EVERY_MAX = 1024
#: record suggests --clock-every where a clock reading takes at least CLOCK_HINT_NS and the
#: program's readings (one an event) about CLOCK_HINT_SHARE of its run or more, in a recording
#: of CLOCK_HINT_EVENTS events or more: 20 ns a reading on the Xeon VM of stop 48, 40% of ring.c's
#: run under record, against 1-3 ns on the earlier EPYC VMs.
CLOCK_HINT_NS, CLOCK_HINT_SHARE, CLOCK_HINT_EVENTS = 10.0, 0.2, 1_000_000
#: The trace directory's log of the processes that ran untraced (recorder.c, note_untraced).
UNTRACED_LOG = "untraced.log"
#: Of those, session.json names at most this many (a shell loop may start thousands).
UNTRACED_KEPT = 100


def _listed(names) -> str:
    names = list(dict.fromkeys(names))
    return ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")


def untraced_note(untraced: list) -> str:
    """The note `heapcast record` prints about the processes that ran untraced."""
    n = len(untraced)
    return (f"{n:,} process{'es' if n != 1 else ''} that the program started ran untraced "
            f"({_listed(os.path.basename(u['exe']) or '?' for u in untraced)}): children that "
            "exec another program are recorded with --follow-children")


#: PYTHONMALLOC values under which CPython's objects are malloc calls.
MALLOC_PYTHONMALLOC = ("malloc", "malloc_debug")


def pymalloc_note(procs: list) -> str | None:
    """The note on the Python processes (Process) that ran on pymalloc unrecorded (their
    PYTHONMALLOC, from their raw files, not malloc): None if there are none. A process is taken
    for CPython when it recorded Python frames or its executable is named python*."""
    python = [p for p in procs if p.pymalloc_seq < 0 and p.python_malloc is not None and
              p.python_malloc not in MALLOC_PYTHONMALLOC and
              (p.python_frames or os.path.basename(p.exe or "").startswith("python"))]
    if not python:
        return None
    names = _listed(f"{os.path.basename(p.exe or '') or '?'} (pid {p.pid})" for p in python)
    return (f"{names} ran on pymalloc: CPython's objects of up to 512 bytes are not malloc "
            "calls, and are not in the trace (`record --pymalloc`, or PYTHONMALLOC=malloc in "
            "the environment, records them)")


def _untraced(path: Path) -> list:
    """The processes of the trace directory's untraced.log, which it removes (its content goes
    into session.json); lines cut short or not of the recorder's form are passed over."""
    from ..trace.mods import hex_text
    log, taken = path / UNTRACED_LOG, path / (UNTRACED_LOG + ".taken")
    try:   # (renamed first: a line appended meanwhile goes to a new log, not lost between)
        os.replace(log, taken)
        text = taken.read_bytes()
        taken.unlink()
    except OSError:
        return []
    out = []
    for line in text.split(b"\n"):
        f = line.split(b" ")
        if len(f) != 5 or f[0] != b"U":
            continue
        try:
            argv = hex_text(f[4].decode())   # (NUL-terminated, unless cut short)
            out.append({"pid": int(f[1], 16), "ppid": int(f[2], 16),
                        "exe": hex_text(f[3].decode()),
                        "argv": argv.split("\0")[:-1] if argv.endswith("\0") else
                        argv.split("\0")})
        except ValueError:
            continue
    return out


def default_output(cmd: list) -> Path:
    """A new name in the current directory: heapcast-<program>-<n>."""
    base = f"heapcast-{Path(cmd[0]).name}" if cmd else "heapcast"
    n = 1
    while Path(f"{base}-{n}").exists():
        n += 1
    return Path(f"{base}-{n}")


class _RssSampler:
    """Reads /proc/<pid>/statm of every traced process, with the seq counter of its raw file."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.files: dict[str, tuple] = {}      # raw file name -> (pid, mmap of its header)
        self.samples: dict[str, list] = {}

    def _discover(self) -> None:
        for entry in os.scandir(self.directory):
            if not entry.name.endswith(".raw") or entry.name in self.files:
                continue
            try:
                with open(entry.path, "rb") as f:
                    m = mmap.mmap(f.fileno(), HEADER_SIZE, access=mmap.ACCESS_READ)
            except (OSError, ValueError):
                continue  # being created: next tick
            if m[:8] != RAW_MAGIC:
                m.close()
                continue
            pid = struct.unpack_from("<i", m, 24)[0]
            self.files[entry.name] = (pid, m)
            self.samples[entry.name] = []

    def sample(self) -> None:
        self._discover()
        newest = {}
        for name, (pid, m) in self.files.items():  # the newest image of a pid is the live one
            if pid not in newest or _image(name) > _image(newest[pid]):
                newest[pid] = name
        for pid, name in newest.items():
            try:
                with open(f"/proc/{pid}/statm", "rb") as f:
                    resident = int(f.read().split()[1]) * PAGE
            except (OSError, ValueError, IndexError):
                continue
            if resident == 0:  # an exited (zombie) process reads 0: not a sample
                continue
            seq = struct.unpack_from("<Q", self.files[name][1], 128)[0]
            self.samples[name].append((time.monotonic_ns(), seq, resident))

    def close(self) -> None:
        for _, m in self.files.values():
            m.close()

    def rss(self, raw_name: str):
        import numpy as np
        from ..trace.format import RSS_DTYPE
        return np.array(self.samples.get(raw_name, []), dtype=RSS_DTYPE)


def _image(raw_name: str) -> int:
    """n of "<pid>.<n>.raw" (0 for "<pid>.raw")."""
    parts = raw_name.split(".")
    return int(parts[1]) if len(parts) == 3 else 0


def _prepare_directory(path: Path) -> str | None:
    """Creates the trace directory; returns a problem description if it cannot be written."""
    try:
        if path.exists():
            if not path.is_dir():
                return f"{path} exists and is not a directory"
            if any(path.iterdir()):
                return f"{path} already exists and is not empty: refusing to mix traces"
        else:
            path.mkdir(mode=0o700, parents=False)
        probe = path / ".heapcast-probe"
        probe.touch(mode=0o600)
        probe.unlink()
    except OSError as e:
        return f"cannot write the trace directory {path}: {e.strerror}"
    return None


def record(cmd, output=None, stacks: int = 0, rss_interval_ms: float = 10, follow_children: bool = False,
           mmap: bool = False, unwind: str = "fp", progress: bool | None = None,
           env: dict | None = None, python: bool = True, policy=None,
           policy_every: int = 1, log_features: bool = False, live: bool = True,
           pymalloc: bool = False, clock_every: int = 1) -> RecordResult:
    """Runs `cmd` with the recorder preloaded and returns how it went (see RecordResult).

    The trace is written at exactly `output` (a directory; default: a new name in the current
    directory). The program's exit status is returned as a shell reports it (128+N for signal N).
    If the trace cannot be written, the program still runs, untouched, and the result says why.
    `env`: extra environment variables for the program. `python`: in CPython 3.11-3.13 programs, a
    thread running Python code records its Python frames (file, function, line) as call sites
    and, with `stacks`, among its native frames; False records native call sites only.
    `pymalloc`: in CPython 3.11-3.13 programs, record pymalloc's own allocations (objects and
    PyMem_Malloc requests of up to 512 bytes, which never reach malloc) as well, from the first
    Python code run on (Process.pymalloc_seq).
    `clock_every`: 1 (default) gives every event its own clock reading; N (2-1024) has one
    event in N of a thread read the clock, and the first after each 100 us tick of `record`,
    the others taking their thread's latest reading (Process.clock_every): reading the clock is
    up to half of what recording an event costs the program on machines where rdtsc is slow.
    `policy`: a compiled POLICY that the recorder runs online on the program's events,
    predicting every `policy_every`-th one and logging its predictions in the trace
    (heapcast.policy.online); a broken or unusable POLICY raises RecordError before the program
    starts. `log_features`: also log what each decision read (development mode).
    `live=False` converts the whole trace
    after the program has ended instead of while it runs (the same trace, later).
    """
    cmd = [str(c) for c in cmd]
    if not cmd:
        raise ValueError("no command to record")
    if unwind not in ("fp", "dwarf"):
        raise ValueError(f"unwind must be 'fp' or 'dwarf', not {unwind!r}")
    if not 0 <= stacks <= 64:
        raise ValueError(f"stacks must be between 0 and 64 frames, not {stacks}")
    if not 1 <= clock_every <= CLOCK_EVERY_MAX:
        raise ValueError(f"clock_every must be between 1 and {CLOCK_EVERY_MAX} events, "
                         f"not {clock_every}")
    if not rss_interval_ms >= 1:
        raise ValueError(f"rss_interval_ms must be at least 1 (ms), not {rss_interval_ms}")
    if policy is not None:
        _check_policy(policy, policy_every)
    elif log_features:
        raise ValueError("log_features needs a policy (--log-features with --policy POLICY)")
    path = Path(output) if output is not None else default_output(cmd)
    existed = path.exists()
    problem = _prepare_directory(path)
    env = {**os.environ, **(env or {})}
    if problem is None:
        lib = str(recorder_library())
        env["LD_PRELOAD"] = lib + (":" + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
        env.update(HEAPCAST_DIR=str(path.resolve()), HEAPCAST_STACKS=str(stacks),
                   HEAPCAST_UNWIND=unwind, HEAPCAST_MMAP="1" if mmap else "0",
                   HEAPCAST_FOLLOW="1" if follow_children else "0",
                   HEAPCAST_PYTHON="1" if python else "0",
                   HEAPCAST_PYMALLOC="1" if pymalloc else "0",
                   HEAPCAST_CLOCK_EVERY=str(clock_every))
        if policy is not None:
            env.update(HEAPCAST_POLICY=str(Path(policy).resolve()),
                       HEAPCAST_POLICY_EVERY=str(policy_every),
                       HEAPCAST_POLICY_FEATURES="1" if log_features else "0")
    drainer = converter = None
    if problem is None:
        converter = _Converter(path, live)   # imports numpy and the codec meanwhile
        try:
            drainer = Drainer(path).start()
            env.update(DRAIN_ENV)
        except OSError:
            pass   # the recorder then takes fresh file space for every chunk
    start = time.monotonic()
    try:
        exit_code, sampler, cut = run_program(cmd, env, path if problem is None else None,
                                              rss_interval_ms,
                                              (lambda s, pid: converter.begin(drainer, s, pid))
                                              if converter is not None else None)
        ended = time.monotonic()
    except RecordError:
        if problem is None and not existed:
            import shutil
            shutil.rmtree(path, ignore_errors=True)  # nothing ran: leave no empty trace behind
        raise
    finally:
        if drainer is not None:   # the program has ended: nothing will reuse a chunk
            drainer.pause()
        if converter is not None:
            converter.stop()
        if drainer is not None:
            drainer.stop()
    result = RecordResult(exit_code, path, cmd)
    result.wall_s, result.ended_at = ended - start, ended
    if problem is not None:
        result.truncated, result.traced = True, False
        result.problems.append(problem + "; the program ran untraced")
    else:
        if converter is not None:
            result.problems.extend(converter.problems)
            result.truncated |= converter.truncated
        if clock_every > 1 and drainer is None:
            result.problems.append(f"--clock-every {clock_every}: the chunk drainer, whose tick "
                                   "bounds how old a clock reading may be, could not start: "
                                   "every event read the clock")
        finalize(path, result, sampler, progress=progress,
                 live=converter.processes() if converter is not None else None,
                 pymalloc=pymalloc, early=converter.early if converter is not None else None,
                 cut=cut)
        if clock_every == 1 and drainer is not None:
            result.hints.extend(clock_hint(result))
    return result


def clock_hint(result: RecordResult, read_ns=None) -> list:
    """The hint to try --clock-every when reading the clock took much of the program's run:
    every event reads it once (`read_ns`: what a reading takes, measured here by default)."""
    if result.events < CLOCK_HINT_EVENTS or result.wall_s <= 0:
        return []
    if read_ns is None:
        from .drain import clock_read_ns
        read_ns = clock_read_ns()
    readings = read_ns * 1e-9 * result.events   # (its threads' together: may exceed the run)
    if read_ns < CLOCK_HINT_NS or readings < CLOCK_HINT_SHARE * result.wall_s:
        return []
    return [f"reading the clock takes {read_ns:.0f} ns on this machine: {readings:.2f} s at one "
            f"reading an event, in a program's run of {result.wall_s:.2f} s; --clock-every 16 "
            "reads it once in 16 events of a thread (the times between two readings are then "
            "estimated)"]


class _Converter:
    """Runs heapcast.recorder.live's converter on a thread. The thread starts at once with the
    imports that the conversion needs (numpy, the codec: most of what `record` of a short
    program waits for), while the main thread starts the program, and converts from begin() on;
    with `live` False it only imports, for the conversion after the exit. A process that has
    ended for good (live.LiveProcess.gone) is converted whole there and then: `early` holds
    what finalize would have returned for it (200 short programs of a shell loop left 0.17 s
    of conversion after the exit)."""

    def __init__(self, path: Path, live: bool = True):
        self.path, self.drainer, self.sampler, self.wanted = path, None, None, live
        self.root = None           # the program's pid
        self.stop_event = threading.Event()
        self.go = threading.Event()
        self.live = None
        self.early: list = []      # (.hct name, (Process, events converted while it ran)) of
                                   # the processes converted whole
        self.problems: list = []   # what their conversion noted
        self.truncated = False     # one of them could not be written in the trace directory
        self.thread = threading.Thread(target=self._run, name="heapcast-convert", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import_quietly()
        from .live import LiveConverter
        self.go.wait()
        if self.wanted and not self.stop_event.is_set():
            self.live = LiveConverter(self.path, self.drainer, self.stop_event)
            self.live.on_ended, self.live.root = self._ended, self.root
            self.live.run()

    def _ended(self, raw: Path, lp) -> None:
        """Converts the raw file of a process that has ended. Where it cannot be read or written
        the file stays, for finalize to convert and report."""
        problems: list = []
        try:
            scanned = _scan_raw(raw, lp, problems)
            got = _finish_raw(*scanned, self.sampler, _NoBar(), problems) if scanned else None
        except Exception:   # never disturb the recording: finalize converts it after the exit
            return
        if got is not None:   # all of its events were converted while the program ran
            self.early.append((raw.with_suffix(TRACE_SUFFIX).name, (got[0], got[0].event_count)))
            self.problems.extend(problems)
        elif not raw.exists():   # (a full disk: the trace was left elsewhere, the message says
            self.problems.extend(problems)   # where) finalize will not meet this file again
            self.truncated = True

    def begin(self, drainer, sampler, root: int) -> None:
        """The program (pid `root`) runs: convert what the recorder writes (through `drainer`'s
        copies; `sampler`: the RSS samples of the processes converted whole). The program's own
        raw files are left to finalize: it is reaped only once it has exited, when finalize
        comes anyway."""
        self.drainer, self.sampler, self.root = drainer, sampler, root
        self.go.set()

    def stop(self) -> None:
        """Stops after the window being converted; the rest is left to finalize."""
        self.stop_event.set()
        self.go.set()
        self.thread.join()

    def processes(self) -> dict | None:
        """The LiveProcess of each raw file the converter read (by path); None with `live`
        False."""
        if not self.wanted:
            return None
        return self.live.processes if self.live is not None else {}


#: numpy's settings for the conversion, unless the user chose them: no OpenBLAS threads, and no
#: transparent huge pages for its arrays of 4 MiB or more (the conversion's temporaries are
#: freed and made again every block, and a fresh huge page cost 5x a small one's zeroing here).
QUIET_NUMPY = {"OPENBLAS_NUM_THREADS": "1", "NUMPY_MADVISE_HUGEPAGE": "0"}


#: Whether this process is the `heapcast` command's own (set by heapcast.cli): only then may
#: import_quietly change os.environ for a moment, as no thread of a user's program can be
#: reading it meanwhile.
OWN_PROCESS = False


def import_quietly() -> None:
    """Imports numpy and the converter with QUIET_NUMPY's settings, unless the user chose them.
    numpy's OpenBLAS starts a thread per CPU at load, and they spin for about 0.1 s of CPU time
    each: taken from the program on a small machine, for linear algebra that the conversion
    never does, so it loads with one thread (none extra); and numpy's arrays go without
    transparent huge pages. os.environ is restored at once (the program's environment was
    copied before). In a user's process (heapcast.record called from Python, OWN_PROCESS False)
    numpy loads with the environment as it is: another thread could read it meanwhile."""
    import sys
    if "numpy" not in sys.modules and OWN_PROCESS:
        chosen = {k: v for k, v in QUIET_NUMPY.items() if k not in os.environ}
        os.environ.update(chosen)
        try:
            import numpy  # noqa: F401  (OpenBLAS and numpy read the variables once, at load)
        finally:
            for k in chosen:
                os.environ.pop(k, None)
    from . import live  # noqa: F401


def run_program(cmd, env, trace_dir, rss_interval_ms, started=None) -> tuple:
    """Runs the program, sampling RSS meanwhile, then waits for the traced processes it left
    running (_wait_for_the_rest); returns its exit status as a shell reports it, the RSS sampler
    (None when untraced) and the raw file names of the processes still running when the waiting
    was stopped. `started(sampler, pid)` is called once the program runs. `heapcast run` runs
    its programs through this too (trace_dir None: no sampler, nothing waited for)."""
    # ^C (and ^\) from the terminal reach the program, which decides; we finalize after it. They
    # are caught here by a handler that does nothing, not ignored: exec resets a caught signal
    # to its default in the program, so no code has to run in the child between fork and exec
    # (which lets subprocess use vfork, and is safe while our other threads hold locks). One
    # ignored when we started stays ignored, in the program too, as it would be untraced.
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGQUIT)}
    for s, handler in old.items():
        if handler != signal.SIG_IGN:
            signal.signal(s, _pass_on)
    sampler = _RssSampler(trace_dir) if trace_dir is not None else None
    reaper = _Subreaper() if trace_dir is not None else None
    try:
        try:
            try:
                proc = subprocess.Popen(cmd, env=env, restore_signals=True)
            except OSError as e:
                raise RecordError(f"cannot run {shlex.join(cmd)}: {e.strerror}",
                                  exit_code=127) from None
            old_term = signal.signal(signal.SIGTERM, lambda s, f: proc.send_signal(s))
            if started is not None:
                started(sampler, proc.pid)
            interval = rss_interval_ms / 1000.0
            try:
                rc = _wait_sampling(proc, sampler, interval)
            finally:
                signal.signal(signal.SIGTERM, old_term)
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)
        cut = _wait_for_the_rest(trace_dir, sampler, interval, reaper) \
            if trace_dir is not None else set()
    finally:
        if reaper is not None:
            reaper.close()
    if sampler is not None:
        sampler.close()
    return (128 - rc if rc < 0 else rc), sampler, cut


def _wait_sampling(proc, sampler, interval: float) -> int:
    """Waits for the program to exit, sampling RSS every `interval` seconds; its return code.
    Its exit is seen at once through a pidfd (Linux 5.3): Popen.wait(timeout) polls with sleeps
    that double up to the interval, and saw an exit 1.5-6 ms late."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):   # an older kernel (or Python): Popen's polling
        pidfd = None
    try:
        if pidfd is not None:
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
        while True:
            if sampler is not None:
                sampler.sample()
            if pidfd is not None:
                if poller.poll(max(1, round(interval * 1000))):
                    return proc.wait()
                continue
            try:
                return proc.wait(timeout=interval)
            except subprocess.TimeoutExpired:
                continue
    finally:
        if pidfd is not None:
            os.close(pidfd)


class _Subreaper:
    """Makes this process the child subreaper of the programs it starts while it records
    (prctl PR_SET_CHILD_SUBREAPER), as it was before once closed. A process the program forked
    just before it ended may not have run yet when `record` sees the end, and so has no raw file
    of its own to be found by (its fork handler opens it): orphaned, it becomes a child of this
    process, where _still_recording finds it mapping its parent's raw file. Those found and
    gone are reaped here (others, which this process never waited for, are left alone)."""

    PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37

    def __init__(self):
        self.before = None
        self.adopted: set = set()   # pids _still_recording found through this
        try:
            import ctypes
            self.prctl = ctypes.CDLL(None, use_errno=True).prctl
            was = ctypes.c_int(0)
            if self.prctl(self.PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0) == 0 and \
                    self.prctl(self.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0:
                self.before = was.value
        except (OSError, AttributeError):   # not Linux (or no libc to ask): as before
            pass

    def close(self) -> None:
        """Reaps the adopted processes that ended; gives the process its setting back."""
        for pid in self.adopted:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        self.adopted.clear()
        if self.before is not None:
            self.prctl(self.PR_SET_CHILD_SUBREAPER, self.before, 0, 0, 0)
            self.before = None


def _children() -> set:
    """The pids of this process's children (its own and the orphans it adopted as subreaper)."""
    out = set()
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/children") as f:
                out.update(int(p) for p in f.read().split())
    except (OSError, ValueError):
        pass
    return out


def _still_recording(trace_dir: Path, adopted: set | None = None) -> dict:
    """pid -> raw file name of the traced processes that still record: a process maps its raw
    file's header until it exits or execs. Also a child of this process (an orphan adopted as
    subreaper: _Subreaper) that still maps another's raw file: forked, it has not run its fork
    handler, which opens its own, yet (named after the file it will open; its pid added to
    `adopted`)."""
    running = {}
    raw_dir = os.fsencode(os.path.realpath(trace_dir)) + b"/"
    for entry in os.scandir(trace_dir):
        name = entry.name
        if not name.endswith(".raw") or not name.split(".", 1)[0].isdigit():
            continue
        pid = int(name.split(".", 1)[0])
        try:
            with open(f"/proc/{pid}/maps", "rb") as f:
                maps = f.read()
        except OSError:
            continue   # gone
        if b" " + os.fsencode(os.path.realpath(entry.path)) + b"\n" in maps:
            running[pid] = name
    for pid in _children() - set(running):
        try:
            with open(f"/proc/{pid}/maps", "rb") as f:
                maps = f.read()
        except OSError:
            continue
        if any(line.endswith(b".raw") and b" " + raw_dir in line for line in maps.splitlines()):
            running[pid] = f"{pid}.raw"
            if adopted is not None:
                adopted.add(pid)
    return running


def _wait_for_the_rest(trace_dir: Path, sampler, interval: float, reaper=None) -> set:
    """Waits while traced processes that the program started still run after it ended (a
    daemon's forked child; with --follow-children, a program started in the background): their
    events would be lost without a word. ^C (or SIGTERM) stops waiting; returns the raw file
    names of those still running then, whose traces end there."""
    adopted = reaper.adopted if reaper is not None else None
    running = _still_recording(trace_dir, adopted)
    if not running:
        return set()
    stop = []   # (the handlers first: a ^C right after the message stops the waiting)
    old = {s: signal.signal(s, lambda signum, frame: stop.append(signum))
           for s in (signal.SIGINT, signal.SIGTERM)}
    n = len(running)
    one = n == 1
    try:
        print(f"heapcast: the program has ended, but {n} traced process{'' if one else 'es'} it "
              f"started still run{'s' if one else ''} (pid {', '.join(map(str, sorted(running)))}"
              f"): waiting for {'it' if one else 'them'} to end (^C: stop waiting; "
              f"{'its trace' if one else 'their traces'} then end{'s' if one else ''} there)",
              file=sys.stderr, flush=True)
        while running and not stop:
            sampler.sample()
            time.sleep(interval)
            running = _still_recording(trace_dir, adopted)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    return set(running.values())


def _pass_on(signum, frame) -> None:
    """SIGINT and SIGQUIT while the program runs: the program got them too (same terminal)."""


def _check_policy(policy, every: int) -> None:
    """Opens `policy` through the native runtime, as the recorder will: RecordError if it cannot
    run online (damaged, mismatched, or of a task the recorder cannot feed)."""
    from ..policy.fileformat import PolicyError
    from ..policy.native import Policy
    if every < 1:
        raise RecordError(f"--policy-every {every}: expected a positive number of events")
    try:
        with Policy(policy) as p:
            if p.task == "free":
                raise RecordError(f"{policy}: a policy of the 'free' task cannot run online (the "
                                  f"recorder does not rank live blocks); use a next or lifetime "
                                  f"policy")
    except (PolicyError, OSError) as e:
        raise RecordError(f"--policy: {e}") from None


class RecordError(Exception):
    """The program was not started: an option that cannot work (`heapcast record` exits 2), or
    a command that cannot run (127, as a shell)."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


def _convert(raw: Path, rp, sampler, bar, live=None, problems: list | None = None):
    """Writes one raw file's .hct and removes the raw files; returns its Process and how many of
    its events were taken as converted while the program ran.

    `live`: the file's LiveProcess, whose converted part is checked and completed (rp was scanned
    without the copies it converted); when the check fails, the conversion goes on from the
    converter's last checkpoint, or, without one, the whole file is converted again. Without
    `live`, a checkpoint left by a `heapcast record` that was killed is gone on from likewise
    (heapcast.recorder.checkpoint: the copies below it are no longer in the raw file).
    On a full disk the .hct is written to the temporary directory first, then moved into place
    once the raw file (which holds the space) is gone."""
    from . import checkpoint
    from . import live as live_windows   # the same windows as the conversion while running
    from ..trace.raw import LocationAssigner, RawProcess
    from ..trace.writer import ProcessFileWriter
    problems = problems if problems is not None else []
    kept = 0
    proc = rp.process()
    if sampler is not None:
        proc.rss = sampler.rss(raw.name)
    out = raw.with_suffix(TRACE_SUFFIX)
    tmp = out.with_name(out.name + ".tmp")
    # (with `live`, its own log says whether there is one: loaded only where it is gone on from)
    ck = checkpoint.load(out) if live is None else None
    if ck is not None and out.exists() and not tmp.exists():
        # a conversion that ended but was killed before it removed the raw file
        rp.close()
        _remove_raw(raw, out)
        return _finished_process(out, proc), ck.emitted

    def write(target, rp, writer=None, assigner=None, start=None):
        assigner = assigner or LocationAssigner()
        assigner.add_definitions(rp.locs)
        writer = writer or ProcessFileWriter(target)
        try:
            for block in rp.iter_events(live_windows.WINDOW, start=start, assigner=assigner):
                bar.update(len(block["seq"]))
                writer.add(block)
                del block   # (encoded: its memory is free for the next window)
            # (the table's rows as they were built: pydoc -k's are 350 MB, never joined)
            offsets, flats = assigner.table_parts()
            rp.canonical_python_ids(flats)
            writer.finish(proc, (offsets, flats))
        except BaseException:
            # a checkpoint needs the part it points into
            writer.abort(remove=ck is None and (live is None or live.log.last is None))
            raise

    def resume(target, rp):
        """Goes on from the checkpoint, or converts the whole file where its part is missing."""
        nonlocal ck, kept
        try:
            writer = ProcessFileWriter(target, resume=ck.resume())
        except (OSError, ValueError) as e:
            checkpoint.remove(out)
            lost, ck = ck, None
            problems.append(f"{raw.name}: the part converted while the program ran is lost ({e}); "
                            f"its events below seq {lost.next_lo} are missing")
            proc.truncated = True
            write(target, rp)
            return
        write(target, rp, writer, ck.assigner(), ck.next_lo)
        kept = ck.emitted

    try:
        try:
            if live is not None and live.check(rp, live.skipped):
                live.checked = True
                kept = live.emitted
                writer, live.writer = live.writer, None
                if writer is not None:
                    writer.full_priority()
                write(out, rp, writer, live.assigner, live.next_lo)
            else:
                if live is not None:   # converted wrongly (a guess failed) or not at all
                    live.close()
                    if live.skipped or live.known_chunks():   # scanned without: scan all
                        rp.close()
                        rp = RawProcess(raw)
                    ck = checkpoint.load(out)
                if ck is not None:
                    resume(out, rp)
                else:
                    write(out, rp)
            staged = None
        finally:
            if live is not None:
                live.close()
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise
        if ck is None and live is not None:
            ck = checkpoint.load(out)
        import tempfile
        staged = Path(tempfile.mkdtemp(prefix="heapcast-")) / out.name
        kept = 0
        # the converted part moves along (the raw file lacks it); resume truncates the copy
        if ck is not None and tmp.exists():
            _copy_private(tmp, staged.with_name(staged.name + ".tmp"))
        tmp.unlink(missing_ok=True)
        bar.reset()
        rp.close()
        rp = RawProcess(raw)
        if ck is not None:
            resume(staged, rp)
        else:
            write(staged, rp)
    rp.close()  # the raw file's mapping holds its disk space until it is closed
    if staged is not None:
        raw.unlink()   # (first: it holds the space the trace needs)
        raw.with_suffix(".mods").unlink(missing_ok=True)
        try:
            _copy_private(staged, tmp)
            os.replace(tmp, out)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise OSError(e.errno, f"{e.strerror}; the converted trace is kept at {staged}") from e
        staged.unlink()
        staged.parent.rmdir()
    _remove_raw(raw, out)
    return proc, kept


def _remove_raw(raw: Path, out: Path) -> None:
    """Removes a converted raw file, its .mods, then the checkpoint log (last: while the raw file
    is there, the log says that its converted part is in the .hct)."""
    from . import checkpoint
    from .discard import unlink_in_background
    unlink_in_background(raw)
    raw.with_suffix(".mods").unlink(missing_ok=True)
    checkpoint.remove(out)


def _finished_process(out: Path, proc):
    """The Process of a finished .hct, with what the raw file said (`proc`) for the rest."""
    from ..trace.reader import read_process
    done = read_process(out)
    proc.event_count, proc.locations = done.event_count, done.locations
    proc.end_ns = done.end_ns
    return proc


def _copy_private(src: Path, dst: Path) -> None:
    """Copies src into a new file dst readable by its owner only."""
    import shutil
    from ..trace.writer import open_private
    with open(src, "rb") as f, open_private(dst) as g:
        shutil.copyfileobj(f, g)


class _NoBar:
    """The progress bar when none is shown (tqdm takes longer to import than a small trace takes
    to convert)."""

    def update(self, n: int = 1) -> None:
        pass

    reset = close = update


def _progress_bar(total: int, progress: bool | None):
    """A tqdm bar over `total` slots when asked for, or by default for a large trace on a terminal."""
    if progress is False or (progress is None and (total < 2_000_000 or not os.isatty(2))):
        return _NoBar()
    from tqdm import tqdm
    return tqdm(total=total, unit="slot", desc="heapcast: writing trace", leave=False)


def _scan_raw(raw: Path, lp, problems: list):
    """Scans one raw file for its conversion: (raw, RawProcess, its LiveProcess or None), or
    None when it cannot be read (the problem noted). A LiveProcess that converted nothing still
    saves the scan the chunks it read."""
    from ..trace.raw import RawProcess
    mods = lp.mods if lp is not None else None   # (parsed while the program ran)
    if lp is not None and (lp.failed or lp.clock is None):
        lp.close()
        lp = None
    try:
        if lp is not None:
            lp.skipped = lp.done_chunks()
        rp = RawProcess(raw, skip=lp.skipped if lp is not None else frozenset(),
                        known=lp.known_chunks() if lp is not None else None, mods=mods)
    except Exception as e:  # a raw file we cannot read must not hide the others
        if lp is not None:
            lp.close()
        problems.append(f"{raw.name}: {e}")
        return None
    return raw, rp, lp


def _finish_raw(raw: Path, rp, lp, sampler, bar, problems: list):
    """Writes the .hct of a scanned raw file and removes the raw file: (its Process, the events
    taken as converted while the program ran), or None when it could not be written (the
    problem noted, the raw files kept)."""
    try:
        proc, kept = _convert(raw, rp, sampler, bar, lp, problems)
    except OSError as e:
        problems.append(f"could not write the trace of {raw.name}: {e.strerror}; its raw files "
                        f"are kept: free space, then `heapcast finalize {raw.parent}`")
        return None
    finally:
        rp.close()
    if lp is not None and not lp.checked and lp.emitted:
        again = "from its last checkpoint" if kept else "after its exit"
        problems.append(f"{raw.name}: the conversion while the program ran missed events; "
                        f"converted again {again}")
    return proc, kept


def _gc_paused(f):
    """Runs f with Python's cyclic garbage collector paused (as it was again after): the
    conversion's objects are not cyclic, but the thousands that a Python program's locations
    take (its frames, their location tuples, the JSON of its .hct) set off collections that
    walked every object of the process: 8 ms of py_dicts' 45 ms of finalize after its exit."""
    @functools.wraps(f)
    def paused(*args, **kwargs):
        was = gc.isenabled()
        gc.disable()
        try:
            return f(*args, **kwargs)
        finally:
            if was:
                gc.enable()
    return paused


@_gc_paused
def finalize(path, result: RecordResult | None = None, sampler: _RssSampler | None = None,
             progress: bool | None = None, live: dict | None = None,
             pymalloc: bool = False, early: list | None = None,
             cut: set | frozenset = frozenset()) -> RecordResult:
    """Converts the raw files of a trace directory into .hct files and writes session.json.

    `heapcast record` calls it when the program has ended, with what its converter did while the
    program ran (`live`: LiveProcess by raw file; `early`: the processes it converted whole once
    they had ended, see _Converter; a .hct of neither is counted as it is); run it by hand
    (`heapcast finalize`) on a directory whose recording session was itself interrupted: the
    raw files hold every event that the converter's checkpoints (`*.hct.ckpt`) do not, and the
    conversion goes on from the last checkpoint's part of `*.hct.tmp` (what an interrupted
    conversion left beyond it, or without a checkpoint all of it, is replaced). `pymalloc`: the
    recording asked for pymalloc's allocations (record --pymalloc); a warning when no process
    wrapped them. `cut`: the raw files of processes still running when the recording stopped
    (marked truncated, with a warning); by hand, those that a live process still writes.
    """
    from ..trace.format import TraceError
    from ..trace.raw import FLAG_TRUNCATED, raw_files
    from ..trace.reader import read_process
    from ..trace.writer import release_workers, write_session

    path = Path(path)
    by_hand = result is None
    if by_hand:
        if not path.is_dir():
            raise ValueError(f"{path}: {'not a' if path.exists() else 'no such'} directory "
                             "(expected the trace directory of an interrupted `heapcast record`)")
        result = RecordResult(exit_code=-1, path=path, command=[])
    early = early or []
    raws = raw_files(path)
    if by_hand:   # a process of an interrupted recording may record still: its trace ends here
        cut = set(cut) | set(_still_recording(path).values())
    if not raws and not early and any(path.glob("*" + TRACE_SUFFIX)):
        raise ValueError(f"{path} is already finalized: it holds no raw files to convert")
    if not raws and by_hand:
        raise ValueError(f"{path}: no raw files to convert (expected the trace directory of an "
                         "interrupted `heapcast record`, with its <pid>.raw files)")
    if not raws and not early:
        result.truncated = True
        result.problems.append("no process wrote a trace (is the program statically linked or "
                               "setuid? LD_PRELOAD does not reach those)")
    live = live or {}
    scanned = [got for raw in raws
               if (got := _scan_raw(raw, live.get(raw), result.problems)) is not None]
    bar = _progress_bar(sum(sum(c.n for c in rp.chunks) for _, rp, _ in scanned), progress)
    done = [got for _, got in early]
    for raw, rp, lp in scanned:
        if raw.name in cut:   # still running when the recording stopped (_wait_for_the_rest)
            rp.flags |= FLAG_TRUNCATED
            result.problems.append(f"process {rp.pid} was still running when the recording "
                                   "stopped: its trace ends there")
        got = _finish_raw(raw, rp, lp, sampler, bar, result.problems)
        if got is None:
            result.truncated = True
        else:
            done.append(got)
    bar.close()
    # Processes converted whole while the program ran whose .hct the caller does not know of
    # (`heapcast finalize` after `record` was killed): counted as they are.
    known = {raw.with_suffix(TRACE_SUFFIX).name for raw in raws} | {name for name, _ in early}
    for hct in sorted(path.glob("*" + TRACE_SUFFIX)):
        if hct.name not in known:
            try:
                proc = read_process(hct)
            except (OSError, TraceError) as e:
                result.problems.append(f"{hct.name}: {e}")
                continue
            done.append((proc, proc.event_count))
    pids, threads, wrapped = set(), 0, 0
    for proc, kept in done:
        result.live_events += kept
        result.events += proc.event_count
        result.lost_events += proc.lost_events
        result.truncated |= proc.truncated
        threads += proc.threads
        wrapped += proc.pymalloc_seq >= 0
        pids.add((proc.pid, proc.image))
    claim = path / "root.claim"
    if claim.exists():
        claim.unlink()
    result.untraced += _untraced(path)
    if result.untraced:
        result.notes.append(untraced_note(result.untraced))
    note = pymalloc_note([proc for proc, _ in done])
    if note:
        result.notes.append(note)
    result.processes = len(pids)
    result.threads = threads
    if pymalloc and done and not wrapped:
        result.problems.append("--pymalloc: no process ran CPython 3.11-3.13 (a release build) "
                               "with the GIL held after its start-up: pymalloc was not recorded")
    session = {
        "command": result.command, "exit_code": result.exit_code, "events": result.events,
        "processes": result.processes, "lost_events": result.lost_events,
        "truncated": result.truncated, "problems": result.problems,
        "converted_while_running": result.live_events,
        "notes": result.notes,
        "untraced_processes": len(result.untraced),
        "untraced": result.untraced[:UNTRACED_KEPT],
        "wall_s": round(result.wall_s, 6),
    }
    if result.ended_at is not None:   # what the user waited for after the program's end
        result.after_exit_s = time.monotonic() - result.ended_at
        session["after_exit_s"] = round(result.after_exit_s, 6)
    try:
        write_session(path, session)
    except OSError as e:
        result.problems.append(f"could not write {SESSION_FILE}: {e.strerror}")
    result.trace_bytes = sum(f.stat().st_size for f in path.glob("*" + TRACE_SUFFIX))
    release_workers()   # (every trace file is written)
    return result
