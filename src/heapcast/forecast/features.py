"""Per-event features of traces, arranged as token streams: what datasets store and models read.

`featurize(traces, order)` turns traces into one `Features` table: rows are events, grouped into
streams (contiguous rows), either one per thread (`order="thread"`: the article's per-thread
sequences, threads of a process in tid order (imported article logs: in pthread_self order, as the
article did), processes in trace order) or one per process
(`order="process"`: the exact global order, which block identity needs). Columns:

| column | dtype | meaning |
|---|---|---|
| seed64, rich | u1, u2 | tokens (heapcast.forecast.vocab) |
| site, stack | u4 | stable call-site / whole-stack key: hash of (module file name, offset in the module), or for a Python frame of (file name, function, line); 0 unknown |
| proc, tid | u2, u4 | process (numbered across all input traces) and thread |
| ts | u8 | CLOCK_MONOTONIC ns |
| dt | u1 | bit_length of ns since the previous event of the same stream (0 at a stream start) |
| lifetime_events, lifetime_ns | i8 | block lifetime (heapcast.forecast.lifetime), -1 none/never |
| lifetime_class, lifetime_ns_class | i1 | lifetime classes, -1 for events that produce no block |
| free_rank | i4 | at a free of a known block: its recency rank among the live blocks (0 = the youngest), else -1 |
| seq | u8 | the event's seq in its process (to find a row's event in the trace) |
| free_live | i4 | at a free of a known block: how many blocks were live just before it (the freed one included), else -1 |
| free_site, free_class | u4, u1 | at a free of a known block: the call-site key and the size class (`min(bit_length(size), 31)`, the article's) of the allocation that made it, else 0 |
| free_site_rank, free_site_live | i4 | free_rank and free_live among the live blocks of the freed block's call site only |
| free_class_rank, free_class_live | i4 | the same among the live blocks of its size class |

Everything is vectorized per process (heapcast.trace.blocks.match, numpy sorts): no Python loop per event.
"""
from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..trace.blocks import match_trace
from ..stats import size_classes
from ..trace.format import FREE
from ..trace.model import Process, Trace, is_python_frame
from . import feature_cache
from .lifetime import lifetime_labels
from .native import group_ranks
from .names import ORDERS  # noqa: F401 (re-exported)
from .vocab import rich_tokens, seed64_tokens

COLUMNS = {
    "seed64": np.uint8, "rich": np.uint16, "site": np.uint32, "stack": np.uint32,
    "proc": np.uint16, "tid": np.uint32, "ts": np.uint64, "dt": np.uint8,
    "lifetime_events": np.int64, "lifetime_ns": np.int64, "lifetime_class": np.int8,
    "lifetime_ns_class": np.int8, "free_rank": np.int32, "free_live": np.int32,
    "seq": np.uint64, "free_site": np.uint32, "free_class": np.uint8,
    "free_site_rank": np.int32, "free_site_live": np.int32,
    "free_class_rank": np.int32, "free_class_live": np.int32,
}
#: Columns that only features built with need_ranks=True have.
RANK_COLUMNS = ("free_rank", "free_live", "free_site", "free_class", "free_site_rank",
                "free_site_live", "free_class_rank", "free_class_live")
#: The size classes of the `free` task's grouping by class: the article's (bit_length, capped).
FREE_CLASS_MAX = 31
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a well-spread 64-bit hash of each uint64 (wrapping arithmetic)."""
    x = np.asarray(x, np.uint64)
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


@dataclass
class Features:
    """Per-event columns of one or more traces, in stream order (see the module docstring)."""

    order: str
    offsets: np.ndarray     # int64 [streams + 1]: stream s is rows offsets[s]:offsets[s+1]
    columns: dict           # name -> array of len(self)
    sources: list = field(default_factory=list)   # per trace: path, program, events, processes

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @property
    def streams(self) -> int:
        return len(self.offsets) - 1

    def stream_starts(self) -> np.ndarray:
        """bool per row: the first row of its stream."""
        first = np.zeros(len(self), bool)
        first[self.offsets[:-1][self.offsets[:-1] < len(self)]] = True
        return first

    def position_in_stream(self) -> np.ndarray:
        """int64 per row: its index within its stream."""
        lengths = np.diff(self.offsets)
        return np.arange(len(self), dtype=np.int64) - np.repeat(self.offsets[:-1], lengths)


def program_name(trace: Trace) -> str:
    """The program a trace recorded: the file name of its first process's executable."""
    for p in trace.processes:
        if p.exe or p.argv:
            return os.path.basename(p.exe or p.argv[0])
    return os.path.basename(str(trace.path))


