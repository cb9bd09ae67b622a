"""heapcast's allocator against the allocators people use, in real runs of the corpus's programs:
peak RSS (VmHWM), mean RSS and wall time under glibc, jemalloc, mimalloc, tcmalloc (Debian
packages, preloaded) and heapcast's allocator with `--policy none`, a learned policy (trained
on run a, compiled to a table; the program runs on input b) and the oracle (the classes of a
recording of the very run b). Beside them the floor: the peak live heap bytes plus what of the
program's RSS is not heap (its RSS under glibc less the lab's glibc footprint), and how much of
the gap between the best of the four and the floor each run closes.

    python bench/alloc_table.py             # the corpus, 3 interleaved repeats (~10 min)
    python bench/alloc_table.py --quick     # python, sqlite3 and jq, 1 repeat
    python bench/alloc_table.py --align 8   # heapcast's packer at 8-byte classes (mimalloc's
                                            # grain): the learned policy compiled with --align 8

Prints the table (and draws it: bench/results/alloc_table.png), where the memory goes at the peak (from the lab's models of glibc and of the
packer; from their own counters for jemalloc and tcmalloc, read by bench/alloc_stats.c in one
more run each) and the issue's targets (met or not, with figures), writes
bench/results/alloc_table.json.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402
from _common import (REPO_ROOT, RESULTS_DIR, compile_c, format_table, interleaved,  # noqa: E402
                     machine_info, median, write_json)

import heapcast  # noqa: E402
from heapcast.alloc import AllocError, environment  # noqa: E402
from heapcast.lab import simulate  # noqa: E402
from heapcast.policy.fileformat import read_spec  # noqa: E402
from heapcast.policy.placement import describe  # noqa: E402

REAL = {   # Debian packages: libjemalloc2, libmimalloc2.0, libtcmalloc-minimal4
    "jemalloc": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    "mimalloc": "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2",
    "tcmalloc": "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
}
FOUR = ("glibc", "jemalloc", "mimalloc", "tcmalloc")
MIB = 1024 * 1024
PAGE = os.sysconf("SC_PAGE_SIZE")


def command_of(program: corpus.Program, trace, tmp: Path) -> tuple[list, dict, str]:
    """The command line, environment and directory of the recording's first process, its output
    file (gcc, g++: -o) moved into `tmp` so that nothing is written beside the corpus."""
    first = trace.processes[0]
    argv = list(first.argv)
    if "-o" in argv:
        argv[argv.index("-o") + 1] = str(tmp / f"{program.name}.out")
    return argv, program.env(), first.cwd


def measure(launcher: Path, cmd: list, env: dict, cwd: str) -> dict:
    """Runs cmd to completion through the launcher: peak RSS (the kernel's maxrss of it and its
    waited-for children), mean RSS (its process tree sampled every 5 ms) and wall seconds."""
    with tempfile.NamedTemporaryFile(prefix="heapcast-rss-") as out:
        start = time.perf_counter()
        proc = subprocess.Popen([str(launcher), out.name, *cmd], env={**os.environ, **env},
                                cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        samples = []
        while proc.poll() is None:
            samples.append(_tree_rss(proc.pid))
            time.sleep(0.005)
        seconds = time.perf_counter() - start
        words = Path(out.name).read_text().split()
    if proc.returncode != 0 or len(words) != 2 or words[1] != "0":
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}, {words}) with env {env}")
    samples = [s for s in samples if s]
    return {"seconds": seconds, "peak_rss": int(words[0]) * 1024,
            "mean_rss": sum(samples) / len(samples) if samples else None}


#: Counters of each allocator that says where its memory is (bench/alloc_stats.c). Debian's
#: mimalloc is a release build: its statistics count segments and pages, not blocks.
STATS = ("jemalloc", "tcmalloc")


def own_stats(launcher: Path, shim: Path, lib: str, cmd: list, env: dict, cwd: str) -> dict:
    """One run of cmd under the allocator `lib` with bench/alloc_stats.c preloaded after it:
    the counters of its largest process near its highest RSS, and the run's peak RSS."""
    with tempfile.TemporaryDirectory(prefix="heapcast-stats-") as tmp:
        out = Path(tmp) / "stats"
        peak = measure(launcher, cmd, {**env, "LD_PRELOAD": f"{lib}:{shim}",
                                       "ALLOC_STATS_OUT": str(out)}, cwd)["peak_rss"]
        lines = [line.split() for line in out.read_text().splitlines()] if out.exists() else []
    if not lines:
        raise RuntimeError(f"{' '.join(cmd)} under {lib}: no process wrote its counters")
    pid, rss, *pairs = max(lines, key=lambda w: int(w[1]))
    return {"peak_rss": peak, "rss_at_sample": int(rss),
            "counters": {k: int(v) for k, v in (p.split("=") for p in pairs)}}


