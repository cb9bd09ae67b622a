"""Heap replay by matching: which allocation produced the block that each release gives back.

Everything that needs block identity (stats, lifetime labels, the allocator lab) starts here. Every
acquisition and release becomes a row keyed by (address, position in the global order), one sort
groups the rows of each address in order, and a release matches the acquisition just before it.
O(n log n): the rows are made and walked in native code (native/codec/match.c), the sort is
numpy's.

Rules (docs/trace-format.md, "How a heap is replayed"):
- allocation ops with addr != 0 acquire `addr`;
- free with old_addr != 0 releases it;
- realloc/reallocarray that returned a block, or returned 0 for size 0, release old_addr (if any)
  at seq - free_lag and acquire addr at seq; an in-place realloc is a release and an acquisition of
  the same address at the same point (the release first).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .format import EVENT_DTYPE

NEVER = -1      # release_of: the block was never released (still live at the end)
UNKNOWN = -1    # alloc_of: the released address was not live
INHERITED = -2  # alloc_of: the block was live in the parent when this process was forked


@dataclass
class Blocks:
    """The matching of one process's events (all arrays are indexed by event index)."""

    acquires: np.ndarray        # bool: the event produced a block
    releases: np.ndarray        # bool: the event released a block (or tried to)
    release_of: np.ndarray      # int64: for acquisitions, index of the releasing event, else -1
    alloc_of: np.ndarray        # int64: for releases, index of the acquiring event, -1/-2, else -1
    released_size: np.ndarray   # uint64: bytes of the block released by this event (0 if unknown)
    unknown_releases: int       # releases of addresses that were not live
    double_acquires: int        # acquisitions of an address that was already live
    inherited_live: int         # blocks inherited from the parent that were still live at the end
    inherited_addrs: np.ndarray = None    # the blocks this process started with (fork child)
    inherited_sizes: np.ndarray = None
    inherited_release_of: np.ndarray = None  # int64: event that released each of them, else -1

    @property
    def leaked(self) -> np.ndarray:
        """Indices of acquisitions never released."""
        return np.flatnonzero(self.acquires & (self.release_of == NEVER))

    def live_delta(self, sizes: np.ndarray) -> np.ndarray:
        """Change of live requested bytes at each event (int64)."""
        delta = np.where(self.acquires, sizes.astype(np.int64), 0)
        return delta - self.released_size.astype(np.int64)


def match(ev: np.ndarray, inherited_addrs: np.ndarray | None = None,
          inherited_sizes: np.ndarray | None = None) -> Blocks:
    """Matches the releases of one process's events (in seq order) to their acquisitions.

    `inherited_addrs`/`inherited_sizes`: blocks live at the start (a forked child's inheritance).
    Every acquisition and release is a row keyed by (address, position in the global order, a
    release before an acquisition at one position); one sort groups the rows of each address in
    order, and a release matches the row before it when that row acquired the address. The rows
    are made and walked natively (native/codec/match.c: 4-5 s of numpy on a Python program's
    13.6M events, now 1.5 s with the sort), the sort is numpy's.
    """
    from . import native_match
    ev = np.ascontiguousarray(ev, EVENT_DTYPE)
    n = len(ev)
    inh_addrs = np.zeros(0, np.uint64) if inherited_addrs is None else \
        np.ascontiguousarray(inherited_addrs, np.uint64)
    inh_sizes = None if inherited_sizes is None else np.ascontiguousarray(inherited_sizes, np.uint64)
    k = len(inh_addrs)
    if inh_sizes is not None and len(inh_sizes) != k:
        raise ValueError(f"{k} inherited addresses but {len(inh_sizes)} sizes")
    acquires, releases, addr, pos, kind, event = native_match.rows(ev, inh_addrs)
    order = np.lexsort((kind, pos, addr))
    out = {"alloc_of": np.full(n, UNKNOWN, np.int64), "release_of": np.full(n, NEVER, np.int64),
           "released_size": np.zeros(n, np.uint64),
           "inherited_release_of": np.full(k, NEVER, np.int64)}
    unknown, doubles = native_match.walk(ev, addr, kind, event, order, inh_sizes, out)
    return Blocks(acquires, releases, out["release_of"], out["alloc_of"], out["released_size"],
                  unknown_releases=unknown, double_acquires=doubles,
                  inherited_live=int(np.count_nonzero(out["inherited_release_of"] == NEVER)),
                  inherited_addrs=inh_addrs,
                  inherited_sizes=inh_sizes if inh_sizes is not None else np.zeros(k, np.uint64),
                  inherited_release_of=out["inherited_release_of"])


def live_at(ev: np.ndarray, blocks: Blocks, seq: int) -> tuple[np.ndarray, np.ndarray]:
    """Addresses and sizes of the blocks live just before event `seq` (for a fork child): the
    process's own and those it inherited itself and had not released yet."""
    def still_live(rel):
        return (rel == NEVER) | (ev["seq"][np.maximum(rel, 0)] >= seq)
    idx = np.flatnonzero(blocks.acquires & (ev["seq"] < seq))
    idx = idx[still_live(blocks.release_of[idx])]
    addrs, sizes = ev["addr"][idx], ev["size"][idx]
    if blocks.inherited_addrs is not None and len(blocks.inherited_addrs):
        keep = still_live(blocks.inherited_release_of)
        addrs = np.concatenate([blocks.inherited_addrs[keep], addrs])
        sizes = np.concatenate([blocks.inherited_sizes[keep], sizes])
    return addrs, sizes


def match_trace(trace) -> list:
    """Blocks for every process of a trace, forked children starting with their parent's live blocks."""
    result = []
    by_pid = {}
    for p in trace.processes:
        inh_a = inh_s = None
        parent = by_pid.get(p.forked_from) if p.forked_from else None
        if parent is not None:
            pev, pblocks = parent
            inh_a, inh_s = live_at(pev, pblocks, p.fork_seq)
        ev = p.events
        b = match(ev, inh_a, inh_s)
        result.append(b)
        by_pid[p.pid] = (ev, b)
    return result