def recording_source(trace: Trace) -> dict:
    """What a trace's features say of the recording they came from (Features.sources: the
    recording a model was trained on, for heapcast evaluate's protocols), from its metadata."""
    return {"path": str(trace.path), "program": program_name(trace),
            "events": sum(p.known_event_count for p in trace.processes),
            "processes": len(trace.processes)}


def location_keys(process: Process) -> tuple[np.ndarray, np.ndarray]:
    """Stable keys of every location id of a process: (call site, whole stack), uint32, 0 unknown.

    A frame's key hashes the file name of the module holding it and its offset in that module
    (the last module map: it knows every dlopen), so the same code has the same key in every run
    and process despite ASLR; a Python frame's key hashes its source file's name, function and
    line. Addresses outside every module hash as they are.
    """
    table = process.locations
    nloc = len(table)
    if nloc == 0:
        return np.zeros(0, np.uint32), np.zeros(0, np.uint32)
    frames = table.flat.astype(np.uint64)
    fkeys = _frame_keys(process, frames)
    lengths = np.diff(table.offsets.astype(np.int64))
    has = lengths > 0
    starts = table.offsets[:-1].astype(np.int64)
    site = np.zeros(nloc, np.uint64)
    site[has] = fkeys[starts[has]]
    # A stack hashes its frames with their depth, so that order matters.
    depth = np.arange(len(frames), dtype=np.int64) - np.repeat(starts, lengths)
    weighted = mix64(fkeys ^ (depth.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)))
    stack = np.zeros(nloc, np.uint64)
    if len(frames):
        sums = np.add.reduceat(weighted, np.minimum(starts, len(frames) - 1))
        stack[has] = sums[has]
    return _fold32(site, has), _fold32(stack, has)


def _fold32(keys: np.ndarray, known: np.ndarray) -> np.ndarray:
    folded = ((keys >> np.uint64(32)) ^ keys).astype(np.uint32)
    folded[folded == 0] = 1          # 0 means unknown
    return np.where(known, folded, 0).astype(np.uint32)


def _frame_keys(process: Process, frames: np.ndarray) -> np.ndarray:
    mods = sorted(process.modules[-1].modules, key=lambda m: m.start) if process.modules else []
    keys = mix64(frames)
    _python_frame_keys(process, frames, keys)
    if not mods or not len(frames):
        return keys
    starts = np.array([m.start for m in mods], np.uint64)
    ends = np.array([m.end for m in mods], np.uint64)
    bases = np.array([m.base % (1 << 64) for m in mods], np.uint64)
    names = np.array([zlib.crc32(os.path.basename(m.path).encode()) for m in mods], np.uint64)
    probe = frames - np.uint64(1)              # return addresses: the call is just before
    mi = np.searchsorted(starts, probe, side="right").astype(np.int64) - 1
    inside = (mi >= 0) & (frames != 0)
    inside[inside] = probe[inside] < ends[mi[inside]]
    m = mi[inside]
    keys[inside] = mix64((names[m] << np.uint64(40)) ^ (frames[inside] - bases[m]))
    return keys


def _python_frame_keys(process: Process, frames: np.ndarray, keys: np.ndarray) -> None:
    """Sets the keys of the Python frames among `frames`: (file name, function, line), hashed."""
    py = np.flatnonzero(is_python_frame(frames))
    if not len(py):
        return
    ids, inv = np.unique(frames[py] & np.uint64(0xFFFFFFFF), return_inverse=True)
    per_id = np.zeros(len(ids), np.uint64)
    for k, fid in enumerate(ids.tolist()):
        f = process.python_frames.get(fid)
        text = (f"{os.path.basename(f.file)}\0{f.function}\0{f.line}" if f is not None
                else f"?{process.pid}:{fid}")
        per_id[k] = (zlib.crc32(text.encode()) << 32) | zlib.crc32(text.encode()[::-1])
    keys[py] = mix64(per_id[inv] ^ np.uint64(0x5059))


