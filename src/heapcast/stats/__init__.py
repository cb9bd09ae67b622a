"""Statistics of a trace in one streaming pass: `stats()` (a dict), `format_stats()` (text), and
the aggregates the report builds on (aggregate.py); `symbolize` names call sites, `plot` draws.

Names are imported on first use (PEP 562): the CLI imports `stats.plot`'s error type at start,
without numpy."""
from .._lazy import lazy_getattr

_API = {"format_stats": ".text", "size_classes": ".classes", "stats": ".summary"}
__all__ = sorted(_API)
__getattr__ = lazy_getattr(globals(), _API)
