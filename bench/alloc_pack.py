"""heapcast's packing backend (native/alloc/pack.c) against the allocators people use: peak RSS
(VmHWM) and wall time of run b of corpus programs under glibc, jemalloc, mimalloc, tcmalloc,
heapcast's allocator on mimalloc (`heapcast run --backend mimalloc --policy none`) and on its
packer (`heapcast run --policy none`, the default backend: one group), the way
bench/alloc_table.py measures them (same launcher, interleaved repeats, medians). No learned
policy: this table is about the backend.

    python bench/alloc_pack.py                        # every corpus program recorded, 3 repeats
    python bench/alloc_pack.py --programs jq --repeats 1 \\
        --variant span32k:HEAPCAST_PACK_SPAN=15 --variant dirty0:HEAPCAST_PACK_DIRTY=0

Beside the floor (peak live heap bytes plus the RSS that is not heap, as bench/alloc_table.py
has it), the floor of an allocator with exact-fit 16-byte classes (glibc's alignment for every
block, what the packer keeps) and with 8-byte classes (what mimalloc does for some sizes): the
floor plus the rounding of the blocks live at the peak (the trace's heap blocks matched by
heapcast.trace.blocks, as every analysis matches them).

A --variant NAME:VAR=VALUE[,VAR=VALUE] adds a row: the packer with those HEAPCAST_PACK_*
settings. Prints the table and the issue's target (peak RSS >= 5% below the best of the four on
at least two programs), writes bench/results/alloc_pack.json.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402
from _common import RESULTS_DIR, compile_c, format_table, interleaved, machine_info, median, write_json  # noqa: E402
from alloc_table import FOUR, MIB, REAL, command_of, floor_of, measure  # noqa: E402

import numpy as np  # noqa: E402

import heapcast  # noqa: E402
from heapcast.alloc import AllocError, environment  # noqa: E402
from heapcast.trace.blocks import NEVER, match  # noqa: E402

PACK_MAX = 256 * 1024   # native/alloc/pack.h: larger blocks get a mapping of their own
PAGE = 4096


def rounded(sizes: np.ndarray, grain: int) -> np.ndarray:
    """The bytes an exact-fit allocator with `grain`-byte classes (glibc's alignment: 16, with a
    16-byte minimum; 8: 8-byte blocks, 8-byte alignment) gives each request; a page multiple
    above PACK_MAX (a mapping of its own)."""
    sizes = sizes.astype(np.int64)
    small = np.maximum(grain, -(-sizes // grain) * grain)
    return np.where(sizes > PACK_MAX, -(-sizes // PAGE) * PAGE, small)


def rounding_at_peak(trace_path: Path) -> dict:
    """The main process (the one with the most events) of a trace, its blocks matched as every
    analysis matches them (heapcast.trace.blocks): at the peak of its live bytes, how many more
    bytes exact-fit classes of 16 bytes (glibc's alignment) and of 8 bytes would hold. Added to
    the floor, these give the floor of any allocator that keeps the alignment: what no packing
    can go below."""
    proc = max(heapcast.load(trace_path).processes, key=lambda p: len(p.events))
    ev = proc.events
    blocks = match(ev)
    live = np.cumsum(blocks.live_delta(ev["size"]))
    at = int(np.argmax(live))
    acquired = np.flatnonzero(blocks.acquires[:at + 1])
    released = blocks.release_of[acquired]
    sizes = ev["size"][acquired[(released == NEVER) | (released > at)]]
    peak = int(live[at])
    return {"live_bytes_at_peak": peak,
            "round16_extra_bytes": int(rounded(sizes, 16).sum()) - peak,
            "round8_extra_bytes": int(rounded(sizes, 8).sum()) - peak}


def parse_variant(text: str) -> tuple[str, dict]:
    name, _, assigns = text.partition(":")
    env = dict(a.split("=", 1) for a in assigns.split(",") if a)
    if not name or not all(k.startswith("HEAPCAST_") for k in env):
        raise ValueError(f"--variant {text}: expected NAME:HEAPCAST_VAR=VALUE[,...]")
    return name, env


def run_program(program: corpus.Program, repeats: int, tmp: Path, launcher: Path,
                variants: dict, oracle: bool = False) -> dict:
    trace_b = corpus.trace_path(program.name, "b")
    cmd, env, cwd = command_of(program, heapcast.load(trace_b), tmp)
    setups = {"glibc": {}}
    setups.update({name: {"LD_PRELOAD": lib} for name, lib in REAL.items() if Path(lib).exists()})
    setups["heapcast mimalloc"] = environment("none", backend="mimalloc")
    pack = environment("none", backend="pack")
    setups["heapcast pack"] = pack
    for name, extra in variants.items():
        setups[f"pack {name}"] = {**pack, **extra}
    if oracle:   # the lifetime classes of the recording of this very run, one group per class pair
        setups["heapcast pack oracle"] = environment(f"oracle:{trace_b}", backend="pack")
    trials = {name: (lambda e=e: measure(launcher, cmd, {**env, **e}, cwd)) for name, e in setups.items()}
    runs = interleaved(trials, repeats, label=program.name)
    out = {"program": program.name, "command": cmd, "allocators": {},
           "settings": {name: {k: v for k, v in e.items() if k.startswith("HEAPCAST_")}
                        for name, e in setups.items()}}
    for name, rs in runs.items():
        out["allocators"][name] = {k: median([r[k] for r in rs]) for k in ("peak_rss", "seconds")}
        out["allocators"][name]["runs"] = rs
    out.update(floor_of(trace_b, out["allocators"]["glibc"]["peak_rss"]))
    out.update(rounding_at_peak(trace_b))
    out["floor16_bytes"] = out["floor_bytes"] + out["round16_extra_bytes"]
    out["floor8_bytes"] = out["floor_bytes"] + out["round8_extra_bytes"]
    four = {n: out["allocators"][n]["peak_rss"] for n in FOUR if n in out["allocators"]}
    best = min(four, key=four.get)
    out["best_of_four"], out["best_of_four_rss"] = best, four[best]
    for a in out["allocators"].values():
        a["vs_best_of_four"] = a["peak_rss"] / four[best]
        a["wall_vs_glibc"] = a["seconds"] / out["allocators"]["glibc"]["seconds"]
    return out


def table(rows: list) -> str:
    heads = ["program", "allocator", "peak RSS MiB", "vs best of 4", "wall s", "wall vs glibc"]
    lines = []
    for r in rows:
        for name, a in r["allocators"].items():
            lines.append([r["program"], name, f"{a['peak_rss'] / MIB:.1f}",
                          f"{a['vs_best_of_four']:.3f}", f"{a['seconds']:.2f}",
                          f"{a['wall_vs_glibc']:.2f}"])
        for name, key in (("floor", "floor_bytes"), ("floor, 16-byte classes", "floor16_bytes"),
                          ("floor, 8-byte classes", "floor8_bytes")):
            lines.append([r["program"], name, f"{r[key] / MIB:.1f}",
                          f"{r[key] / r['best_of_four_rss']:.3f}", None, None])
    return format_table(heads, lines)


def verdict(rows: list) -> list:
    out = []
    for which in sorted({n for r in rows for n in r["allocators"] if n.startswith(("heapcast pack", "pack "))}):
        have = [r for r in rows if which in r["allocators"]]
        below = [r["program"] for r in have if r["allocators"][which]["vs_best_of_four"] <= 0.95]
        worst = max(have, key=lambda r: r["allocators"][which]["vs_best_of_four"])
        wall = max(have, key=lambda r: r["allocators"][which]["wall_vs_glibc"])
        out.append(f"{which}: >= 5% below the best of the four on >= 2 programs: "
                   f"{'MET' if len(below) >= 2 else 'NOT met'} ({', '.join(below) or 'none'}); "
                   f"worst {worst['program']} {worst['allocators'][which]['vs_best_of_four']:.3f}x "
                   f"the best of four; wall worst {wall['program']} "
                   f"{wall['allocators'][which]['wall_vs_glibc']:.2f}x glibc")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", help="comma-separated subset of the corpus (default: every "
                                       "program recorded)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:VAR=VALUE[,...]")
    ap.add_argument("--oracle", action="store_true",
                    help="also the packer with the oracle's lifetime classes (groups of the "
                         "default heap map)")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "alloc_pack.json")
    a = ap.parse_args(argv)
    variants = dict(parse_variant(v) for v in a.variant)
    try:
        environment("none", check=False, backend="pack")
    except AllocError as e:
        print(f"alloc_pack: {e}", file=sys.stderr)
        return 2
    names = a.programs.split(",") if a.programs else [p.name for p in corpus.PROGRAMS]
    rows = []
    with tempfile.TemporaryDirectory(prefix="heapcast-pack-") as tmp:
        launcher = compile_c(Path(__file__).with_name("rss_run.c"), Path(tmp) / "rss_run")
        for program in corpus.PROGRAMS:
            if program.name not in names:
                continue
            if not (corpus.trace_path(program.name, "b") / "session.json").exists():
                print(f"alloc_pack: {program.name}: no recording, skipped", file=sys.stderr)
                continue
            rows.append(run_program(program, a.repeats, Path(tmp), launcher, variants, a.oracle))
    print(table(rows))
    lines = verdict(rows)
    print("\n".join(lines))
    write_json(a.out, {"machine": machine_info(), "repeats": a.repeats, "rows": rows,
                       "verdict": lines})
    print(f"wrote {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
