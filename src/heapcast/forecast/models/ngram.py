"""The n-gram / PPM baseline: variable-order contexts with blending, trained in seconds.

For each order k (default 1, 2, 3, 4, 6, 8, 12, 16, 24, 32), the context of a row is the k
symbols before it in its stream (for `lifetime`: the row's own symbol and the k-1 before it);
positions before the stream's start are padding. A symbol is the event's token (next, free) or a
hash of its token and call site (lifetime, or `sites=True`), and with `dt=True` of its time-delta
bucket too (bit_length of the ns since the previous event, // 4). Training hashes the contexts of all
rows at once (a rolling 64-bit hash, natively: one pass over the rows per order), sorts
(context, label) keys and, in one native pass over them, keeps per context its count n, its
number of distinct labels d and its min(d, topk) most frequent labels with their counts.

An order that does not repeat in training keeps only its contexts seen more than once
(`prune_once`, default on): one whose contexts seen once hold more than half of its rows, while
Good-Turing expects fewer than 0.2% of new rows to meet one of them again (2 N2 / N, N2 the
contexts seen twice, N the rows). On ring.c's random sizes, orders 12 and above hold one context
per row (99.5-100% of the rows; 0.00-0.16% expected to meet them again, 0.45% for order 12 of
its 20M events, kept), and its model was 1.8 GB, 0.67 GB without them. Where a program repeats
itself, even a short training run's long orders whose contexts were mostly seen once expect
9-18% of new rows to meet them again (jq, 50,000 rows with call sites), and keep them: dropping
the 1% of python's rows' contexts seen once cost 0.06-0.19 points of cross-run top-1.

A table stores those labels ragged: `tok` and `cnt` hold min(d, topk) entries per context, one
context after the other (the offsets follow from d). Most contexts of the long orders were seen
once (on ring's 20M events, every context of orders 12 to 32), and a row of `topk` slots each
made the model 2.8x larger: 5.9 GB against 2.1 GB there. Files of the dense layout (tok and cnt
of shape (contexts, topk)) are still read.

Prediction blends the orders as PPM method C does (without exclusions): from the longest context
seen in training down, a label gets weight * c(label) / (n + d), and the weight passed down is
multiplied by the escape probability d / (n + d); order 0 (label frequencies) gets what is left.
The k best labels of a row are among its contexts' labels and the k most frequent classes, so
they are found in one native pass over those (native/forecast/ngram_topk.c) instead of a dense
row over every class (4-9x faster on the corpus' traces), with the same probabilities bit for
bit; among equal scores the lower class comes first, at the k-th place too.
"""
from __future__ import annotations

import time

import numpy as np

from ..features import mix64
from ..tasks import TaskData
from ..native import ngram_topk
from .base import Model

_LABEL_BITS = 16                    # context hashes leave room for a label (contexts.c too)
_CHUNK = 1 << 16                    # rows predicted at once
_STORED = ("ctx", "n", "d", "tok", "cnt")    # a table's arrays in a model file
_ONCE_SHARE, _MEET_AGAIN = 0.5, 0.002         # prune_once: an order that does not repeat


def _unsigned(v: np.ndarray, name: str, dtype) -> np.ndarray:
    """v as `dtype` (itself if it is already), ValueError if a value does not fit."""
    v = np.asarray(v)
    if v.dtype == dtype:
        return v
    if len(v) and (int(np.min(v)) < 0 or int(np.max(v)) > np.iinfo(dtype).max):
        raise ValueError(f"an n-gram table's {name} holds values outside {np.dtype(dtype).name}")
    return v.astype(dtype)


def _finder(table: dict):
    """The table's lookup of contexts (native.SortedFind: a directory of a byte or two per
    context, built on first use and kept with the table, not in the model file)."""
    if "find" not in table:
        from ..native import SortedFind
        table["find"] = SortedFind(table["ctx"])
    return table["find"]