def _tree_rss(pid: int) -> int:
    """Resident bytes of the descendants of pid (the launcher itself left out)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            if p != pid:
                total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * PAGE
            for task in os.listdir(f"/proc/{p}/task"):
                todo += [int(c) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split()]
        except (OSError, ValueError, IndexError):
            pass
    return total


def learned_policy(program: str, train: Path, tmp: Path, align: int = 16) -> tuple[str | None, str]:
    """A table POLICY compiled from a lifetime model trained on run a (n-gram: the table kind's
    source) for the packer's alignment `align`, or (None, why not)."""
    model, policy = tmp / f"{program}.model", tmp / f"{program}.policy"
    steps = [["train", str(train), "-o", str(model), "--task", "lifetime", "--model", "ngram"],
             ["compile", str(model), "--kind", "table", "-o", str(policy), "--align", str(align)]]
    for step in steps:
        done = subprocess.run([sys.executable, "-m", "heapcast", *step], capture_output=True,
                              text=True)
        if done.returncode != 0:
            return None, f"heapcast {step[0]} failed: {done.stderr.strip()[-300:]}"
    return str(policy), ""


def pack_dirty_budget() -> int:
    """The packer's free-page budget, which the lab's `heapcast` footprint counts as held at
    every moment: PACK_DIRTY_BUDGET of native/alloc/pack_params.h (HEAPCAST_PACK_DIRTY's
    default), read from there so that the two cannot differ."""
    header = REPO_ROOT / "native" / "alloc" / "pack_params.h"
    m = re.search(r"#define PACK_DIRTY_BUDGET \((\d+) \* (\d+)\)", header.read_text())
    if not m:
        raise SystemExit(f"alloc_table: no PACK_DIRTY_BUDGET (N * M) in {header}")
    return int(m[1]) * int(m[2])


def lab_main_process(program: str, align: int) -> dict:
    """The lab's replay of run b's main process (the one with the most live bytes) through the
    models of glibc and of heapcast's packer at `align`."""
    d = simulate(corpus.trace_path(program, "b"), policies="glibc,heapcast", grain=align)
    return max(d["per_process"], key=lambda p: p["peak_live_bytes"])


def floor_of(main: dict, glibc_peak_rss: float) -> dict:
    """Peak live heap bytes of the main process (lab_main_process) and the floor: those plus its
    RSS that is not heap (glibc's real peak RSS less the lab's glibc footprint)."""
    non_heap = max(glibc_peak_rss - main["policies"]["glibc"]["peak_footprint"], 0)
    return {"peak_live_bytes": main["peak_live_bytes"], "non_heap_bytes": non_heap,
            "floor_bytes": non_heap + main["peak_live_bytes"]}


def memory_split(row: dict, main: dict) -> dict:
    """Where the memory goes at the peak. For the allocators the lab models closely (glibc and
    heapcast's packer, at the row's alignment): the main process's peak live bytes, what the
    model adds at its peak (internal: headers and class rounding; external: free space in the
    pages or extent it holds, the packer's budget of free-but-resident pages apart), the RSS
    that is not heap (glibc's real peak less its model's footprint) and what the model does not
    explain (real peak RSS less all of these). `main`: lab_main_process at the row's alignment.
    For jemalloc and tcmalloc, from their own counters (own_stats; see counter_split)."""
    out = {}
    for name, model in (("glibc", "glibc"), ("heapcast none", "heapcast")):
        m = main["policies"][model]
        real = row["allocators"][name]["peak_rss"]
        budget = pack_dirty_budget() if model == "heapcast" else 0
        external = m["peak_footprint"] - m["peak_live_at_footprint"] - m["internal_at_peak"] - budget
        out[name] = {"real_peak_rss": real, "live": m["peak_live_at_footprint"],
                     "internal": m["internal_at_peak"], "external": external,
                     "free_resident": budget, "non_heap": row["non_heap_bytes"],
                     "unexplained": real - row["non_heap_bytes"] - m["peak_footprint"]}
    for name, st in (row.get("own_stats") or {}).items():
        out[name] = counter_split(name, st, main["peak_live_bytes"], row["non_heap_bytes"])
    return out


