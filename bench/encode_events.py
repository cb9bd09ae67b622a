"""EVENTS block encoding: what the writer spends per block of 1,048,576 events before zstd.

    python bench/encode_events.py                    # records ring (~2 s), then times 3 blocks
    python bench/encode_events.py --trace DIR        # the first block of an existing trace
    python bench/encode_events.py --corpus           # every trace, with and without the hint

Blocks: `ring` (the first 2**20 events of `heapcast record -- ring 2000000 1000`: malloc/free
pairs over a ring of 1000 live blocks), `pool` (synthetic: addresses drawn from 50,000, frees of
an address produced 300 rows earlier) and `random` (random 63-bit values in every column, half of
them zero: no address repeats, so nearly every old_addr is an escape and the back-reference table
holds every address; the worst case). Each block is encoded as the writer receives it from
`heapcast record` (`dict`: one contiguous array per column) and as an EVENT_DTYPE array (`struct`:
64-byte strides), into a reused output buffer as the writer does (`fresh` allocates one per
call). `zstd` is level 3 on the payload, for scale. Target (the issue): encoding under 20 ms per
block of 2**20 events; the numpy encoder this replaced took 160-220 ms.

`--corpus` encodes every block of every trace (bench/sparse_columns.every_trace: the corpus, its
extra programs included, and ring, threads, py_dicts), each process's blocks in order as one
stream, as the trace writer does: with a planes hint kept along the stream (the writer's way:
only the byte planes the stream needed so far are written) and without one (every plane),
interleaved, the fastest of 3 rounds; ns per event per trace and in all
(bench/results/encode_events_corpus.json).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (RESULTS_DIR, compile_c, format_table, machine_info,  # noqa: E402
                     time_command, workload, write_json)

import heapcast  # noqa: E402
from heapcast.trace.format import EVENT_DTYPE  # noqa: E402
from heapcast.trace.native_codec import encode_events, planes_hint, stream_buffer  # noqa: E402
from heapcast.trace.writer import BLOCK_EVENTS  # noqa: E402

N = 1 << 20


def ring_block(trace: Path | None) -> np.ndarray:
    if trace is not None:
        return heapcast.load(trace).events[:N].copy()
    with tempfile.TemporaryDirectory(prefix="heapcast-bench-") as tmp:
        exe = compile_c(workload("ring.c"), Path(tmp) / "ring")
        trace = Path(tmp) / "trace"
        time_command([sys.executable, "-m", "heapcast", "record", "-o", str(trace), "--",
                      str(exe), "2000000", "1000"])
        return heapcast.load(trace).events[:N].copy()


def pool_block(seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ev = np.zeros(N, EVENT_DTYPE)
    ev["seq"] = np.arange(N) + 5
    ev["ts"] = 10**12 + np.cumsum(rng.integers(20, 200, N))
    pool = 0x5555_5555_0000 + 16 * rng.permutation(50_000).astype(np.uint64)
    ev["addr"] = pool[rng.integers(0, len(pool), N)] * (rng.random(N) < 0.5)
    ev["old_addr"] = np.where(ev["addr"] == 0, np.roll(ev["addr"], 300), 0)
    ev["size"] = rng.integers(16, 600, N)
    ev["loc"] = rng.integers(0, 300, N)
    ev["op"] = rng.integers(0, 10, N)
    return ev


def random_block(seed: int = 2) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ev = np.zeros(N, EVENT_DTYPE)
    ev["seq"] = np.cumsum(rng.integers(1, 3, N))
    for name in ("ts", "addr", "old_addr", "size", "arg"):
        ev[name] = rng.integers(0, 2**63, N, dtype=np.uint64) * (rng.random(N) < 0.5)
    return ev


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def corpus_streams(trace: Path) -> list:
    """A trace's blocks of BLOCK_EVENTS as the writer gets them: a list of blocks per process."""
    streams = []
    for p in heapcast.load(trace).processes:
        ev = p.events
        cols = {k: np.ascontiguousarray(ev[k]) for k in ev.dtype.names}
        streams.append([{k: v[s:s + BLOCK_EVENTS] for k, v in cols.items()}
                        for s in range(0, len(ev), BLOCK_EVENTS)])
    return streams


