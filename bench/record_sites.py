"""What recording costs as a program's call sites grow in number: a Python function of N
allocating lines (one `x = [r, i]` each, run under PYTHONMALLOC=malloc, the same 2.56M line runs
in all), with --native a C program of 2^BITS distinct stacks recorded with --stacks 64
(tests/programs/many_stacks.c), and with --pydoc a real program of millions of distinct Python
stacks: `python -m pydoc -k zzzqqq`, which imports every module that this interpreter can find
(so its figures depend on what is installed beside it: the table says how many events and
locations it made). Untraced and `heapcast record` interleaved, medians: the whole wait, the time
added per event, the locations the trace holds and the peak RSS of the largest process (under
`record`, `heapcast record` itself where its conversion holds more than the program; its RSS
counts the pages of the raw file that it maps, page cache that the program wrote: for a small
program most of it). (Until
stop 45 a thread's location table had a fixed 16,384 slots and started over when crowded: a
program with more call sites than about 8,000 defined a location at almost every event.)

    python bench/record_sites.py [--lines 1000,4000,16000,64000] [--native 12,15,17] [--pydoc]
                                 [--repeats 3]
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (REPO_ROOT, RESULTS_DIR, compile_c, format_table, interleaved,  # noqa: E402
                     machine_info, measured, median, python_executable, write_json)

import heapcast  # noqa: E402

LINE_RUNS = 2_560_000   # lines run in all, whatever N (the rounds: LINE_RUNS / N)


def python_sites(directory: Path, lines: int) -> list:
    """A script whose function has `lines` allocating lines, run LINE_RUNS / lines times."""
    script = directory / f"sites_{lines}.py"
    body = [f"        x{i % 7} = [r, {i}]" for i in range(lines)]
    script.write_text("import sys\ndef work(rounds):\n    for r in range(rounds):\n"
                      + "\n".join(body) + "\nwork(int(sys.argv[1]))\n")
    return [python_executable(), str(script), str(max(1, LINE_RUNS // lines))]


def heapcast_command() -> list:
    """The heapcast command: the one beside this interpreter (a virtual environment's), else
    PATH's."""
    beside = Path(sys.executable).parent / "heapcast"
    exe = str(beside) if beside.exists() else shutil.which("heapcast")
    if not exe:
        raise SystemExit("the heapcast command is not on PATH (pip install .)")
    return [exe]


def measure(name: str, cmd: list, env: dict, scratch: Path, record_args: list,
            repeats: int) -> dict:
    """Untraced and recorded runs of cmd, interleaved; the median row."""
    def untraced():
        return measured(cmd, env)

    def recorded():
        with tempfile.TemporaryDirectory(dir=scratch) as d:
            out = Path(d) / "t"
            run = measured([*heapcast_command(), "record", "-o", str(out), *record_args, "--",
                            *cmd], env)
            trace = heapcast.load(out)
            return {**run, "events": trace.event_count,
                    "locations": sum(len(p.locations) for p in trace.processes)}
    runs = interleaved({"untraced": untraced, "record": recorded}, repeats, label=name)
    base = median(r["seconds"] for r in runs["untraced"])
    rec = median(r["seconds"] for r in runs["record"])
    events = runs["record"][0]["events"]
    return {"workload": name, "untraced_s": base, "record_s": rec, "events": events,
            "locations": runs["record"][0]["locations"],
            "added_ns_per_event": (rec - base) / events * 1e9 if events else None,
            "untraced_peak_rss_mb": median(r["peak_rss_mb"] for r in runs["untraced"]),
            "record_peak_rss_mb": median(r["peak_rss_mb"] for r in runs["record"]),
            "runs": runs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", default="1000,4000,16000,64000",
                    help="Python functions of these many allocating lines (comma-separated; "
                         "empty: none)")
    ap.add_argument("--native", default="",
                    help="C programs of 2^BITS distinct stacks, for these BITS (e.g. 12,15,17)")
    ap.add_argument("--pydoc", action="store_true",
                    help="also `python -m pydoc -k zzzqqq` (a real program of millions of "
                         "distinct Python stacks; some 10-20 s a run with a large environment)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "record_sites.json")
    a = ap.parse_args(argv)
    rows, results = [], []
    with tempfile.TemporaryDirectory(prefix="heapcast-sites-") as tmp:
        scratch = Path(tmp)
        for lines in [int(x) for x in a.lines.split(",") if x.strip()]:
            r = measure(f"python {lines:,} lines", python_sites(scratch, lines),
                        {"PYTHONMALLOC": "malloc"}, scratch, [], a.repeats)
            results.append(r)
        if a.native.strip():
            prog = compile_c(REPO_ROOT / "tests" / "programs" / "many_stacks.c",
                             scratch / "many_stacks", ("-O1", "-fno-omit-frame-pointer"))
            for bits in [int(x) for x in a.native.split(",")]:
                r = measure(f"C 2^{bits} stacks", [str(prog), str(bits), "3"], {}, scratch,
                            ["--stacks", "64"], a.repeats)
                results.append(r)
        if a.pydoc:
            r = measure("python -m pydoc -k", [python_executable(), "-m", "pydoc", "-k", "zzzqqq"],
                        {"PYTHONMALLOC": "malloc", "PYTHONWARNINGS": "ignore"}, scratch, [],
                        a.repeats)
            results.append(r)
    for r in results:
        rows.append([r["workload"], f"{r['events']:,}", f"{r['locations']:,}",
                     f"{r['untraced_s']:.3f}", f"{r['record_s']:.3f}",
                     f"{r['record_s'] / r['untraced_s']:.2f}x",
                     f"{r['added_ns_per_event']:.1f}", f"{r['untraced_peak_rss_mb']:.0f}",
                     f"{r['record_peak_rss_mb']:.0f}"])
    print(format_table(["workload", "events", "locations", "untraced s", "record s", "slowdown",
                        "+ns/event", "untraced MB", "record MB"], rows))
    path = write_json(a.out, {"machine": machine_info(), "repeats": a.repeats,
                              "results": results})
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