def counter_split(name: str, st: dict, live: int, non_heap: float) -> dict:
    """The split from an allocator's own counters, sampled within 1% of its process's highest
    RSS where it held the most (own_stats, bench/alloc_stats.c): internal, its blocks' class sizes less the peak live bytes of the trace (the
    sample is near, not at, the live peak); external, free space in the pages it holds for
    blocks (jemalloc: active less allocated; tcmalloc: heap less allocated less free pages,
    i.e. its caches and partly used spans); free resident, whole free pages kept (jemalloc's
    dirty pages; tcmalloc's page heap); metadata; unexplained, the run's peak RSS less the
    not-heap RSS less what the allocator says it holds."""
    c = st["counters"]
    if name == "jemalloc":
        allocated, held = c["stats.allocated"], c["stats.resident"]
        external = c["stats.active"] - allocated
        metadata = c["stats.metadata"]
        free_resident = held - c["stats.active"] - metadata
    else:
        allocated, held = c["generic.current_allocated_bytes"], c["generic.total_physical_bytes"]
        free_resident = c["tcmalloc.pageheap_free_bytes"]
        external = c["generic.heap_size"] - allocated - free_resident
        metadata = held - c["generic.heap_size"]
    return {"real_peak_rss": st["peak_rss"], "live": live, "internal": allocated - live,
            "external": external, "free_resident": free_resident, "metadata": metadata,
            "non_heap": non_heap, "unexplained": st["peak_rss"] - non_heap - held}


def split_table(rows: list) -> str:
    heads = ["program", "allocator", "real peak RSS MiB", "not heap", "live at peak",
             "rounding+headers", "free in held pages", "free resident", "metadata", "unexplained"]
    lines = []
    for r in rows:
        for name, x in r["split"].items():
            lines.append([r["program"], name] + [f"{x[k] / MIB:.1f}" if k in x else "-" for k in (
                "real_peak_rss", "non_heap", "live", "internal", "external", "free_resident",
                "metadata", "unexplained")])
    return format_table(heads, lines) + (
        "\n(glibc and heapcast: the lab's models, metadata in headers or unexplained; jemalloc "
        "and tcmalloc: their own counters within 1% of their highest RSS, where they held the most; "
        "mimalloc: Debian's release build counts no blocks)")


