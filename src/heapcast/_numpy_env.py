"""numpy loaded, in heapcast's own process, with settings of heapcast's choosing.

numpy and its OpenBLAS read some environment variables once, when numpy is imported: how many
threads OpenBLAS starts, and whether numpy asks for transparent huge pages for its arrays of 4
MiB or more (NUMPY_MADVISE_HUGEPAGE). On this project's 2-core VM a fresh huge page is zeroed at
0.42-0.55 GB/s against 2.5 GB/s for small pages, and heapcast's commands make and free arrays of
a trace's size over and over: `heapcast record` loads numpy without them (recorder/session.py),
and so do the heavy commands (cli.py): `evaluate` of the main job's compiled policy 20.4 -> 16.6
s, of its GRU 20.7 -> 17.6 s, its training 33.7 -> 29.2 s.
"""
from __future__ import annotations

import os
import sys


def import_numpy(settings: dict) -> None:
    """Imports numpy, if it is not loaded yet, with `settings` (environment variables) in force
    where the user set none of them, then gives os.environ back as it was, so that the programs
    the command starts get the user's environment. Only for heapcast's own process: another
    thread of a user's program could read os.environ meanwhile."""
    if "numpy" in sys.modules:
        return
    chosen = {k: v for k, v in settings.items() if k not in os.environ}
    os.environ.update(chosen)
    try:
        import numpy  # noqa: F401  (numpy and OpenBLAS read the variables once, at load)
    finally:
        for k in chosen:
            os.environ.pop(k, None)
