"""The report's forecast section (--model): how well forecasting models predict this trace, where
in the run they fail, per class and (lifetimes) as a confusion matrix.

Everything is computed from one function's output, `predictions(model, trace)`: the true label and
the model's top-5 of each scored event, fed to heapcast.forecast.evaluate.model_result (a
compiled policy's per-event predictions too). When `heapcast evaluate` scored the model on this
trace already, under the protocol the report uses, the section takes what it kept in the trace's
directory (heapcast.trace.cache): every scored row, not a sample, and no prediction again.
Otherwise the report predicts a sample of the rows and keeps its result there too, so that the
next report of the same trace and model (other options, another look) does not predict again:
22 s for the main job's GRU.
"""
from __future__ import annotations

import numpy as np

MAX_ROWS = 300_000      # scored events per model (evenly spread over the scorable ones)


def predictions(model_path, trace, features: dict | None = None
                ) -> tuple[object, np.ndarray, np.ndarray, str]:
    """(model, true labels, top-5 predictions, protocol) of a forecasting model file, or of a
    compiled POLICY (run through the native runtime), on `trace`.

    Scored rows follow heapcast evaluate's protocols: the held-out part ('time'/'article' split)
    when the model was trained on this very recording, else the whole recording (cross-run).
    `features`: the trace's features by stream order and rank columns, shared by the models of
    one report (each took 13 s to build again on a Python program's 13.6M events)."""
    from ..forecast.dataset import load_features
    from ..forecast.evaluate import scored_rows
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
    protocol = protocol_for(model_path, trace)     # a refusal before the features are built
    order = training.get("order", "thread")
    ranks = rank_groupings(model.task, getattr(model, "free_group", "all"))
    features = {} if features is None else features
    key = (order, ranks)
    if key not in features:
        # (from the file: the report's Trace keeps no events, and must not keep these)
        features[key] = load_features([str(trace.path)], order, need_ranks=ranks)
    feats = features[key]
    data = make_task_for(feats, model)
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
        pred = predict_streams(Policy(model_path), data, want,     # rows: sorted, unique
                               warmup=model.spec["model"]["config"].get("warmup"))
    else:
        pred = model.predict(data, rows, 5)
    return model, data.labels[rows], pred, protocol


def model_section(models, trace) -> dict:
    """The forecast section for one or more model files."""
    paths = models if isinstance(models, (list, tuple)) else [models]
    from ..forecast.evaluate import kept_for_report, model_result
    from ..trace import cache
    results, features = [], {}
    for path in paths:
        digest = cache.file_digest(path)
        kept = kept_for_report(path, trace.path, _split(path), digest)
        if kept is not None:   # `heapcast evaluate` scored every row of it already
            kept.pop("trained_on_these_traces", None)
            results.append(kept)
            continue
        k = cache.key(trace.path, model=digest, sample=MAX_ROWS)
        again = cache.load(trace.path, "forecast-report", k)
        if again is not None:   # an earlier report's sample
            results.append({**again, "path": str(path)})
            continue
        model, y, pred, protocol = predictions(path, trace, features)
        result = model_result(model, y, pred, protocol, str(path))
        cache.save(trace.path, "forecast-report", k, result)
        results.append(result)
    return {"results": results}


def protocol_for(model_path, trace) -> str:
    """The protocol the report scores a model file or POLICY under on `trace`: the held-out part
    of its split ('time'/'article') when it was trained on this very recording, else cross-run.
    From their metadata alone, so that the refusal of a model that protocol cannot score
    (ModelError: trained on the whole of this recording, on another program...) comes before
    the report's work, not after its features are built (heapcast.forecast.evaluate.
    check_protocol, which scored_rows applies again to the features)."""
    from ..forecast.evaluate import check_protocol, overlap
    from ..forecast.features import recording_source
    training = _training(model_path)
    sources = [recording_source(trace)]
    split = training.get("split", "all")
    trained = overlap(training.get("traces", []), sources)
    if trained and split not in ("time", "article"):
        from ..forecast.modelfile import ModelError
        raise ModelError(f"{model_path}: trained on the whole of {', '.join(trained)} (--split "
                         f"{split}): the report has none of its events left to score it on; "
                         "report it on another recording of the same program, or train it "
                         "with --split time")
    protocol = split if trained else "cross-run"
    check_protocol(model_path, protocol, training, sources)
    return protocol


def _training(path) -> dict:
    """How a model file (or the model a POLICY was compiled from) was trained, from its metadata
    alone (report() has checked the file already; predictions() loads it if needed)."""
    from ..policy.fileformat import is_policy, read_spec
    if is_policy(path):
        return read_spec(path).get("training", {})
    from ..forecast.modelfile import read_model_meta
    return read_model_meta(path).get("training", {})


def _split(path) -> str:
    """The split a model file (or a POLICY's model) was trained with."""
    return _training(path).get("split", "all")
