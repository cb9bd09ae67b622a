"""heapcast's allocator: run a program with blocks placed by predicted lifetime (`heapcast run`).

The allocator itself is native (native/alloc/, libheapcast_alloc.so, preloaded); this package
finds it, checks the POLICY or builds the oracle file before the program starts, runs the program
and merges the `--log` summaries of its processes. docs/allocator.md describes the design.
"""
from .runner import AllocError, RunResult, alloc_library, environment, run

__all__ = ["AllocError", "RunResult", "alloc_library", "environment", "run"]
