"""Features: free ranks against a simulated live list, stable call-site keys, datasets on disk."""
import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from heapcast.forecast.dataset import build_dataset, load_dataset, load_features
from heapcast.forecast.features import free_ranks, location_keys
from heapcast.forecast.native import group_ranks
from heapcast.trace.blocks import match
from heapcast.trace.format import EVENT_DTYPE, FREE, MALLOC, REALLOC
from heapcast.trace.model import LocationTable, Module, ModuleSnapshot, Process
from heapcast.trace.writer import write_process_file


def random_heap(rng, n):
    """Random mallocs, frees (LIFO-ish or anywhere) and moving reallocs, with the recency rank of
    every free and the live count before it, computed by simulating the live list."""
    live, rows, ranks, lives, addr = [], [], [], [], 0x1000
    for _ in range(n):
        r = rng.random()
        if live and r < 0.45:
            j = len(live) - 1 - int(rng.integers(min(len(live), 3))) if rng.random() < 0.7 \
                else int(rng.integers(len(live)))
            rows.append((FREE, 0, live[j], 0))
            ranks.append(len(live) - 1 - j)
            lives.append(len(live))
            live.pop(j)
        elif live and r < 0.5:
            old = live.pop(int(rng.integers(len(live))))
            addr += 16
            rows.append((REALLOC, addr, old, 32))
            ranks.append(-1)
            lives.append(-1)
            live.append(addr)
        else:
            addr += 16
            rows.append((MALLOC, addr, 0, 8))
            ranks.append(-1)
            lives.append(-1)
            live.append(addr)
    ev = np.zeros(len(rows), EVENT_DTYPE)
    # A realloc takes two numbers (its release is at seq - 1): leave a gap before every event.
    ev["seq"] = 2 * np.arange(1, len(rows) + 1)
    ev["free_lag"] = np.where([r[0] == REALLOC for r in rows], 1, 0)
    for k, name in enumerate(("op", "addr", "old_addr", "size")):
        ev[name] = [r[k] for r in rows]
    return ev, np.array(ranks), np.array(lives)


def test_free_ranks_match_a_simulated_live_list():
    rng = np.random.default_rng(3)
    for _ in range(5):
        ev, expected, lives = random_heap(rng, 4000)
        rank, live = free_ranks(ev["op"], match(ev))
        assert (rank == expected).all() and (live == lives).all()


def test_free_ranks_within_groups_match_a_simulated_live_list_per_group():
    """free_ranks with a group per acquisition (bench/free_groups.py: call site or size class)
    counts only the freed block's group; a moving realloc releases in the old block's group and
    acquires in its own."""
    rng = np.random.default_rng(5)
    for _ in range(3):
        ev, _, _ = random_heap(rng, 3000)
        blocks = match(ev)
        group = rng.integers(0, 3, len(ev))
        want_rank, want_live = np.full(len(ev), -1), np.full(len(ev), -1)
        live: dict = {}
        for i in range(len(ev)):
            a = int(blocks.alloc_of[i])
            if blocks.releases[i] and a >= 0:
                same = live[group[a]]
                if ev["op"][i] == FREE:
                    want_rank[i], want_live[i] = len(same) - 1 - same.index(a), len(same)
                same.remove(a)
            if blocks.acquires[i]:
                live.setdefault(group[i], []).append(i)
        rank, live_count = free_ranks(ev["op"], blocks, group)
        assert (rank == want_rank).all() and (live_count == want_live).all()


def test_group_ranks_refuses_a_release_of_no_earlier_acquisition():
    """The native pass checks what it is given before it counts (a caller's own arrays)."""
    acq, rel = np.array([True, False, False]), np.array([False, True, True])
    rank, live = np.full(3, -1, np.int32), np.full(3, -1, np.int32)
    for alloc_of in ([-1, 2, -1], [-1, 1, -1], [-1, -1, 1]):   # later, itself, no acquisition
        with pytest.raises(ValueError, match="names no earlier acquisition"):
            group_ranks(acq, rel, np.array(alloc_of), None, rel, rank, live)
    assert rank.tolist() == [-1, -1, -1]
    group_ranks(acq, rel, np.array([-1, 0, -2]), None, rel, rank, live)   # -2: inherited
    assert rank.tolist() == [-1, 0, -1] and live.tolist() == [-1, 1, -1]
    with pytest.raises(ValueError, match="3 events in every array"):
        group_ranks(acq, rel, np.array([-1, 0]), None, rel, rank, live)


def process_at(base, pid=1):
    """A process whose two call sites are at offsets 0x100 and 0x200 of /bin/prog loaded at
    `base`; location 3 is a two-frame stack."""
    mods = [Module("/bin/prog", base, base, base + 0x10000),
            Module("/lib/libc.so.6", base + 0x100000, base + 0x100000, base + 0x200000)]
    locs = LocationTable.from_lists([[], [base + 0x100], [base + 0x200],
                                     [base + 0x100, base + 0x100000 + 0x55]])
    return Process(index=0, pid=pid, locations=locs, modules=[ModuleSnapshot(0, mods)],
                   _events=np.zeros(0, EVENT_DTYPE))


