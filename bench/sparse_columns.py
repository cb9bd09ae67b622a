"""Sparse EVENTS columns (trace format 4) against the dense layout of format 2, on every trace.

The same events, encoded both ways in blocks of 2**20 (native_codec.encode_events with and
without sparse=False), then compressed by zstd at level 3 as the writer does: bytes per event
and zstd's time per event, for each trace of the corpus (bench/corpus.py, recorded if missing)
(its extra programs included) and for the reference workloads ring, threads and py_dicts
(recorded here).

    python bench/sparse_columns.py                 # corpus + reference workloads (~3 min)
    python bench/sparse_columns.py --no-workloads  # the corpus only

Prints a table and writes JSON (bench/results/sparse_columns.json).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402
from _common import RESULTS_DIR, format_table, machine_info, write_json  # noqa: E402
from record_overhead import build_workloads  # noqa: E402

import heapcast  # noqa: E402
from heapcast.trace import native_codec  # noqa: E402
from heapcast.trace.writer import BLOCK_EVENTS  # noqa: E402


def compare(trace: Path, repeats: int) -> dict:
    """Bytes and zstd seconds of the trace's events, dense (format 2) and sparse (format 4)."""
    zstd = zstandard.ZstdCompressor(level=3)
    out = {"events": 0, "dense_bytes": 0, "sparse_bytes": 0, "dense_s": 0.0, "sparse_s": 0.0}
    for p in heapcast.load(trace).processes:
        ev = p.events
        cols = {k: np.ascontiguousarray(ev[k]) for k in ev.dtype.names}
        for s in range(0, len(ev), BLOCK_EVENTS):
            block = {k: v[s:s + BLOCK_EVENTS] for k, v in cols.items()}
            for kind, sparse in (("dense", False), ("sparse", True)):
                payload = bytes(native_codec.encode_events(block, sparse=sparse))
                best = float("inf")
                for _ in range(repeats):
                    t = time.perf_counter()
                    size = len(zstd.compress(payload))
                    best = min(best, time.perf_counter() - t)
                out[f"{kind}_bytes"] += size
                out[f"{kind}_s"] += best
        out["events"] += len(ev)
    return out


def every_trace(tmp: Path, workloads: bool = True) -> dict:
    """{name: trace directory} of every corpus trace (bench/corpus.py, its extra programs
    included, recorded if missing) and, with `workloads`, of ring, threads and py_dicts recorded
    into tmp (as bench/record_overhead.py runs them)."""
    every = [p.name for p in corpus.PROGRAMS]   # the extra programs too
    traces = {f"{prog}-{run}": path
              for (prog, run), path in corpus.ensure(every, quiet=True).items()}
    if workloads:
        for w in build_workloads(["ring", "threads", "py_dicts"], False, tmp):
            out = tmp / f"trace-{w.name}"   # (the programs are built in tmp too)
            r = heapcast.record(w.cmd, output=out, env=w.env, progress=False)
            if r.exit_code != 0:
                raise SystemExit(f"{w.name} exited with {r.exit_code}")
            traces[w.name] = out
    return dict(sorted(traces.items()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-workloads", action="store_true", help="the corpus only")
    ap.add_argument("--repeats", type=int, default=3, help="zstd runs per block (the fastest)")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "sparse_columns.json")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="heapcast-sparse-") as tmp:
        traces = every_trace(Path(tmp), not a.no_workloads)
        results = {name: compare(path, a.repeats) for name, path in traces.items()}
    rows = []
    for name, r in results.items():
        n = r["events"]
        rows.append([name, f"{n:,}", f"{r['dense_bytes'] / n:.4f}", f"{r['sparse_bytes'] / n:.4f}",
                     f"{r['sparse_bytes'] / r['dense_bytes']:.3f}x",
                     f"{r['dense_s'] * 1e9 / n:.1f}", f"{r['sparse_s'] * 1e9 / n:.1f}"])
    total = {k: sum(r[k] for r in results.values()) for k in next(iter(results.values()))}
    n = total["events"]
    rows.append(["all", f"{n:,}", f"{total['dense_bytes'] / n:.4f}",
                 f"{total['sparse_bytes'] / n:.4f}",
                 f"{total['sparse_bytes'] / total['dense_bytes']:.3f}x",
                 f"{total['dense_s'] * 1e9 / n:.1f}", f"{total['sparse_s'] * 1e9 / n:.1f}"])
    print(format_table(["trace", "events", "B/ev dense", "B/ev sparse", "bytes", "zstd ns/ev dense",
                        "zstd ns/ev sparse"], rows))
    worse = [name for name, r in results.items() if r["sparse_bytes"] > r["dense_bytes"]]
    print(f"sparse is larger on: {', '.join(worse) if worse else 'none'}")
    print(f"results: {write_json(a.out, {'machine': machine_info(), 'traces': results})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
