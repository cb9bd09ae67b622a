"""The chunk drainer that runs beside a recorded program (native/recorder/drain.c).

A recorder started with HEAPCAST_DRAIN=1 hands every full 1 MiB chunk to the drainer, which copies
it to the end of the raw file and gives it back, zeroed, for reuse: the program then writes into
page-cache pages that already exist instead of making the kernel create a fresh page per 128
records, which is most of what recording costs it. `heapcast record` runs one for every
recording; without one the recorder simply keeps taking fresh file space.

    with Drainer(trace_dir) as d:
        run the program with HEAPCAST_DRAIN=1
    d.chunks   # chunks recycled
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

from ..trace.base import LoadedOnce, bind

LIBRARY = Path(__file__).resolve().parent.parent / "libheapcast_drain.so"

#: The environment variable (and value) that tells the recorder a drainer is running.
ENV = {"HEAPCAST_DRAIN": "1"}


def load(path: Path = LIBRARY) -> ctypes.CDLL:
    """Loads the drainer library."""
    p, u64s, size = ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t
    return bind(path, {"hc_drain_start": (p, [ctypes.c_char_p, ctypes.c_uint]),
                       "hc_drain_pause": (None, [p]),
                       "hc_drain_keep": (None, [p, ctypes.c_int]),
                       "hc_drain_stop": (None, [p, u64s]),
                       "hc_drain_released": (size, [p, u64s, size]),
                       "hc_drain_copies": (size, [p, u64s, size, u64s]),
                       "hc_clock_read_ns": (ctypes.c_double, [ctypes.c_int])},
                "drainer (hc_drain_start)", use_errno=True)


#: Where the kernel names its clock source: the recorder reads the TSC where it is "tsc".
CLOCKSOURCE = Path("/sys/devices/system/clocksource/clocksource0/current_clocksource")


def clock_read_ns() -> float:
    """Nanoseconds that one reading of the recorder's clock takes on this machine (the TSC
    where the kernel's clock source is the TSC on x86-64, as recorder.c's tsc_is_reliable
    decides; else clock_gettime)."""
    try:
        tsc = os.uname().machine == "x86_64" and CLOCKSOURCE.read_text().startswith("tsc")
    except OSError:
        tsc = False
    return float(library().hc_clock_read_ns(int(tsc)))


library = LoadedOnce(load, LIBRARY)


class Drainer:
    """Recycles the full chunks of the raw files in `directory` until stop() (a native thread; it
    holds no GIL). After stop(): `chunks` recycled, and `failures`: files whose recycling stopped
    on an error (a full disk, a file system without fallocate); their records stayed in place."""

    def __init__(self, directory, poll_us: int = 200):
        self.directory = Path(directory)
        self.poll_us = poll_us
        self.chunks = self.failures = 0
        self._handle = None

    def start(self) -> "Drainer":
        """Starts the thread. OSError if it cannot start."""
        lib = library()
        handle = lib.hc_drain_start(os.fsencode(self.directory.resolve()), self.poll_us)
        if not handle:
            e = ctypes.get_errno()
            raise OSError(e, f"cannot start the chunk drainer: {os.strerror(e)}")
        self._handle = handle
        return self

    def copies(self, max_copies: int = 4096) -> tuple[list, int]:
        """The chunk copies completed since the last call, oldest first, as (inode of the raw
        file, offset of the copy) pairs, and the number of copies that could not be logged (no
        memory) since the start. A copy never changes: heapcast.recorder.live reads it at once."""
        if self._handle is None:
            return [], 0
        out = (ctypes.c_uint64 * (2 * max_copies))()
        lost = ctypes.c_uint64()
        n = library().hc_drain_copies(self._handle, out, max_copies, ctypes.byref(lost))
        return [(out[2 * k], out[2 * k + 1]) for k in range(n)], int(lost.value)

    def released(self, most: int = 4096) -> list:
        """The raw files the drainer has let go of since the last call (their process is gone,
        or their recycling stopped), as (inode, pid) pairs: it writes to them no more."""
        if self._handle is None:
            return []
        out = (ctypes.c_uint64 * (2 * most))()
        n = library().hc_drain_released(self._handle, out, most)
        return [(out[2 * k], out[2 * k + 1]) for k in range(n)]

    def keep(self, on: bool) -> None:
        """Keeps the chunks sealed from now on in place (marked kept) instead of copying them
        (True), or copies them again (False): for a converter far behind the program, copies
        cost its core and double the pages that the kernel writes back."""
        if self._handle is not None:
            library().hc_drain_keep(self._handle, int(on))

    def pause(self) -> None:
        """Stops recycling once the program has exited (a sealed chunk is complete in place:
        copying it then is work for nothing); copies() still gives the copies made."""
        if self._handle is not None:
            library().hc_drain_pause(self._handle)

    def stop(self) -> None:
        """Stops the thread; chunks that wait in a queue stay where they are, records intact."""
        if self._handle is None:
            return
        out = (ctypes.c_uint64 * 2)()
        library().hc_drain_stop(self._handle, out)
        self._handle = None
        self.chunks, self.failures = int(out[0]), int(out[1])

    def __enter__(self) -> "Drainer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
