"""A converted raw file is unlinked at once and freed by a helper process (heapcast.recorder.discard):
the name goes before the call returns, the disk space once the helper has ended, and every
failure to start the helper falls back to a plain unlink."""
from __future__ import annotations

import os
import time

import pytest

import heapcast
from heapcast.recorder import discard


def _file(path, nbytes):
    with open(path, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, nbytes)
    return path


def _helpers_end(timeout=10.0):
    """Waits until every helper started has ended and been reaped."""
    deadline = time.monotonic() + timeout
    while discard._helpers and time.monotonic() < deadline:
        discard._reap()
        time.sleep(0.01)
    return not discard._helpers


def _free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_a_large_file_is_unlinked_at_once_and_freed_by_the_helper(tmp_path):
    big = _file(tmp_path / "1.raw", discard.LARGE + (16 << 20))
    before = _free_bytes(tmp_path)
    assert discard.unlink_in_background(big) is True
    assert not big.exists()
    assert discard._helpers, "no helper holds the file"
    assert _helpers_end()
    # the helper held the file's last reference: its blocks are free once it ended (other
    # writers on the file system could take some meanwhile; a 80 MiB file is far above them)
    assert _free_bytes(tmp_path) - before > discard.LARGE // 2


def test_a_small_file_is_unlinked_here(tmp_path):
    small = _file(tmp_path / "2.raw", 1 << 20)
    assert discard.unlink_in_background(small) is False
    assert not small.exists()
    assert not discard._helpers


def test_a_missing_file_is_nothing_to_do(tmp_path):
    assert discard.unlink_in_background(tmp_path / "gone.raw") is False


@pytest.mark.parametrize("helper", ["missing", "fails to start"])
def test_without_a_helper_to_start_the_file_is_unlinked_here(tmp_path, monkeypatch, helper):
    if helper == "missing":
        monkeypatch.setattr(discard, "HELPERS", (str(tmp_path / "no-cat"),))
    else:   # executable, but not a program the kernel can run
        bad = tmp_path / "cat"
        bad.write_bytes(b"\x7fELF not really")
        bad.chmod(0o700)
        monkeypatch.setattr(discard, "HELPERS", (str(bad),))
    big = _file(tmp_path / "3.raw", discard.LARGE + (1 << 20))
    assert discard.unlink_in_background(big) is False
    assert not big.exists()
    assert not discard._helpers


@pytest.mark.parametrize("live", [True, False])
def test_a_recording_whose_raw_files_a_helper_frees_is_complete(build, tmp_path, monkeypatch,
                                                                live):
    monkeypatch.setattr(discard, "LARGE", 0)   # every raw file through a helper
    handed = []
    hand_over = discard._hand_over
    monkeypatch.setattr(discard, "_hand_over", lambda fd, path: handed.append(path.name)
                        or hand_over(fd, path))
    r = heapcast.record([str(build("churn"))], output=tmp_path / "t", progress=False, live=live)
    assert r.exit_code == 0 and not r.problems
    assert r.processes == 2 and len(handed) == 2   # churn forks: two raw files, two helpers
    assert not list((tmp_path / "t").glob("*.raw"))
    assert _helpers_end()
    t = heapcast.load(tmp_path / "t")
    assert len(t.events) == r.events > 20000
