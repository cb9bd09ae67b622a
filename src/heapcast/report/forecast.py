"""The report's forecast section (--model): how well forecasting models predict this trace, where
in the run they fail, per class and (lifetimes) as a confusion matrix.

Everything is computed from one function's output, `predictions(model, trace)`: the true label and
the model's top-5 of each scored event. Anything that yields that (a compiled policy's
per-event predictions too) can feed `model_result`.
"""
from __future__ import annotations

import numpy as np

MAX_ROWS = 300_000      # scored events per model (evenly spread over the scorable ones)
TIME_BINS = 100


def predictions(model_path, trace, features: dict | None = None
                ) -> tuple[object, np.ndarray, np.ndarray, str]:
    """(model, true labels, top-5 predictions, protocol) of a forecasting model file, or of a
    compiled POLICY (run through the native runtime), on `trace`.

    Scored rows follow heapcast evaluate's protocols: the held-out part ('time'/'article' split)
    when the model was trained on this very recording, else the whole recording (cross-run).
    `features`: the trace's features by stream order and rank columns, shared by the models of
    one report (each took 13 s to build again on a Python program's 13.6M events)."""
    from ..forecast.dataset import load_features
    from ..forecast.evaluate import overlap, scored_rows
    from ..forecast.tasks import make_task_for, rank_groupings
    from ..forecast.models import load_model
    from ..policy.evaluate import label_space
    from ..policy.fileformat import is_policy, read_spec
    policy = is_policy(model_path)
    if policy:
        spec = read_spec(model_path)
        model = label_space(spec)
        model.kind, model.meta, model.spec = (f"policy:{spec['kind']}",
                                              {"training": spec.get("training", {})}, spec)
    else:
        model = load_model(model_path)
    training = model.meta.get("training", {})
    order = training.get("order", "thread")
    ranks = rank_groupings(model.task, getattr(model, "free_group", "all"))
    features = {} if features is None else features
    key = (order, ranks)
    if key not in features:
        # (from the file: the report's Trace keeps no events, and must not keep these)
        features[key] = load_features([str(trace.path)], order, need_ranks=ranks)
    feats = features[key]
    data = make_task_for(feats, model)
    trained = overlap(training.get("traces", []), feats.sources)
    split = training.get("split", "all")
    protocol = split if trained and split in ("time", "article") else "cross-run"
    test, _ = scored_rows(model_path, protocol, data, training, feats.sources)
    rows = np.flatnonzero(test)
    if len(rows) > MAX_ROWS:
        rows = rows[np.linspace(0, len(rows) - 1, MAX_ROWS).astype(np.int64)]
    if not len(rows):
        pred = np.zeros((0, 5), np.int64)
    elif policy:
        from ..policy.evaluate import predict_streams
        from ..policy.native import Policy
        want = np.zeros(len(data), bool)
        want[rows] = True
        pred = predict_streams(Policy(model_path), data, want,
                               warmup=model.spec["model"]["config"].get("warmup"))[rows]
    else:
        pred = model.predict(data, rows, 5)
    return model, data.labels[rows], pred, protocol


def model_result(model, y: np.ndarray, pred: np.ndarray, protocol: str, path: str) -> dict:
    """The section's numbers for one model: heapcast evaluate's metrics plus top-1 over time."""
    from ..forecast.evaluate import metrics
    from ..forecast.tasks import label_names
    out = {"model": model.kind, "task": model.task, "vocab": model.vocab, "protocol": protocol,
           "path": path, "events": int(len(y))}
    out.update(metrics(model, y, pred))
    hit = pred[:, 0] == y if len(y) else np.zeros(0, bool)
    bins = np.array_split(np.arange(len(y)), min(TIME_BINS, max(len(y), 1)))
    out["over_time"] = {"position": [float(b[0] / max(len(y), 1)) if len(b) else 0.0 for b in bins],
                        "top1": [float(hit[b].mean()) if len(b) else None for b in bins]}
    if "confusion" in out:
        out["confusion_names"] = list(label_names(model.task, model.vocab))
    return out


def model_section(models, trace) -> dict:
    """The forecast section for one or more model files."""
    paths = models if isinstance(models, (list, tuple)) else [models]
    results, features = [], {}
    for path in paths:
        model, y, pred, protocol = predictions(path, trace, features)
        results.append(model_result(model, y, pred, protocol, str(path)))
    return {"results": results}
