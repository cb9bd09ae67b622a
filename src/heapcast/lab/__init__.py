"""The allocator lab: replay real traces through allocation policies, against the clairvoyant
bound (docs/policies.md). `simulate(trace, policies=None, train=None, model=None) -> dict`."""
from .replay import ALL_POLICIES, CLASSIC, LabError, lifetime_classes, parse_policies, simulate

__all__ = ["ALL_POLICIES", "CLASSIC", "LabError", "lifetime_classes", "parse_policies", "simulate"]
