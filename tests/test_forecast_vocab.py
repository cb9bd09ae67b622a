"""Token vocabularies and lifetime labels, checked against hand-computed examples."""
import numpy as np
import pytest

from heapcast.forecast.features import featurize
from heapcast.forecast.lifetime import lifetime_classes, lifetime_labels
from heapcast.forecast.vocab import (RICH_FREE_NULL, RICH_FREE_UNKNOWN, RICH_SIZE, VOCABS,
                                     article_target, fine_size_class, get_vocab,
                                     is_allocation_token, rich_to_seed64, rich_tokens,
                                     seed64_tokens)
from heapcast.trace.blocks import match
from heapcast.trace.format import EVENT_DTYPE, OP
from heapcast.trace.model import LocationTable, Process, Trace


def events(rows):
    arr = np.zeros(len(rows), EVENT_DTYPE)
    for i, r in enumerate(rows):
        for k, v in r.items():
            arr[i][k] = OP[v] if k == "op" else v
    arr["seq"] = np.arange(1, len(rows) + 1)
    arr["ts"] = 1000 * np.arange(1, len(rows) + 1)
    return arr


A, B, C, D = 0x1000, 0x2000, 0x3000, 0x4000
ROWS = [
    dict(op="malloc", size=0, addr=A),                         # seed 0   rich 0
    dict(op="malloc", size=1, addr=D),                         # seed 1   rich 1
    dict(op="malloc", size=24, addr=B),                        # seed 5   rich 14 (24-27)
    dict(op="calloc", size=100, arg=10, addr=0x5000),          # seed 7   rich 125 + 22 (96-111)
    dict(op="free", old_addr=B),                               # seed 37  rich 500 + 14
    dict(op="free", old_addr=0),                               # seed 32  rich free NULL
    dict(op="free", old_addr=0x9999),                          # seed 32  rich free unknown
    dict(op="realloc", old_addr=A, addr=C, size=4096, free_lag=1),   # seed 13  rich 250 + 44
    dict(op="posix_memalign", size=64, arg=16, addr=0x6000),   # seed 7   rich 375 + 20
    dict(op="free", old_addr=C),                               # seed 45  rich 500 + 44
    dict(op="malloc", size=1 << 40, addr=0x7000),              # seed 31 (capped), rich 124
    dict(op="free", old_addr=D),                               # seed 33  rich 501
]
SEED = [0, 1, 5, 7, 37, 32, 32, 13, 7, 45, 31, 33]
RICH = [0, 1, 14, 147, 514, RICH_FREE_NULL, RICH_FREE_UNKNOWN, 294, 395, 544, 124, 501]
# The article's buggy target: bit_length of the class: 0 malloc(0), 1 malloc(1), 2: 2-7 bytes,
# 3: 8-127, 4: 128-32767, 5: larger, 6: any free.
ARTICLE = [0, 1, 3, 3, 6, 6, 6, 4, 3, 6, 5, 6]


def test_seed64_and_rich_tokens_by_hand():
    ev = events(ROWS)
    b = match(ev)
    assert seed64_tokens(ev, b).tolist() == SEED
    assert rich_tokens(ev, b).tolist() == RICH
    assert seed64_tokens(ev, b).dtype == np.uint8 and rich_tokens(ev, b).dtype == np.uint16
    for block in (1, 5, len(ROWS) - 1):      # computed in blocks, the same tokens
        assert rich_tokens(ev, b, block).tolist() == RICH, block


def test_article_target_is_bit_length_of_the_class():
    assert article_target(np.array(SEED)).tolist() == ARTICLE
    # Every seed64 class maps onto one of 7 coarse targets; every free onto the same one.
    t = article_target(np.arange(64))
    assert sorted(set(t.tolist())) == list(range(7))
    assert (t[32:] == 6).all()
    assert t[:8].tolist() == [0, 1, 2, 2, 3, 3, 3, 3]
    assert (t[8:16] == 4).all() and (t[16:32] == 5).all()


