"""The in-memory view of a trace: Trace, Process, locations and module maps.

A Trace is what `heapcast.load(path)` returns and what every stage of heapcast reads. Events of all
processes live in one numpy structured array (format.EVENT_DTYPE), process after process, each in
its exact global order (`seq`). Per-process metadata, locations (call sites and stacks), module maps
and RSS samples hang off `Trace.processes`.
"""
from __future__ import annotations

import bisect
from itertools import chain
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from .format import EVENT_DTYPE, RSS_DTYPE

# A frame value with this bit set is a Python frame: the low 32 bits are a key of
# Process.python_frames (user-space code addresses never have the bit).
PY_FRAME_TAG = 1 << 63


def is_python_frame(frames) -> np.ndarray:
    """Which of `frames` (frame values) are Python frames."""
    return (np.asarray(frames, np.uint64) & np.uint64(PY_FRAME_TAG)) != 0


@dataclass(frozen=True)
class PyFrame:
    """A Python source location: the code's file name (as the interpreter has it), its function's
    qualified name, and the line."""

    file: str
    function: str
    line: int


def frame_rows(stacks: list) -> tuple[np.ndarray, np.ndarray]:
    """Each frame sequence's length and all their frames in order, as uint64 arrays: the rows of a
    LocationTable (from_lengths), which may be built a part at a time."""
    lengths = np.fromiter(map(len, stacks), dtype=np.uint64, count=len(stacks))
    flat = np.fromiter(chain.from_iterable(stacks), dtype=np.uint64, count=int(lengths.sum()))
    return lengths, flat


