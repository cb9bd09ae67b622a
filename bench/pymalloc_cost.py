"""What `heapcast record --pymalloc` costs, against the way to see Python's small objects before
it: recording under PYTHONMALLOC=malloc, which runs the program on glibc's allocator (issue 14).

    python bench/pymalloc_cost.py [--repeats 5] [--interpreter PYTHON]

py_dicts.py (../shared/workloads) runs, interleaved, --repeats times each:
  untraced, pymalloc                  the script as it is
  untraced, PYTHONMALLOC=malloc       the script on glibc's malloc
  --pymalloc [program]                under the recorder with pymalloc's allocations recorded:
                                      the program's own run inside `heapcast record` (drainer and
                                      converter beside it, as record_overhead.py's [program] rows)
  PYTHONMALLOC=malloc [program]       the same, recording malloc's events
  --pymalloc (whole wait)             `heapcast record --pymalloc -- python py_dicts.py`
  PYTHONMALLOC=malloc (whole wait)    `heapcast record -- python py_dicts.py` under PYTHONMALLOC
Both record Python call sites. Events are counted in each way's trace. Prints medians: seconds,
events, ns per event added over the untraced run on the same allocator, slowdown; writes
bench/results/pymalloc_cost.json.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (RESULTS_DIR, format_table, interleaved, machine_info, median,  # noqa: E402
                     python_executable, workload, write_json)
from record_overhead import (Workload, heapcast_program, heapcast_record,  # noqa: E402
                             heapcast_tools, untraced)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--interpreter", help="the CPython that runs py_dicts.py (default: this one)")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "pymalloc_cost.json")
    a = ap.parse_args(argv)
    heapcast_cmd, library, missing = heapcast_tools()
    if heapcast_cmd is None:
        print(f"pymalloc_cost: {missing}", file=sys.stderr)
        return 1
    cmd = [a.interpreter or python_executable(), str(workload("py_dicts.py"))]
    ways = {"pymalloc": Workload("py_dicts", cmd, {}),
            "PYTHONMALLOC=malloc": Workload("py_dicts", cmd, {"PYTHONMALLOC": "malloc"})}
    scratch = Path(tempfile.mkdtemp(prefix="heapcast-pymalloc-"))
    try:
        trials = {}
        for way, w in ways.items():
            mine = way == "pymalloc"
            trials[f"untraced, {way}"] = untraced(w, scratch)
            trials[f"{'--pymalloc' if mine else way} [program]"] = heapcast_program(
                w, scratch, library, 0, pymalloc=mine)
            trials[f"{'--pymalloc' if mine else way} (whole wait)"] = heapcast_record(
                w, scratch, heapcast_cmd, 0, extra=("--pymalloc",) if mine else ())
        runs = interleaved(trials, a.repeats, label="pymalloc")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    rows, out = [], {}
    for way in ways:
        mine = way == "pymalloc"
        base = median(r["seconds"] for r in runs[f"untraced, {way}"])
        whole = runs[f"{'--pymalloc' if mine else way} (whole wait)"]
        events = int(median(r["events"] for r in whole))
        out[way] = {"untraced_s": base, "events": events}
        rows.append([f"untraced, {way}", f"{base:.3f}", "", "", ""])
        for kind in ("[program]", "(whole wait)"):
            name = f"{'--pymalloc' if mine else way} {kind}"
            s = median(r["seconds"] for r in runs[name])
            ns = (s - base) / max(events, 1) * 1e9
            out[way][kind.strip("[]()").replace(" ", "_")] = {
                "seconds": s, "ns_per_event": ns, "slowdown": s / base,
                "runs": [r["seconds"] for r in runs[name]]}
            rows.append([name, f"{s:.3f}", f"{events:,}", f"{ns:.1f}", f"{s / base:.2f}x"])
    print(format_table(["run", "median s", "events", "ns/event added", "slowdown"], rows))
    pm, ml = out["pymalloc"]["program"], out["PYTHONMALLOC=malloc"]["program"]
    print(f"\n--pymalloc adds {pm['ns_per_event']:.1f} ns/event to the program's run, recording "
          f"under PYTHONMALLOC=malloc {ml['ns_per_event']:.1f} (each against its own untraced run)")
    write_json(a.out, {"machine": machine_info(), "repeats": a.repeats, "results": out})
    print(f"wrote {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
