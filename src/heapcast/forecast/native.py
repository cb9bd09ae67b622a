"""ctypes bindings of native/forecast/: a freed block's recency rank within its group (ranks.c,
heapcast.forecast.features.free_ranks), the n-gram's context hashes, their lookup
in its tables, the counting of its labels and the in-run memory's latest continuations
(contexts.c, heapcast.forecast.models.ngram), and the n-gram's k best labels per row
(ngram_topk.c)."""
from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from ..trace.base import LoadedOnce, bind

LIBRARY = Path(__file__).resolve().parent.parent / "libheapcast_forecast.so"


def _load(path: Path) -> ctypes.CDLL:
    p, u64, u32, i = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_int
    return bind(path, {
        "hc_contexts": (i, [p, u64, p, p, u64, ctypes.c_int, u32, u32, p, p]),
        "hc_sorted_buckets": (u64, [p, u64]),
        "hc_sorted_index": (i, [p, u64, p, u64]),
        "hc_sorted_find": (i, [p, u64, p, u64, p, u64, p]),
        "hc_count_labels": (i, [p, u64, ctypes.c_uint, ctypes.c_uint, p, p, p, p, p, p, p, p]),
        "hc_recent_continuations": (i, [p, p, u64, p, u64, p]),
        "hc_ngram_topk": (i, [u64, p, u32, p, p, u32, u32, p, p]),
        "hc_group_ranks": (i, [p, p, p, p, p, u64, p, p])},
        "forecasting kernels (hc_ngram_topk)")


class _Order(ctypes.Structure):
    """hc_ngram_order (ngram_topk.c): one order's table and the rows' hits in it."""
    _fields_ = [("hit", ctypes.c_void_p), ("n", ctypes.c_void_p), ("d", ctypes.c_void_p),
                ("start", ctypes.c_void_p), ("tok", ctypes.c_void_p), ("cnt", ctypes.c_void_p),
                ("start64", ctypes.c_uint32), ("tok32", ctypes.c_uint32)]


library = LoadedOnce(_load, LIBRARY)


def group_ranks(acquires: np.ndarray, releases: np.ndarray, alloc_of: np.ndarray,
                key: np.ndarray | None, want: np.ndarray, rank: np.ndarray,
                live: np.ndarray) -> None:
    """Recency ranks within groups, in one native pass over a process's events in order
    (native/forecast/ranks.c): for each event marked in `want` that releases a known block
    (`releases`, `alloc_of` >= 0: the acquiring event), writes into rank (int32) how many
    blocks of its group, live just before the release, were acquired after it, and into live
    (int32) how many of its group were live then, the freed one included; a group is the `key`
    of the acquiring event (any integers; None: one group). Other entries are left as they
    are. ValueError where a release names no earlier acquisition."""
    n = len(acquires)
    arrays = [np.ascontiguousarray(acquires, np.bool_), np.ascontiguousarray(releases, np.bool_),
              np.ascontiguousarray(alloc_of, np.int64),
              None if key is None else np.ascontiguousarray(key, np.int64),
              np.ascontiguousarray(want, np.bool_)]
    if any(a is not None and len(a) != n for a in arrays) or len(rank) != n or len(live) != n \
            or rank.dtype != np.int32 or live.dtype != np.int32 \
            or not (rank.flags.c_contiguous and live.flags.c_contiguous):
        raise ValueError(f"group_ranks: {n} events in every array, rank and live int32")
    rc = library().hc_group_ranks(*(a.ctypes.data if a is not None else None for a in arrays), n,
                                  rank.ctypes.data, live.ctypes.data)
    if rc == -1:
        raise MemoryError("group_ranks: out of memory")
    if rc:
        raise ValueError("group_ranks: a release names no earlier acquisition, or 2^31 events or "
                         "more")


