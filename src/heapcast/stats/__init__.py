"""Statistics of a trace in one streaming pass: `stats()` (a dict), `format_stats()` (text), and
the aggregates the report builds on (aggregate.py); `symbolize` names call sites, `plot` draws.

Names are imported on first use (PEP 562): the CLI imports `stats.plot`'s error type at start,
without numpy."""
import importlib

_API = {"format_stats": ".text", "size_classes": ".classes", "stats": ".summary"}
__all__ = sorted(_API)


def __getattr__(name):
    if name not in _API:
        raise AttributeError(f"module 'heapcast.stats' has no attribute {name!r}")
    value = getattr(importlib.import_module(_API[name], __name__), name)
    globals()[name] = value
    return value
