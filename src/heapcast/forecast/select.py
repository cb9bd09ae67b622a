"""Choosing settings on a validation run: recordings that are neither trained on nor tested on.

`heapcast train A1 A2 --validate V -o M` learns from A1, A2 and chooses on V what a single run
cannot tell: for `free`, whether blocks are named by their rank among all live blocks or within
their size class or call site (`choose_free_group`), which n-gram context orders and whether call sites carry over to another input
(`choose_ngram`: the n-gram model itself, or the n-gram whose hints the gru reads), and, for the
gru, which context lengths its in-run memory keys on (`choose_memory`), its recurrent size
(`choose_hidden`: small probe models, each scored on V) and how far to trust the offline hints
against its in-run memory (RNNModel.calibrate: the logit boosts of both, fitted on V). A setting
the user gave is kept, not chosen. The test run is never read here; `heapcast evaluate` refuses
to score a model on its validation runs.
"""
from __future__ import annotations

import numpy as np

from .tasks import FREE_GROUPS, TaskData, free_code_table, make_task

#: Labelled rows of the validation run that are scored (its first ones, every candidate alike).
VALIDATION_ROWS = 200_000
#: The longest context order of each n-gram candidate (the orders up to it are blended).
ORDER_CAPS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
#: Context lengths of the gru's in-run memory that choose_memory tries (the default first).
MEMORY_CANDIDATES = ((4, 8, 16), (1, 2, 4), (2, 4, 8), (1, 4, 16), (8, 16, 32))
#: Recurrent sizes that choose_hidden tries (the default first), on probes trained on at most
#: PROBE_EVENTS training rows and scored on at most PROBE_ROWS validation rows.
HIDDEN_CANDIDATES = (128, 64, 256)
PROBE_EVENTS = 200_000
PROBE_ROWS = 50_000


def validation_rows(val: TaskData, limit: int = VALIDATION_ROWS) -> np.ndarray:
    """The labelled rows of the validation data that choices are scored on."""
    return np.flatnonzero(val.labels >= 0)[:limit]


