"""Forecasting tasks: what is predicted at which row of the event streams, from what.

- `next`: the token of event j, from the events before it in its stream (the article's task).
- `free`: at a free of a known block, which live block it releases, named from either end of the
  recency order (free_label: the youngest FREE_YOUNG and the oldest FREE_OLD blocks each have a
  label; others share FREE_BEYOND, never counted right), from the events before it. Needs
  process-order streams to be meaningful. With a grouping (FREE_GROUPS: `class`, `site`) the
  order is that of the freed block's own size class or call site, and the label names the group
  too: one label per (group, end label) pair of the model's code table (free_code_table).
- `lifetime`: the lifetime class of the block allocated by event j, from that allocation itself
  (its token, call site) and the events before it.

A TaskData is what models read: per-row inputs (token, call-site key, time-delta bucket), a
label per row (-1: nothing to predict there) and the stream boundaries.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .features import Features
from .lifetime import LIFETIME_CLASSES
from .names import FREE_GROUPS, TASKS  # noqa: F401 (re-exported)
from .vocab import get_vocab

#: `free` labels (docs/vocabularies.md, "Free labels", version 2): 0..FREE_YOUNG-1 name the
#: youngest live blocks (LIFO end), FREE_YOUNG..FREE_BEYOND-1 the oldest (FIFO end).
FREE_YOUNG = 64
FREE_OLD = 64
FREE_BEYOND = FREE_YOUNG + FREE_OLD
FREE_LABELS_VERSION = 2
#: At most this many (group, end label) pairs get a label of their own in a grouped label space.
FREE_CODES_MAX = 4096
#: The stream order each task uses by default.
DEFAULT_ORDER = {"next": "thread", "free": "process", "lifetime": "process"}


@dataclass
class TaskData:
    """Inputs and labels of one task over some streams (rows = events in stream order)."""

    task: str
    vocab: str
    tokens: np.ndarray       # vocabulary tokens of the events (uint8/uint16)
    sites: np.ndarray        # uint32 call-site keys
    dt: np.ndarray           # uint8 time-delta buckets
    labels: np.ndarray       # int64 label per row, -1 where nothing is predicted
    offsets: np.ndarray      # int64 stream boundaries
    ts: np.ndarray           # uint64 event times (time split)
    proc: np.ndarray         # uint16 process numbers (time split)
    life: np.ndarray         # int64 lifetime in events (causal baselines), -1 none/never
    free_codes: np.ndarray | None = None   # grouped `free` labels: the code of each label
    free_group: str = "all"                # how `free` labels group the live blocks

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def n_labels(self) -> int:
        return n_labels(self.task, self.vocab, self.free_codes)

    @property
    def beyond(self) -> int:
        """The `free` label that names no block (never counted right); -1 for other tasks."""
        return self.n_labels - 1 if self.task == "free" else -1

    @property
    def shift(self) -> bool:
        """True when row j is predicted from rows before it only (next, free); False when the
        row's own event is an input too (lifetime: the allocation is known when it happens)."""
        return self.task != "lifetime"

    def position_in_stream(self) -> np.ndarray:
        lengths = np.diff(self.offsets)
        return np.arange(len(self), dtype=np.int64) - np.repeat(self.offsets[:-1], lengths)

    def select(self, mask: np.ndarray) -> "TaskData":
        """The rows where `mask` is true, as streams: a new stream starts at every original
        stream start and after every gap (so a prefix of each stream stays one stream)."""
        rows = np.flatnonzero(mask)
        starts = np.zeros(len(self), bool)
        starts[self.offsets[:-1][self.offsets[:-1] < len(self)]] = True
        new_start = starts[rows].copy()
        if len(rows):
            new_start[0] = True
            new_start[1:] |= np.diff(rows) != 1
        offsets = np.append(np.flatnonzero(new_start), len(rows)).astype(np.int64)
        return replace(self, tokens=self.tokens[rows], sites=self.sites[rows], dt=self.dt[rows],
                       labels=self.labels[rows], offsets=offsets, ts=self.ts[rows],
                       proc=self.proc[rows], life=self.life[rows])


def n_labels(task: str, vocab: str, free_codes: np.ndarray | None = None) -> int:
    """Number of label classes of a task (a grouped `free`: one per code, plus `beyond`)."""
    if task == "next":
        return get_vocab(vocab).size
    if task == "free":
        return FREE_BEYOND + 1 if free_codes is None else len(free_codes) + 1
    if task == "lifetime":
        return len(LIFETIME_CLASSES)
    raise ValueError(f"unknown task {task!r} (known: {', '.join(TASKS)})")


def label_names(task: str, vocab: str, free_group: str = "all",
                free_codes: np.ndarray | None = None) -> list:
    """A name for every label class."""
    if task == "next":
        return get_vocab(vocab).names()
    if task == "free":
        ends = ([f"youngest {r}" for r in range(FREE_YOUNG)]
                + [f"oldest {r}" for r in range(FREE_OLD)])
        if free_codes is None:
            return ends + ["beyond"]
        group = (lambda k: f"class {k}") if free_group == "class" else (lambda k: f"site {k:08x}")
        return [f"{group(int(c) // FREE_BEYOND)}, {ends[int(c) % FREE_BEYOND]}"
                for c in free_codes] + ["beyond"]
    return list(LIFETIME_CLASSES)


