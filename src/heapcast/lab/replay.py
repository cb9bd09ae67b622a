"""`heapcast simulate`: replays every allocation, realloc and free of a trace through simulated
allocators and measures their footprint against the trace's live bytes (docs/policies.md).

Each process is its own heap, replayed in its exact seq order by the native driver; a forked
child starts from a copy of its parent's simulated heaps at the fork. Events stream through in
blocks, so memory stays bounded (1 byte per event for the lifetime classes, plus live blocks).
Python only orchestrates: numpy blocks in, metrics out.
"""
from __future__ import annotations

import time
from collections import defaultdict

import numpy as np

from ..stats import size_classes
from ..trace.reader import iter_process_blocks, load
from . import classes
from .native import NO_CLASS, Replay

from .names import (ALL_POLICIES, CLAIRVOYANT, CLASSIC, LAYERED_FITS, LEARNED,  # noqa: F401
                    LEARNED_OVER, LabError)
#: A process with at most this many events is decoded once and kept while its passes run.
IN_MEMORY_EVENTS = 1 << 23
BLOCK_EVENTS = 1 << 20
#: The least gap between the best classic policy and the oracle (a fraction of the former) that
#: `learned_gap_closed` is measured against.
MIN_GAP = 0.01
SERIES_POINTS = 1000


def parse_policies(spec) -> list:
    """Policy names from "a,b" or a list; None or "all": every policy. Raises LabError."""
    if spec is None or spec == "all":
        return list(ALL_POLICIES)
    names = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else list(spec)
    unknown = [n for n in names if n not in ALL_POLICIES]
    if unknown or not names:
        raise LabError(f"unknown policy {', '.join(unknown) or '(none)'}; choose from "
                       f"{', '.join(ALL_POLICIES)}")
    return list(dict.fromkeys(names))


def _blocks(p):
    """(index of the first event, block) over a process's events, in seq order."""
    first = 0
    for block in iter_process_blocks(p, BLOCK_EVENTS):
        yield first, block
        first += len(block)


def lifetime_classes(process, params: np.ndarray | None = None) -> np.ndarray:
    """The true lifetime class (heapcast.lab.classes) of every event of a process: uint8,
    NO_CLASS (255) for events that produce no block. A streamed pass of the native driver."""
    r = Replay([], classes.kernel_params() if params is None else params)
    out = np.full(process.event_count, NO_CLASS, np.uint8)
    r.set_classes(lifetimes=out, n_events=len(out))
    for first, block in _blocks(process):
        r.feed(block, first)
    r.finish()
    r.close()
    return out


