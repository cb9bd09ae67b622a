"""Whether placing blocks by lifetime pays for a program: the allocator lab's verdict, which a
compiled lifetime POLICY carries to heapcast's allocator (docs/allocator.md, "Placement").

Separating lifetimes costs each extra group its partly filled pages; it saves memory only where
short- and long-lived blocks would otherwise pin each other's pages. The lab replays the traces
the policy is distilled on through best-fit and through lifetime segregation over best-fit fed
the compiled policy's own predicted classes (`learned-lifetime`, the classes the allocator will
get); the policy says "one group" unless the segregation lowers the peak footprint by at least
MIN_GAIN. Then `heapcast run --policy` places every block as `--policy none` does, without
classifying it.
"""
from __future__ import annotations

import numpy as np

#: The least drop in the lab's peak footprint (a fraction of best-fit's) for which a policy
#: places blocks by lifetime class.
MIN_GAIN = 0.02
PLACEMENTS = ("lab", "lifetime", "one")


def lab_placement(policy_path, traces, data, placement: str = "lab") -> dict:
    """The placement of the lifetime POLICY at `policy_path`: {"lifetime_groups": bool, "how":
    ...} and, with placement "lab", the lab's figures over `traces` (peak footprints summed over
    them, the gain, MIN_GAIN). `data`: the lifetime TaskData of `traces` in process order (one
    stream per process, a row per event), whose rows the policy predicts. "lifetime" and "one"
    force the choice without the lab."""
    if placement not in PLACEMENTS:
        raise ValueError(f"--placement {placement!r}: expected one of {', '.join(PLACEMENTS)}")
    if placement != "lab":
        return {"lifetime_groups": placement == "lifetime", "how": f"--placement {placement}"}
    from ..lab import simulate
    from ..trace.reader import load
    from .evaluate import predict_streams
    from .native import Policy
    want = data.labels >= 0
    classes = np.where(want, predict_streams(Policy(policy_path), data, want)[:, 0], -1)
    best_fit = learned = 0
    per_trace, first = [], 0
    for path in traces:
        trace = load(path)
        predicted = []
        for i in range(len(trace.processes)):
            rows = np.flatnonzero(data.proc == first + i)
            predicted.append(classes[rows])
        first += len(trace.processes)
        r = simulate(trace, policies="best-fit,learned-lifetime", predicted=predicted)
        b = r["policies"]["best-fit"]["peak_footprint_bytes"]
        lt = r["policies"]["learned-lifetime"]["peak_footprint_bytes"]
        best_fit += b
        learned += lt
        per_trace.append({"trace": str(path), "best_fit_peak_bytes": int(b),
                          "learned_lifetime_peak_bytes": int(lt)})
    gain = (best_fit - learned) / best_fit if best_fit else 0.0
    return {"lifetime_groups": bool(gain >= MIN_GAIN), "how": "lab", "lab_gain": gain,
            "min_gain": MIN_GAIN, "traces": per_trace}