def run_program(program: corpus.Program, repeats: int, tmp: Path, launcher: Path,
                align: int = 16, shim: Path | None = None) -> dict:
    traces = {run: corpus.trace_path(program.name, run) for run in "ab"}
    trace_b = heapcast.load(traces["b"])
    cmd, env, cwd = command_of(program, trace_b, tmp)
    setups = {"glibc": {}}
    setups.update({name: {"LD_PRELOAD": lib} for name, lib in REAL.items() if Path(lib).exists()})
    setups["heapcast none"] = environment("none", align=align)
    setups["heapcast oracle"] = environment(f"oracle:{traces['b']}", align=align)
    policy, why = learned_policy(program.name, traces["a"], tmp, align)
    if policy:
        setups["heapcast learned"] = environment(policy)
    trials = {name: (lambda e=e: measure(launcher, cmd, {**env, **e}, cwd)) for name, e in setups.items()}
    runs = interleaved(trials, repeats, label=program.name)
    out = {"program": program.name, "command": cmd, "align": align,
           "learned_unavailable": why or None,
           "learned_placement": read_spec(policy).get("placement") if policy else None,
           "allocators": {}}
    for name, rs in runs.items():
        out["allocators"][name] = {k: median([r[k] for r in rs]) for k in ("peak_rss", "mean_rss", "seconds")}
        out["allocators"][name]["runs"] = rs
    if shim is not None:   # untimed runs of their own: the sampling thread costs time
        out["own_stats"] = {name: own_stats(launcher, shim, REAL[name], cmd, env, cwd)
                            for name in STATS if name in setups}
    main = lab_main_process(program.name, align)
    out.update(floor_of(main, out["allocators"]["glibc"]["peak_rss"]))
    four = {n: out["allocators"][n]["peak_rss"] for n in FOUR if n in out["allocators"]}
    best = min(four, key=four.get)
    out["best_of_four"], out["best_of_four_rss"] = best, four[best]
    gap = four[best] - out["floor_bytes"]
    for name, a in out["allocators"].items():
        a["vs_best_of_four"] = a["peak_rss"] / four[best]
        a["gap_closed"] = (four[best] - a["peak_rss"]) / gap if gap > 0 else None
        a["wall_vs_glibc"] = a["seconds"] / out["allocators"]["glibc"]["seconds"]
    out["split"] = memory_split(out, main)
    return out


def table(rows: list) -> str:
    heads = ["program", "allocator", "peak RSS MiB", "vs best of 4", "gap closed", "mean RSS MiB",
             "wall s", "wall vs glibc"]
    lines = []
    for r in rows:
        for name, a in r["allocators"].items():
            lines.append([r["program"], name, f"{a['peak_rss'] / MIB:.1f}",
                          f"{a['vs_best_of_four']:.3f}",
                          None if a["gap_closed"] is None else f"{100 * a['gap_closed']:.0f}%",
                          None if a["mean_rss"] is None else f"{a['mean_rss'] / MIB:.1f}",
                          f"{a['seconds']:.2f}", f"{a['wall_vs_glibc']:.2f}"])
        lines.append([r["program"], "floor", f"{r['floor_bytes'] / MIB:.1f}",
                      f"{r['floor_bytes'] / r['best_of_four_rss']:.3f}", "100%", None, None, None])
    return format_table(heads, lines)


CHART = ("glibc", "jemalloc", "mimalloc", "tcmalloc", "heapcast none", "heapcast learned",
         "heapcast oracle")


