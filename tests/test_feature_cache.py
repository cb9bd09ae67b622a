"""Features kept in a trace's directory (heapcast.forecast.feature_cache): the forecasting
commands featurize a trace once, read back exactly what featurize computes, and never features
of another trace, code or option."""
import os
import stat
import time

import numpy as np
import pytest

from heapcast.forecast import feature_cache, features
from heapcast.forecast.features import featurize


@pytest.fixture(scope="module")
def runs(build, tmp_path_factory):
    from conftest import record_inputs
    d = tmp_path_factory.mktemp("featcache")
    return record_inputs(build("forecast_work"), d, (("a", 3000, 1), ("b", 2000, 2)))


def fresh(trace_dir):
    """Removes the trace's kept results."""
    for p in (trace_dir / ".cache").glob("*") if (trace_dir / ".cache").exists() else []:
        p.unlink()


def same(a, b):
    assert a.order == b.order and a.sources == b.sources
    assert np.array_equal(a.offsets, b.offsets) and a.offsets.dtype == b.offsets.dtype
    assert list(a.columns) == list(b.columns)
    for c in a.columns:
        assert a.columns[c].dtype == b.columns[c].dtype, c
        assert np.array_equal(a.columns[c], b.columns[c]), c
        assert b.columns[c].flags.writeable, c


def entries(trace_dir):
    return sorted((trace_dir / ".cache").glob("features-*.hcf"))


def no_build(monkeypatch):
    """Makes featurize fail if it computes features instead of reading them back."""
    def computed(*a, **k):
        raise AssertionError("featurized again")
    monkeypatch.setattr(features, "_build", computed)


@pytest.mark.parametrize("order,ranks", [("thread", False), ("process", True),
                                         ("process", ("site",))])
def test_kept_features_are_what_featurize_computes(runs, monkeypatch, order, ranks):
    t = runs["a"]
    fresh(t)
    monkeypatch.setenv("HEAPCAST_CACHE", "0")
    reference = featurize([t], order, ranks)
    assert not (t / ".cache").exists() or not entries(t)
    monkeypatch.delenv("HEAPCAST_CACHE")
    first = featurize([t], order, ranks)        # computed, then kept
    same(reference, first)
    (entry,) = entries(t)
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600
    assert entry.stat().st_size < 16 * len(reference)   # compressed: bytes per row
    featurize([runs["b"]], order, ranks)
    with monkeypatch.context() as m:
        no_build(m)
        same(reference, featurize([t], order, ranks))
        # several traces: processes numbered one after the other, as without the cache
        both = featurize([t, runs["b"]], order, ranks)
    monkeypatch.setenv("HEAPCAST_CACHE", "0")
    same(featurize([t, runs["b"]], order, ranks), both)
    monkeypatch.delenv("HEAPCAST_CACHE")
    assert sorted(set(both.columns["proc"].tolist())) == [0, 1]


def test_each_order_and_rank_choice_keeps_one_entry_and_a_changed_trace_is_computed_again(
        runs, monkeypatch):
    t = runs["b"]
    fresh(t)
    featurize([t], "thread", False)
    featurize([t], "process", False)
    assert len(entries(t)) == 2
    featurize([t], "thread", False)
    assert len(entries(t)) == 2                 # read back, nothing added
    # The trace changes (its file's time here): computed again, and the entry replaced.
    hct = next(t.glob("*.hct"))
    st = hct.stat()
    os.utime(hct, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    calls = []
    real = features._build
    monkeypatch.setattr(features, "_build", lambda *a, **k: calls.append(1) or real(*a, **k))
    featurize([t], "thread", False)
    assert calls == [1] and len(entries(t)) == 2


def test_a_trace_keeps_its_most_recently_used_entries(runs, monkeypatch):
    """At most MAX_ENTRIES feature entries per trace: a new one pushes out the one used least
    recently, and reading an entry back counts as a use."""
    t = runs["a"]
    fresh(t)
    choices = [("thread", False), ("process", False), ("thread", ("site",)),
               ("process", ("site",)), ("thread", ("class",))]
    assert len(choices) == feature_cache.MAX_ENTRIES + 1
    def path(order, ranks):
        k = feature_cache.entry_key(t, order, features._rank_groups(ranks))
        return feature_cache.cache.entry_path(t, feature_cache.KIND, k, ".hcf")
    for i, (order, ranks) in enumerate(choices[:-1]):
        featurize([t], order, ranks)
        # one after the other a second apart (file times may be coarser than one featurize)
        os.utime(path(order, ranks), (time.time() - 100 + i,) * 2)
    assert len(entries(t)) == feature_cache.MAX_ENTRIES
    with monkeypatch.context() as m:
        no_build(m)
        featurize([t], *choices[0])                # the oldest entry, used again
    featurize([t], *choices[-1])
    assert sorted(entries(t)) == sorted(path(*c) for c in choices if c != choices[1])
    with monkeypatch.context() as m:
        no_build(m)
        featurize([t], *choices[0])


def test_a_damaged_entry_is_computed_again(runs, monkeypatch):
    t = runs["a"]
    fresh(t)
    reference = featurize([t], "thread", False)
    (entry,) = entries(t)
    data = bytearray(entry.read_bytes())
    for damage in (data[: len(data) // 2], data[:40], data[:-3] + b"xyz", b"HCFEAT1\n" + b"\xff" * 8):
        entry.write_bytes(bytes(damage))
        k = feature_cache.entry_key(t, "thread", ())
        assert feature_cache.load(t, k) is None
        same(reference, featurize([t], "thread", False))
        (entry,) = entries(t)
        assert feature_cache.load(t, k) is not None     # written again, whole


def test_no_cache_where_it_is_off_or_cannot_be_written(runs, monkeypatch, tmp_path):
    import shutil
    t = tmp_path / "ro.trace"
    shutil.copytree(runs["b"], t, ignore=shutil.ignore_patterns(".cache"))
    monkeypatch.setenv("HEAPCAST_CACHE", "0")
    reference = featurize([t], "thread", False)
    assert not (t / ".cache").exists()
    monkeypatch.delenv("HEAPCAST_CACHE")
    if os.geteuid() != 0:   # (root writes anywhere)
        t.chmod(0o500)
        try:
            same(reference, featurize([t], "thread", False))
            assert not (t / ".cache").exists()
        finally:
            t.chmod(0o700)
    # A Trace object (maybe changed in memory) is never cached.
    import heapcast
    same(reference, featurize([heapcast.load(t)], "thread", False))
    assert not (t / ".cache").exists()
