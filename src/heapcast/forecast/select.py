"""Choosing settings on a validation run: recordings that are neither trained on nor tested on.

`heapcast train A1 A2 --validate V -o M` learns from A1, A2 and chooses on V what a single run
cannot tell: which n-gram context orders and whether call sites carry over to another input
(`choose_ngram`: the n-gram model itself, or the n-gram whose hints the gru reads), and, for the
gru, how far to trust those offline hints against its in-run memory (RNNModel.calibrate: the
logit boosts of both, fitted on V). The test run is never read here; `heapcast evaluate` refuses
to score a model on its validation runs.
"""
from __future__ import annotations

import numpy as np

from .tasks import TaskData

#: Labelled rows of the validation run that are scored (its first ones, every candidate alike).
VALIDATION_ROWS = 200_000
#: The longest context order of each n-gram candidate (the orders up to it are blended).
ORDER_CAPS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)


def validation_rows(val: TaskData, limit: int = VALIDATION_ROWS) -> np.ndarray:
    """The labelled rows of the validation data that choices are scored on."""
    return np.flatnonzero(val.labels >= 0)[:limit]


def choose_ngram(task: str, vocab: str, train: TaskData, train_mask: np.ndarray,
                 val: TaskData, base: dict | None = None, limit: int = VALIDATION_ROWS,
                 caps=ORDER_CAPS) -> tuple:
    """(chosen n-gram settings, every candidate with its validation top-1): n-grams with and
    without call sites, blending all orders up to each of `caps`, fitted on the training
    rows and scored on the validation run. Ties go to fewer orders, then to no call sites."""
    from .models.ngram import NGram
    rows = validation_rows(val, limit)
    if not len(rows):
        raise ValueError("the validation runs have no labels of this task to choose on")
    y = val.labels[rows]
    candidates = []
    for sites in (False, True):
        full = NGram(task, vocab, {**(base or {}), "sites": sites, "orders": list(caps)})
        full.fit(train, train_mask)
        contexts = full.contexts(val)
        for cap in caps:
            sub = full.restricted([m for m in caps if m <= cap])
            pred = sub.predict_proba(val, rows, 1, contexts)[0][:, 0]
            candidates.append({"sites": sites, "orders": sub.config["orders"],
                               "top1": float(np.mean(pred == y))})
    best = max(candidates, key=lambda c: (c["top1"], -len(c["orders"]), not c["sites"]))
    return {"sites": best["sites"], "orders": best["orders"]}, candidates


def tune_on_validation(model, data: TaskData, train_rows: np.ndarray, val: TaskData) -> dict:
    """Sets into `model` (not yet fitted) the n-gram settings chosen on the validation data
    `val`: its own (ngram) or its hints' (gru, lstm, transformer). Returns the record of the
    choice (chosen settings, candidates, rows scored); call calibrate_on_validation after
    fitting."""
    target = model.config if model.kind == "ngram" else model.config.get("ngram")
    if target is None:
        return {}
    chosen, candidates = choose_ngram(model.task, model.vocab, data, train_rows, val,
                                      {"topk": target.get("topk", 8)})
    target.update(chosen)
    return {"ngram": chosen, "candidates": candidates, "rows": int(len(validation_rows(val)))}


def calibrate_on_validation(model, val: TaskData) -> dict:
    """After fitting: the gru's trust in its hints vs its in-run memory, fitted on `val`
    (RNNModel.calibrate); {} for models without it."""
    return model.calibrate(val, validation_rows(val)) if hasattr(model, "calibrate") else {}
