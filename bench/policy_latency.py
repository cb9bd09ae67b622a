"""Policy latency: nanoseconds per prediction and top-1, one event at a time, per runtime.

    python bench/policy_latency.py                 # jq from the corpus (~10 min on 2 cores)
    python bench/policy_latency.py --quick         # sqlite3, small model and rows (< 2 min)
    python bench/policy_latency.py --program perl --model gru.safetensors

The default model (the GRU with n-gram hints and in-run memory, default size) is trained on run a
of a corpus program (bench/corpus.py; at most --max-train-events network steps) unless --model
gives one, and scored cross-run on run b, the way a policy meets events: one event per call, the
recurrent state carried from call to call, single thread. Runtimes:

- `torch`: PyTorch eager, one StreamNet step per call (torch.set_num_threads(1)), then topk;
- `onnxruntime`: the step exported with heapcast.policy.onnx_export, one InferenceSession.run
  per event from Python (1 intra-op thread), then the top-k in numpy: the figure includes
  Python's per-call overhead (about the cost of one run of an empty graph);
- `native_fp32`, `native_int8`, `table`: policies compiled with `heapcast compile` and run by the
  native runtime through `heapcast evaluate POLICY` (all rows of run b): the time inside the C
  runtime (`runtime_seconds`: every event of each stream fed, each scored row predicted) per
  prediction, without the numpy that prepares its input (`evaluate_ns_per_prediction` in the
  JSON: the whole predict step of `heapcast evaluate`, with it). Left out, with a line saying
  so, where this heapcast has no `compile` command.

torch and onnxruntime step through the first --max-test-events events of run b, fed the per-row
ids that RNNModel._inputs computes beforehand in numpy (the n-gram hints and the in-run memory:
`inputs_ns_per_row` in the JSON, not included in their ns/prediction). Every runtime runs
--repeats times, interleaved (bench/_common.interleaved), medians. top-1 is over the labelled
rows stepped through; `agree_top1` is the share of rows where a runtime's top-1 equals torch's.

Targets (issue 9): native rnn step >= 5x faster than onnxruntime 1-thread at the same top-1
(within 0.1 point); table <= 30 ns per prediction. The verdict lines say where they are missed.
JSON: bench/results/policy_latency.json (object `runtimes`, keyed by runtime).
"""
from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (RESULTS_DIR, format_table, interleaved, machine_info, median,  # noqa: E402
                     write_json)

RUNTIMES = ("torch", "onnxruntime", "native_fp32", "native_int8", "table")
#: `heapcast compile` options of each native runtime.
NATIVE = {"native_fp32": ["--kind", "rnn"], "native_int8": ["--kind", "rnn", "--int8"],
          "table": ["--kind", "table"]}
TARGET_SPEEDUP, TARGET_TABLE_NS = 5.0, 30.0


def torch_stream(model, inputs: list, k: int = 5):
    """Steps the model's torch network through `inputs` (RNNModel._inputs arrays) one event per
    call from a zero state; returns (seconds, top-k class indices per row)."""
    import torch
    net = model.net.eval()
    n = len(inputs[0])
    xs = [torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64).reshape(n, 1, 1))
          for a in inputs]
    kk = min(k, len(model.classes))
    out = np.empty((n, kk), np.int64)
    state = None
    with torch.inference_mode():
        t0 = time.perf_counter()
        for i in range(n):
            logits, state = net(*[x[i] for x in xs], state=state)
            out[i] = torch.topk(logits[0, 0], kk).indices.numpy()
        seconds = time.perf_counter() - t0
    return seconds, out


def onnx_stream(stepper, inputs: list, k: int = 5):
    """The same through onnxruntime (OnnxStepper.stream: one InferenceSession.run per event,
    top-k in numpy): (seconds, top-k class indices per row)."""
    t0 = time.perf_counter()
    out = stepper.stream(inputs, k=k)
    return time.perf_counter() - t0, out


def native_available() -> bool:
    """True when this heapcast has the `compile` command (the native policy runtime)."""
    import argparse as ap
    from heapcast.cli import build_parser
    return any("compile" in action.choices for action in build_parser()._actions
               if isinstance(action, ap._SubParsersAction))


def heapcast_cli(*args) -> str:
    """Runs `heapcast ARGS...` in this process; what it printed (RuntimeError if it failed)."""
    from heapcast.cli import main
    buf = io.StringIO()
    with redirect_stdout(buf):
        code = main([str(a) for a in args])
    if code != 0:
        raise RuntimeError(f"heapcast {' '.join(map(str, args))} exited with {code}")
    return buf.getvalue()


