"""How far each grouping of the `free` labels reaches: rank among all live blocks, or within the
freed block's call site or size class (heapcast train --free-group).

    python bench/free_groups.py                  # run a of every corpus program
    python bench/free_groups.py --runs a,b --programs jq,perl

The `free` task names the freed block by its rank from the nearer end of a recency order
(docs/vocabularies.md): labels reach the 64 youngest and 64 oldest, the rest share "beyond",
which never counts as right. A grouped label ranks it among its own group's live blocks and names
the group too, so it only pays where the grouping brings frees into reach, or to an end, that the
global order does not. For every free of a known block (the `free` task's rows) this prints the
share within 64 of either end, and the share at an end (rank 0 from the young or the old end: a
stack or a queue), for each grouping: the features' free_* rank columns, exactly what the labels
are made of (heapcast.forecast.features). Writes bench/results/free_groups.json.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402
from _common import RESULTS_DIR, format_table, machine_info, write_json  # noqa: E402

from heapcast.forecast.features import featurize  # noqa: E402
from heapcast.forecast.tasks import FREE_BEYOND, FREE_YOUNG, free_label  # noqa: E402

#: grouping -> the prefix of its rank columns (free_rank, free_site_rank, free_class_rank, ...)
GROUPINGS = {"all live blocks": "", "same call site": "site_", "same size class": "class_"}


def measure(path: Path) -> dict:
    """Per grouping: frees, share within reach, share at an end."""
    cols = featurize([path], "process", need_ranks=True).columns
    out = {}
    for name, prefix in GROUPINGS.items():
        rank, live = cols[f"free_{prefix}rank"], cols[f"free_{prefix}live"]
        freed = rank >= 0
        label = free_label(rank[freed], live[freed])
        n = len(label)
        out[name] = {"frees": n,
                     "within_reach": int((label < FREE_BEYOND).sum()) / max(n, 1),
                     "at_an_end": int(((label == 0) | (label == FREE_YOUNG)).sum()) / max(n, 1)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", help="comma-separated subset of the corpus")
    ap.add_argument("--runs", default="a", help="comma-separated runs (default a)")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "free_groups.json")
    a = ap.parse_args(argv)
    wanted = a.programs.split(",") if a.programs else None
    paths = corpus.ensure(wanted, runs=tuple(a.runs.split(",")), quiet=True)
    results, rows = {}, []
    for (prog, run), path in sorted(paths.items()):
        r = results[f"{prog}-{run}"] = measure(path)
        rows.append([f"{prog}-{run}", f"{r['all live blocks']['frees']:,}",
                     *(f"{100 * r[g]['within_reach']:.1f}" for g in GROUPINGS),
                     *(f"{100 * r[g]['at_an_end']:.1f}" for g in GROUPINGS)])
    print(format_table(["trace", "frees", *(f"reach % ({g})" for g in GROUPINGS),
                        *(f"at an end % ({g})" for g in GROUPINGS)], rows))
    write_json(a.out, {"machine": machine_info(), "results": results})
    print(f"wrote {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
