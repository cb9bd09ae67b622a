"""Every loader of heapcast's native libraries goes through trace.base.bind: a library that is
missing, or that lacks what its module declares (another library in its place, an old build),
is a clear error naming the file and what to do, never an AttributeError from ctypes."""
from __future__ import annotations

import pytest

from heapcast.stats.matching import LIBRARY as OTHER   # a real library, without the others'
from heapcast.trace.base import NativeError          # functions


def _loaders():
    from heapcast.forecast import native as forecast_native
    from heapcast.recorder import drain
    from heapcast.stats import classes, matching
    from heapcast.trace import codec, native_codec, native_raw, native_match, steps
    return {"codec": native_codec.load, "raw": native_raw.load, "decode": codec._load,
            "steps": steps.load, "match": native_match.load,
            "livemap": matching._load, "classes": classes._load, "drain": drain.load,
            "forecast": forecast_native._load}


@pytest.mark.parametrize("name", sorted(_loaders()))
def test_a_missing_or_foreign_library_is_a_clear_error(name, tmp_path):
    load = _loaders()[name]
    with pytest.raises(NativeError, match=r"nothing\.so is missing: build heapcast's native code"):
        load(tmp_path / "nothing.so")
    if name in ("livemap", "classes"):   # (OTHER is their own library)
        return
    with pytest.raises(NativeError, match=r"libheapcast_stats\.so (has no .*: rebuild it|does not "
                                          r"match)"):
        load(OTHER)


def test_the_replay_and_policy_libraries_say_so_too(monkeypatch, tmp_path):
    from heapcast.lab import native as lab_native
    from heapcast.policy import native as policy_native
    from heapcast.policy.fileformat import PolicyError
    monkeypatch.setattr(lab_native, "LIBRARY", tmp_path / "lab.so")
    monkeypatch.setattr(lab_native, "_lib", None)
    with pytest.raises(NativeError, match=r"lab\.so is missing: build"):
        lab_native.library()
    monkeypatch.setattr(policy_native, "LIBRARY", OTHER)
    monkeypatch.setattr(policy_native, "_lib", None)
    with pytest.raises(PolicyError, match=r"libheapcast_stats\.so has no policy runtime"):
        policy_native.library()