class Contexts:
    """The rolling context hashes of rows of a stream of symbols, order after order
    (NGram._contexts): each next(order) gives the hashes of that order, the orders ascending,
    one pass over the rows per call, with one hash per row kept in between."""

    def __init__(self, sym: np.ndarray, rows: np.ndarray, pos: np.ndarray, shift: bool):
        self.sym = np.ascontiguousarray(sym, np.uint64)
        self.rows, self.pos = (np.ascontiguousarray(v, np.int64) for v in (rows, pos))
        self.shift = int(bool(shift))
        self.h = np.zeros(len(self.rows), np.uint64)
        self.order = 0

    def next(self, order: int) -> np.ndarray:
        """uint64 context hash of every row at `order` (above the order of the call before)."""
        out = np.empty(len(self.rows), np.uint64)
        rc = library().hc_contexts(self.sym.ctypes.data, len(self.sym), self.rows.ctypes.data,
                                   self.pos.ctypes.data, len(self.rows), self.shift, self.order,
                                   int(order), self.h.ctypes.data, out.ctypes.data)
        if rc:
            raise ValueError(f"contexts: order {order} after {self.order} (ascending, up to "
                             f"4096), or a row or position outside the symbols")
        self.order = int(order)
        return out


class SortedFind:
    """Finds values in a table of sorted, distinct uint64 values (an n-gram table's contexts)
    through a directory built once (contexts.c: a byte or two per value): find(queries) gives the
    int64 index of each query, -1 where it is absent, as searchsorted + a comparison would,
    with two reads per query, fetched ahead, instead of a bisection's twenty-odd."""

    def __init__(self, table: np.ndarray):
        self.table = np.ascontiguousarray(table, np.uint64)
        lib = library()
        self.buckets = int(lib.hc_sorted_buckets(self.table.ctypes.data, len(self.table)))
        self.dir = np.zeros(self.buckets + 1, np.uint32)
        if len(self.table) and lib.hc_sorted_index(self.table.ctypes.data, len(self.table),
                                                   self.dir.ctypes.data, self.buckets):
            raise ValueError(f"sorted_find: a table of {len(self.table)} values that are not "
                             f"sorted and distinct, or 2^32 values or more")

    def find(self, queries: np.ndarray) -> np.ndarray:
        queries = np.ascontiguousarray(queries, np.uint64)
        out = np.empty(len(queries), np.int64)
        if library().hc_sorted_find(self.table.ctypes.data, len(self.table), self.dir.ctypes.data,
                                    self.buckets, queries.ctypes.data, len(queries),
                                    out.ctypes.data):
            raise ValueError("sorted_find: bad arguments")
        return out


def count_labels(keys: np.ndarray, label_bits: int, topk: int, wide: bool = False) -> tuple:
    """An n-gram table from the sorted keys (context << label_bits | label) of its rows: (ctx,
    n, d, tok, cnt), per context its rows, distinct labels and min(d, topk) most frequent
    labels (uint16, or uint32 if `wide`) with their counts, by decreasing count, a tie to the
    lower label; one pass (contexts.c)."""
    keys = np.ascontiguousarray(keys, np.uint64)
    n = len(keys)
    ctx, cn, cd = np.empty(n, np.uint64), np.empty(n, np.uint32), np.empty(n, np.uint32)
    tok, cnt = np.empty(n, np.uint32 if wide else np.uint16), np.empty(n, np.uint32)
    ne, nk = ctypes.c_uint64(), ctypes.c_uint64()
    rc = library().hc_count_labels(keys.ctypes.data, n, label_bits, topk, ctx.ctypes.data,
                                   cn.ctypes.data, cd.ctypes.data,
                                   None if wide else tok.ctypes.data,
                                   tok.ctypes.data if wide else None, cnt.ctypes.data,
                                   ctypes.byref(ne), ctypes.byref(nk))
    if rc:
        raise ValueError(f"count_labels: keys not sorted, topk {topk} outside 1..64, or a "
                         f"count past 2^32")
    # The used part, in place (realloc: no copy, and the rest of the buffer is given back;
    # nothing else refers to these arrays yet).
    for a, m in ((ctx, ne.value), (cn, ne.value), (cd, ne.value), (tok, nk.value),
                 (cnt, nk.value)):
        a.resize(m, refcheck=False)
    return ctx, cn, cd, tok, cnt


