"""The allocator lab: replay real traces through allocation policies, against the clairvoyant
bound (docs/policies.md). `simulate(trace, policies=None, train=None, model=None) -> dict`."""
from .names import ALL_POLICIES, CLASSIC, LabError

__all__ = ["ALL_POLICIES", "CLASSIC", "LabError", "lifetime_classes", "parse_policies", "simulate"]


def __getattr__(name):
    # imported on first use: `heapcast --help` builds its parsers without numpy
    if name in ("lifetime_classes", "parse_policies", "simulate"):
        from . import replay
        return getattr(replay, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
