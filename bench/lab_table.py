"""The allocator lab's table: every policy's fragmentation and peak footprint on the corpus's
real programs, what the clairvoyant lifetime policy wins over the best classic one and how much of
that gap the learned one closes; then the reality check: the same programs run under jemalloc,
mimalloc and tcmalloc, their real peak RSS against what the lab predicts.

    python bench/lab_table.py                    # corpus runs a and b, reality check (~5 min)
    python bench/lab_table.py --no-reality --runs a

Prints the tables, writes bench/results/lab_table.json and bench/results/lab_table.png.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402
from _common import RESULTS_DIR, format_table, machine_info, write_json  # noqa: E402

import heapcast  # noqa: E402
from heapcast.lab import ALL_POLICIES, CLASSIC, simulate  # noqa: E402
from heapcast.lab.replay import MIN_GAP  # noqa: E402

ALLOCATORS = {   # Debian packages: libjemalloc2, libmimalloc2.0, libtcmalloc-minimal4
    "jemalloc": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    "mimalloc": "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2",
    "tcmalloc": "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
}
#: The lab policy that models each real allocator. heapcast's allocator with --policy none is its
#: packer in one group (the lab's `heapcast`); with the oracle's classes, the packer's spans per
#: lifetime group (the kernel oracle-lifetime@heapcast).
MODEL_OF = {"glibc": "glibc", "jemalloc": "segregated", "mimalloc": "segregated",
            "tcmalloc": "segregated", "heapcast none": "heapcast",
            "heapcast oracle": "oracle-lifetime@heapcast"}
GAIN_TARGET, CLOSE_TARGET = 0.20, 0.50
MIB = 1024 * 1024


def lifetime_model(train: Path, out: Path) -> Path | None:
    """An n-gram lifetime model (heapcast.forecast) trained on `train`, or None without it."""
    try:
        from heapcast.forecast.train import train as train_model
    except ImportError:
        return None
    train_model([train], out, model="ngram", task="lifetime")
    return out


def lab_row(program: str, run: str, path: Path, train: Path | None, tmp: Path) -> dict:
    """Simulates one trace with every policy (learned: online), plus learned-lifetime seeded by
    the other run of the same program and fed by a lifetime model trained on the other run
    (cross-run: neither sees this run's lifetimes)."""
    d = simulate(path)
    row = {"program": program, "run": run, "trace": str(path), "events": d["events"],
           "peak_live_bytes": d["peak_live_bytes"], "policies": d["policies"],
           "summary": d["summary"], "prediction": d.get("prediction"),
           "unknown_frees": d["unknown_frees"], "per_process": [
               {k: p[k] for k in ("pid", "exe", "peak_live_bytes")} | {
                   "footprint": {n: v["peak_footprint"] for n, v in p["policies"].items()}}
               for p in d["per_process"]]}
    best = d["summary"]["best_classic"]
    row["placement_room"] = (d["policies"][best]["external_bytes_at_peak"]
                             / d["policies"][best]["peak_footprint_bytes"])
    if train is not None:
        t = simulate(path, policies=["learned-lifetime"], train=train)
        learned = t["policies"]["learned-lifetime"]["peak_footprint_bytes"]
        classic = d["summary"]["best_classic_footprint_bytes"]
        gap = classic - d["policies"]["oracle-lifetime"]["peak_footprint_bytes"]
        # (as simulate's own learned_gap_closed: no share of a gap under MIN_GAP of the classic)
        gap = gap if gap > MIN_GAP * classic else 0
        row["trained"] = {"trained_on": str(train), "peak_footprint_bytes": learned,
                          "fragmentation": learned / d["peak_live_bytes"],
                          "gap_closed": ((d["summary"]["best_classic_footprint_bytes"] - learned) / gap
                                         if gap > 0 else None),
                          "prediction": t.get("prediction")}
        model = lifetime_model(train, tmp / f"{program}-{run}.lifetime")
        if model is not None:
            m = simulate(path, policies=["learned-lifetime"], model=model)
            fp = m["policies"]["learned-lifetime"]["peak_footprint_bytes"]
            row["model"] = {"model": "ngram lifetime, trained on " + str(train),
                            "peak_footprint_bytes": fp, "fragmentation": fp / d["peak_live_bytes"],
                            "gap_closed": ((d["summary"]["best_classic_footprint_bytes"] - fp) / gap
                                           if gap > 0 else None),
                            "prediction": m.get("prediction")}
    return row


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def lab_table(rows: list) -> str:
    heads = ["program", "run", "events", "peak live MiB"] + list(ALL_POLICIES) + \
        ["best classic", "oracle gain", "room", "learned gain", "closed", "trained closed",
         "model closed"]
    out = []
    for r in rows:
        s = r["summary"]
        tr, mo = r.get("trained") or {}, r.get("model") or {}
        out.append([r["program"], r["run"], f"{r['events']:,}", f"{r['peak_live_bytes'] / MIB:.1f}"]
                   + [f"{r['policies'][p]['fragmentation']:.3f}" for p in ALL_POLICIES]
                   + [s["best_classic"], _pct(s["oracle_gain"]), f"{100 * r['placement_room']:.1f}%",
                      _pct(s["learned_gain"]),
                      "-" if s.get("learned_gap_closed") is None else f"{100 * s['learned_gap_closed']:.0f}%",
                      "-" if tr.get("gap_closed") is None else f"{100 * tr['gap_closed']:.0f}%",
                      "-" if mo.get("gap_closed") is None else f"{100 * mo['gap_closed']:.0f}%"])
    return format_table(heads, out)


def prediction_table(rows: list) -> str:
    """learned-lifetime's predictors: exact class / predicted too short, and fragmentation."""
    heads = ["program", "run", "online exact", "short", "frag", "trained exact", "short", "frag",
             "model exact", "short", "frag", "oracle frag"]
    out = []
    for r in rows:
        cells = [r["program"], r["run"]]
        online = {"prediction": r.get("prediction"),
                  "fragmentation": r["policies"]["learned-lifetime"]["fragmentation"]}
        for variant in (online, r.get("trained") or {}, r.get("model") or {}):
            pred, frag = variant.get("prediction"), variant.get("fragmentation")
            cells += ["-", "-", "-"] if pred is None else [
                f"{100 * pred['accuracy']:.1f}%", f"{100 * pred['predicted_shorter']:.1f}%",
                f"{frag:.3f}"]
        out.append(cells + [f"{r['policies']['oracle-lifetime']['fragmentation']:.3f}"])
    return format_table(heads, out)


def speed_table(rows: list) -> str:
    heads = ["policy", "min Mevents/s", "median Mevents/s"]
    out = []
    for p in ALL_POLICIES:
        v = sorted(r["policies"][p]["events_per_s"] / 1e6 for r in rows)
        out.append([p, f"{v[0]:.1f}", f"{v[len(v) // 2]:.1f}"])
    return format_table(heads, out)


@contextlib.contextmanager
def program_output_hidden():
    """Sends what the programs print (to file descriptor 1) to /dev/null meanwhile."""
    sys.stdout.flush()
    saved, devnull = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def rss_of(trace, exe: str) -> tuple[int, float | None]:
    """Peak RSS of the trace's process running `exe` (largest RSS sample or VmHWM) and its mean
    RSS over the run, from the recorder's samples (None without samples)."""
    best, mean = 0, None
    for p in trace.processes:
        if os.path.basename(p.exe) == exe:
            samples = int(p.rss["rss"].max()) if len(p.rss) else 0
            if samples > best:
                mean = float(p.rss["rss"].mean())
            best = max(best, samples, int(p.peak_rss_bytes))
    return best, mean


def heapcast_allocator(path: Path) -> dict:
    """The environments of heapcast's allocator for the reality check (`--policy none` and the
    oracle of the recording at `path`), or {} where it is not built."""
    try:
        from heapcast.alloc import AllocError, environment
        return {"heapcast none": environment("none"),
                "heapcast oracle": environment(f"oracle:{path}")}
    except (ImportError, AllocError):
        return {}


def reality_check(program: corpus.Program, path: Path, row: dict) -> dict:
    """Runs the program (run a's input) under each allocator, heapcast's own included (its
    `--policy none` and oracle), recorded (the recorder first, the allocator preloaded after it),
    and compares the main process's real peak RSS with the lab's
    prediction: the RSS under glibc minus the lab's glibc footprint (what is not heap: code,
    stacks, the recorder's buffers) plus the footprint of the policy that models the allocator.
    Beside it each allocator's mean RSS over the run, from the recorder's samples."""
    trace = heapcast.load(path)
    main = max(row["per_process"], key=lambda p: p["peak_live_bytes"])
    exe = os.path.basename(main["exe"])
    real = {"glibc": rss_of(trace, exe)}
    with tempfile.TemporaryDirectory(prefix="heapcast-lab-") as tmp:
        for name, lib in ALLOCATORS.items():
            if not Path(lib).exists():
                continue
            out = Path(tmp) / name
            with program_output_hidden():
                r = heapcast.record(program.prepare("a"), output=out, progress=False,
                                    env={**program.env(), "LD_PRELOAD": lib},
                                    follow_children=program.follow_children)
            if r.exit_code == 0:
                real[name] = rss_of(heapcast.load(out), exe)
            shutil.rmtree(out, ignore_errors=True)
        for name, env in heapcast_allocator(path).items():   # recorded under heapcast run
            out = Path(tmp) / name.replace(" ", "-")
            with program_output_hidden():
                r = heapcast.record(program.prepare("a"), output=out, progress=False,
                                    env={**program.env(), **env},
                                    follow_children=program.follow_children)
            if r.exit_code == 0:
                real[name] = rss_of(heapcast.load(out), exe)
            shutil.rmtree(out, ignore_errors=True)
    glibc = real["glibc"][0]
    other = glibc - main["footprint"]["glibc"]
    result = {"program": program.name, "process": exe, "non_heap_bytes": other, "allocators": {}}
    for name, (rss, mean) in real.items():
        model = MODEL_OF[name]
        predicted = other + main["footprint"][model]
        result["allocators"][name] = {"model": model, "real_peak_rss_bytes": rss,
                                      "mean_rss_bytes": mean, "predicted_bytes": predicted,
                                      "ratio": rss / predicted if predicted > 0 else None,
                                      "real_vs_glibc": rss / glibc if glibc else None,
                                      "lab_vs_glibc": predicted / glibc if glibc else None}
    return result


def reality_table(checks: list) -> str:
    heads = ["program", "allocator", "lab policy", "real peak RSS MiB", "predicted MiB",
             "real/predicted", "real vs glibc", "lab vs glibc", "mean RSS MiB"]
    out = []
    for c in checks:
        for name, a in c["allocators"].items():
            out.append([c["program"], name, a["model"], f"{a['real_peak_rss_bytes'] / MIB:.1f}",
                        f"{a['predicted_bytes'] / MIB:.1f}",
                        "-" if a["ratio"] is None else f"{a['ratio']:.2f}",
                        f"{a['real_vs_glibc']:.2f}", f"{a['lab_vs_glibc']:.2f}",
                        "-" if a.get("mean_rss_bytes") is None else f"{a['mean_rss_bytes'] / MIB:.1f}"])
    return format_table(heads, out)


def verdict(rows: list) -> list:
    """Plain statements of where the issue's targets are met and where not."""
    lines = []
    wins = [r for r in rows if (r["summary"].get("oracle_gain") or 0) >= GAIN_TARGET]
    roomy = max(rows, key=lambda r: r["placement_room"])
    gain = max(rows, key=lambda r: r["summary"].get("oracle_gain") or 0)
    lines.append(f"oracle-lifetime wins >= {100 * GAIN_TARGET:.0f}% over the best classic policy on "
                 f"{len(wins)} of {len(rows)} traces" + ("" if wins else
                 f" (target NOT met: at most {100 * (gain['summary'].get('oracle_gain') or 0):.1f}% "
                 f"({gain['program']} {gain['run']}); the best classic policy's free memory at its "
                 f"peak, the most a placement of the same chunks could win, is at most "
                 f"{100 * roomy['placement_room']:.1f}% ({roomy['program']} {roomy['run']}, "
                 f"{roomy['summary']['best_classic']}))"))
    for r in wins:
        closed = r["summary"].get("learned_gap_closed")
        tclosed = (r.get("trained") or {}).get("gap_closed")
        mclosed = (r.get("model") or {}).get("gap_closed")
        ok = max(c for c in (closed, tclosed, mclosed, -1) if c is not None) >= CLOSE_TARGET
        lines.append(f"  {r['program']}-{r['run']}: learned closes "
                     f"{'-' if closed is None else f'{100 * closed:.0f}%'} online, "
                     f"{'-' if tclosed is None else f'{100 * tclosed:.0f}%'} trained on the other run, "
                     f"{'-' if mclosed is None else f'{100 * mclosed:.0f}%'} with a lifetime model"
                     f" ({'met' if ok else 'NOT met'})")
    slow = [p for p in ALL_POLICIES if min(r["policies"][p]["events_per_s"] for r in rows) < 2e6]
    lines.append("replay speed >= 2M events/s per policy on every trace: " +
                 ("met" if not slow else f"NOT met by {', '.join(slow)}"))
    return lines


def chart(rows: list, out: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        print("lab_table: matplotlib missing, no chart", file=sys.stderr)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    labels = [f"{r['program']}-{r['run']}" for r in rows]
    x = np.arange(len(rows))
    width = 0.8 / len(ALL_POLICIES)
    fig, ax = plt.subplots(figsize=(max(10, len(rows) * 1.1), 5.5))
    for i, p in enumerate(ALL_POLICIES):
        ax.bar(x + i * width - 0.4 + width / 2, [r["policies"][p]["fragmentation"] for r in rows],
               width, label=p, hatch="//" if p not in CLASSIC else None)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(x, labels, rotation=30, ha="right")
    ax.set_ylabel("peak footprint / peak live bytes")
    ax.set_ylim(0.9, min(2.2, max(r["policies"][p]["fragmentation"] for r in rows
                                  for p in ALL_POLICIES) + 0.05))
    ax.set_title("heapcast allocator lab: fragmentation by policy (lower is better)")
    ax.legend(ncol=4, fontsize="small")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", help="comma-separated subset of the corpus")
    ap.add_argument("--runs", default="ab", help="which runs to simulate (default: ab)")
    ap.add_argument("--no-reality", action="store_true", help="skip the jemalloc/mimalloc/tcmalloc runs")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "lab_table.json")
    a = ap.parse_args(argv)
    progs = a.programs.split(",") if a.programs else None
    with program_output_hidden():
        traces = corpus.ensure(progs, quiet=True)
    rows = []
    todo = [(p, r) for (p, r) in traces if r in a.runs]
    with tempfile.TemporaryDirectory(prefix="heapcast-lab-") as tmp:
        for program, run in tqdm(todo, desc="simulate", file=sys.stderr):
            other = traces.get((program, "b" if run == "a" else "a"))
            rows.append(lab_row(program, run, traces[(program, run)], other, Path(tmp)))
    checks = []
    if not a.no_reality:
        by_name = {p.name: p for p in corpus.PROGRAMS}
        for row in tqdm([r for r in rows if r["run"] == "a"], desc="reality", file=sys.stderr):
            checks.append(reality_check(by_name[row["program"]], Path(row["trace"]), row))
    print(lab_table(rows))
    print()
    print(prediction_table(rows))
    print()
    print(speed_table(rows))
    if checks:
        print()
        print(reality_table(checks))
    print()
    for line in verdict(rows):
        print(line)
    png = a.out.with_suffix(".png")
    write_json(a.out, {"machine": machine_info(), "rows": rows, "reality": checks,
                       "verdict": verdict(rows)})
    chart(rows, png)
    print(f"\nwrote {a.out} and {png}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