def chart(rows: list, out: Path, align: int) -> None:
    """Bars per program: each allocator's peak RSS over the best of the four (1.0, the line),
    the floor as a black tick; writes `out` (PNG)."""
    try:
        import matplotlib
    except ImportError:
        print("alloc_table: matplotlib missing, no chart", file=sys.stderr)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    x = np.arange(len(rows))
    width = 0.84 / len(CHART)
    fig, ax = plt.subplots(figsize=(max(10, len(rows) * 1.3), 5.5))
    for i, name in enumerate(CHART):
        ys = [r["allocators"][name]["vs_best_of_four"] if name in r["allocators"] else np.nan
              for r in rows]
        ax.bar(x + i * width - 0.42 + width / 2, ys, width, label=name,
               hatch="//" if name.startswith("heapcast") else None)
    floors = [r["floor_bytes"] / r["best_of_four_rss"] for r in rows]
    ax.scatter(x, floors, marker="_", s=900, color="black", zorder=3, label="floor")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(0.95, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xticks(x, [r["program"] for r in rows])
    ax.set_ylabel("peak RSS / best of glibc, jemalloc, mimalloc, tcmalloc")
    ax.set_ylim(0.8, min(1.45, max(r["allocators"][n]["vs_best_of_four"] for r in rows
                                   for n in CHART if n in r["allocators"]) + 0.03))
    ax.set_title(f"heapcast's allocator in real runs, {align}-byte classes (lower is better; "
                 f"dashed: 5% below the best)")
    ax.legend(ncol=8, fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.06))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def verdict(rows: list, which: str = "heapcast learned") -> list:
    """The issue's targets for `which`, plainly."""
    have = [r for r in rows if which in r["allocators"]]
    if not have:
        why = "; ".join(f"{r['program']}: {r['learned_unavailable']}" for r in rows)
        return [f"{which}: not measured ({why})"]
    out = []
    below = [r["program"] for r in have if r["allocators"][which]["vs_best_of_four"] <= 0.95]
    out.append(f"{which} peak RSS >= 5% below the best of the four on >= 2 programs: "
               f"{'MET' if len(below) >= 2 else 'NOT met'} ({', '.join(below) or 'none'})")
    worst = max(have, key=lambda r: r["allocators"][which]["vs_best_of_four"])
    x = worst["allocators"][which]["vs_best_of_four"]
    out.append(f"never > 5% above the best of the four: {'MET' if x <= 1.05 else 'NOT met'} "
               f"(worst {worst['program']} {x:.3f}x)")
    vs_none = max((r["allocators"][which]["peak_rss"] / r["allocators"]["heapcast none"]["peak_rss"], r["program"])
                  for r in have)
    out.append(f"never > 2% above --policy none: {'MET' if vs_none[0] <= 1.02 else 'NOT met'} "
               f"(worst {vs_none[1]} {vs_none[0]:.3f}x)")
    wall = max((r["allocators"][which]["wall_vs_glibc"], r["program"]) for r in have)
    out.append(f"wall within 1.15x of glibc: {'MET' if wall[0] <= 1.15 else 'NOT met'} "
               f"(worst {wall[1]} {wall[0]:.2f}x)")
    for r in have:
        o = r["allocators"].get("heapcast oracle")
        if o:
            out.append(f"  {r['program']}: oracle {o['vs_best_of_four']:.3f}x the best of the four "
                       f"({r['best_of_four']}), floor {r['floor_bytes'] / r['best_of_four_rss']:.3f}x")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="python, sqlite3, jq; one repeat")
    ap.add_argument("--programs", help="comma-separated subset of the corpus")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--align", type=int, choices=(16, 8), default=16,
                    help="heapcast's packer at 16-byte (glibc's guarantee) or 8-byte classes")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--resplit", type=Path, metavar="JSON",
                    help="only (re)compute the memory split of an earlier run's JSON, in place, "
                         "and redraw its chart")
    a = ap.parse_args(argv)
    if a.resplit:
        import json
        d = json.loads(a.resplit.read_text())
        for r in d["rows"]:
            r["split"] = memory_split(r, lab_main_process(r["program"], r.get("align", 16)))
        print(split_table(d["rows"]))
        write_json(a.resplit, d)
        chart(d["rows"], a.resplit.with_suffix(".png"), d.get("align", 16))
        return 0
    out = a.out or RESULTS_DIR / ("alloc_table.json" if a.align == 16 else
                                  f"alloc_table_align{a.align}.json")
    names = a.programs.split(",") if a.programs else (["python", "sqlite3", "jq"] if a.quick else None)
    repeats = 1 if a.quick else a.repeats
    try:
        environment("none", check=False)
    except AllocError as e:
        print(f"alloc_table: {e}", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="heapcast-alloc-") as tmp:
        launcher = compile_c(Path(__file__).with_name("rss_run.c"), Path(tmp) / "rss_run")
        shim = compile_c(Path(__file__).with_name("alloc_stats.c"), Path(tmp) / "alloc_stats.so",
                         flags=("-O2", "-shared", "-fPIC", "-pthread"), libs=("-ldl",))
        for program in corpus.PROGRAMS:
            if names and program.name not in names:
                continue
            if not (corpus.trace_path(program.name, "b") / "session.json").exists():
                print(f"alloc_table: {program.name}: no recording, skipped", file=sys.stderr)
                continue
            rows.append(run_program(program, repeats, Path(tmp), launcher, a.align, shim))
    print(table(rows))
    print(split_table(rows))
    lines = verdict(rows)
    lines += [f"  {r['program']}: learned placement: {describe(r['learned_placement'])}"
              for r in rows if r.get("learned_placement")]
    print("\n".join(lines))
    write_json(out, {"machine": machine_info(), "repeats": repeats, "align": a.align,
                     "rows": rows, "verdict": lines})
    chart(rows, out.with_suffix(".png"), a.align)
    print(f"wrote {out} and {out.with_suffix('.png')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
