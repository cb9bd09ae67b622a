"""Development mode's other half: `heapcast train --from-log LOG... --init MODEL -o MODEL2`
continues training a model on the feature logs of field runs (`heapcast record --policy POLICY
--log-features`), as MLGO retrains a policy on the logs its development mode wrote.

A log holds, for each decision, the event's call-site key, token and time-delta bucket and its
true label (docs/trace-format.md, "Features"): per stream in order, the rows a `next` model learns
from. The model keeps its weights, label classes and n-gram; training continues on the logged
rows (the n-gram's hints on them are what it predicts for data it never saw).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ..forecast.modelfile import ModelError
from ..forecast.tasks import TaskData
from .online import read_features


def log_files(paths) -> list:
    """The `<pid>.features` files of the given trace directories or files."""
    out = []
    for p in map(Path, paths):
        found = sorted(p.glob("*.features")) if p.is_dir() else [p]
        if not found:
            raise ModelError(f"{p}: no feature logs (record with `heapcast record --policy POLICY "
                             f"--log-features`)")
        out += found
    return out


def task_data_of_logs(paths, vocab: str) -> TaskData:
    """The logged decisions as a `next` TaskData: one stream per logged thread, rows in seq
    order; ModelError for a log of another task or vocabulary."""
    tokens, sites, dt, labels, offsets = [], [], [], [], [0]
    for f in log_files(paths):
        header, recs = read_features(f)
        if header["task"] != "next" or header["vocab"] != vocab:
            raise ModelError(f"{f}: a log of a {header['task']!r} policy on vocabulary "
                             f"{header['vocab']!r}: fine-tuning from logs takes next-task logs "
                             f"of the model's vocabulary ({vocab!r})")
        order = np.lexsort((recs["seq"], recs["stream"]))
        recs = recs[order]
        for s in np.unique(recs["stream"]):
            r = recs[recs["stream"] == s]
            tokens.append(r["token"])
            sites.append(r["site"])
            dt.append(r["dt"])
            labels.append(r["label"].astype(np.int64))
            offsets.append(offsets[-1] + len(r))
    if offsets[-1] == 0:
        raise ModelError("the feature logs hold no decisions")
    n = offsets[-1]
    cat = np.concatenate
    return TaskData("next", vocab, cat(tokens).astype(np.uint16), cat(sites).astype(np.uint32),
                    cat(dt).astype(np.uint8), cat(labels), np.asarray(offsets, np.int64),
                    np.zeros(n, np.uint64), np.zeros(n, np.uint16), np.full(n, -1, np.int64))


def finetune(init, logs, output, epochs: int = 1, lr: float | None = None,
             progress: bool = False) -> dict:
    """Continues training the model file `init` on feature logs `logs` (trace directories or
    .features files) and writes it to `output`; returns the training summary."""
    from ..forecast.models import STREAM_MODELS, load_model, save_model
    model = load_model(init)
    if model.kind not in STREAM_MODELS or model.task != "next":
        raise ModelError(f"{init}: a {model.kind} model of task {model.task!r}; fine-tuning from "
                         f"logs continues a next-task {'/'.join(STREAM_MODELS)} model")
    data = task_data_of_logs(logs, model.vocab)
    if lr is not None:
        model.config["lr"] = lr
    t0 = time.perf_counter()
    stats = model.fit(data, np.ones(len(data), bool), epochs=epochs, progress=progress,
                      finetune=True)
    training = dict(model.meta.get("training", {}))
    training["finetuned"] = {"from": str(init), "logs": [str(f) for f in log_files(logs)],
                             "rows": int(len(data)), "epochs": epochs}
    save_model(model, output, training)
    return {"output": str(output), "rows": int(len(data)), "stats": stats,
            "wall_s": time.perf_counter() - t0}
