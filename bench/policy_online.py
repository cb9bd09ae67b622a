"""What running a compiled policy inside the traced program costs (`heapcast record --policy`).

    python bench/policy_online.py [--repeats 5] [--quick] [--workloads ring,py_dicts]

For ring.c and py_dicts.py (../shared/workloads) it trains, on a short recording of the same
workload, an n-gram for `next` and for `lifetime` and a small default GRU for `next`, compiles the
n-grams into tables and the GRU into an rnn policy, then times, interleaved, the program's own run
(the recorder preloaded with LD_PRELOAD and HEAPCAST_DIR, as `heapcast record` runs it, without
the conversion after exit):
  untraced | recorder | recorder + table (lifetime, every event) | + table (next, every event)
  | + table (next, every 16) | + rnn (next, every event) | + rnn (next, every 16).
Columns: median seconds, ns/event added over the recorder alone, and that over the recorder's
own ns/event (target for a table on every event: <= 2x). Writes bench/results/policy_online.json.
"""
from __future__ import annotations

import argparse
import inspect
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (RESULTS_DIR, compile_c, format_table, interleaved, machine_info,  # noqa: E402
                     median, python_executable, time_command, workload, write_json)

import heapcast  # noqa: E402
from heapcast.recorder.session import recorder_library  # noqa: E402


def _record_kwargs() -> dict:
    # a policy sees native call sites: train on recordings made the same way
    return {"python": False} if "python" in inspect.signature(heapcast.record).parameters else {}


def prepare(name: str, build: Path, quick: bool) -> tuple[list, dict, list]:
    """(command, environment, [(trial name, policy path or None, every)]) of one workload."""
    from heapcast.forecast.train import train
    from heapcast.policy import compile_policy
    if name == "ring":
        exe = compile_c(workload("ring.c"), build / "ring")
        cmd = [str(exe), "300000" if quick else "3000000", "1000"]
        train_cmd, env = [str(exe), "100000", "1000"], {}
    else:
        cmd = [python_executable(), str(workload("py_dicts.py"))]
        train_cmd, env = cmd, {"PYTHONMALLOC": "malloc"}
    trace = build / f"{name}.trace"
    heapcast.record(train_cmd, output=trace, env=env, progress=False, **_record_kwargs())
    policies = []
    for task in ("lifetime", "next"):
        model = build / f"{name}-{task}.safetensors"
        train([trace], model, model="ngram", task=task)
        compile_policy(model, build / f"{name}-{task}.table", kind="table", max_rows=300_000)
        policies.append((task, build / f"{name}-{task}.table"))
    gru = build / f"{name}-gru.safetensors"
    train([trace], gru, model="gru", task="next", max_events=50_000,
          config={"hidden": 32 if quick else 128})
    compile_policy(gru, build / f"{name}.rnn", kind="rnn")
    trials = [("untraced", None, 0), ("recorder", None, 1),
              ("+ table lifetime", policies[0][1], 1), ("+ table next", policies[1][1], 1),
              ("+ table next /16", policies[1][1], 16)]
    if name == "ring" or not quick:    # the GRU steps every event: minutes on py_dicts
        trials += [("+ rnn next", build / f"{name}.rnn", 1),
                   ("+ rnn next /16", build / f"{name}.rnn", 16)]
    return cmd, env, trials


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true",
                    help="ring at 1/10 size, a small GRU, no GRU on py_dicts")
    ap.add_argument("--workloads", default="ring,py_dicts")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "policy_online.json")
    a = ap.parse_args()
    build = Path(tempfile.mkdtemp(prefix="heapcast-policy-online-"))
    results, rows = {"machine": machine_info(), "workloads": {}}, []
    try:
        for name in a.workloads.split(","):
            print(f"preparing {name} (recording, training, compiling)...", file=sys.stderr)
            cmd, env, trials = prepare(name, build, a.quick)
            probe = build / f"{name}.probe"
            heapcast.record(cmd, output=probe, env=env, progress=False, **_record_kwargs())
            events = heapcast.load(probe).event_count
            runs = {}

            def trial(policy, every, label):
                def run():
                    out = build / f"{name}-{label.replace(' ', '_').replace('/', '_')}"
                    shutil.rmtree(out, ignore_errors=True)
                    out.mkdir()
                    e = dict(env)
                    if every:      # the recorder, as heapcast record preloads it
                        e.update(LD_PRELOAD=str(recorder_library()), HEAPCAST_DIR=str(out),
                                 HEAPCAST_STACKS="0")
                        if "python" in inspect.signature(heapcast.record).parameters:
                            e["HEAPCAST_PYTHON"] = "0"
                    if policy is not None:
                        e.update(HEAPCAST_POLICY=str(policy), HEAPCAST_POLICY_EVERY=str(every))
                    return {"seconds": time_command(cmd, env=e)}
                return run
            for label, policy, every in trials:
                runs[label] = trial(policy, every, label)
            done = interleaved(runs, a.repeats, label=name)
            sec = {k: median(r["seconds"] for r in v) for k, v in done.items()}
            own = (sec["recorder"] - sec["untraced"]) / events * 1e9
            out = {"events": events, "seconds": sec, "recorder_ns_per_event": own, "trials": {}}
            for label, _, _ in trials:
                added = (sec[label] - sec["recorder"]) / events * 1e9 if label.startswith("+") \
                    else None
                out["trials"][label] = {"seconds": sec[label], "ns_per_event_added": added,
                                        "over_recorder": added / own if added is not None
                                        and own > 0 else None}
                rows.append([name, label, f"{sec[label]:.3f}",
                             None if label == "untraced" else
                             f"{(own if added is None else added):.1f}",
                             None if added is None or own <= 0 else f"{added / own:.2f}x"])
            results["workloads"][name] = out
    finally:
        shutil.rmtree(build, ignore_errors=True)
    print(format_table(["workload", "run", "median s", "+ns/event", "over recorder"], rows))
    print("(recorder row: the recorder's own ns/event over untraced; target for a table on "
          "every event: <= 2x it)")
    write_json(a.out, results)
    print(f"wrote {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