def correct(val: TaskData, pred: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Which predictions `pred` of labels `y` are right: equal, and not the `free` task's
    `beyond` (which names no block)."""
    return (pred == y) & (y != val.beyond)


def choose_free_group(feats, train_rows: np.ndarray, vfeats, vocab: str,
                      limit: int = VALIDATION_ROWS) -> tuple:
    """(chosen `free` grouping, its code table (None for `all`), every candidate with its
    validation top-1): for each grouping of FREE_GROUPS, its label space learned from the
    training rows of `feats`, an n-gram (default settings) fitted there and scored on the
    validation features `vfeats`. Ties go to the earlier grouping (`all` first)."""
    from .models.ngram import NGram
    scored, tables = [], {}
    for group in FREE_GROUPS:
        table = None if group == "all" else free_code_table(feats, group, train_rows)
        data = make_task(feats, "free", vocab, group, table)
        val = make_task(vfeats, "free", vocab, group, table)
        rows = validation_rows(val, limit)
        if not len(rows):
            raise ValueError("the validation runs have no frees of known blocks to choose on")
        probe = NGram("free", vocab)
        probe.fit(data, train_rows)
        pred = probe.predict(val, rows, 1)[:, 0]
        tables[group] = table
        scored.append({"group": group, "labels": int(data.n_labels),
                       "top1": float(np.mean(correct(val, pred, val.labels[rows])))})
    best = max(scored, key=lambda c: c["top1"])     # max keeps the first of equals
    return best["group"], tables[best["group"]], scored


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
                               "top1": float(np.mean(correct(val, pred, y)))})
    best = max(candidates, key=lambda c: (c["top1"], -len(c["orders"]), not c["sites"]))
    return {"sites": best["sites"], "orders": best["orders"]}, candidates


def choose_memory(model, val: TaskData, limit: int = VALIDATION_ROWS, candidates=None) -> tuple:
    """(chosen in-run memory orders, every candidate with its validation top-1): each candidate
    set of context lengths scored as the memory alone would predict on the validation run (the
    label after the latest earlier occurrence of the longest of its contexts seen so far in the
    run). It reads only the validation run, causally. Ties go to the earlier candidate."""
    candidates = candidates or MEMORY_CANDIDATES
    rows = validation_rows(val, limit)
    if not len(rows):
        raise ValueError("the validation runs have no labels of this task to choose on")
    orders = sorted({m for c in candidates for m in c})
    from .models.ngram import NGram
    recent = NGram(model.task, model.vocab, {"sites": True, "orders": orders}) \
        .recent_continuations(val.select(np.arange(len(val)) <= rows[-1]), orders)
    y = val.labels[rows]
    scored = []
    for cand in candidates:
        pred = np.full(len(rows), -1, np.int64)
        for m in sorted(cand):              # longer contexts override shorter ones
            lab = recent[m][rows]
            pred = np.where(lab >= 0, lab, pred)
        scored.append({"orders": list(cand), "top1": float(np.mean(correct(val, pred, y)))})
    best = max(scored, key=lambda c: c["top1"])     # max keeps the first of equals
    return best["orders"], scored


def choose_hidden(model, data: TaskData, train_rows: np.ndarray, val: TaskData,
                  candidates=None, runs: np.ndarray | None = None) -> tuple:
    """(chosen recurrent size, every candidate with its validation top-1): for each size, a
    probe of `model`'s kind and settings trained on at most PROBE_EVENTS of the training rows
    (spread over them) and scored on the validation run's first PROBE_ROWS labelled rows. Ties
    go to the earlier candidate. `runs`: the training run of every row of `data`, as fit takes
    it (hints cross-fitted leave-one-run-out, as the model itself will be)."""
    from .models import create_model
    candidates = candidates or HIDDEN_CANDIDATES
    rows = validation_rows(val, PROBE_ROWS)
    y = val.labels[rows]
    scored, prepared = [], {}    # the probes' inputs do not depend on their size: made once
    for hidden in candidates:
        probe = create_model(model.kind, model.task, model.vocab,
                             {**model.config, "hidden": hidden})
        probe.fit(data, train_rows, max_events=PROBE_EVENTS, progress=False, runs=runs,
                  prepared=prepared)
        top1 = float(np.mean(correct(val, probe.predict(val, rows, 1)[:, 0], y)))
        scored.append({"hidden": hidden, "top1": top1})
    best = max(scored, key=lambda c: c["top1"])
    return best["hidden"], scored


def tune_on_validation(model, data: TaskData, train_rows: np.ndarray, val: TaskData,
                       fixed=(), runs: np.ndarray | None = None) -> dict:
    """Sets into `model` (not yet fitted) the settings chosen on the validation data `val`:
    the n-gram's (ngram) or its hints' n-gram, the in-run memory's orders and the recurrent
    size (gru, lstm, transformer), except the config keys in `fixed` (given by the user);
    `runs` as choose_hidden takes it.
    Returns the record of the choices (chosen settings, candidates, rows scored); call
    calibrate_on_validation after fitting."""
    target = model.config if model.kind == "ngram" else model.config.get("ngram")
    if target is None:
        return {}
    out = {}
    ngram_keys = {"orders", "sites"} if model.kind == "ngram" else {"ngram"}
    if not ngram_keys & set(fixed):
        chosen, candidates = choose_ngram(model.task, model.vocab, data, train_rows, val,
                                          {"topk": target.get("topk", 8)})
        target.update(chosen)
        out.update(ngram=chosen, candidates=candidates,
                   rows=int(len(validation_rows(val))))
    if model.kind == "ngram":
        return out
    if model.config.get("cache_orders") and "cache_orders" not in fixed \
            and model.task != "lifetime":
        orders, scored = choose_memory(model, val)
        model.config["cache_orders"] = orders
        out["memory"] = {"orders": orders, "candidates": scored}
    if "hidden" not in fixed:
        hidden, scored = choose_hidden(model, data, train_rows, val, runs=runs)
        model.config["hidden"] = hidden
        out["hidden"] = {"hidden": hidden, "candidates": scored,
                         "probe_events": PROBE_EVENTS, "rows": int(len(validation_rows(
                             val, PROBE_ROWS)))}
    return out


def calibrate_on_validation(model, val: TaskData) -> dict:
    """After fitting: the gru's trust in its hints vs its in-run memory, fitted on `val`
    (RNNModel.calibrate); {} for models without it."""
    return model.calibrate(val, validation_rows(val)) if hasattr(model, "calibrate") else {}
