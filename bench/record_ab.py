"""A/B of `heapcast record`'s whole wait between two checkouts of heapcast, each built in place
(`python setup.py build_ext --inplace`): the same reference workloads recorded by each, and run
untraced, interleaved, several repeats, medians. What a change to the recorder or the converter
saves, measured as a user waits for it (start, run, conversion after the exit).

    git worktree add /tmp/base BASE_COMMIT && (cd /tmp/base && python setup.py build_ext --inplace)
    python bench/record_ab.py /tmp/base .            # ring 10M and py_dicts, 5 repeats (~2 min)
    python bench/record_ab.py A B --workloads ring --repeats 7
    python bench/record_ab.py A B --workloads true --repeats 12   # start and end: /bin/true
    python bench/record_ab.py A B --pause 12     # each run after 12 s idle: cold memory

Prints a table (seconds, ratio to untraced and B/A, bytes/event, and the peak disk space of the
raw files while recording, sampled every 10 ms) and writes JSON
(bench/results/record_ab.json by default).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS_DIR, format_table, interleaved, machine_info, median, write_json  # noqa: E402

import heapcast  # noqa: E402  (reads both checkouts' traces: it reads every format version)
from record_overhead import Workload, build_workloads  # noqa: E402


class RawPeak:
    """Samples, every 10 ms on a thread, the disk space that the raw files of a trace directory
    hold (their allocated blocks: copies punched out once converted do not count)."""

    def __init__(self, directory: Path):
        self.directory, self.peak = directory, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.01):
            total = 0
            for p in self.directory.glob("*.raw"):
                try:
                    total += p.stat().st_blocks * 512
                except OSError:
                    pass
            self.peak = max(self.peak, total)

    def close(self) -> int:
        self.stop.set()
        self.thread.join()
        return self.peak


def record_trial(tree: Path, workload, scratch: Path):
    """A trial: `heapcast record` of the workload with the checkout at `tree` (its src first on
    PYTHONPATH), timed as a whole; the trace's bytes and events, and the raw files' peak size."""
    env = {**os.environ, **workload.env, "PYTHONPATH": str(tree / "src")}
    out = scratch / f"{tree.name}-{workload.name}"

    def run() -> dict:
        shutil.rmtree(out, ignore_errors=True)
        sampler = RawPeak(out)
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "heapcast", "record", "-o", str(out),
                               *workload.record_args, "--", *workload.cmd], env=env,
                              stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
        seconds = time.perf_counter() - t0
        raw_peak = sampler.close()
        if done.returncode != 0:
            raise SystemExit(f"record_ab: {tree}: heapcast record failed: {done.stderr[-500:]}")
        size = sum(p.stat().st_size for p in out.iterdir() if p.suffix == ".hct")
        events = sum(p.event_count for p in heapcast.load(out).processes)
        return {"seconds": seconds, "bytes": size, "raw_peak_bytes": raw_peak,
                "bytes_per_event": size / events if events else None}
    return run


def untraced_trial(workload):
    def run() -> dict:
        t0 = time.perf_counter()
        subprocess.run(workload.cmd, env={**os.environ, **workload.env}, stdout=subprocess.DEVNULL,
                       check=True)
        return {"seconds": time.perf_counter() - t0}
    return run


def _after_pause(trial, seconds: float):
    def run() -> dict:
        time.sleep(seconds)
        return trial()
    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", type=Path, help="checkout A (the base)")
    ap.add_argument("b", type=Path, help="checkout B (the change)")
    ap.add_argument("--workloads", default="ring,py_dicts",
                    help="comma-separated: ring, threads, py_dicts, py_calls, py_deep, ring_long (ring ten times as "
                         "long: the drainer falls behind), churn (20,000 short threads), spawn "
                         "(a shell running 200 short programs, followed), or true "
                         "(/bin/true: what starting and ending `record` costs)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--pause", type=float, default=0.0,
                    help="seconds of sleep before each run, not timed: a VM that gives its free "
                         "memory back to the host then makes each run find its memory cold, as "
                         "a run after a while of idling does (12 s on the development VM)")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "record_ab.json")
    a = ap.parse_args(argv)
    trees = [a.a.resolve(), a.b.resolve()]
    for t in trees:
        if not list((t / "src" / "heapcast").glob("libheapcast_recorder*.so")):
            ap.error(f"{t}: no built recorder in src/heapcast (python setup.py build_ext --inplace)")
    if trees[0].name == trees[1].name:
        ap.error("the two checkouts need different directory names")
    rows, results = [], {}
    with tempfile.TemporaryDirectory(prefix="heapcast-ab-") as tmp:
        scratch = Path(tmp)
        for name in a.workloads.split(","):
            w = Workload("true", ["/bin/true"]) if name == "true" else \
                build_workloads([name], False, scratch)[0]
            trials = {"untraced": untraced_trial(w)}
            trials.update({f"{'AB'[i]} {t.name}": record_trial(t, w, scratch)
                           for i, t in enumerate(trees)})
            if a.pause:
                trials = {n: _after_pause(t, a.pause) for n, t in trials.items()}
            runs = interleaved(trials, a.repeats, label=w.name)
            base = median(r["seconds"] for r in runs["untraced"])
            med = {n: median(r["seconds"] for r in rs) for n, rs in runs.items()}
            results[w.name] = {"runs": runs, "median_seconds": med}
            names = list(trials)
            for n in names:
                per_event = median(r.get("bytes_per_event") for r in runs[n])
                peak = median(r.get("raw_peak_bytes") for r in runs[n])
                rows.append([w.name, n, f"{med[n]:.3f}", f"{med[n] / base:.2f}x",
                             "-" if n == "untraced" else f"{med[n] / med[names[1]]:.3f}",
                             "-" if per_event is None else f"{per_event:.3f}",
                             "-" if peak is None else f"{peak / 2**20:.0f}"])
    print(format_table(["workload", "run", "median s", "vs untraced", "vs A", "bytes/event",
                        "raw peak MiB"], rows))
    write_json(a.out, {"machine": machine_info(), "a": str(trees[0]), "b": str(trees[1]),
                       "repeats": a.repeats, "pause_s": a.pause, "results": results})
    print(f"wrote {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