def recent_continuations(ctx: np.ndarray, labels: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """For every row: the label of the latest earlier row of its stream (`offsets`: the streams'
    row ranges) with the same context hash, among rows with a label (>= 0); -1 if none. One pass
    through a hash table (contexts.c); the keys mix the stream in as NGram's always did."""
    ctx = np.ascontiguousarray(ctx, np.uint64)
    labels = np.ascontiguousarray(labels, np.int64)
    offsets = np.ascontiguousarray(offsets, np.int64)
    if len(labels) != len(ctx) or len(offsets) < 1:
        raise ValueError("recent_continuations: a label for every context, and stream offsets")
    out = np.empty(len(ctx), np.int64)
    rc = library().hc_recent_continuations(ctx.ctypes.data, labels.ctypes.data, len(ctx),
                                           offsets.ctypes.data, len(offsets) - 1,
                                           out.ctypes.data)
    if rc == -1:
        raise MemoryError(f"recent_continuations: no memory for the table of {len(ctx):,} rows")
    if rc:
        raise ValueError("recent_continuations: stream offsets do not run from 0 to the rows "
                         "in order")
    return out


def ngram_topk(nrows: int, hits: list, base: np.ndarray, by_base: np.ndarray, k: int) -> tuple:
    """The n-gram's k best classes of each of `nrows` rows and their blended probabilities:
    (int64 [nrows, k] class indices, -1 past the number of classes; float64 [nrows, k]).
    `hits`: per order, longest first, (table, int64 index of each row's context in it, -1 if
    absent), a table as heapcast.forecast.models.ngram keeps it (n, d, start, tok, cnt);
    `base`: the unigram's probability of each class, `by_base` the classes by base descending,
    index ascending. The same scores, bit for bit, as the dense blend over every class."""
    keep, orders = [], (_Order * max(1, len(hits)))()
    for o, (t, hit) in enumerate(hits):
        hit = np.ascontiguousarray(hit, np.int64)
        if len(hit) != nrows:
            raise ValueError(f"ngram_topk: {len(hit)} hits for {nrows} rows")
        n, d, cnt = (np.ascontiguousarray(t[c], np.uint32) for c in ("n", "d", "cnt"))
        start, tok = t["start"], t["tok"]
        if start.dtype != np.int64:
            start = np.ascontiguousarray(start, np.uint32)
        if tok.dtype != np.uint32:
            tok = np.ascontiguousarray(tok, np.uint16)
        if len(start) != len(n) + 1 or len(d) != len(n) or len(tok) != len(cnt) or \
                (len(n) and int(start[-1]) > len(tok)) or (len(hit) and hit.max() >= len(n)):
            raise ValueError("ngram_topk: a table whose arrays do not match")
        keep += [hit, n, d, cnt, start, tok]
        orders[o] = _Order(hit.ctypes.data, n.ctypes.data, d.ctypes.data, start.ctypes.data,
                           tok.ctypes.data, cnt.ctypes.data, int(start.dtype == np.int64),
                           int(tok.dtype == np.uint32))
    base = np.ascontiguousarray(base, np.float64)
    by_base = np.ascontiguousarray(by_base, np.uint32)
    if len(by_base) != len(base) or k < 1:
        raise ValueError("ngram_topk: by_base must order every class, and k be at least 1")
    labels = np.empty((nrows, k), np.int64)
    scores = np.empty((nrows, k), np.float64)
    rc = library().hc_ngram_topk(nrows, orders, len(hits), base.ctypes.data, by_base.ctypes.data,
                                 len(base), k, labels.ctypes.data, scores.ctypes.data)
    if rc == -2:
        raise MemoryError("ngram_topk: out of memory")
    if rc:
        raise ValueError("ngram_topk: bad arguments")
    return labels, scores