def native_trial(policy: Path, trace: Path):
    """One scoring of a compiled policy by the native runtime (`heapcast evaluate POLICY`)."""
    def run() -> dict:
        r = json.loads(heapcast_cli("evaluate", policy, trace, "--protocol", "cross-run",
                                    "--json"))
        return {"seconds": r.get("runtime_seconds", r["predict_seconds"]), "rows": r["events"],
                "top1": r["top1"], "evaluate_seconds": r["predict_seconds"]}
    return run


def prepare(a, work: Path):
    """(model path, run b trace) of the chosen corpus program, training the model if needed."""
    import corpus as corpus_mod
    from heapcast.forecast.train import train
    paths = corpus_mod.ensure([a.program], quiet=True)
    if (a.program, "a") not in paths or (a.program, "b") not in paths:
        raise SystemExit(f"policy_latency: corpus program {a.program!r} is not available "
                         f"(is it installed?)")
    model = a.model
    if model is None:
        model = work / "model.safetensors"
        print(f"policy_latency: training the default model on {a.program} run a "
              f"({a.max_train_events:,} network steps) ...", file=sys.stderr)
        train([paths[(a.program, "a")]], model, config={"threads": a.threads},
              max_events=a.max_train_events, progress=True)
    return Path(model), paths[(a.program, "b")]


def test_data(model, trace: Path, cap: int):
    """TaskData of the first `cap` events of `trace` (all for 0), in the model's stream order."""
    from heapcast.forecast.dataset import load_task_for
    _, data = load_task_for([trace], model.meta["training"].get("order", "thread"), model)
    if cap and len(data) > cap:
        data = data.select(np.arange(len(data)) < cap)
    return data


