"""Call trees for the report's flame graph: per-location values summed along their stacks.

A location is a call site, or with `record --stacks N` an interned stack (innermost frame first).
The tree runs from the outermost frame to the allocating call site (top-down), or the other way
round (inverted, bottom-up: who allocates, then who called it). Nodes are keyed by their symbolized
path, so the same function reached through the same callers is one node whatever the process.
Only the `max_locations` heaviest locations (by each metric) are kept: the page stays small.
"""
from __future__ import annotations

import numpy as np

from ..stats.symbolize import UNKNOWN
from ..trace.model import PY_FRAME_TAG

METRICS = ("at_peak", "count", "temporary", "leaked_bytes")


def frame_label(address: int, s) -> str:
    """A frame's name in the graph: "file:line function" for a Python frame, "function (module)"
    for a native one, its address where unknown."""
    if address & PY_FRAME_TAG:
        return f"{s.module}:{s.offset} {s.function}" if s.module != UNKNOWN else "? (python)"
    return (f"{s.function} ({s.module})" if s.function != UNKNOWN
            else f"{address:#x} ({s.module})" if s.module != UNKNOWN else f"{address:#x}")


class CallTree:
    """Nodes (id, label, parent) with one value per metric, for both orientations."""

    def __init__(self, symbolizer, max_locations: int = 1500):
        self.symbolizer = symbolizer
        self.max_locations = max_locations
        self.trees = {False: {}, True: {}}      # inverted -> {path tuple: values}
        self.ranged = []    # (pid, innermost-first path, {metric: per coarse time bucket})

    def add(self, p, agg) -> None:
        """Adds process `p`'s per-location aggregates (stats.aggregate.ProcessAggregate)."""
        nloc = len(agg.loc_count) - 1
        values = {"at_peak": np.maximum(agg.loc_at_peak[:nloc], 0) if agg.loc_at_peak is not None
                  else np.zeros(nloc, np.int64),
                  "count": agg.loc_count[:nloc], "temporary": agg.loc_temporary[:nloc],
                  "leaked_bytes": np.maximum(agg.loc_leaked_bytes[:nloc], 0)}
        keep = set()
        for v in values.values():
            nz = np.flatnonzero(v)
            keep.update(nz[np.argsort(-v[nz], kind="stable")[:self.max_locations]].tolist())
        keep = sorted(keep)
        inherited = int(agg.loc_at_peak[-1]) if agg.loc_at_peak is not None else 0
        if not keep and not inherited:
            return
        table = p.locations
        stacks = [table.frames(loc).tolist() if loc < len(table) else [] for loc in keep]
        addrs = np.unique(np.array([a for s in stacks for a in s] or [0], np.uint64))
        names = {}
        for a, s in zip(addrs.tolist(), self.symbolizer.symbolize(p, addrs)):
            names[a] = frame_label(a, s)
        # per coarse time bucket: allocations, temporary ones and bytes never freed by the bucket
        # of the allocation, bytes live at the bucket's own peak (stats.aggregate)
        by_range = {"count": agg.loc_by_range, "temporary": agg.loc_temp_by_range,
                    "leaked_bytes": agg.loc_leak_by_range, "at_peak": agg.loc_peak_by_range}
        for loc, frames in zip(keep, stacks):
            path = tuple(names[a] for a in frames) or ("unknown call site",)
            vals = [int(values[m][loc]) for m in METRICS]
            self._add_path(path, vals)
            per = {m: _sparse(t[:, loc]) for m, t in by_range.items()
                   if t is not None and loc < t.shape[1] - 1 and t[:, loc].any()}
            if per:
                self.ranged.append((p.pid, path, per))
        if inherited:
            self._add_path(("inherited at fork",), [inherited, 0, 0, 0])

    def _add_path(self, innermost_first: tuple, vals: list) -> None:
        for inverted, path in ((False, innermost_first[::-1]), (True, innermost_first)):
            tree = self.trees[inverted]
            for depth in range(1, len(path) + 1):
                node = tree.setdefault(path[:depth], [0] * len(METRICS))
                for i, v in enumerate(vals):
                    node[i] += v

    def to_json(self, inverted: bool) -> dict:
        """{"ids", "labels", "parents", "values": {metric: [...]}} for a Plotly icicle, the root
        "all" first; ids are indices as strings."""
        tree = self.trees[inverted]
        paths = sorted(tree, key=lambda t: (len(t), t))
        index = {path: i + 1 for i, path in enumerate(paths)}
        totals = [sum(tree[p][i] for p in paths if len(p) == 1) for i in range(len(METRICS))]
        out = {"ids": ["0"], "labels": ["all"], "parents": [""],
               "values": {m: [totals[i]] for i, m in enumerate(METRICS)}}
        for path in paths:
            out["ids"].append(str(index[path]))
            out["labels"].append(path[-1])
            out["parents"].append(str(index.get(path[:-1], 0)))
            for i, m in enumerate(METRICS):
                out["values"][m].append(tree[path][i])
        # For filtering by a time range: each location's nodes, and per metric its non-zero coarse
        # time buckets and their values ([buckets], [values]).
        out["ranged"] = [{"pid": pid, "nodes": [index[path[:d]] for d in range(1, len(path) + 1)],
                          "by": per}
                         for pid, innermost_first, per in self.ranged
                         for path in [innermost_first if inverted else innermost_first[::-1]]]
        return out


def _sparse(column: np.ndarray) -> list:
    """[non-zero bucket indices], [their values]."""
    nz = np.flatnonzero(column)
    return [nz.tolist(), column[nz].tolist()]
