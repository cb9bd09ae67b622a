"""Token vocabularies: how heap events become the symbols that forecasting models read and predict.

Every event of a process becomes exactly one token (docs/vocabularies.md has the tables):

- `seed64` (version 1): the article's 64 classes. An allocation of `s` bytes is `s.bit_length()`
  (capped at 31); a free is `32 + bit_length(size of the block it frees)`, 32 when the block is
  unknown or the pointer NULL (the article's log parser did exactly this).
- `article` (version 1): what the article's code actually trained on by mistake:
  `seed64_token.bit_length()`, 7 coarse classes. For reproducing and exposing the bug only.
- `rich` (version 1): operation kind x fine size class (four classes per power of two), for the
  real task; 1002 tokens, uint16.

All encoders are vectorized over a process's events and need the block matching
(`heapcast.trace.blocks.match`) for the size of the block a free releases.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace.blocks import Blocks
from ..stats import size_classes
from ..trace.format import (ALIGNED_ALLOC, CALLOC, FREE, MALLOC, MEMALIGN, MMAP, MREMAP, MUNMAP,
                            POSIX_MEMALIGN, PVALLOC, REALLOC, REALLOCARRAY, VALLOC)
from .names import VOCAB_NAMES


@dataclass(frozen=True)
class Vocab:
    """A versioned token vocabulary: `size` tokens stored as `dtype`."""

    name: str
    version: int
    size: int
    dtype: str
    description: str

    def names(self) -> list:
        """A readable name for every token id (for per-class tables)."""
        return _NAMERS[self.name]()


# ---- seed64 and the article's buggy target -------------------------------------------------

SEED_FREE = 32          # first free class; 32 itself = free of a NULL/unknown/empty block
SEED_MAX_CLASS = 31     # the article's (mental) uint32 limit on sizes


def seed64_tokens(ev: np.ndarray, blocks: Blocks) -> np.ndarray:
    """The article's class of every event (uint8, 0..63); see the module docstring.

    Operations the article's logger did not see map by analogy: realloc and every other
    allocation like malloc (class of the new size), munmap like a free of `size` bytes.
    """
    op = ev["op"]
    alloc_cls = np.minimum(size_classes(ev["size"]), SEED_MAX_CLASS)
    freed_cls = np.minimum(size_classes(blocks.released_size), SEED_MAX_CLASS)
    tok = alloc_cls.astype(np.uint8)
    is_free = op == FREE
    tok[is_free] = SEED_FREE + freed_cls[is_free]
    unmap = op == MUNMAP
    tok[unmap] = SEED_FREE + alloc_cls[unmap]
    return tok


def article_target(seed64: np.ndarray) -> np.ndarray:
    """The target the article's code trained on: `class.bit_length()` of a seed64 class (0..6).

    0: malloc(0); 1: malloc(1); 2: 2-7 bytes; 3: 8-127; 4: 128-32767; 5: larger; 6: any free.
    """
    return size_classes(np.asarray(seed64)).astype(np.uint8)


# ---- rich ----------------------------------------------------------------------------------

#: Operation kinds of the rich vocabulary, in token order.
RICH_KINDS = ("malloc", "calloc", "realloc", "aligned", "free", "mmap", "munmap", "mremap")
RICH_SIZES = 125         # fine size classes: 0..7 exact, then 4 per power of two, last >= 2**32
RICH_FREE_NULL = len(RICH_KINDS) * RICH_SIZES       # free(NULL)
RICH_FREE_UNKNOWN = RICH_FREE_NULL + 1              # free of a block that was not live
RICH_SIZE = RICH_FREE_UNKNOWN + 1                   # 1002

_KIND_OF_OP = np.full(256, 0, np.int64)
_KIND_OF_OP[[MALLOC]] = 0
_KIND_OF_OP[[CALLOC]] = 1
_KIND_OF_OP[[REALLOC, REALLOCARRAY]] = 2
_KIND_OF_OP[[POSIX_MEMALIGN, ALIGNED_ALLOC, MEMALIGN, VALLOC, PVALLOC]] = 3
_KIND_OF_OP[FREE] = 4
_KIND_OF_OP[MMAP] = 5
_KIND_OF_OP[MUNMAP] = 6
_KIND_OF_OP[MREMAP] = 7


def fine_size_class(sizes: np.ndarray) -> np.ndarray:
    """Four size classes per power of two (int64, 0..124).

    0..7 bytes: the size itself. From 8 on, with e = bit_length - 1: 8 + 4 (e - 3) + the two bits
    after the leading one (16-19 -> 12, 20-23 -> 13, 24-27 -> 14, 28-31 -> 15, 32-39 -> 16, ...).
    Sizes of 2**32 and more share class 124.
    """
    s = np.asarray(sizes, np.uint64)
    bl = size_classes(s)
    e = np.maximum(bl - 1, 2)
    sub = ((s >> (e - 2).astype(np.uint64)) & np.uint64(3)).astype(np.int64)
    cls = np.where(bl <= 3, s.astype(np.int64), 8 + 4 * (e - 3) + sub)
    return np.where(bl > 32, RICH_SIZES - 1, cls)


def rich_tokens(ev: np.ndarray, blocks: Blocks, block: int = 1 << 20) -> np.ndarray:
    """The rich token of every event (uint16): kind * 125 + fine size class.

    Allocations (and mmap, mremap) use the requested size, a free the size of the block it
    releases, munmap its length; free(NULL) and frees of blocks that were not live have their
    own tokens. Computed `block` events at a time: at once, its int64 temporaries were 1.3 GB
    on a trace of 20M events, when featurize holds the most.
    """
    out = np.empty(len(ev), np.uint16)
    for s in range(0, len(ev), block):
        e = min(s + block, len(ev))
        op = ev["op"][s:e]
        is_free = op == FREE
        sizes = np.where(is_free, blocks.released_size[s:e], ev["size"][s:e])
        tok = _KIND_OF_OP[op] * RICH_SIZES + fine_size_class(sizes)
        known = blocks.alloc_of[s:e] != -1   # matched, or inherited from a fork parent
        tok[is_free & ~known] = RICH_FREE_UNKNOWN
        tok[is_free & (ev["old_addr"][s:e] == 0)] = RICH_FREE_NULL
        out[s:e] = tok
    return out


def _rich_lower_bounds() -> np.ndarray:
    """Smallest size of each fine size class."""
    lb = np.zeros(RICH_SIZES, np.uint64)
    lb[:8] = np.arange(8)
    for c in range(8, RICH_SIZES - 1):
        e, sub = 3 + (c - 8) // 4, (c - 8) % 4
        lb[c] = (1 << e) + sub * (1 << (e - 2))
    lb[-1] = 1 << 32
    return lb


def rich_to_seed64() -> np.ndarray:
    """For each rich token, the seed64 token of the same event (uint8 table, exact: a fine class
    never straddles a power of two)."""
    cls = np.minimum(size_classes(_rich_lower_bounds()), SEED_MAX_CLASS).astype(np.uint8)
    table = np.empty(RICH_SIZE, np.uint8)
    for k, kind in enumerate(RICH_KINDS):
        free_like = kind in ("free", "munmap")
        table[k * RICH_SIZES:(k + 1) * RICH_SIZES] = cls + (SEED_FREE if free_like else 0)
    table[RICH_FREE_NULL] = table[RICH_FREE_UNKNOWN] = SEED_FREE
    return table


def is_allocation_token(vocab: str, tokens: np.ndarray) -> np.ndarray:
    """Whether each token stands for an allocation (what 'allocation-only accuracy' counts)."""
    t = np.asarray(tokens, np.int64)
    if vocab == "seed64":
        return t < SEED_FREE
    if vocab == "rich":
        kind = t // RICH_SIZES
        return (kind <= 3) | (kind == 5) | (kind == 7)
    if vocab == "article":
        return t < 6
    raise ValueError(f"unknown vocabulary {vocab!r}")


# ---- names ---------------------------------------------------------------------------------

def _range_name(lo: int, hi: int) -> str:
    return str(lo) if hi == lo else f"{lo}-{hi}"


def _seed64_names() -> list:
    out = []
    for c in range(64):
        k = c % 32
        rng = "0" if k == 0 else _range_name(1 << (k - 1), (1 << k) - 1)
        if k == SEED_MAX_CLASS:
            rng = f">={1 << (k - 1)}"
        out.append(f"malloc {rng}" if c < 32 else ("free ?/0" if k == 0 else f"free {rng}"))
    return out


def _article_names() -> list:
    return ["malloc 0", "malloc 1", "malloc 2-7", "malloc 8-127", "malloc 128-32767",
            "malloc >=32768", "free"]


def _rich_names() -> list:
    lb = _rich_lower_bounds().tolist()
    ranges = [_range_name(lb[c], lb[c + 1] - 1) for c in range(RICH_SIZES - 1)] + [">=4294967296"]
    out = [f"{kind} {r}" for kind in RICH_KINDS for r in ranges]
    return out + ["free NULL", "free unknown"]


_NAMERS = {"seed64": _seed64_names, "article": _article_names, "rich": _rich_names}

VOCABS = {
    "seed64": Vocab("seed64", 1, 64, "uint8", "the article's 64 classes: bit_length of the size, "
                    "+32 for frees"),
    "article": Vocab("article", 1, 7, "uint8", "the article's buggy target: seed64.bit_length()"),
    "rich": Vocab("rich", 1, RICH_SIZE, "uint16", "op kind x 4 size classes per power of two"),
}


assert tuple(VOCABS) == VOCAB_NAMES, "heapcast.forecast.names.VOCAB_NAMES lists every vocabulary"


def get_vocab(name: str) -> Vocab:
    """The vocabulary called `name`; ValueError listing the known ones otherwise."""
    try:
        return VOCABS[name]
    except KeyError:
        raise ValueError(f"unknown vocabulary {name!r} (known: {', '.join(VOCABS)})") from None