def free_ranks(op: np.ndarray, blocks, group: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """(recency rank, live count) of the block each free releases: its rank among the blocks
    live at that moment (0: the youngest, a LIFO guess; live count - 1: the oldest, a FIFO
    guess) and how many blocks were live (the freed one included). Both -1 for events that are
    not frees of a block allocated in this process. With `group` (a key per acquiring event,
    e.g. its call site or size class), both are counted among the live blocks of the freed
    block's group only (bench/free_groups.py); a realloc releases in its old block's group and
    acquires in its own.

    One native pass over the events in order (native/forecast/ranks.c): each group numbers its
    acquisitions and keeps a Fenwick tree of the live ones; a free's rank is the number of its
    group's live blocks numbered after its own, O(n log n)."""
    n = len(op)
    rank = np.full(n, -1, np.int32)
    live = np.full(n, -1, np.int32)
    group_ranks(blocks.acquires, blocks.releases, blocks.alloc_of, group, op == FREE, rank, live)
    return rank, live


def featurize_process(process: Process, blocks=None, order: str = "thread",
                      need_ranks=True, proc: int = 0) -> Features:
    """Features of one process (its events in the stream order asked for); `need_ranks` as
    featurize takes it."""
    if blocks is None:
        from ..trace.blocks import match
        blocks = match(process.events)
    return _build([(process, blocks)], order, need_ranks, proc)


def featurize(traces, order: str = "thread", need_ranks=True) -> Features:
    """Features of every process of every trace (Trace objects or paths), in stream order.

    `need_ranks`: which free_* rank columns to compute: True (all), False (none), or groupings
    of the `free` task (`all`, `class`, `site`: heapcast.forecast.tasks.rank_groupings), each
    costing about 0.04 s per million events (one native pass)."""
    from ..trace.reader import load
    if order not in ORDERS:
        raise ValueError(f"unknown stream order {order!r} (known: {', '.join(ORDERS)})")
    parts, sources = [], []
    groups = _rank_groups(need_ranks)
    for t in traces:
        # a trace named by its directory: its features may be kept there (feature_cache)
        k = None if isinstance(t, Trace) else feature_cache.entry_key(t, order, groups)
        kept = feature_cache.load(t, k)
        if kept is not None:
            f, source = kept
            source["path"] = str(Path(t))
        else:
            trace = t if isinstance(t, Trace) else load(t)
            # (the matched blocks held by _build alone, which lets each go once used)
            f = _build(list(zip(trace.processes, match_trace(trace))), order, groups, 0)
            source = recording_source(trace)   # (its events: f's rows, one each)
            feature_cache.save(t, k, f, source)
        parts.append(f)   # (concat numbers the processes of each part after the last one's)
        sources.append(source)
    return concat(parts, sources)


def concat(parts: list, sources: list | None = None) -> Features:
    """One Features table holding the streams of `parts` one after the other."""
    if not parts:
        raise ValueError("no traces given")
    order = parts[0].order
    offsets = [np.zeros(1, np.int64)]
    base = 0
    for f in parts:
        offsets.append(f.offsets[1:] + base)
        base += len(f)
    names = [c for c in COLUMNS if all(c in f.columns for f in parts)]
    # (one part: its columns themselves; copied, they were 1.3 GB more at featurize's peak on
    # a trace of 20M events)
    cols = {c: parts[0].columns[c] if len(parts) == 1 else
            np.concatenate([f.columns[c] for f in parts]) for c in names if c != "proc"}
    # Process numbers continue from one part to the next.
    procs, base = [], 0
    for f in parts:
        p = np.asarray(f.columns["proc"], np.int64)
        procs.append(p - (p.min() if len(p) else 0) + base)
        base = int(procs[-1].max()) + 1 if len(p) else base
    cols["proc"] = np.concatenate(procs).astype(np.uint16)
    srcs = sources if sources is not None else [s for f in parts for s in f.sources]
    return Features(order, np.concatenate(offsets), cols, srcs)


def _build(procs: list, order: str, need_ranks, proc0: int) -> Features:
    groups = _rank_groups(need_ranks)
    ranked = {c for g in groups for c in _RANKS_OF[g]}
    cols = {c: [] for c in COLUMNS if c != "dt" and (c not in RANK_COLUMNS or c in ranked)}
    offsets = [0]
    for i in range(len(procs)):
        (p, blocks), procs[i] = procs[i], None
        ev = p.events
        site_of, stack_of = location_keys(p)
        loc = ev["loc"].astype(np.int64)
        loc = np.where(loc < len(site_of), loc, 0) if len(site_of) else np.zeros(len(ev), np.int64)
        life = lifetime_labels(ev, blocks)
        per = {
            "seed64": seed64_tokens(ev, blocks), "rich": rich_tokens(ev, blocks),
            "site": site_of[loc] if len(site_of) else np.zeros(len(ev), np.uint32),
            "stack": stack_of[loc] if len(stack_of) else np.zeros(len(ev), np.uint32),
            "proc": np.full(len(ev), proc0 + i, np.uint16), "tid": ev["tid"], "ts": ev["ts"],
            "lifetime_events": life["events"], "lifetime_ns": life["ns"],
            "lifetime_class": life["cls"], "lifetime_ns_class": life["ns_cls"],
            "seq": ev["seq"],
        }
        del life, loc
        if groups:
            per.update(_rank_columns(ev, blocks, per["site"], groups))
        del blocks   # (what is left to hold at once: the columns, gathered below)
        if order == "thread":
            key = _thread_rank(p)[ev["tid"]] if p.pthread_ids else ev["tid"]
            # (rows already in thread order, as a single-threaded program's: no gather of
            # every column through an identity permutation)
            perm = None if len(key) < 2 or bool(np.all(key[1:] >= key[:-1])) else \
                np.argsort(key, kind="stable")
            lengths = np.unique(key, return_counts=True)[1]
            del key
        else:
            perm, lengths = None, np.array([len(ev)] if len(ev) else [], np.int64)
        for c in cols:   # (each column let go of as it is gathered: not all twice at once)
            v = per.pop(c)
            cols[c].append(v[perm] if perm is not None else v)
            del v
        del perm
        offsets.extend((offsets[-1] + np.cumsum(lengths)).tolist())
    # (one process: its columns as they are where already contiguous and of the column's type;
    # several: each column's parts let go of once joined)
    out = {}
    for c in list(cols):
        v = cols.pop(c)
        out[c] = np.ascontiguousarray(v[0] if len(v) == 1 else np.concatenate(v), COLUMNS[c]) \
            if v else np.zeros(0, COLUMNS[c])
        del v
    feats = Features(order, np.asarray(offsets, np.int64), out)
    feats.columns["dt"] = _time_deltas(feats)
    return feats


#: The free_* columns of each grouping of the `free` task.
_RANKS_OF = {"all": ("free_rank", "free_live"),
             "site": ("free_site", "free_site_rank", "free_site_live"),
             "class": ("free_class", "free_class_rank", "free_class_live")}


def _rank_groups(need_ranks) -> tuple:
    if need_ranks is True:
        return tuple(_RANKS_OF)
    if not need_ranks:   # (False, None, ()): no rank column at all
        return ()
    groups = tuple(need_ranks)
    unknown = [g for g in groups if g not in _RANKS_OF]
    if unknown:
        raise ValueError(f"need_ranks: unknown grouping {unknown[0]!r} (known: "
                         f"{', '.join(_RANKS_OF)})")
    # every grouping's rows are the frees that have a global rank
    return ("all",) + tuple(g for g in groups if g != "all")


def _rank_columns(ev: np.ndarray, blocks, site: np.ndarray, groups: tuple) -> dict:
    """The free_* columns of one process for `groups`: recency ranks of each freed block among
    all live blocks, among those of its call site or of its size class, and its groups."""
    out = {}
    out["free_rank"], out["free_live"] = free_ranks(ev["op"], blocks)
    made = np.where(out["free_rank"] >= 0, blocks.alloc_of, -1)
    known = made >= 0
    for group in groups[1:]:
        key = site if group == "site" else \
            np.minimum(size_classes(ev["size"]), FREE_CLASS_MAX).astype(np.uint8)
        out[f"free_{group}_rank"], out[f"free_{group}_live"] = free_ranks(ev["op"], blocks, key)
        out[f"free_{group}"] = np.where(known, key[np.maximum(made, 0)], 0)
    return out


def _thread_rank(p: Process) -> np.ndarray:
    """Stream position of each tid of an imported log: its threads in pthread_self order, as the
    article laid them out (tids beyond the known values keep their order after them)."""
    known = len(p.pthread_ids)
    ntid = max(known, int(p.events["tid"].max()) + 1 if len(p.events) else 0)
    rank = np.arange(ntid, dtype=np.int64)
    by_value = sorted(range(known), key=lambda t: p.pthread_ids[t])
    rank[by_value] = np.arange(known)
    return rank


def _time_deltas(f: Features, block: int = 1 << 20) -> np.ndarray:
    """bit_length of the ns since the previous row (0 at a stream's start, or where time went
    back), in blocks: done at once, its int64 temporaries were 880 MB for ring's 20M rows, at
    the moment featurize holds the most."""
    ts = f.columns["ts"]
    out = np.zeros(len(ts), np.uint8)
    for s in range(1, len(ts), block):
        e = min(s + block, len(ts))
        d = np.maximum(ts[s:e].astype(np.int64) - ts[s - 1:e - 1].astype(np.int64), 0)
        out[s:e] = np.minimum(size_classes(d.astype(np.uint64)), 63)
    out[f.stream_starts()] = 0
    return out