class NGram(Model):
    """PPM-C blended n-gram model (see the module docstring)."""

    kind = "ngram"

    @classmethod
    def default_config(cls) -> dict:
        return {"orders": [1, 2, 3, 4, 6, 8, 12, 16, 24, 32], "topk": 8, "sites": None,
                "dt": False, "prune_once": True}

    def _use_sites(self) -> bool:
        s = self.config["sites"]
        return self.task == "lifetime" if s is None else bool(s)

    def symbols(self, data: TaskData) -> np.ndarray:
        """uint64 symbol of every row."""
        sym = data.tokens.astype(np.uint64)
        if self._use_sites():
            sym = mix64(sym ^ (data.sites.astype(np.uint64) << np.uint64(20)))
        if self.config["dt"]:
            # 16 time-delta buckets: bit_length(ns since the previous event) // 4.
            sym = mix64(sym ^ ((data.dt.astype(np.uint64) >> np.uint64(2)) << np.uint64(56)))
        return sym & np.uint64(0xFFFFFFFFFFFE)     # never equal to the padding

    def _contexts(self, data: TaskData, sym: np.ndarray, pos: np.ndarray, rows: np.ndarray):
        """Yields (order, context hash of each row in `rows`) for every order, ascending;
        `pos`: every row's position in its stream. The hash of order m is a rolling 64-bit hash
        of the row's m newest symbols (rows j-1 .. j-m, or j .. j-m+1 when the row's own event
        is an input: lifetime), padding before the stream's start, computed natively
        (native/forecast/contexts.c) order after order."""
        from ..native import Contexts
        hashes = Contexts(sym, rows, pos[rows], data.shift)
        for m in sorted(set(self.config["orders"])):
            yield m, hashes.next(m)

    def contexts(self, data: TaskData, orders=None) -> dict:
        """The context hash of every row of `data`, per order (`orders`, default the model's):
        what fit, predict_proba and recent_continuations compute; hashed once and passed to
        them, it serves several fits over the same data (the GRU's cross-fitted hints)."""
        sym, pos = self.symbols(data), data.position_in_stream()
        keep = set(orders or self.config["orders"])
        saved = self.config["orders"]
        self.config["orders"] = sorted(keep)
        try:
            return dict(self._contexts(data, sym, pos, np.arange(len(data))))
        finally:
            self.config["orders"] = saved

    def recent_continuations(self, data: TaskData, orders, contexts: dict | None = None) -> dict:
        """An in-run memory, per order k in `orders`: for every row, the label that followed the
        latest earlier occurrence of the row's order-k context in its own stream (-1: none yet).
        It only looks back at earlier labels, so it is causal for `next` and `free`, whose
        labels are known as soon as their event has happened (not for `lifetime`).
        `contexts`: this model's contexts() of `data` with these orders, if already hashed.
        One native pass per order (native.recent_continuations)."""
        from ..native import recent_continuations
        contexts = contexts if contexts is not None else self.contexts(data, orders)
        return {m: recent_continuations(contexts[m], data.labels, data.offsets)
                for m in sorted(set(orders))}

    def fit(self, data: TaskData, train: np.ndarray, contexts: dict | None = None,
            **options) -> dict:
        """Counts the labels of the rows where `train` is true per context (`contexts`: this
        model's contexts() of `data`, if already hashed)."""
        self.check_data(data, fitting=True)
        t0 = time.perf_counter()
        rows = np.flatnonzero(train & (data.labels >= 0))
        y = data.labels[rows]
        self.classes = np.unique(y)
        if len(self.classes) > 1 << _LABEL_BITS:   # (the vocabularies have at most 4,097)
            raise ValueError(f"the n-gram counts at most {1 << _LABEL_BITS:,} distinct labels "
                             f"(its table keys hold a label in {_LABEL_BITS} bits); these rows "
                             f"have {len(self.classes):,}")
        yc = np.searchsorted(self.classes, y).astype(np.uint64)
        self.unigram = np.bincount(yc.astype(np.int64), minlength=len(self.classes))
        self.tables = {}
        if contexts is not None:
            ctxs = ((m, contexts[m][rows]) for m in sorted(self.config["orders"]))
        else:
            ctxs = self._contexts(data, self.symbols(data), data.position_in_stream(), rows)
        dropped = 0
        for m, ctx in ctxs:
            self.tables[m], gone = self._count(ctx, yc)
            dropped += gone
        return {"events": int(train.sum()), "labels": int(len(rows)),
                "seconds": time.perf_counter() - t0,
                "contexts": int(sum(len(t["ctx"]) for t in self.tables.values())),
                "contexts_seen_once_dropped": dropped}

    def _count(self, ctx: np.ndarray, yc: np.ndarray) -> tuple[dict, int]:
        """The table of one order from its rows' contexts and label indexes (native count), and
        how many contexts seen once it left out (`prune_once`: see the module docstring)."""
        from ..native import count_labels
        keys = (ctx << np.uint64(_LABEL_BITS)) | yc
        keys.sort()
        wide = len(self.classes) >= np.iinfo(np.uint16).max
        c, n, d, tok, cnt = count_labels(keys, _LABEL_BITS, self.config["topk"], wide)
        del keys
        once = n == 1
        gone, twice = int(once.sum()), int((n == 2).sum())
        if not self.config["prune_once"] or gone <= _ONCE_SHARE * len(ctx) or \
                2 * twice >= _MEET_AGAIN * len(ctx):
            return self._table(c, n, d, tok, cnt), 0
        labels = np.repeat(~once, np.minimum(d, self.config["topk"]))
        return self._table(c[~once], n[~once], d[~once], tok[labels], cnt[labels]), gone

    def _table(self, ctx, n, d, tok, cnt) -> dict:
        """A table from its stored arrays, with `start`: where each context's labels begin in
        tok and cnt (E + 1 offsets; uint32 while they fit, half the memory of int64). Counts
        are held as uint32 and labels as uint16 (uint32 past 65,535), what the native
        prediction reads: a file of other integer types is converted here, once, not at every
        prediction."""
        n, d, cnt = (_unsigned(v, name, np.uint32) for v, name in ((n, "n"), (d, "d"),
                                                                     (cnt, "cnt")))
        if tok.dtype not in (np.uint16, np.uint32):
            wide = len(tok) and int(np.max(tok)) > np.iinfo(np.uint16).max
            tok = _unsigned(tok, "tok", np.uint32 if wide else np.uint16)
        kept = np.minimum(d, self.config["topk"])
        total = int(kept.sum(dtype=np.int64))
        start = np.zeros(len(kept) + 1, np.uint32 if total < 2**32 else np.int64)
        np.cumsum(kept, out=start[1:], dtype=start.dtype)
        if not (len(ctx) == len(n) == len(d)) or len(tok) != total or len(cnt) != total:
            raise ValueError(f"an n-gram table of {len(ctx)} contexts, {len(n)} counts and "
                             f"{len(d)} label counts holds {len(tok)} labels and {len(cnt)} "
                             f"counts, expected {total} of each")
        return {"ctx": ctx, "n": n, "d": d, "tok": tok, "cnt": cnt, "start": start}

    def dense_table(self, m: int) -> tuple[np.ndarray, np.ndarray]:
        """Order m's labels and counts as (contexts, topk) arrays, the padding label
        len(classes) with count 0 (the layout of the compiled policy's tables)."""
        t, kk = self.tables[m], self.config["topk"]
        start = t["start"].astype(np.int64)
        kept = np.diff(start)
        slot = np.arange(len(t["tok"])) - np.repeat(start[:-1], kept)
        row = np.repeat(np.arange(len(kept)), kept)
        tok = np.full((len(kept), kk), len(self.classes), t["tok"].dtype)
        cnt = np.zeros((len(kept), kk), np.uint32)
        tok[row, slot] = t["tok"]
        cnt[row, slot] = t["cnt"]
        return tok, cnt

    def restricted(self, orders) -> "NGram":
        """The same fitted model blending only `orders` (a subset of its own)."""
        out = NGram(self.task, self.vocab, {**self.config, "orders": sorted(orders)})
        out.classes, out.unigram = self.classes, self.unigram
        out.free_group, out.free_codes = self.free_group, self.free_codes
        out.tables = {m: self.tables[m] for m in out.config["orders"]}
        return out

    def predict(self, data: TaskData, rows: np.ndarray, k: int = 5) -> np.ndarray:
        return self.predict_proba(data, rows, k)[0]

    def predict_proba(self, data: TaskData, rows: np.ndarray, k: int = 5,
                      contexts: dict | None = None):
        """(labels, probabilities): the k most likely labels of each row (-1 padding) and their
        blended probabilities (float32). `contexts`: as for fit."""
        self.check_data(data)
        if contexts is None:
            sym, pos = self.symbols(data), data.position_in_stream()
        labels = np.empty((len(rows), k), np.int64)
        probs = np.zeros((len(rows), k), np.float32)
        base = self.unigram / max(self.unigram.sum(), 1)
        by_base = np.lexsort((np.arange(len(base)), -base)).astype(np.uint32)
        for s in range(0, len(rows), _CHUNK):
            chunk = rows[s:s + _CHUNK]
            ctxs = [(m, contexts[m][chunk]) for m in sorted(self.config["orders"])] \
                if contexts is not None else list(self._contexts(data, sym, pos, chunk))
            hits = [(t, _finder(t).find(ctx)) for m, ctx in reversed(ctxs)   # longest first
                    for t in (self.tables[m],) if len(t["ctx"])]
            best, score = ngram_topk(len(chunk), hits, base, by_base, k)
            labels[s:s + len(chunk)] = np.where(best >= 0, self.classes[np.maximum(best, 0)], -1) \
                if len(self.classes) else -1
            probs[s:s + len(chunk)] = score
        return labels, probs

    def tensors(self) -> dict:
        out = {"classes": self.classes.astype(np.int64), "unigram": self.unigram}
        for m, t in self.tables.items():
            for name in _STORED:
                out[f"order{m}.{name}"] = t[name]
        return out

    def load_tensors(self, tensors: dict) -> None:
        self.classes = np.asarray(tensors["classes"], np.int64)
        self.unigram = np.asarray(tensors["unigram"], np.int64)
        self.tables = {}
        for m in self.config["orders"]:
            ctx, n, d, tok, cnt = (np.asarray(tensors[f"order{m}.{name}"]) for name in _STORED)
            if tok.ndim == 2:   # version 1's dense layout: each context's first min(d, topk)
                keep = np.arange(tok.shape[1])[None, :] < np.minimum(d, tok.shape[1])[:, None]
                tok, cnt = tok[keep], cnt[keep]
            self.tables[int(m)] = self._table(ctx, n, d, tok, cnt)
