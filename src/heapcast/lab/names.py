"""The lab's policy names and its error, in a module that imports nothing heavy (the command
line is built without numpy); heapcast.lab.replay implements them."""
from __future__ import annotations

CLASSIC = ("first-fit", "next-fit", "best-fit", "buddy", "segregated", "glibc", "heapcast")
CLAIRVOYANT = ("oracle-lifetime",)
LEARNED = ("learned-lifetime",)
#: Every policy, in the order they are reported.
ALL_POLICIES = CLASSIC + CLAIRVOYANT + LEARNED
#: The placements that lifetime segregation is layered over (kernels NAME@FIT in
#: native.POLICY_IDS): three fits, and heapcast's packer (its spans per lifetime group).
LAYERED_FITS = ("first-fit", "next-fit", "best-fit", "heapcast")
#: What `learned-lifetime` layers its segregation over by default: heapcast's packer, the placement
#: that heapcast's allocator (`heapcast run`) gives a compiled policy's lifetime groups.
LEARNED_OVER = "heapcast"


class LabError(ValueError):
    """A simulation that cannot be run as asked (unknown policy, missing model support, ...)."""
