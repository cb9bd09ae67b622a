"""Removing a converted raw file without making the user wait while the kernel frees it.

A raw file is 32 bytes an event of page cache and disk blocks (640 MB for ring's 20M events).
Its unlink frees all of that before it returns (on a file system mounted with `discard`, each
extent is discarded too): 25-35 ms on ring, after the trace is complete, for nothing the user
needs. The last close of an unlinked file is what frees it, in the process that closes it. So a
large raw file is opened, handed to a small helper process (`cat`, reading a pipe), unlinked,
and the pipe closed: the helper reads its end of file and exits, and its exit frees the file on
whatever core is free, while `heapcast record` returns. The name is gone at once; the space
follows within moments. A file below LARGE, or any failure to start the helper, is unlinked
here as before.
"""
from __future__ import annotations

import os
from pathlib import Path

# Bytes of disk below which the file is unlinked here: its unlink then costs a few ms at most
# (about 0.04 ms a MiB on this VM's ext4), against 0.6 ms to start a helper.
LARGE = 64 << 20
HELPERS = ("/usr/bin/cat", "/bin/cat")   # by absolute path: not whatever `cat` PATH names
_helpers: list[int] = []   # pids of the helpers started, reaped once they have ended


def unlink_in_background(path: Path) -> bool:
    """Unlinks `path` (missing: nothing to do) and leaves freeing its pages and blocks to a
    helper process when the file is LARGE or more; returns True when a helper took it."""
    _reap()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        if os.fstat(fd).st_blocks * 512 < LARGE or not _hand_over(fd, path):
            path.unlink(missing_ok=True)
            return False
        return True
    finally:
        os.close(fd)


def _hand_over(fd: int, path: Path) -> bool:
    """Starts a helper holding fd, unlinks path, then lets the helper end; False (nothing
    unlinked) when no helper could be started."""
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        if min(fd, r) < 3:   # (a closed stdin or stdout: the helper's dup2s would clobber them)
            return False
        cat = next((p for p in HELPERS if os.access(p, os.X_OK)), None)
        if cat is None:
            return False
        try:
            pid = os.posix_spawn(cat, [cat], {},
                                 file_actions=[(os.POSIX_SPAWN_DUP2, r, 0),
                                               (os.POSIX_SPAWN_DUP2, fd, 3),
                                               (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)],
                                 setsid=True)
        except OSError:
            return False
        _helpers.append(pid)
        os.close(r)
        r = -1
        path.unlink(missing_ok=True)   # the helper's fd 3 now holds the file's last reference
        return True
    finally:
        if r >= 0:
            os.close(r)
        os.close(w)   # the helper reads its end of file and exits (after the unlink, on success)


def _reap() -> None:
    """Collects the helpers that have ended (a long-lived caller would otherwise keep zombies)."""
    for pid in list(_helpers):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            _helpers.remove(pid)
