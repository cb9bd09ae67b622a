"""The commands' output files, made ready before the work that fills them, and whether a
command draws a progress bar.

A command given an output file in a directory that does not exist, or that it cannot write, used
to find out when it wrote the file: `simulate --plot` after a 16 s replay, `run --log` after the
program had run, `train -o` after training. Every command now makes the file's directory (as
`train`, `compile` and `dataset` always did) and checks that it can write there first, and an
error names the file.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path


def show_progress(quiet: bool = False) -> bool:
    """Whether a command draws a progress bar: only on a terminal, and never with -q. Redirected
    to a log, a bar is hundreds of carriage-returned updates."""
    return not quiet and sys.stderr.isatty()


def prepare_output(path) -> Path:
    """Makes the directory of output file `path` and checks that a file can be written there;
    returns the path. OSError naming the file when it cannot be."""
    path = Path(path)
    if path.is_dir():
        raise OSError(f"{path} is a directory (expected the name of a file to write)")
    parent = path.parent
    for d in (parent, *parent.parents):   # the nearest one that exists must be a directory
        if d.exists():
            if not d.is_dir():
                raise OSError(f"{path}: {d} is not a directory")
            break
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(f"{path}: cannot make its directory {parent}: {e.strerror}") from None
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OSError(f"{path}: cannot write in {parent} (permission denied)")
    return path
