"""Names and layouts shared by every part of heapcast: operations, the event array, file magic.

The on-disk formats are described in docs/trace-format.md; this module is their single source of
truth on the Python side (native/recorder/raw_format.h is the C side of the raw format).
"""
from __future__ import annotations

import numpy as np

from .base import (SESSION_FILE, TRACE_MAGIC, TRACE_READ_VERSIONS, TRACE_SUFFIX,  # noqa: F401
                   TRACE_VERSION, TraceError)

#: Operation names by code. The codes are stored in traces: never renumber them.
OPS = (
    "malloc", "calloc", "realloc", "reallocarray", "posix_memalign", "aligned_alloc",
    "memalign", "valloc", "pvalloc", "free", "mmap", "munmap", "mremap",
)
OP = {name: code for code, name in enumerate(OPS)}
MALLOC, CALLOC, REALLOC, REALLOCARRAY, POSIX_MEMALIGN, ALIGNED_ALLOC, MEMALIGN, VALLOC, PVALLOC, \
    FREE, MMAP, MUNMAP, MREMAP = range(len(OPS))

#: The heap operations (everything but the mmap family), in the order stats reports them.
HEAP_OPS = OPS[:10]
#: Operations that produce a block in `addr` when they succeed.
ALLOC_OPS = (MALLOC, CALLOC, REALLOC, REALLOCARRAY, POSIX_MEMALIGN, ALIGNED_ALLOC, MEMALIGN,
             VALLOC, PVALLOC)
#: Operations that pass a block in `old_addr`.
RELEASE_OPS = (REALLOC, REALLOCARRAY, FREE)

#: One heap event. All processes of a trace share this layout; `proc` says whose event it is.
EVENT_DTYPE = np.dtype([
    ("seq", "<u8"),       # exact global order within the process
    ("ts", "<u8"),        # CLOCK_MONOTONIC nanoseconds
    ("addr", "<u8"),      # address produced (0: none, or the call failed)
    ("old_addr", "<u8"),  # address passed in: free, realloc, reallocarray, munmap, mremap
    ("size", "<u8"),      # requested bytes in total (calloc: nmemb * size, saturated at 2**64-1)
    ("arg", "<u8"),       # calloc/reallocarray: nmemb; memalign family: alignment;
                          # mmap: prot << 32 | flags; mremap: old length; munmap: 1 if it failed
    ("loc", "<u4"),       # location id: index into the process's LocationTable (0 = unknown)
    ("tid", "<u4"),       # small sequential thread id within the process (0 = first thread)
    ("free_lag", "<u4"),  # realloc/reallocarray/mremap: old_addr was released at seq - free_lag
    ("proc", "<u2"),      # index into Trace.processes
    ("op", "u1"),         # index into OPS
    ("flags", "u1"),      # reserved, 0
])
assert EVENT_DTYPE.itemsize == 64

#: RSS samples of one process, taken from /proc while it ran.
RSS_DTYPE = np.dtype([("ts", "<u8"), ("seq", "<u8"), ("rss", "<u8")])