def free_label(rank, live) -> np.ndarray:
    """The `free` label of frees of the block of recency rank `rank` (0: the youngest live
    block) among `live` live blocks (the freed one included); -1 where rank < 0 (no label).

    The block is named from the nearer end of the recency order: label `rank` when rank <=
    older (older = live - 1 - rank, how many live blocks are older; ties go to the young end),
    else FREE_YOUNG + older; FREE_BEYOND when that number is beyond its end's labels. So a LIFO
    stack frees label 0, a FIFO queue of any length label FREE_YOUNG (its oldest block).
    Vectorized over arrays; a native runtime computes the same from its live count."""
    rank = np.asarray(rank, np.int64)
    older = np.asarray(live, np.int64) - 1 - rank
    young_end = np.where(rank < FREE_YOUNG, rank, FREE_BEYOND)
    old_end = np.where(older < FREE_OLD, FREE_YOUNG + older, FREE_BEYOND)
    return np.where(rank < 0, -1, np.where(rank <= older, young_end, old_end))


def free_label_rank(label, live) -> np.ndarray:
    """The inverse of free_label: the recency rank (0: youngest) of the block a `free` label
    names when `live` blocks are live; -1 where it names none (FREE_BEYOND, or past the live
    blocks)."""
    label = np.asarray(label, np.int64)
    live = np.asarray(live, np.int64)
    rank = np.where(label < FREE_YOUNG, label, live - 1 - (label - FREE_YOUNG))
    ok = (label >= 0) & (label < FREE_BEYOND) & (rank >= 0) & (rank < live)
    return np.where(ok, rank, -1)


def free_block_codes(cols: dict, group: str) -> np.ndarray:
    """Per row of feature columns `cols`, the code of the block a grouped free releases: group
    key * FREE_BEYOND + its end label within the group (free_label over the group's live blocks),
    where the group key is the size class (`class`) or the call-site key (`site`) of the freed
    block; -2 where the block is beyond both ends of its group's order; -1: not such a free."""
    if group not in FREE_GROUPS[1:]:
        raise ValueError(f"unknown free grouping {group!r} (known: {', '.join(FREE_GROUPS[1:])})")
    need = (f"free_{group}", f"free_{group}_rank", f"free_{group}_live")
    if any(c not in cols for c in need):
        raise ValueError("features without ranks within call sites and size classes (a dataset "
                         "of an older heapcast, or need_ranks=False): build them again")
    within = free_label(cols[need[1]], cols[need[2]])
    code = cols[need[0]].astype(np.int64) * FREE_BEYOND + within
    return np.where(within < 0, -1, np.where(within == FREE_BEYOND, -2, code))


def free_code_table(feats: Features, group: str, rows: np.ndarray | None = None,
                    limit: int = FREE_CODES_MAX) -> np.ndarray:
    """The label space of grouped frees learned from `rows` (bool mask; all rows if None): the
    `limit` most frequent codes (free_block_codes; ties: lower code first), sorted ascending. A model
    keeps it: label i names codes[i], and a code outside it is `beyond`."""
    code = free_block_codes(feats.columns, group)
    if rows is not None:
        code = code[rows]
    seen, counts = np.unique(code[code >= 0], return_counts=True)
    keep = np.lexsort((seen, -counts))[:limit]
    return np.sort(seen[keep]).astype(np.int64)


def grouped_free_labels(codes: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Labels of `codes` (free_block_codes) in the label space `table` (free_code_table): the index
    of the code in the table, len(table) (`beyond`) where it is not there, -1 kept."""
    if not len(table):
        return np.where(codes == -1, -1, 0)
    i = np.minimum(np.searchsorted(table, codes), len(table) - 1)
    return np.where(codes == -1, -1, np.where(table[i] == codes, i, len(table)))


def rank_groupings(task: str, free_group: str | None = "all"):
    """What featurize's `need_ranks` must be for `task` with `free_group` (None: not chosen
    yet, so every grouping)."""
    if task != "free":
        return False
    return True if free_group is None else ("all", free_group)


def make_task_for(feats: Features, model) -> TaskData:
    """The TaskData `model` (a model, or anything with its task, vocab, free_group and
    free_codes) reads over `feats`."""
    return make_task(feats, model.task, model.vocab, getattr(model, "free_group", "all"),
                     getattr(model, "free_codes", None))


def make_task(feats: Features, task: str, vocab: str = "rich", free_group: str = "all",
              free_table: np.ndarray | None = None) -> TaskData:
    """The TaskData of `task` over `feats`, with tokens of vocabulary `vocab`; for a grouped
    `free` (free_group `class` or `site`) labels in the label space `free_table`."""
    get_vocab(vocab)
    if vocab not in feats.columns:
        raise ValueError(f"vocabulary {vocab!r} is not a token column of these features")
    cols = feats.columns
    tokens = cols[vocab]
    if task == "next":
        labels = tokens.astype(np.int64)
    elif task == "free":
        if "free_rank" not in cols or "free_live" not in cols:
            raise ValueError("features were built without free ranks (need_ranks=False)")
        if free_group == "all":
            labels = free_label(cols["free_rank"], cols["free_live"])
        elif free_table is None:
            raise ValueError(f"grouped free labels ({free_group!r}) need their code table")
        else:
            labels = grouped_free_labels(free_block_codes(cols, free_group), free_table)
    elif task == "lifetime":
        labels = cols["lifetime_class"].astype(np.int64)
    else:
        raise ValueError(f"unknown task {task!r} (known: {', '.join(TASKS)})")
    grouped = task == "free" and free_group != "all"
    return TaskData(task, vocab, tokens, cols["site"], cols["dt"], labels, feats.offsets,
                    cols["ts"], cols["proc"], cols["lifetime_events"],
                    np.asarray(free_table, np.int64) if grouped else None,
                    free_group if grouped else "all")
