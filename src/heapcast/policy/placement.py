"""How heapcast's allocator should place a program's blocks: the allocator lab's verdict, which a
compiled lifetime POLICY carries to `heapcast run` (docs/allocator.md, "Placement").

The allocator can run a program three ways: on glibc's malloc as it is, on heapcast's allocator
(its packer's size classes, or mimalloc's with --backend mimalloc) in one group (`--policy
none`), or on heapcast's allocator with spans (heaps) per lifetime group. The lab replays the
traces the policy is distilled on through the placements that model them: `glibc`,
`segregated` (size classes in slabs, its model of size-class allocators), best-fit, and lifetime segregation
over best-fit fed the compiled policy's own predicted classes (`learned-lifetime`, the classes
the allocator will get). Lifetime groups are chosen when they lower the peak footprint by at
least MIN_GAIN below the best of the others; else the size-class family when `segregated` beats
`glibc` by more than the model's known error (MODEL_ERROR); else glibc's malloc.
"""
from __future__ import annotations

import numpy as np

#: The least drop in the lab's peak footprint (a fraction of the best placement without lifetime
#: classes) for which a policy places blocks by lifetime class.
MIN_GAIN = 0.02
#: `segregated` predicts the peak RSS under mimalloc 1-5% low (docs/policies.md, "Reality
#: check"): the size-class family is chosen over glibc's only when the lab finds it lower by more.
MODEL_ERROR = 0.05
PLACEMENTS = ("lab", "lifetime", "one", "glibc")
LAB_POLICIES = ("glibc", "segregated", "best-fit", "learned-lifetime")


def forced(placement: str) -> dict:
    """The placement asked for with --placement lifetime|one|glibc, without the lab."""
    return {"lifetime_groups": placement == "lifetime",
            "family": "glibc" if placement == "glibc" else "heapcast",
            "how": f"--placement {placement}"}


def lab_placement(policy_path, traces, data, placement: str = "lab") -> dict:
    """The placement of the lifetime POLICY at `policy_path`: {"lifetime_groups": bool, "family":
    "heapcast" | "glibc", "how": ...} and, with placement "lab", the lab's figures over `traces`
    (peak footprints summed over them, the lifetime gain, the thresholds). `data`: the lifetime
    TaskData of `traces` in process order (one stream per process, a row per event), whose rows
    the policy predicts. "lifetime", "one" and "glibc" force the choice without the lab."""
    if placement not in PLACEMENTS:
        raise ValueError(f"--placement {placement!r}: expected one of {', '.join(PLACEMENTS)}")
    if placement != "lab":
        return forced(placement)
    from ..forecast.dataset import is_dataset
    from ..lab import simulate
    from ..trace.reader import load
    from .evaluate import predict_streams
    from .fileformat import PolicyError
    from .native import Policy
    datasets = [str(t) for t in traces if is_dataset(t)]
    if datasets:
        raise PolicyError(f"{', '.join(datasets)}: a dataset; the allocator lab that chooses a "
                          f"lifetime table's placement replays traces: distil it from traces "
                          f"(--data TRACE...) or choose with --placement lifetime|one|glibc")
    want = data.labels >= 0
    classes = np.where(want, predict_streams(Policy(policy_path), data, want)[:, 0], -1)
    peaks = dict.fromkeys(LAB_POLICIES, 0)
    per_trace, first = [], 0
    for path in traces:
        trace = load(path)
        predicted = [classes[np.flatnonzero(data.proc == first + i)]
                     for i in range(len(trace.processes))]
        first += len(trace.processes)
        r = simulate(trace, policies=",".join(LAB_POLICIES), predicted=predicted)
        got = {n: int(r["policies"][n]["peak_footprint_bytes"]) for n in LAB_POLICIES}
        for n in LAB_POLICIES:
            peaks[n] += got[n]
        per_trace.append({"trace": str(path), "peak_bytes": got})
    best_other = min(peaks[n] for n in LAB_POLICIES if n != "learned-lifetime")
    gain = (best_other - peaks["learned-lifetime"]) / best_other if best_other else 0.0
    groups = bool(gain >= MIN_GAIN)
    size_classes = peaks["segregated"] < (1 - MODEL_ERROR) * peaks["glibc"]
    return {"lifetime_groups": groups, "family": "heapcast" if groups or size_classes else "glibc",
            "how": "lab", "lab_gain": gain, "min_gain": MIN_GAIN, "model_error": MODEL_ERROR,
            "peak_bytes": peaks, "traces": per_trace}


def describe(p: dict) -> str:
    """One line saying what a placement is and, for the lab's, why."""
    what = ("glibc's malloc (heapcast run preloads nothing)" if p["family"] == "glibc" else
            "heapcast's allocator, by lifetime class" if p["lifetime_groups"] else
            "heapcast's allocator, one group (as --policy none)")
    if p["how"] != "lab":
        return f"{what} ({p['how']})"
    k = {n: v / 2**20 for n, v in p["peak_bytes"].items()}
    return (f"{what}: the lab's peak footprints (MiB) glibc {k['glibc']:.1f}, size classes "
            f"{k['segregated']:.1f}, best-fit {k['best-fit']:.1f}, lifetime classes "
            f"{k['learned-lifetime']:.1f} ({-100 * p['lab_gain']:+.1f}% against the best other; "
            f"needs <= {-100 * p['min_gain']:.0f}%)")
