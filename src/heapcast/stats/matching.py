"""Block matching over a stream of event chunks, with memory bounded by the live blocks.

heap.match pairs every release with its acquisition by sorting a whole process's events by
(address, position). Here the same sort runs over one chunk at a time plus the *carried* blocks: the
blocks still live from earlier chunks (or inherited at a fork) whose addresses the chunk touches.
The live map holds one block per address (a second acquisition of a live address, a "double
acquire", shadows the first, which heap.match also never releases), so it is bounded by the
program's live blocks, not by its events.

One subtlety keeps it exact: a moved realloc's release sits at `seq - free_lag`, which can fall in
an earlier chunk, before an acquisition there that reused the address. Shadowed blocks ("ghosts")
are therefore offered to later chunks' releases, valid only for a release positioned before the
acquisition that shadowed them (as the whole-process sort would order them), for GHOST_SPAN seqs:
a realloc recorded more than that many events after its release, whose address another thread
reused meanwhile, would be matched differently than by heap.match (none has been seen: lags are a
few events).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..heap import acquire_release_masks
from ..trace.format import FREE

GHOST_SPAN = 1 << 16

#: Columns of a carried block: address, position (acquisition seq; -1 inherited), size, ts, event
#: index in its process, acquisition ordinal, location id (-1: inherited), and `limit` (shadowed
#: blocks only: the position of the acquisition that shadowed it).
CARRY_DTYPE = np.dtype([("addr", "<u8"), ("pos", "<i8"), ("size", "<u8"), ("ts", "<u8"),
                        ("index", "<i8"), ("ordinal", "<i8"), ("loc", "<i8"), ("limit", "<i8")])


def empty_blocks(n: int = 0) -> np.ndarray:
    """A zeroed array of `n` carried blocks."""
    return np.zeros(n, CARRY_DTYPE)


@dataclass
class ChunkMatch:
    """What matching one chunk found, per event of the chunk (local indices)."""

    acquires: np.ndarray        # bool
    releases: np.ndarray        # bool
    released_size: np.ndarray   # uint64: bytes each release gave back (0 if unmatched)
    released: np.ndarray        # CARRY_DTYPE row per release event matched (source block), with
    released_at: np.ndarray     # ... the local index of the release that freed it
    unknown_releases: int
    double_acquires: int
    shadowed: np.ndarray        # CARRY_DTYPE: blocks that a later acquisition shadowed (never freed)
    revived: np.ndarray         # CARRY_DTYPE: blocks shadowed in an earlier chunk, freed after all


class LiveMap:
    """The live blocks of one process between chunks, sorted by address (one per address)."""

    def __init__(self, blocks: np.ndarray | None = None):
        self.blocks = empty_blocks() if blocks is None else np.sort(blocks, order="addr")
        self.shadowed = empty_blocks()     # ghosts: shadowed blocks, offered for GHOST_SPAN seqs

    def __len__(self) -> int:
        return len(self.blocks)

    def match(self, ev: np.ndarray, first_index: int, first_ordinal: int) -> ChunkMatch:
        """Matches the chunk `ev` (seq order; event `first_index` of its process, whose first
        acquisition has ordinal `first_ordinal`) and updates the live map."""
        acquires, releases = acquire_release_masks(ev)
        acq_idx = np.flatnonzero(acquires)
        rel_idx = np.flatnonzero(releases)
        seq = ev["seq"].astype(np.int64)
        moved = (ev["addr"][rel_idx] != ev["old_addr"][rel_idx]) & (ev["op"][rel_idx] != FREE)
        rel_pos = seq[rel_idx] - np.where(moved, ev["free_lag"][rel_idx].astype(np.int64), 0)

        # The chunk's acquisitions as blocks (they become live or are released right here).
        own = empty_blocks(len(acq_idx))
        own["addr"], own["pos"], own["size"] = ev["addr"][acq_idx], seq[acq_idx], ev["size"][acq_idx]
        own["ts"], own["index"] = ev["ts"][acq_idx], first_index + acq_idx
        own["ordinal"] = first_ordinal + np.arange(len(acq_idx))
        own["loc"] = ev["loc"][acq_idx]

        # Carried blocks at addresses this chunk touches, and last chunk's shadowed blocks.
        live = self.blocks
        touched = np.unique(np.concatenate([ev["addr"][acq_idx], ev["old_addr"][rel_idx]]))
        if len(live) and len(touched):
            i = np.minimum(np.searchsorted(live["addr"], touched), len(live) - 1)
            carried_at = np.unique(i[live["addr"][i] == touched])
        else:
            carried_at = np.zeros(0, np.int64)
        carried = live[carried_at]
        ghosts = self.shadowed
        blocks = np.concatenate([ghosts, carried, own])
        ng, nc = len(ghosts), len(carried)
        is_ghost = np.zeros(len(blocks) + 1, bool)     # one spare: index 0 of an empty chunk
        is_ghost[:ng] = True

        # Rows: blocks (kind 1) and releases (kind 0); at equal position the release sorts first.
        nb = len(blocks)
        addr = np.concatenate([blocks["addr"], ev["old_addr"][rel_idx]])
        pos = np.concatenate([blocks["pos"], rel_pos])
        kind = np.concatenate([np.ones(nb, np.int8), np.zeros(len(rel_idx), np.int8)])
        row = np.concatenate([np.arange(nb), np.arange(len(rel_idx))])   # into blocks / rel_idx
        order = np.lexsort((kind, pos, addr))
        addr, pos, kind, row = addr[order], pos[order], kind[order], row[order]

        same_prev = np.zeros(len(addr), bool)
        same_prev[1:] = addr[1:] == addr[:-1]
        prev_block = np.zeros(len(addr), bool)
        prev_block[1:] = kind[:-1] == 1
        prev_row = np.zeros(len(addr), np.int64)
        prev_row[1:] = row[:-1]
        prev_ghost = prev_block & is_ghost[np.where(prev_block, prev_row, 0)]

        rel_rows = kind == 0
        matched = rel_rows & same_prev & prev_block
        # A ghost was shadowed at `limit`: only a release positioned before that reaches it.
        ghost_hit = matched & prev_ghost
        matched[ghost_hit] = pos[ghost_hit] < blocks["limit"][prev_row[ghost_hit]]
        src = prev_row[matched]                     # index into blocks
        rel_local = rel_idx[row[matched]]
        released_size = np.zeros(len(ev), np.uint64)
        released_size[rel_local] = blocks["size"][src]

        # A block row followed by another block row at its address is shadowed (never released).
        nxt_block = np.zeros(len(addr), bool)
        nxt_block[:-1] = (kind[1:] == 1) & (addr[1:] == addr[:-1])
        shadowed_rows = (kind == 1) & nxt_block & ~is_ghost[row * (kind == 1)]
        shadowed = blocks[row[shadowed_rows]]
        # ... by the acquisition in the next row.
        shadowed["limit"] = pos[np.flatnonzero(shadowed_rows) + 1]
        double = (kind == 1) & same_prev & prev_block & ~prev_ghost & (row >= ng + nc)

        # The new live map: untouched carried blocks, plus touched and own blocks neither released
        # nor shadowed.
        gone = np.zeros(nb, bool)
        gone[src] = True
        gone[row[shadowed_rows]] = True
        gone[:ng] = True
        keep = np.ones(len(live), bool)
        keep[carried_at] = False
        survivors = blocks[ng:][~gone[ng:]]
        self.blocks = np.concatenate([live[keep], survivors])
        if len(survivors):
            self.blocks = self.blocks[np.argsort(self.blocks["addr"], kind="stable")]
        revived = blocks[src[src < ng]]
        alive = np.ones(ng, bool)
        alive[src[src < ng]] = False
        alive &= ghosts["limit"] >= int(seq[-1]) - GHOST_SPAN
        self.shadowed = np.concatenate([ghosts[alive], shadowed])
        return ChunkMatch(acquires, releases, released_size, blocks[src], rel_local,
                          unknown_releases=int(np.count_nonzero(rel_rows)) - len(src),
                          double_acquires=int(np.count_nonzero(double)),
                          shadowed=shadowed, revived=revived)
