"""The lab's policy names and its error, in a module that imports nothing heavy (the command
line is built without numpy); heapcast.lab.replay implements them."""
from __future__ import annotations

CLASSIC = ("first-fit", "next-fit", "best-fit", "buddy", "segregated", "glibc", "heapcast")
CLAIRVOYANT = ("oracle-lifetime",)
LEARNED = ("learned-lifetime",)
#: Every policy, in the order they are reported.
ALL_POLICIES = CLASSIC + CLAIRVOYANT + LEARNED


class LabError(ValueError):
    """A simulation that cannot be run as asked (unknown policy, missing model support, ...)."""
