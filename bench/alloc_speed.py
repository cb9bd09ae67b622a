"""heapcast's allocator's speed where every object goes through malloc: wall time of CPython on
the bundled py_dicts.py with PYTHONMALLOC=malloc (13.7M mallocs and frees) and with pymalloc,
and of ring.c (20M), under glibc, jemalloc, mimalloc, tcmalloc and heapcast's packer
(`heapcast run --policy none`'s environment, so that heapcast's own start is not timed),
interleaved, medians, as ratios to glibc in the same run; peak RSS beside it (where it is above
the benchmark's own, which a forked child counts until its exec).

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
import resource
import subprocess
import tempfile
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (RESULTS_DIR, BenchError, compile_c, format_table, interleaved,  # noqa: E402
                     machine_info, median, python_executable, workload, write_json)
from alloc_table import REAL  # noqa: E402

from heapcast.alloc import environment  # noqa: E402


def timed(cmd: list, env: dict) -> dict:
    """Wall seconds and peak RSS (the child's own maxrss, from wait4) of one run."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise BenchError(f"{' '.join(cmd)} exited with {proc.returncode}")
    # maxrss counts the forked benchmark before the exec: only a larger one is the program's
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"seconds": seconds, "peak_kb": usage.ru_maxrss if usage.ru_maxrss > own else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:LIBRARY",
                    help="also the packer from this build of libheapcast_alloc.so")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "alloc_speed.json")
    a = ap.parse_args()
    base = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PYTHONMALLOC")}
    pack = environment("none")
    allocators = {"glibc": {}, **{n: {"LD_PRELOAD": lib} for n, lib in REAL.items()
                                  if Path(lib).exists()}, "heapcast": pack}
    for v in a.variant:
        name, _, lib = v.partition(":")
        allocators[name] = {**pack, "LD_PRELOAD": lib}
    py = python_executable()
    with tempfile.TemporaryDirectory(prefix="heapcast-speed-") as tmp:
        ring = compile_c(workload("ring.c"), Path(tmp) / "ring")
        programs = {
            "py_dicts malloc": ([py, str(workload("py_dicts.py"))], {"PYTHONMALLOC": "malloc"}),
            "py_dicts pymalloc": ([py, str(workload("py_dicts.py"))], {}),
            "ring 10M": ([str(ring), "10000000"], {}),
        }
        rows, results = [], {"machine": machine_info(), "repeats": a.repeats, "programs": {}}
        for prog, (cmd, penv) in programs.items():
            trials = {name: (lambda e=env: timed(cmd, {**base, **penv, **e}))
                      for name, env in allocators.items()}
            runs = interleaved(trials, a.repeats, prog)
            glibc = median(r["seconds"] for r in runs["glibc"])
            out = {}
            for name, rs in runs.items():
                s = median(r["seconds"] for r in rs)
                kb = median(r["peak_kb"] for r in rs)
                out[name] = {"seconds": s, "vs_glibc": s / glibc, "peak_rss_kb": kb,
                             "runs": [r["seconds"] for r in rs]}
                rows.append([prog, name, f"{s:.3f}", f"{s / glibc:.2f}x",
                             "-" if kb is None else f"{kb / 1024:.1f}"])
            results["programs"][prog] = out
    print(format_table(["program", "allocator", "wall s", "vs glibc", "peak RSS MiB"], rows))
    print(f"results: {write_json(a.out, results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
