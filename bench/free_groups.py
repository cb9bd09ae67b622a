"""Would a free label by rank *within the block's call site or size class* reach more frees?

    python bench/free_groups.py                  # run a of every corpus program
    python bench/free_groups.py --runs a,b --programs jq,perl

The `free` task names the freed block by its rank from the nearer end of the recency order of all
live blocks (docs/vocabularies.md): labels reach the 64 youngest and 64 oldest, the rest share
"beyond", which never counts as right. Issue 13 asked for ranks within the block's own call site
or size class where that helps. A label by group must name the group too (the rank alone does
not say which block), so it only pays where the grouping brings frees into reach, or to an end,
that the global order does not. For every free of a known block (the `free` task's rows) this
prints the share within 64 of either end, and the share at an end (rank 0 from the young or the
old end: a stack or a queue), with the recency order taken over all live blocks, over the live
blocks of the freed block's allocation call site, and over those of its size class. A realloc
releases its old block from that block's group and acquires the new one in its own
(heapcast.forecast.features.free_ranks with a group). Writes bench/results/free_groups.json.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402
from _common import RESULTS_DIR, format_table, machine_info, write_json  # noqa: E402

import heapcast  # noqa: E402
from heapcast.forecast.features import free_ranks, location_keys  # noqa: E402
from heapcast.forecast.tasks import FREE_BEYOND, FREE_YOUNG, free_label  # noqa: E402
from heapcast.heap import match_trace  # noqa: E402
from heapcast.stats import size_classes  # noqa: E402

GROUPINGS = ("all live blocks", "same call site", "same size class")


def measure(path: Path, check: bool = False) -> dict:
    """Per grouping: frees, share within reach, share at an end."""
    trace = heapcast.load(path)
    sums = {name: [0, 0, 0] for name in GROUPINGS}
    for p, blocks in zip(trace.processes, match_trace(trace)):
        ev = p.events
        if not len(ev):
            continue
        site_of, _ = location_keys(p)
        loc = ev["loc"].astype(np.int64)
        site = site_of[np.where(loc < len(site_of), loc, 0)].astype(np.int64) \
            if len(site_of) else np.zeros(len(ev), np.int64)
        cls = size_classes(ev["size"].astype(np.uint64)).astype(np.int64)
        for name, group in zip(GROUPINGS, (np.zeros(len(ev), np.int64), site, cls)):
            rank, live = free_ranks(ev["op"], blocks, group)
            if check and name == GROUPINGS[0]:
                assert np.array_equal((rank, live), free_ranks(ev["op"], blocks)), path
            freed = rank >= 0
            label = free_label(rank[freed], live[freed])
            s = sums[name]
            s[0] += len(label)
            s[1] += int(((label >= 0) & (label < FREE_BEYOND)).sum())
            s[2] += int(((label == 0) | (label == FREE_YOUNG)).sum())
    return {name: {"frees": s[0], "within_reach": s[1] / max(s[0], 1),
                   "at_an_end": s[2] / max(s[0], 1)} for name, s in sums.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", help="comma-separated subset of the corpus")
    ap.add_argument("--runs", default="a", help="comma-separated runs (default a)")
    ap.add_argument("--check", action="store_true",
                    help="check the global ranks against the free task's own")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "free_groups.json")
    a = ap.parse_args(argv)
    wanted = a.programs.split(",") if a.programs else None
    paths = corpus.ensure(wanted, runs=tuple(a.runs.split(",")), quiet=True)
    results, rows = {}, []
    for (prog, run), path in sorted(paths.items()):
        r = results[f"{prog}-{run}"] = measure(path, a.check)
        rows.append([f"{prog}-{run}", f"{r[GROUPINGS[0]]['frees']:,}",
                     *(f"{100 * r[g]['within_reach']:.1f}" for g in GROUPINGS),
                     *(f"{100 * r[g]['at_an_end']:.1f}" for g in GROUPINGS)])
    print(format_table(["trace", "frees", *(f"reach % ({g})" for g in GROUPINGS),
                        *(f"at an end % ({g})" for g in GROUPINGS)], rows))
    write_json(a.out, {"machine": machine_info(), "results": results})
    print(f"wrote {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