def corpus_main(out_path: Path) -> int:
    from sparse_columns import every_trace
    out = stream_buffer(256 << 20)
    kinds = ("every plane", "hint")
    rows, results = [], {}
    with tempfile.TemporaryDirectory(prefix="heapcast-bench-") as tmp:
        for name, trace in every_trace(Path(tmp)).items():
            streams = corpus_streams(trace)
            n = sum(len(b["seq"]) for st in streams for b in st)
            best = dict.fromkeys(kinds, float("inf"))
            for rnd in range(3):
                for kind in (kinds if rnd % 2 == 0 else kinds[::-1]):
                    start = time.perf_counter()
                    for st in streams:
                        hint = planes_hint() if kind == "hint" else None
                        for b in st:
                            encode_events(b, out, sparse=False, hint=hint)
                    best[kind] = min(best[kind], time.perf_counter() - start)
            results[name] = {"events": n, "processes": len(streams),
                             **{f"{k}_s": v for k, v in best.items()}}
            rows.append([name, f"{n:,}", str(len(streams)),
                         f"{best['every plane'] * 1e9 / n:.1f}", f"{best['hint'] * 1e9 / n:.1f}",
                         f"{best['hint'] / best['every plane']:.3f}x"])
            print(f"{name}: {rows[-1][-1]}", file=sys.stderr)
    n = sum(r["events"] for r in results.values())
    every, hint = (sum(r[f"{k}_s"] for r in results.values()) for k in kinds)
    rows.append(["all", f"{n:,}", "", f"{every * 1e9 / n:.1f}", f"{hint * 1e9 / n:.1f}",
                 f"{hint / every:.3f}x"])
    print(format_table(["trace", "events", "processes", "every plane ns/ev", "hint ns/ev",
                        "hint"], rows))
    path = write_json(out_path, {"machine": machine_info(), "traces": results})
    print(f"\nwritten to {path}", file=sys.stderr)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, help="use the first block of this trace as `ring`")
    ap.add_argument("--corpus", action="store_true",
                    help="every trace, with and without the planes hint (see above)")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.corpus:
        return corpus_main(args.out or RESULTS_DIR / "encode_events_corpus.json")
    args.out = args.out or RESULTS_DIR / "encode_events.json"

    blocks = {"ring": ring_block(args.trace), "pool": pool_block(), "random": random_block()}
    rows, results = [], []
    for name, ev in blocks.items():
        columns = {field: np.ascontiguousarray(ev[field]) for field in EVENT_DTYPE.names}
        for form, block in (("dict", columns), ("struct", ev)):
            buffer = encode_events(block).obj
            reused = timed(lambda: encode_events(block, buffer), args.repeats)
            fresh = timed(lambda: encode_events(block), args.repeats)
            payload = encode_events(block, buffer)
            zstd = timed(lambda: zstandard.ZstdCompressor(level=3).compress(payload), 3)
            stored = len(zstandard.ZstdCompressor(level=3).compress(payload))
            row = {"block": name, "form": form, "events": len(ev),
                   "encode_ms": 1e3 * statistics.median(reused),
                   "encode_min_ms": 1e3 * min(reused),
                   "encode_fresh_ms": 1e3 * statistics.median(fresh),
                   "zstd_ms": 1e3 * statistics.median(zstd),
                   "raw_bytes": len(payload), "zstd_bytes": stored}
            results.append(row)
            rows.append([name, form, f"{row['encode_ms']:.1f}", f"{row['encode_min_ms']:.1f}",
                         f"{row['encode_fresh_ms']:.1f}", f"{row['zstd_ms']:.1f}",
                         f"{stored / len(ev):.2f}"])
            print(f"{name} {form}: {row['encode_ms']:.1f} ms", file=sys.stderr)
    print(format_table(["block", "form", "encode ms", "min ms", "fresh ms", "zstd ms",
                        "bytes/ev"], rows))
    path = write_json(args.out, {"machine": machine_info(), "events_per_block": N,
                                 "results": results})
    print(f"\nwritten to {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
