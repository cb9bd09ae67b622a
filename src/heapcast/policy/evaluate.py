"""`heapcast evaluate POLICY TRACE...`: a compiled policy scored through the native runtime.

The rows, protocols and metrics are those of `heapcast evaluate MODEL` (heapcast.forecast.
evaluate); what differs is how predictions are made: every stream runs through the C runtime
from its first event, one event at a time, exactly as a program's own run feeds it
(`heapcast record --policy`), the in-run memory reading each row's label once the row happened.
"""
from __future__ import annotations

import os
import time
from types import SimpleNamespace

import numpy as np

from ..forecast.dataset import load_task_for
from ..forecast.evaluate import keep_for_report, metrics, refuse_early, scored_rows
from ..forecast.protocols import PROTOCOLS
from ..forecast.tasks import DEFAULT_ORDER
from .fileformat import read_spec
from .native import Policy, events_of


def predict_streams(policy: Policy, data, want: np.ndarray, memory_log2: int = 0,
                    warmup: int | None = None) -> np.ndarray:
    """Top-5 labels (int64 [rows, 5]) of the rows of TaskData `data` where `want` is true, in
    row order, each stream run through `policy` from its start. With `warmup` = W, the network
    of an rnn starts W rows before a stream's first wanted row, as the model's own prediction
    does (its n-gram histories and in-run memory still see the whole stream); None: the whole
    stream, as a program's run feeds it. Streams are independent (each runs in a state of its
    own, the policy is only read), so they run side by side, one thread per CPU: the runtime
    leaves Python's lock while it runs."""
    want = np.asarray(want, bool)
    out = np.empty((int(want.sum()), 5), np.int64)   # only the wanted rows: not [len(data), 5]
    events = events_of(data.tokens, data.sites, data.ts)
    labels = data.labels.astype(np.int32)
    jobs, done = [], 0   # (stream rows a:b, its wanted rows, where they go in out, warm-up start)
    for s in range(len(data.offsets) - 1):
        a, b = int(data.offsets[s]), int(data.offsets[s + 1])
        sel = want[a:b]
        count = int(sel.sum())
        if count:
            warm = 0 if warmup is None else max(0, int(np.argmax(sel)) - warmup)
            jobs.append((a, b, sel, done, warm))
            done += count

    def run(job) -> None:
        a, b, sel, at, warm = job
        pred = policy.run(events[a:b], labels[a:b], sel, memory_log2, warm)
        picked = pred["label"][sel]
        out[at:at + len(picked)] = picked

    workers = min(len(jobs), len(os.sched_getaffinity(0)) or 1)
    if workers <= 1:
        for job in jobs:
            run(job)
    else:
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(workers, thread_name_prefix="heapcast-policy") as pool:
            for _ in pool.map(run, jobs):   # (an error raises here)
                pass
    return out


def evaluate_policy(policy_path, traces, protocol: str) -> dict:
    """Scores the POLICY at `policy_path` on `traces` under `protocol` (as heapcast.forecast.
    evaluate.evaluate does for a model file); returns the metrics as a JSON-able dict."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r} (known: {', '.join(PROTOCOLS)})")
    spec = read_spec(policy_path)
    policy = Policy(policy_path)
    training = spec.get("training", {})
    order = training.get("order", DEFAULT_ORDER[spec["task"]])
    labels = label_space(spec)
    refuse_early(policy_path, protocol, training, traces)
    feats, data = load_task_for(traces, order, labels)
    test, overlap = scored_rows(policy_path, protocol, data, training, feats.sources)
    rows = np.flatnonzero(test)
    t0 = time.perf_counter()
    # the network warms up as long before the first scored row as the source model's does
    warmup = spec["model"]["config"].get("warmup")
    pred = predict_streams(policy, data, test, warmup=warmup)
    seconds = time.perf_counter() - t0
    kind = spec["kind"] + ("-int8" if spec.get("rnn", {}).get("int8") else "") + \
        (f"-prune{spec['rnn']['prune']:g}" if spec.get("rnn", {}).get("prune") else "")
    result = {"protocol": protocol, "task": spec["task"], "model": f"policy:{kind}",
              "vocab": spec["vocab"], "target": "true", "model_path": str(policy_path),
              "source_model": spec["model"]["path"], "source_sha256": spec["model"]["sha256"],
              "traces": [s["path"] for s in feats.sources], "events": int(len(rows)),
              "events_available": int(len(rows)), "sampled": False,
              "trained_on_these_traces": bool(overlap), "predict_seconds": seconds,
              "predict_events_per_s": len(rows) / max(seconds, 1e-9), "runtime": "native",
              # inside the C runtime only (every event of the streams fed, the scored rows
              # predicted), without preparing its input in numpy
              "runtime_seconds": policy.run_seconds,
              "runtime_ns_per_prediction": policy.run_seconds / max(len(rows), 1) * 1e9}
    y = data.labels[rows]
    scored = metrics(labels, y, pred)
    result.update(scored)
    if len(feats.sources) == 1:
        labels.kind = f"policy:{spec['kind']}"    # as the report names it
        keep_for_report(policy_path, feats.sources[0]["path"], labels, y, pred, protocol,
                        bool(overlap), scored)
    return result


def label_space(spec: dict) -> SimpleNamespace:
    """What a POLICY predicts, as heapcast.forecast reads a model: task, vocabulary, target and,
    for `free`, its grouping and code table (spec `outputs`)."""
    out = spec.get("outputs", {})
    codes = out.get("free_codes")
    return SimpleNamespace(task=spec["task"], vocab=spec["vocab"], target="true",
                           free_group=out.get("free_group", "all"),
                           free_codes=None if codes is None else np.asarray(codes, np.int64),
                           n_labels=int(out.get("labels", 0)))
