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


def test_the_replay_and_policy_libraries_say_so_too(tmp_path):
    from heapcast.lab import native as lab_native
    from heapcast.policy import native as policy_native
    from heapcast.policy.fileformat import PolicyError
    with pytest.raises(NativeError, match=r"lab\.so is missing: build"):
        lab_native._load(tmp_path / "lab.so")
    with pytest.raises(NativeError, match=r"libheapcast_stats\.so has no replay kernels"):
        lab_native._load(OTHER)
    with pytest.raises(PolicyError, match=r"libheapcast_stats\.so has no policy runtime"):
        policy_native._load(OTHER)


def test_the_command_says_so_without_a_traceback(monkeypatch, tmp_path, capsys):
    """`heapcast stats` with its library gone: one line naming the file, exit status 2."""
    import numpy as np
    from heapcast.cli import main
    from heapcast.stats import matching
    from heapcast.trace.base import LoadedOnce
    from heapcast.trace.format import EVENT_DTYPE
    from heapcast.trace.model import Process
    from heapcast.trace.writer import write_process_file
    ev = np.zeros(2, EVENT_DTYPE)
    ev["seq"], ev["op"], ev["addr"], ev["size"] = [1, 2], [0, 9], [0x1000, 0], [16, 0]
    ev["old_addr"][1] = 0x1000
    (tmp_path / "t").mkdir()
    write_process_file(tmp_path / "t" / "1.hct", Process(index=0, pid=1), ev)
    monkeypatch.setattr(matching, "library", LoadedOnce(matching._load, tmp_path / "gone.so"))
    assert main(["stats", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert "heapcast stats: error: " in err and "gone.so is missing: build" in err
    assert "Traceback" not in err
