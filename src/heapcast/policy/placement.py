"""How heapcast's allocator should place a program's blocks: the allocator lab's verdict, which a
compiled lifetime POLICY carries to `heapcast run` (docs/allocator.md, "Placement").

The allocator can run a program three ways: on glibc's malloc as it is, on heapcast's allocator
(its packer) in one group (`--policy none`), or on heapcast's allocator with spans per lifetime
group. The lab replays the traces the policy is distilled on through the models of exactly these
three: `glibc`, `heapcast` (the packer's size classes, spans and page-by-page return; at the
grain `heapcast run --align` will use) and `learned-lifetime` over the packer, fed the compiled
policy's own predicted classes (the classes the allocator will get). Lifetime groups are chosen
when they lower the peak footprint by at least MIN_GAIN below the best of the other two; else
the packer in one group when it beats glibc by more than the model's known error (MODEL_ERROR of
glibc's footprint plus MODEL_ERROR_BYTES); else glibc's malloc.
"""
from __future__ import annotations

import numpy as np

#: The least drop in the lab's peak footprint (a fraction of the best placement without lifetime
#: classes) for which a policy places blocks by lifetime class.
MIN_GAIN = 0.02
#: What the lab's packer model leaves out of the real peak RSS under the packer (thread caches,
#: free pages beyond its budget between two sweeps, side tables): at most 0.8 MiB on every corpus
#: program (bench/alloc_table.py, "unexplained"; docs/allocator.md, "Placement"), which is 1-10%
#: of a small heap such as gcc's, hence the bytes beside the share. The packer is chosen over glibc
#: only when the lab finds it lower by more than this share of glibc's footprint plus these bytes.
MODEL_ERROR = 0.02
MODEL_ERROR_BYTES = 2 << 20
PLACEMENTS = ("lab", "lifetime", "one", "glibc")
LAB_POLICIES = ("glibc", "heapcast", "learned-lifetime")
ALIGNS = (16, 8)


def forced(placement: str, align: int = 16) -> dict:
    """The placement asked for with --placement lifetime|one|glibc, without the lab."""
    return {"lifetime_groups": placement == "lifetime",
            "family": "glibc" if placement == "glibc" else "heapcast", "align": align,
            "how": f"--placement {placement}"}


def lab_placement(policy_path, traces, data, placement: str = "lab", align: int = 16) -> dict:
    """The placement of the lifetime POLICY at `policy_path`: {"lifetime_groups": bool, "family":
    "heapcast" | "glibc", "align": 16 | 8, "how": ...} and, with placement "lab", the lab's
    figures over `traces` (peak footprints summed over them, the lifetime gain, the thresholds).
    `data`: the lifetime TaskData of `traces` in process order (one stream per process, a row per
    event), whose rows the policy predicts. `align`: the packer's alignment that `heapcast run`
    will use with this policy (8: classes every 8 bytes), which the lab models. "lifetime",
    "one" and "glibc" force the choice without the lab."""
    if placement not in PLACEMENTS:
        raise ValueError(f"--placement {placement!r}: expected one of {', '.join(PLACEMENTS)}")
    if align not in ALIGNS:
        raise ValueError(f"--align {align}: expected 16 (glibc's guarantee) or 8")
    if placement != "lab":
        return forced(placement, align)
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
    classes = np.full(len(data), -1, np.int64)
    classes[want] = predict_streams(Policy(policy_path), data, want)[:, 0]
    peaks = dict.fromkeys(LAB_POLICIES, 0)
    per_trace, first = [], 0
    for path in traces:
        trace = load(path)
        predicted = [classes[np.flatnonzero(data.proc == first + i)]
                     for i in range(len(trace.processes))]
        first += len(trace.processes)
        r = simulate(trace, policies=",".join(LAB_POLICIES), predicted=predicted,
                     learned_over="heapcast", grain=align)
        got = {n: int(r["policies"][n]["peak_footprint_bytes"]) for n in LAB_POLICIES}
        for n in LAB_POLICIES:
            peaks[n] += got[n]
        per_trace.append({"trace": str(path), "peak_bytes": got})
    best_other = min(peaks["glibc"], peaks["heapcast"])
    gain = (best_other - peaks["learned-lifetime"]) / best_other if best_other else 0.0
    groups = bool(gain >= MIN_GAIN)
    packer = peaks["heapcast"] < (1 - MODEL_ERROR) * peaks["glibc"] - MODEL_ERROR_BYTES
    return {"lifetime_groups": groups, "family": "heapcast" if groups or packer else "glibc",
            "align": align, "how": "lab", "lab_gain": gain, "min_gain": MIN_GAIN,
            "model_error": MODEL_ERROR, "model_error_bytes": MODEL_ERROR_BYTES,
            "peak_bytes": peaks, "traces": per_trace}


def describe(p: dict) -> str:
    """One line saying what a placement is and, for the lab's, why."""
    what = ("glibc's malloc (heapcast run preloads nothing)" if p["family"] == "glibc" else
            "heapcast's allocator, by lifetime class" if p["lifetime_groups"] else
            "heapcast's allocator, one group (as --policy none)")
    if p["family"] != "glibc" and p.get("align", 16) == 8:
        what += ", 8-byte size classes"
    if p["how"] != "lab":
        return f"{what} ({p['how']})"
    k = {n: v / 2**20 for n, v in p["peak_bytes"].items()}
    if "heapcast" not in k:   # compiled before the lab modelled the packer
        return f"{what} (the lab's verdict of an older heapcast)"
    need = (1 - p["model_error"]) * k["glibc"] - p.get("model_error_bytes", 0) / 2**20
    return (f"{what}: the lab's peak footprints (MiB) glibc {k['glibc']:.1f}, heapcast "
            f"{k['heapcast']:.1f} (needs < {need:.1f}), "
            f"by lifetime class {k['learned-lifetime']:.1f} ({-100 * p['lab_gain']:+.1f}% "
            f"against the best other; needs <= {-100 * p['min_gain']:.0f}%)")