@dataclass
class LocationTable:
    """Interned locations of one process: id -> frames (innermost first; frames[0] is the call site).

    Id 0 is "unknown" (no frames). Stored flat: frames of id i are flat[offsets[i]:offsets[i+1]].
    """

    offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.uint64))
    flat: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint64))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def frames(self, loc: int) -> np.ndarray:
        """Return addresses of location `loc`, innermost first."""
        return self.flat[int(self.offsets[loc]):int(self.offsets[loc + 1])]

    @property
    def callsites(self) -> np.ndarray:
        """The call site (first frame) of every location id, 0 where unknown."""
        starts = self.offsets[:-1].astype(np.int64)
        has = self.offsets[1:] > self.offsets[:-1]
        out = np.zeros(len(self), dtype=np.uint64)
        out[has] = self.flat[starts[has]]
        return out

    @classmethod
    def from_lists(cls, stacks: list) -> "LocationTable":
        """Builds a table from a list of frame sequences; stacks[0] should be empty (unknown)."""
        return cls.from_lengths(*frame_rows(stacks))

    @classmethod
    def from_lengths(cls, lengths: np.ndarray, flat: np.ndarray) -> "LocationTable":
        """Builds a table from each location's frame count and all their frames in order."""
        offsets = np.zeros(len(lengths) + 1, dtype=np.uint64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(offsets, np.asarray(flat, np.uint64))


@dataclass
class Module:
    """A loaded ELF object: its path, load bias (base) and the address range of its segments."""

    path: str
    base: int
    start: int
    end: int


@dataclass
class ModuleSnapshot:
    """The modules loaded in a process as seen just before event `seq`."""

    seq: int
    modules: list


@dataclass
class Process:
    """One traced process image: who it was, how it ended, and its slice of the events."""

    index: int
    pid: int
    ppid: int = 0
    forked_from: int = 0        # pid of the parent whose heap this process continued (fork), else 0
    fork_seq: int = 0           # the parent's seq at the fork: the child starts with its live blocks
    image: int = 0              # exec count within this pid (file "<pid>.<image>.hct")
    exe: str = ""
    argv: list = field(default_factory=list)
    cwd: str = ""
    start_ns: int = 0           # CLOCK_MONOTONIC
    end_ns: int = 0             # last event or exit, CLOCK_MONOTONIC
    start_unix_ns: int = 0
    clean_exit: bool = False    # the recorder's destructor ran (exit() or return from main)
    peak_rss_bytes: int = 0     # VmHWM at exit (0 if the process did not exit cleanly)
    threads: int = 0
    lost_events: int = 0
    truncated: bool = False
    stack_depth: int = 0
    unwind: str = "fp"
    # 1: every event's time is its own clock reading; N > 1 (`record --clock-every N`): one event
    # in N of a thread read the clock, the others carry their thread's latest reading (which
    # the reader spreads between readings where it can: heapcast.trace.steps)
    clock_every: int = 1
    mmap_recorded: bool = False
    pymalloc_seq: int = -1      # pymalloc's own allocations are recorded from this seq on (-1: not)
    # PYTHONMALLOC as the process had it ("" unset), from its raw files (not kept in the .hct:
    # None when read from one), for `record`'s note on Python processes that ran on pymalloc
    python_malloc: str | None = None
    event_count: int = 0
    pthread_ids: list = field(default_factory=list)  # imported logs: pthread_self of each tid
    locations: LocationTable = field(default_factory=LocationTable)
    modules: list = field(default_factory=list)       # list[ModuleSnapshot], by seq
    python_frames: dict = field(default_factory=dict)  # PY_FRAME_TAG frame id -> PyFrame
    rss: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=RSS_DTYPE))
    source: str = ""            # the .hct file it was read from
    _events: np.ndarray | None = field(default=None, repr=False)
    _blocks: list = field(default_factory=list, repr=False)     # EVENTS sections in the file
    # clock_every > 1: read the times as recorded (steps), not spread between readings
    # (heapcast.trace.steps)
    _clock_steps: bool = field(default=False, repr=False)

    @property
    def events(self) -> np.ndarray:
        """This process's events in seq order (EVENT_DTYPE)."""
        if self._events is None:
            from .reader import read_process_events
            self._events = read_process_events(self)
        return self._events

    @property
    def known_event_count(self) -> int:
        """How many events this process has, without reading them: those loaded, else its
        metadata's count (a Process built in memory may leave event_count 0)."""
        return len(self._events) if self._events is not None else self.event_count

    def modules_at(self, seq: int) -> list:
        """The module map in force at event `seq` (the latest snapshot taken at or before it)."""
        if not self.modules:
            return []
        i = bisect.bisect_right([m.seq for m in self.modules], seq) - 1
        return self.modules[max(i, 0)].modules

    def meta(self) -> dict:
        """Metadata as a plain dict (what the META section stores)."""
        keys = ("pid", "ppid", "forked_from", "fork_seq", "image", "exe", "argv", "cwd", "start_ns",
                "end_ns", "start_unix_ns", "clean_exit", "peak_rss_bytes", "threads", "lost_events",
                "truncated", "stack_depth", "unwind", "clock_every", "mmap_recorded", "pymalloc_seq",
                "event_count", "pthread_ids")
        return {k: getattr(self, k) for k in keys}


@dataclass
class Trace:
    """A recorded (or imported) trace: all its processes and their events.

    `events` concatenates the processes' events in process order (column `proc` is the index into
    `processes`). For traces larger than memory use `chunks()`, which never holds more than one
    block of events.
    """

    path: Path
    processes: list
    session: dict = field(default_factory=dict)

    @property
    def events(self) -> np.ndarray:
        """Every event of every process (EVENT_DTYPE): loads the whole trace into memory."""
        parts = [p.events for p in self.processes]
        if not parts:
            return np.zeros(0, dtype=EVENT_DTYPE)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def chunks(self, size: int = 1 << 20) -> Iterator[np.ndarray]:
        """Yields the events in blocks of at most `size` rows, process by process, in seq order,
        reading the files incrementally (bounded memory)."""
        from .reader import iter_process_blocks
        for p in self.processes:
            for block in iter_process_blocks(p, size):
                yield block

    @property
    def event_count(self) -> int:
        return sum(p.event_count for p in self.processes)

    @property
    def lost_events(self) -> int:
        return sum(p.lost_events for p in self.processes)

    @property
    def truncated(self) -> bool:
        return bool(self.session.get("truncated")) or any(p.truncated for p in self.processes)

    def __repr__(self) -> str:
        return (f"Trace({str(self.path)!r}, processes={len(self.processes)}, "
                f"events={self.event_count})")