def torch_top1_all_rows(model, trace: Path) -> float:
    """The model's top-1 on every labelled row of `trace` with its own batched predict() (what
    `heapcast evaluate MODEL TRACE --protocol cross-run` reports): the figure the native rnn
    policy, which scores all of run b, is held to."""
    data = test_data(model, trace, 0)
    rows = np.flatnonzero(data.labels >= 0)
    return float((model.predict(data, rows, 1)[:, 0] == data.labels[rows]).mean())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--program", help="corpus program (default: jq; sqlite3 with --quick)")
    ap.add_argument("--model", type=Path, help="a trained gru/lstm model (default: train one)")
    ap.add_argument("--max-train-events", type=int, help="network steps of the training "
                    "(default 300,000; 30,000 with --quick)")
    ap.add_argument("--max-test-events", type=int, help="events of run b that torch and "
                    "onnxruntime step through (default 10,000; 4,000 with --quick)")
    ap.add_argument("--repeats", type=int, help="interleaved runs of each (default 5; 3 quick)")
    ap.add_argument("--threads", type=int, default=2, help="training threads (default 2)")
    ap.add_argument("--quick", action="store_true", help="a small version (< 2 minutes)")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "policy_latency.json")
    a = ap.parse_args(argv)
    quick = a.quick
    a.program = a.program or ("sqlite3" if quick else "jq")
    a.max_train_events = a.max_train_events or (30_000 if quick else 300_000)
    a.max_test_events = a.max_test_events or (4_000 if quick else 10_000)
    a.repeats = a.repeats or (3 if quick else 5)
    t_start = time.perf_counter()

    import torch
    from heapcast.forecast.models import load_model
    from heapcast.policy.onnx_export import OnnxStepper, export_onnx
    with tempfile.TemporaryDirectory(prefix="policy_latency-") as tmp:
        work = Path(tmp)
        model_path, trace_b = prepare(a, work)
        model = load_model(model_path)
        if model.kind not in ("gru", "lstm"):
            raise SystemExit(f"policy_latency: {model_path} is a {model.kind!r} model; this "
                             f"benchmark runs a gru or lstm model")
        onnx_path = export_onnx(model_path, work / "model.onnx")
        stepper = OnnxStepper(onnx_path, threads=1)
        torch.set_num_threads(1)
        data = test_data(model, trace_b, a.max_test_events)
        top1_all = None if quick else torch_top1_all_rows(model, trace_b)
        t0 = time.perf_counter()
        inputs = model._inputs(data)
        inputs_ns = (time.perf_counter() - t0) / len(data) * 1e9
        labelled = data.labels >= 0
        truth = data.labels[labelled]
        preds = {}

        def stream_trial(name, fn, *args):
            def run() -> dict:
                seconds, best = fn(*args)
                preds[name] = best
                return {"seconds": seconds, "rows": len(best)}
            return run

        trials = {"torch": stream_trial("torch", torch_stream, model, inputs),
                  "onnxruntime": stream_trial("onnxruntime", onnx_stream, stepper, inputs)}
        native = native_available()
        missing = {}
        if native:
            for name, options in NATIVE.items():
                policy = work / f"{name}.policy"
                try:
                    heapcast_cli("compile", model_path, "-o", policy, *options)
                except (RuntimeError, SystemExit) as e:
                    missing[name] = f"heapcast compile {' '.join(options)} failed: {e}"
                    continue
                trials[name] = native_trial(policy, trace_b)
        else:
            missing = {name: "not available: this heapcast has no `compile` command (native "
                       "policy runtime)" for name in NATIVE}
        runs = interleaved(trials, a.repeats, "policy_latency")

    runtimes = {}
    for name, rs in runs.items():
        ns = median([r["seconds"] / r["rows"] * 1e9 for r in rs])
        entry = {"ns_per_prediction": ns, "rows": rs[0]["rows"],
                 "runs_ns_per_prediction": [r["seconds"] / r["rows"] * 1e9 for r in rs]}
        if name in preds:
            top = model.classes[preds[name][labelled, 0]]
            entry.update(top1=float((top == truth).mean()), scored_rows=int(labelled.sum()),
                         agree_top1=float((preds[name][labelled, 0]
                                           == preds["torch"][labelled, 0]).mean()))
        else:
            entry.update(top1=rs[0]["top1"], scored_rows=rs[0]["rows"],
                         evaluate_ns_per_prediction=median(
                             [r["evaluate_seconds"] / r["rows"] * 1e9 for r in rs]))
        runtimes[name] = entry
    how = {"torch": "PyTorch eager, 1 thread, one step per call",
           "onnxruntime": "InferenceSession.run from Python per event, 1 intra-op thread",
           "native_fp32": "heapcast policy runtime, rnn fp32 (heapcast evaluate)",
           "native_int8": "heapcast policy runtime, rnn int8 (heapcast evaluate)",
           "table": "heapcast policy runtime, table (heapcast evaluate)"}
    if top1_all is not None:
        runtimes["torch"]["top1_all_rows"] = top1_all
    ort_ns = runtimes["onnxruntime"]["ns_per_prediction"]
    rows = []
    for name in RUNTIMES:
        if name not in runtimes:
            rows.append([name, missing.get(name, "not run"), None, None, None, None, None])
            continue
        r = runtimes[name]
        rows.append([name, how[name], f"{r['scored_rows']:,}", f"{r['ns_per_prediction']:,.0f}",
                     f"{ort_ns / r['ns_per_prediction']:.2f}x", f"{100 * r['top1']:.2f}",
                     f"{100 * r['agree_top1']:.2f}" if "agree_top1" in r else None])
    print(f"policy_latency: {model.kind} ({model.config['hidden']} hidden, "
          f"{len(model.classes)} classes) trained on {a.program} run a, scored on run b; "
          f"medians of {a.repeats} interleaved runs")
    print(format_table(["runtime", "how", "rows", "ns/prediction", "vs onnxruntime", "top-1 %",
                        "same top-1 as torch %"], rows))
    print(f"(torch and onnxruntime read ids precomputed in numpy: {inputs_ns:,.0f} ns/row for "
          f"the n-gram hints and the in-run memory, not included above)")
    if top1_all is not None:
        print(f"torch's batched predict() on all rows of run b: top-1 {100 * top1_all:.2f}%")
    verdicts = []
    if "native_fp32" in runtimes:
        r = runtimes["native_fp32"]
        speedup = ort_ns / r["ns_per_prediction"]
        torch_r = runtimes["torch"]
        whole = r["rows"] != len(data) and "top1_all_rows" in torch_r
        gap = 100 * (r["top1"] - torch_r["top1_all_rows" if whole else "top1"])
        verdicts.append(f"native rnn fp32 vs onnxruntime: {speedup:.1f}x (target >= "
                        f"{TARGET_SPEEDUP:.0f}x): {'met' if speedup >= TARGET_SPEEDUP else 'MISSED'}"
                        f"; top-1 {gap:+.2f} points from torch's"
                        + (f" (both on all {r['rows']:,} rows of run b)" if whole else ""))
    if "table" in runtimes:
        ns = runtimes["table"]["ns_per_prediction"]
        verdicts.append(f"table: {ns:.1f} ns/prediction (target <= {TARGET_TABLE_NS:.0f}): "
                        f"{'met' if ns <= TARGET_TABLE_NS else 'MISSED'}")
    for name, why in missing.items():
        verdicts.append(f"{name}: {why}")
    for v in verdicts:
        print(v)
    result = {"machine": machine_info(), "quick": quick, "program": a.program,
              "model": {"path": str(a.model) if a.model else None, "kind": model.kind,
                        "hidden": model.config["hidden"], "classes": int(len(model.classes)),
                        "train_events": a.max_train_events},
              "test_trace": str(trace_b), "max_test_events": a.max_test_events,
              "repeats": a.repeats, "inputs_ns_per_row": inputs_ns, "runtimes": runtimes,
              "not_available": missing, "verdicts": verdicts,
              "wall_s": time.perf_counter() - t_start}
    print(f"wrote {write_json(a.out, result)} ({result['wall_s']:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