def site_prior(train, params: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Lifetime class counts of a training recording (a Trace or path) per (stable location key,
    size class): (sorted uint64 keys `location key << 7 | size class`, uint32 counts [keys,
    classes]). Location keys are heapcast.forecast's (module file name and offset of each frame),
    the same in every run despite ASLR; size classes are `size.bit_length()`."""
    from ..forecast.features import location_keys
    trace = train if hasattr(train, "processes") else load(train)
    keys, rows = [], []
    for p in trace.processes:
        cls = lifetime_classes(p, params)
        acq = cls != NO_CLASS
        locs = np.concatenate([b["loc"][acq[f:f + len(b)]] for f, b in _blocks(p)] or
                              [np.zeros(0, np.uint32)])
        sizes = np.concatenate([b["size"][acq[f:f + len(b)]] for f, b in _blocks(p)] or
                               [np.zeros(0, np.uint64)])
        stack = location_keys(p)[1].astype(np.uint64)
        known = locs < len(stack)
        k = stack[locs[known]]
        sc = size_classes(sizes[known]).astype(np.uint64)
        keys.append((k << np.uint64(7)) | sc)
        rows.append(cls[acq][known])
    k = np.concatenate(keys or [np.zeros(0, np.uint64)])
    c = np.concatenate(rows or [np.zeros(0, np.uint8)])
    uniq, inv = np.unique(k, return_inverse=True)
    counts = np.zeros((len(uniq), len(classes.CLASS_NAMES)), np.uint32)
    np.add.at(counts, (inv, c.astype(np.int64)), 1)
    return uniq, counts


def _prior_for(process, prior) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The training counts as rows (location id, size class, counts) of this process: each
    training key is joined to every location id of this process with the same stable key."""
    from ..forecast.features import location_keys
    keys, counts = prior
    stack = location_keys(process)[1].astype(np.uint64)
    order = np.argsort(stack, kind="stable")
    sorted_keys = stack[order]
    want = keys >> np.uint64(7)
    lo = np.searchsorted(sorted_keys, want, "left")
    hi = np.searchsorted(sorted_keys, want, "right")
    n = hi - lo
    row = np.repeat(np.arange(len(keys)), n)
    pos = np.repeat(lo, n) + (np.arange(len(row)) - np.repeat(np.cumsum(n) - n, n))
    locs = order[pos].astype(np.uint32)
    scs = (keys[row] & np.uint64(127)).astype(np.uint8)
    return locs, scs, counts[row]


def _model_classes(model, process) -> np.ndarray:
    try:
        from ..forecast.lifetime import predict_lifetime_classes
    except ImportError as e:
        raise LabError(f"--model needs heapcast's forecasting models (heapcast.forecast), which "
                       f"cannot be imported here: {e}") from None
    return classes.to_kernel(predict_lifetime_classes(model, process))


def _fork_plan(trace) -> dict:
    """Each parent's (fork_seq, child index) points in seq order, by parent index. A child's
    parent is the latest image of the pid its forked_from names (as heap.match_trace does)."""
    by_pid, forks = {}, defaultdict(list)
    for i, p in enumerate(trace.processes):
        j = by_pid.get(p.forked_from) if p.forked_from else None
        if j is not None:
            forks[j].append((int(p.fork_seq), i))
        by_pid[p.pid] = i
    return {j: sorted(v) for j, v in forks.items()}


def _replay_process(p, r: Replay, forks: list) -> dict:
    """Feeds a process's events into `r`, forking a child replay at each fork point; returns
    {child index: Replay}."""
    children, pending = {}, list(forks)
    for first, block in _blocks(p):
        while pending:
            seq, child = pending[0]
            cut = int(np.searchsorted(block["seq"], np.uint64(seq)))   # events before the fork
            if cut == len(block):
                break
            if cut:
                r.feed(block[:cut], first)
                first, block = first + cut, block[cut:]
            children[child] = r.fork(seq)
            pending.pop(0)
        if len(block):
            r.feed(block, first)
    for seq, child in pending:   # forked after the parent's last event
        children[child] = r.fork(seq)
    r.finish()
    return children


def simulate(trace, policies=None, train=None, model=None, checked: bool = False,
             series: bool = False, span: int = classes.SPAN_BYTES,
             quantile: float = classes.QUANTILE, predicted=None, learned_over: str = LEARNED_OVER,
             grain: int = 16) -> dict:
    """Replays `trace` (a Trace or a path) through `policies` (names, "a,b", or None for all) and
    returns the measurements as a JSON-ready dict (keys in docs/policies.md).

    `train`: a recording of the same program whose per-call-site lifetimes seed the learned
    policy's predictor. `model`: a lifetime model (heapcast train --task lifetime) whose
    predictions replace the call-site predictor. `checked`: verify the invariants at every op
    (no two live chunks overlap, every chunk lies inside the footprint; slower); a violation
    raises LabError. `predicted`: instead of a model, the predicted lifetime class of every
    event of each process (a list in the trace's process order, -1 where no block), e.g. a
    compiled policy's (heapcast.policy.placement). `learned_over`: the placement (one of
    LAYERED_FITS) that `learned-lifetime` segregates by lifetime. `grain`: the step of the
    `heapcast` packer's fine size classes (16, or 8 as `heapcast run --align 8`). `series`: also
    return the footprint over time, as numpy arrays under "series" (for report.plot_simulation;
    drop them before json.dumps).
    """
    names = parse_policies(policies)
    if learned_over not in LAYERED_FITS:
        raise LabError(f"learned_over={learned_over!r}: expected one of {', '.join(LAYERED_FITS)}")
    if grain not in (8, 16):
        raise LabError(f"grain={grain}: expected 8 or 16")
    kernels = kernel_policies(names, learned_over)
    if not hasattr(trace, "processes"):
        trace = load(trace)
    params = classes.kernel_params(span=span, quantile=quantile, grain=grain)
    need_oracle = any(k.startswith("oracle-lifetime@") for k in kernels)
    use_model = (model is not None or predicted is not None) and "learned-lifetime" in names
    prior = site_prior(train, params) if train is not None and "learned-lifetime" in names else None
    if predicted is not None:
        sizes = [len(c) for c in predicted]
        want = [p.event_count for p in trace.processes]
        if sizes != want:
            raise LabError(f"{getattr(trace, 'path', trace)}: predicted classes for processes of "
                           f"{sizes} events; its processes have {want}")
    forks = _fork_plan(trace)
    started = time.perf_counter()
    replays, per_process, all_series, threads = {}, [], [], 1
    for i, p in enumerate(trace.processes):
        loaded_here = (p._events is None and p.event_count <= IN_MEMORY_EVENTS
                       and (need_oracle or use_model))
        if loaded_here:
            p.events   # decoded once for all passes
        oracle = lifetime_classes(p, params) if need_oracle else None
        given = None
        if use_model:
            given = (classes.to_kernel(predicted[i]) if predicted is not None
                     else _model_classes(model, p))
        every = max(1, p.event_count // SERIES_POINTS) if series else 0
        r = replays.pop(i, None) or Replay(kernels, params, checked, every)
        r.set_classes(oracle=oracle, model=given, n_events=p.event_count)
        if prior is not None:
            r.set_prior(*_prior_for(p, prior))
        replays.update(_replay_process(p, r, forks.get(i, [])))
        per_process.append(_process_result(p, r, kernels))
        if series:
            all_series.append(_series(p, r, kernels))
        threads = max(threads, r.threads())
        r.close()
        if loaded_here:
            p._events = None
    for r in replays.values():   # children whose own trace file is missing
        r.close()
    result = _trace_result(trace, kernels, per_process, time.perf_counter() - started)
    result["threads"] = threads   # the policies of a batch ran side by side on these
    result["policies"] = clairvoyant(result["policies"], names, learned_over)
    result["summary"] = summarize(result["policies"])
    result["summary"]["lower_bound_bytes"] = result["peak_live_bytes"]
    result["predictor"] = ("given classes" if use_model and predicted is not None else
                           "model " + str(model) if use_model else
                           "call sites, seeded by " + str(getattr(train, "path", train))
                           if prior is not None else "call sites, learned online")
    if series:
        result["series"] = all_series
    return result


def kernel_policies(names: list, learned_over: str = LEARNED_OVER) -> list:
    """The replay kernels that `names` need: the classic policies asked for, and for the lifetime
    oracle, segregation layered over each of LAYERED_FITS plus every classic policy (the
    candidates of the clairvoyant choice); for the learned one, segregation over `learned_over`."""
    kernels = [n for n in names if n in CLASSIC]
    if "oracle-lifetime" in names:
        kernels += [n for n in CLASSIC if n not in kernels]
        kernels += [f"oracle-lifetime@{fit}" for fit in LAYERED_FITS]
    if "learned-lifetime" in names:
        kernels.append(f"learned-lifetime@{learned_over}")
    return kernels


def clairvoyant(pol: dict, names: list, learned_over: str = LEARNED_OVER) -> dict:
    """The reported policies from the kernels' results. `oracle-lifetime` is the best placement a
    clairvoyant allocator can choose for the trace: lifetime segregation layered over first-,
    next- or best-fit or heapcast's packer, or a classic policy as it is (one lifetime group),
    whichever has the smallest peak footprint, so it is never worse than the best classic
    policy. Its `placement` says which. `learned-lifetime` is the segregation over
    `learned_over`, fed predicted classes: heapcast's packer unless asked, the placement that
    heapcast's allocator ships (a learned allocator cannot know beforehand which placement this
    trace favours, so it does not choose one per trace as the oracle does)."""
    out = {n: pol[n] for n in names if n in CLASSIC}
    if "oracle-lifetime" in names:
        candidates = {f"lifetime over {f}": pol[f"oracle-lifetime@{f}"] for f in LAYERED_FITS}
        candidates.update({n: pol[n] for n in CLASSIC})
        best = min(candidates, key=lambda c: candidates[c]["peak_footprint_bytes"])
        out["oracle-lifetime"] = {**candidates[best], "placement": best}
    if "learned-lifetime" in names:
        out["learned-lifetime"] = {**pol[f"learned-lifetime@{learned_over}"],
                                   "placement": f"lifetime over {learned_over}"}
    return out


def _process_result(p, r: Replay, names: list) -> dict:
    st = r.stats()
    out = {"pid": p.pid, "exe": p.exe, "events": st["events"], "peak_live_bytes": st["peak_live"],
           "unknown_frees": st["unknown_frees"], "double_acquires": st["double_acquires"],
           "late_releases": st["late_releases"], "driver_ns": st["ns"], "ops": st["ops"],
           "sum_live16": st["sum_live16"],
           "prediction": {"blocks": st["pred_total"], "exact": st["pred_exact"],
                          "shorter": st["pred_shorter"]},
           "policies": {}}
    for i, name in enumerate(names):
        m = r.metrics(i)
        m["failure"] = r.failure(i)
        if m["failure"]:
            raise LabError(f"{p.source or p.pid}: policy {name} broke an invariant: {m['failure']}")
        out["policies"][name] = m
    return out


def _series(p, r: Replay, names: list) -> dict:
    ts, live = r.series(-1)
    return {"pid": p.pid, "ts": ts, "live": live,
            "policies": {name: dict(zip(("extent", "pages4k"), r.series(i)))
                         for i, name in enumerate(names)}}


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def _trace_result(trace, names: list, procs: list, wall: float) -> dict:
    """Trace-level numbers. Processes are separate heaps: a trace's peaks are those of the
    largest process (as `heapcast stats` reports peak live bytes)."""
    peak_live = max((p["peak_live_bytes"] for p in procs), default=0)
    events = sum(p["events"] for p in procs)
    driver_ns = sum(p["driver_ns"] for p in procs)
    ops = sum(p["ops"] for p in procs)
    live16 = sum(p["sum_live16"] for p in procs)
    pol = {}
    for name in names:
        ms = [p["policies"][name] for p in procs]
        top = max(ms, key=lambda m: m["peak_footprint"], default=None)
        if top is None:
            continue
        footprint = top["peak_footprint"]
        pages4k = max(m["peak_pages4k"] for m in ms)
        internal = top["internal_at_peak"]
        external = footprint - top["peak_live_at_footprint"] - internal
        ns = sum(m["ns"] for m in ms)
        pol[name] = {
            "peak_footprint_bytes": footprint,
            "peak_pages_4k": pages4k,
            "peak_pages_2m": max(m["peak_pages2m"] for m in ms),
            "fragmentation": _ratio(footprint, peak_live),
            "fragmentation_pages_4k": _ratio(pages4k * 4096, peak_live),
            "live_bytes_at_peak": top["peak_live_at_footprint"],
            "internal_bytes_at_peak": internal,
            "external_bytes_at_peak": external,
            "peak_mmapped_bytes": max(m["peak_mmapped"] for m in ms),
            "mean_footprint_bytes": _ratio(16 * sum(m["sum_footprint16"] for m in ms), ops),
            "mean_pages_4k": _ratio(sum(m["sum_pages4k"] for m in ms), ops),
            "mean_fragmentation": _ratio(sum(m["sum_footprint16"] for m in ms), live16),
            "events_per_s": _ratio(events, ns / 1e9),
            "seconds": ns / 1e9,
            "moves": sum(m["moves"] for m in ms),
            "in_place_reallocs": sum(m["inplace"] for m in ms),
            "reclassified_spans": sum(m["reclassified"] for m in ms),
        }
    pred = {k: sum(p["prediction"][k] for p in procs) for k in ("blocks", "exact", "shorter")}
    result = {
        "trace": str(trace.path), "events": events, "processes": len(procs),
        "peak_live_bytes": peak_live,
        "mean_live_bytes": _ratio(16 * live16, ops),
        "unknown_frees": sum(p["unknown_frees"] for p in procs),
        "double_acquires": sum(p["double_acquires"] for p in procs),
        "late_releases": sum(p["late_releases"] for p in procs),
        "lifetime_classes": {"version": classes.SCHEME_VERSION, "names": list(classes.CLASS_NAMES)},
        "driver_events_per_s": _ratio(events, driver_ns / 1e9),
        "wall_s": wall,
        "policies": pol,
        "summary": summarize(pol),
        "per_process": procs,
    }
    if any(n.startswith("learned-lifetime") for n in names) and pred["blocks"]:
        result["prediction"] = {"blocks": pred["blocks"], "accuracy": pred["exact"] / pred["blocks"],
                                "predicted_shorter": pred["shorter"] / pred["blocks"]}
    return result


def summarize(pol: dict) -> dict:
    """The best classic policy, what the clairvoyant one wins over it, and how much of that gap
    the learned one closes (by peak footprint)."""
    classic = {n: v["peak_footprint_bytes"] for n, v in pol.items() if n in CLASSIC}
    if not classic:
        return {}
    best = min(classic, key=classic.get)
    out = {"best_classic": best, "best_classic_footprint_bytes": classic[best]}
    if "oracle-lifetime" in pol:
        oracle = pol["oracle-lifetime"]["peak_footprint_bytes"]
        gap = classic[best] - oracle
        out["oracle_gain"] = gap / classic[best] if classic[best] else None
        if "learned-lifetime" in pol:
            learned = pol["learned-lifetime"]["peak_footprint_bytes"]
            out["learned_gain"] = (classic[best] - learned) / classic[best] if classic[best] else None
            # a gap of a few pages is no room to close (the ratio would be noise)
            out["learned_gap_closed"] = ((classic[best] - learned) / gap
                                         if gap > MIN_GAP * classic[best] else None)
    return out