def test_fine_size_classes_four_per_power_of_two():
    sizes = np.array([0, 7, 8, 9, 10, 15, 16, 20, 24, 28, 31, 32, 40, 100, 2**31, 2**32 - 1,
                      2**32, 2**64 - 1], np.uint64)
    assert fine_size_class(sizes).tolist() == [0, 7, 8, 8, 9, 11, 12, 13, 14, 15, 15, 16, 17,
                                               22, 120, 123, 124, 124]
    names = VOCABS["rich"].names()
    assert len(names) == RICH_SIZE == get_vocab("rich").size
    assert names[14] == "malloc 24-27" and names[514] == "free 24-27"
    assert names[RICH_FREE_NULL] == "free NULL"


def test_rich_projects_exactly_onto_seed64():
    rng = np.random.default_rng(1)
    sizes = np.concatenate([np.arange(0, 5000), rng.integers(0, 2**40, 5000)]).astype(np.uint64)
    rows = [dict(op="malloc", size=int(s), addr=0x10000 + 16 * i) for i, s in enumerate(sizes)]
    rows += [dict(op="free", old_addr=0x10000 + 16 * i) for i in range(len(sizes))]
    ev = events(rows)
    b = match(ev)
    assert (rich_to_seed64()[rich_tokens(ev, b)] == seed64_tokens(ev, b)).all()


def test_allocation_tokens():
    assert is_allocation_token("seed64", np.array(SEED)).tolist() == \
        [True] * 4 + [False] * 3 + [True, True, False, True, False]
    assert is_allocation_token("rich", np.array(RICH)).tolist() == \
        [True] * 4 + [False] * 3 + [True, True, False, True, False]


def test_lifetime_labels_and_classes():
    # Block X lives 2 events, Y 20, Z is never freed; lifetimes in events and ns (ts = 1000 i).
    rows = [dict(op="malloc", size=8, addr=0x10), dict(op="malloc", size=8, addr=0x20),
            dict(op="free", old_addr=0x10)]
    rows += [dict(op="free", old_addr=0) for _ in range(18)]
    rows += [dict(op="free", old_addr=0x20), dict(op="malloc", size=8, addr=0x30)]
    ev = events(rows)
    life = lifetime_labels(ev, match(ev))
    assert life["events"][[0, 1, 22]].tolist() == [2, 20, -1]
    assert life["ns"][[0, 1, 22]].tolist() == [2000, 20000, -1]
    assert life["cls"][[0, 1, 22]].tolist() == [0, 1, 5]
    assert (life["cls"][2:22] == -1).all()                      # not allocations
    assert life["ns_cls"][[0, 1, 22]].tolist() == [1, 2, 8]     # 1-10us, 10-100us, never
    assert lifetime_classes(np.array([1, 15, 16, 255, 256, 4095, 4096, 65535, 65536, -1]),
                            np.ones(10, bool)).tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 5]


def test_featurize_thread_streams_and_columns():
    rows = [dict(op="malloc", size=8, addr=0x10, tid=0),
            dict(op="malloc", size=16, addr=0x20, tid=1),
            dict(op="free", old_addr=0x10, tid=1), dict(op="free", old_addr=0x20, tid=0)]
    ev = events(rows)
    p = Process(index=0, pid=7, _events=ev, event_count=4, locations=LocationTable.from_lists([[]]))
    f = featurize([Trace("mem", [p])], order="thread")
    # Thread 0's events, then thread 1's, each in seq order.
    assert f.offsets.tolist() == [0, 2, 4]
    assert f.columns["seed64"].tolist() == [4, 32 + 5, 5, 32 + 4]
    assert f.columns["tid"].tolist() == [0, 0, 1, 1]
    assert f.columns["lifetime_events"].tolist() == [2, -1, 2, -1]
    # dt: bit_length of ns since the previous event of the same stream (0 at stream starts).
    assert f.columns["dt"].tolist() == [0, (3000).bit_length(), 0, (1000).bit_length()]
    g = featurize([Trace("mem", [p])], order="process")
    assert g.offsets.tolist() == [0, 4] and g.columns["free_rank"].tolist() == [-1, -1, 1, 0]


def test_unknown_vocabulary_is_refused():
    with pytest.raises(ValueError, match="unknown vocabulary"):
        get_vocab("nope")
