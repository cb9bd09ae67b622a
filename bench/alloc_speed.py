"""heapcast's allocator's speed where every object goes through malloc: wall time of CPython on
the bundled py_dicts.py with PYTHONMALLOC=malloc (13.7M mallocs and frees) and with pymalloc,
and of ring.c (20M), under glibc, jemalloc, mimalloc, tcmalloc and heapcast's packer
(`heapcast run --policy none`'s environment, so that heapcast's own start is not timed),
interleaved, medians, as ratios to glibc in the same run; peak RSS beside it. Each run is
measured as bench/alloc_table.py measures them (its `measure`, through bench/rss_run.c).

    python bench/alloc_speed.py [--repeats 5] [--variant NAME:LIBRARY]

The corpus tables (bench/alloc_table.py) run programs that allocate far less often; this is
where the packer's per-call path and the locality of what it hands out show (until stop 40 its
thread cache's batches of 8 blocks made py_dicts 1.5x glibc's time). --variant adds a row that
preloads another build of the allocator library (an A/B of pack.c). Prints the table, writes
bench/results/alloc_speed.json.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (RESULTS_DIR, compile_c, format_table, interleaved, machine_info,  # noqa: E402
                     median, python_executable, workload, write_json)
from alloc_table import MIB, REAL, measure  # noqa: E402

from heapcast.alloc import environment  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:LIBRARY",
                    help="also the packer from this build of libheapcast_alloc.so")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "alloc_speed.json")
    a = ap.parse_args()
    # measure() runs the program in this environment updated with a trial's: what the trial does
    # not set is set here, so that nothing of the caller's LD_PRELOAD or PYTHONMALLOC leaks in
    pack = environment("none")
    allocators = {"glibc": {"LD_PRELOAD": ""},
                  **{n: {"LD_PRELOAD": lib} for n, lib in REAL.items() if Path(lib).exists()},
                  "heapcast": pack}
    for v in a.variant:
        name, _, lib = v.partition(":")
        allocators[name] = {**pack, "LD_PRELOAD": lib}
    py = python_executable()
    with tempfile.TemporaryDirectory(prefix="heapcast-speed-") as tmp:
        launcher = compile_c(Path(__file__).with_name("rss_run.c"), Path(tmp) / "rss_run")
        ring = compile_c(workload("ring.c"), Path(tmp) / "ring")
        programs = {
            "py_dicts malloc": ([py, str(workload("py_dicts.py"))], {"PYTHONMALLOC": "malloc"}),
            "py_dicts pymalloc": ([py, str(workload("py_dicts.py"))], {"PYTHONMALLOC": "pymalloc"}),
            "ring 10M": ([str(ring), "10000000"], {}),
        }
        rows, results = [], {"machine": machine_info(), "repeats": a.repeats, "programs": {}}
        for prog, (cmd, penv) in programs.items():
            trials = {name: (lambda e=env: measure(launcher, cmd, {**penv, **e}, os.getcwd()))
                      for name, env in allocators.items()}
            runs = interleaved(trials, a.repeats, prog)
            glibc = median(r["seconds"] for r in runs["glibc"])
            out = {}
            for name, rs in runs.items():
                s = median(r["seconds"] for r in rs)
                peak = median(r["peak_rss"] for r in rs)
                out[name] = {"seconds": s, "vs_glibc": s / glibc, "peak_rss": peak,
                             "runs": [r["seconds"] for r in rs]}
                rows.append([prog, name, f"{s:.3f}", f"{s / glibc:.2f}x", f"{peak / MIB:.1f}"])
            results["programs"][prog] = out
    print(format_table(["program", "allocator", "wall s", "vs glibc", "peak RSS MiB"], rows))
    print(f"results: {write_json(a.out, results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
