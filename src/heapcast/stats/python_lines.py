"""Python programs: the line of the program's own code under each allocation.

A CPython program allocates mostly inside the interpreter and its library (a list grows in
listobject.c, a dict in dictobject.c, json in the json package); what its author wrote is the
innermost Python frame outside that library. Computed per location id (the location table, never
the events), so it fits the streaming pass: the per-location sums are grouped by this frame.
"""
from __future__ import annotations

import numpy as np

from ..trace.model import is_python_frame


def own_code(file: str) -> bool:
    """Whether a Python frame's file is the program's own code, not the interpreter's library
    (`<frozen ...>` modules, `.../lib/python3.X/...` with site-packages)."""
    return not file.startswith("<frozen") and "/lib/python3" not in file


def program_lines(p) -> np.ndarray:
    """Per location id of process `p`: its innermost Python frame in the program's own code
    (a frame value with PY_FRAME_TAG); 0 where there is none."""
    table = p.locations
    out = np.zeros(len(table), np.uint64)
    own = [fid for fid, f in p.python_frames.items() if own_code(f.file)]
    if not own or not len(table.flat):
        return out
    flat = table.flat.astype(np.uint64)
    idx = np.flatnonzero(is_python_frame(flat)
                         & np.isin(flat & np.uint64(0xFFFFFFFF), np.array(own, np.uint64)))
    loc_of = np.searchsorted(table.offsets.astype(np.int64), idx, side="right") - 1
    locs, first = np.unique(loc_of, return_index=True)     # idx is sorted: innermost first
    out[locs] = flat[idx[first]]
    return out
