"""heapcast's allocator: run a program with blocks placed by predicted lifetime (`heapcast run`).

The allocator itself is native (native/alloc/, libheapcast_alloc.so, preloaded); this package
finds it, checks the POLICY or builds the oracle file before the program starts, runs the program
and merges the `--log` summaries of its processes. docs/allocator.md describes the design.
"""
__all__ = ["AllocError", "RunResult", "alloc_library", "environment", "run"]


def __getattr__(name):
    # imported on first use: `heapcast --help` builds its parsers without loading the runner
    if name in __all__:
        from . import runner
        return getattr(runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
