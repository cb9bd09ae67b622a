"""Statistics of a trace in one streaming pass: `stats()` (a dict), `format_stats()` (text), and
the aggregates the report builds on (aggregate.py)."""
from .classes import size_classes
from .summary import stats
from .text import format_stats

__all__ = ["format_stats", "size_classes", "stats"]