def test_location_keys_are_stable_across_aslr():
    s1, k1 = location_keys(process_at(0x555500000000))
    s2, k2 = location_keys(process_at(0x7F0000000000))
    assert s1.tolist() == s2.tolist() and k1.tolist() == k2.tolist()
    assert s1[0] == 0 and k1[0] == 0                   # unknown location
    assert len(set(s1[1:].tolist())) == 2               # two distinct call sites
    assert s1[3] == s1[1] and k1[3] != k1[1]            # same call site, another stack


def small_trace(tmp_path, name="t", n=300, ts=None):
    """A trace directory on disk (the real file format) with two threads (`ts`: the events'
    times, default every 100 ns)."""
    rows = []
    for i in range(n):
        rows.append(dict(op=MALLOC, size=16 + (i % 5) * 8, addr=0x1000 + 16 * i, tid=i % 2, loc=1))
        rows.append(dict(op=FREE, old_addr=0x1000 + 16 * i, tid=i % 2, loc=2))
    ev = np.zeros(len(rows), EVENT_DTYPE)
    for i, r in enumerate(rows):
        for k, v in r.items():
            ev[i][k] = v
    ev["seq"] = np.arange(1, len(ev) + 1)
    ev["ts"] = 10_000 + 100 * np.arange(len(ev)) if ts is None else ts
    p = process_at(0x400000)
    p._events = None
    d = tmp_path / name
    d.mkdir()
    write_process_file(d / "1.hct", p, ev)
    return d


def test_dataset_round_trip(tmp_path):
    src = small_trace(tmp_path)
    out = build_dataset([src], tmp_path / "ds", order="thread")
    manifest = json.loads((out / "dataset.json").read_text())
    assert manifest["events"] == 600 and manifest["streams"] == 2
    assert manifest["vocabularies"]["seed64"] == 1 and manifest["order"] == "thread"
    d = load_dataset(out)
    assert isinstance(d.columns["rich"], np.memmap)
    direct = load_features([src], "thread", need_ranks=True)
    for c, arr in direct.columns.items():
        assert np.array_equal(np.asarray(d.columns[c]), arr), c
    table = pq.read_table(out / "events.parquet")
    assert table.num_rows == 600
    assert table.column("seed64").to_pylist() == d.columns["seed64"].tolist()
    # A dataset is accepted where a trace is, in its own stream order only.
    assert np.array_equal(load_features([out], "thread").columns["rich"], direct.columns["rich"])
    with pytest.raises(ValueError, match="thread-order streams"):
        load_features([out], "process")
    with pytest.raises(FileExistsError):
        build_dataset([src], out)


def test_a_process_whose_metadata_counts_more_events_than_it_holds_is_an_error(tmp_path):
    """Events missing from what a process's metadata counts are an error that names the file,
    not rows of zeros (featurize, and a dataset, would have taken them as events); the dataset
    directory is not left behind."""
    from heapcast.trace.format import TraceError
    from heapcast.trace.reader import load
    src = small_trace(tmp_path)
    for extra in (50, -50):
        trace = load(src)
        trace.processes[0].event_count += extra
        with pytest.raises(TraceError, match=rf"1\.hct: EVENTS blocks hold (more than )?600 "
                                             rf"events, expected {600 + extra} \(META\)"):
            trace.processes[0].events
        trace.processes[0]._events = None
        with pytest.raises(TraceError, match="expected"):
            build_dataset([trace], tmp_path / "ds", order="process", parquet=False)
        assert not (tmp_path / "ds").exists()


def test_features_carry_the_rank_columns_asked_for_only(tmp_path):
    """need_ranks False (the next and lifetime tasks) computes no rank column (it computed the
    global ones all the same: a second per million events for nothing); a grouping asks for the
    global ranks and its own."""
    from heapcast.forecast.features import RANK_COLUMNS
    src = small_trace(tmp_path)
    assert not set(RANK_COLUMNS) & set(load_features([src], "thread").columns)
    site = load_features([src], "thread", need_ranks=("site",)).columns
    assert {"free_rank", "free_live", "free_site", "free_site_rank"} <= set(site)
    assert "free_class" not in site
    full = load_features([src], "thread", need_ranks=True).columns
    assert set(RANK_COLUMNS) <= set(full)
    for c in site:
        assert np.array_equal(site[c], full[c]), c


def test_time_deltas_are_bit_lengths_of_each_streams_gaps_in_any_block_size(tmp_path):
    """dt: bit_length of the ns since the stream's previous row, 0 at its start and where time
    went back (threads' clocks), computed in blocks without changing a value."""
    from heapcast.forecast.features import _time_deltas
    rng = np.random.default_rng(5)
    ts = 10_000 + np.cumsum(rng.integers(0, 1 << rng.integers(1, 40, 600), dtype=np.int64))
    ts[[50, 51, 300]] = ts[[50, 51, 300]] - 5_000     # a few steps back
    feats = load_features([small_trace(tmp_path, ts=ts)], "thread")
    t = feats.columns["ts"].astype(np.int64)
    want = np.zeros(len(t), np.int64)
    want[1:] = [max(int(b) - int(a), 0).bit_length() for a, b in zip(t[:-1], t[1:])]
    want[feats.stream_starts()] = 0
    assert len(set(want.tolist())) > 10 and np.array_equal(feats.columns["dt"], want)
    for block in (1, 7, 64, 599, 600, 1 << 20):
        assert np.array_equal(_time_deltas(feats, block), want), block
