"""Block matching over a stream of event chunks, with memory bounded by the live blocks.

heap.match pairs every release with its acquisition by sorting a whole process's events by
(address, position). Here native/stats/livemap.c does the same pairing one chunk at a time, in
seq order, against a hash table of the live blocks (one per address: a second acquisition of a
live address, a "double acquire", shadows the first, which heap.match also never releases), so
memory is bounded by the program's live blocks, not by its events.

One subtlety keeps it exact: a moved realloc's release sits at `seq - free_lag`, which can lie
before an acquisition that reused the address. Shadowed blocks ("ghosts") are therefore kept for
GHOST_SPAN seqs and paired with such a release when it is positioned before the acquisition that
shadowed them, as the whole-process sort orders them. A realloc recorded more than GHOST_SPAN
events after its release, whose address another thread reused meanwhile, would be paired
differently than by heap.match (none has been seen: lags are a few events).
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..trace.format import EVENT_DTYPE
from ..trace.base import LoadedOnce, bind

GHOST_SPAN = 1 << 16
LIBRARY = Path(__file__).resolve().parent.parent / "libheapcast_stats.so"

#: A block (livemap.c's block_t): address, position (acquisition seq; -1 inherited), size, ts,
#: event index in its process, acquisition ordinal, location id (-1: inherited at a fork), and
#: `limit` (ghosts: the seq of the acquisition that shadowed it).
BLOCK_DTYPE = np.dtype([("addr", "<u8"), ("pos", "<i8"), ("size", "<u8"), ("ts", "<u8"),
                        ("index", "<i8"), ("ordinal", "<i8"), ("loc", "<i8"), ("limit", "<i8")])


class _Result(ctypes.Structure):
    _fields_ = [(name, ctypes.c_void_p) for name in
                ("released_size", "src", "matched", "shadowed", "revived")] + \
               [(name, ctypes.c_int64) for name in
                ("nmatched", "nshadowed", "nrevived", "unknown", "doubles")]


def _load(path: Path) -> ctypes.CDLL:
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    return bind(path, {"hc_livemap_new": (p, [p, i64]), "hc_livemap_free": (None, [p]),
                       "hc_livemap_count": (i64, [p]), "hc_livemap_ghosts": (i64, [p]),
                       "hc_livemap_export": (None, [p, p]),
                       "hc_livemap_match": (ctypes.c_int,
                                            [p, p, i64, i64, i64, ctypes.POINTER(_Result)])},
                "live-block map (hc_livemap_match)")


library = LoadedOnce(_load, LIBRARY)


def empty_blocks(n: int = 0) -> np.ndarray:
    """A zeroed array of `n` blocks."""
    return np.zeros(n, BLOCK_DTYPE)


@dataclass
class ChunkMatch:
    """What matching one chunk found (indices are local to the chunk)."""

    released_size: np.ndarray   # uint64 per event: bytes it released (0: none)
    released: np.ndarray        # BLOCK_DTYPE: the blocks released, in event order, by ...
    released_at: np.ndarray     # ... these events
    unknown_releases: int       # releases of no live block
    double_acquires: int        # net: double acquires, less ghosts released after all
    shadowed: np.ndarray        # BLOCK_DTYPE: blocks a double acquire shadowed (never freed)
    revived: np.ndarray         # BLOCK_DTYPE: ghosts released after all (no double acquire)


class LiveMap:
    """The live blocks of one process between chunks (native hash table, freed with the object)."""

    def __init__(self, blocks: np.ndarray | None = None):
        self._lib = library()
        blocks = empty_blocks() if blocks is None else np.ascontiguousarray(blocks, BLOCK_DTYPE)
        self._map = self._lib.hc_livemap_new(blocks.ctypes.data, len(blocks))
        if not self._map:
            raise MemoryError("heapcast: out of memory for the live-block map")

    def __del__(self):
        if getattr(self, "_map", None):
            self._lib.hc_livemap_free(self._map)
            self._map = None

    def __len__(self) -> int:
        return self._lib.hc_livemap_count(self._map)

    @property
    def ghosts(self) -> int:
        """Shadowed blocks kept for a late release (bounded by GHOST_SPAN seqs of double acquires)."""
        return self._lib.hc_livemap_ghosts(self._map)

    @property
    def blocks(self) -> np.ndarray:
        """A copy of the live blocks, sorted by address."""
        out = empty_blocks(len(self))
        self._lib.hc_livemap_export(self._map, out.ctypes.data)
        return np.sort(out, order="addr")

    def match(self, ev: np.ndarray, first_index: int, first_ordinal: int) -> ChunkMatch:
        """Matches the chunk `ev` (seq order; event `first_index` of its process, whose first
        acquisition has ordinal `first_ordinal`) and updates the live map."""
        ev = np.ascontiguousarray(ev, EVENT_DTYPE)
        n = len(ev)
        # Not zeroed: the native pass writes every event's released_size and src, and the
        # blocks only up to the counts it returns (zeroing three arrays of 64 bytes an event
        # took a tenth of `heapcast stats`).
        released_size = np.empty(n, np.uint64)
        src = np.empty(n, np.int64)
        matched, shadowed, revived = (np.empty(n, BLOCK_DTYPE) for _ in range(3))
        r = _Result(released_size.ctypes.data, src.ctypes.data, matched.ctypes.data,
                    shadowed.ctypes.data, revived.ctypes.data)
        if self._lib.hc_livemap_match(self._map, ev.ctypes.data, n, first_index, first_ordinal,
                                      ctypes.byref(r)):
            raise MemoryError("heapcast: out of memory for the live-block map")
        return ChunkMatch(released_size, matched[:r.nmatched], np.flatnonzero(src >= 0),
                          unknown_releases=r.unknown, double_acquires=r.doubles,
                          shadowed=shadowed[:r.nshadowed], revived=revived[:r.nrevived])
