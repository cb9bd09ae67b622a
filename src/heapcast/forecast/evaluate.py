"""`heapcast evaluate`: score a model file on traces under a protocol (heapcast.forecast.protocols).

Metrics: top-1 and top-5 accuracy, allocation-only accuracy (rows whose true token is an
allocation; for lifetimes every row is one), a per-class table, a confusion matrix for
lifetimes. For `next` the article's buggy target is scored too: `top1_article_target` compares
`bit_length` of predicted and true seed64 classes (rich tokens are projected to seed64 first,
exactly). A model trained on that buggy target (`seed`, target "article") outputs article labels:
its `top1` (against the true classes, which is what the article claimed to predict) and its
`top1_article_target` (what it was actually trained and validated on) stand side by side.

The protocol decides which rows are scored and what the model must not have seen: `article` and
`time` score the held-out tail of the traces the model was trained on with the same split;
`cross-run` and `cross-program` score whole traces the model never saw (refused otherwise).
"""
from __future__ import annotations

import os
import time

import numpy as np

from ..trace import cache
from .dataset import load_task_for
from .modelfile import ModelError
from .models import load_model
from .protocols import PROTOCOLS, split_masks
from .tasks import FREE_OLD, FREE_YOUNG, label_names
from .vocab import article_target, is_allocation_token, rich_to_seed64

PER_CLASS_ROWS = 30
TIME_BINS = 100      # top-1 over time, in the report


def evaluate(model_path, traces, protocol: str, max_samples: int = 0, k: int = 5,
             seed: int = 0) -> dict:
    """Scores the model at `model_path` on `traces` (paths of traces or datasets) under
    `protocol`; returns the metrics as a JSON-able dict. `max_samples` > 0 scores a random
    subset (fixed `seed`) of that many rows (for the slow `seed` model)."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r} (known: {', '.join(PROTOCOLS)})")
    if max_samples < 0:
        raise ValueError(f"max_samples must be 0 (every row) or more, not {max_samples}")
    model = load_model(model_path)
    training = model.meta.get("training", {})
    refuse_early(model_path, protocol, training, traces)
    feats, data = load_task_for(traces, training.get("order", "thread"), model)
    test, trained = scored_rows(model_path, protocol, data, training, feats.sources)
    rows = np.flatnonzero(test)
    total = len(rows)
    if max_samples and total > max_samples:
        rng = np.random.default_rng(seed)
        rows = np.sort(rng.choice(rows, max_samples, replace=False))
    t0 = time.perf_counter()
    pred = model.predict(data, rows, k) if len(rows) else np.zeros((0, k), np.int64)
    seconds = time.perf_counter() - t0
    result = {"protocol": protocol, "task": model.task, "model": model.kind,
              **({"free_group": model.free_group, "free_labels": int(model.n_labels)}
                 if model.task == "free" else {}),
              "vocab": model.vocab, "target": model.target, "model_path": str(model_path),
              "traces": [s["path"] for s in feats.sources], "events": int(len(rows)),
              "events_available": int(total), "sampled": bool(len(rows) < total),
              "trained_on_these_traces": bool(trained), "predict_seconds": seconds,
              "predict_events_per_s": len(rows) / max(seconds, 1e-9)}
    y = data.labels[rows]
    scored = metrics(model, y, pred)
    result.update(scored)
    if len(feats.sources) == 1 and len(rows) == total and k == 5:   # (the report's top-5)
        keep_for_report(model_path, feats.sources[0]["path"], model, y, pred, protocol,
                        bool(trained), scored)
    return result


def model_result(model, y: np.ndarray, pred: np.ndarray, protocol: str, path: str,
                 scored: dict | None = None) -> dict:
    """What `heapcast report` shows of a model on a trace (its forecast section): heapcast
    evaluate's metrics (`scored`: metrics() of these rows, if computed already) plus top-1 over
    the scored events."""
    out = {"model": model.kind, "task": model.task, "vocab": model.vocab, "protocol": protocol,
           "path": path, "events": int(len(y))}
    out.update(metrics(model, y, pred) if scored is None else scored)
    hit = pred[:, 0] == y if len(y) else np.zeros(0, bool)
    bins = np.array_split(np.arange(len(y)), min(TIME_BINS, max(len(y), 1)))
    out["over_time"] = {"position": [float(b[0] / max(len(y), 1)) if len(b) else 0.0 for b in bins],
                        "top1": [float(hit[b].mean()) if len(b) else None for b in bins]}
    if "confusion" in out:
        out["confusion_names"] = list(label_names(model.task, model.vocab))
    return out


def keep_for_report(model_path, trace_path, model, y, pred, protocol: str, trained: bool,
                    scored: dict) -> None:
    """Keeps the report's view of a whole evaluation on one trace (model_result, every scored
    row) in the trace's directory (heapcast.trace.cache), where `heapcast report --model` finds
    it instead of predicting again."""
    k = cache.key(trace_path, model=cache.file_digest(model_path), protocol=protocol)
    r = model_result(model, y, pred, protocol, str(model_path), scored)
    r["trained_on_these_traces"] = trained
    cache.save(trace_path, "forecast", k, r)


def kept_for_report(model_path, trace_path, split: str, digest: str | None = None
                    ) -> dict | None:
    """The report's view of `model_path` on the trace, if an evaluation left it
    (keep_for_report) under the protocol the report scores with: the model's split on the
    recordings it was trained on, cross-run on others. `digest`: the model file's SHA-256 if
    the caller has it."""
    digest = digest or cache.file_digest(model_path)
    for protocol, trained in (((split, True),) if split in ("time", "article") else ()) + \
            (("cross-run", False),):
        r = cache.load(trace_path, "forecast", cache.key(trace_path, model=digest,
                                                         protocol=protocol))
        if r is not None and r.get("trained_on_these_traces") == trained:
            return {**r, "path": str(model_path)}
    return None


def scored_rows(model_path, protocol: str, data, training: dict, sources: list):
    """(mask of the rows `protocol` scores, the evaluated traces the model was trained on) for a
    model (or a policy compiled from one) trained as `training` says; ModelError when the
    protocol forbids scoring these traces with it (check_protocol)."""
    trained = check_protocol(model_path, protocol, training, sources)
    if protocol in ("article", "time"):
        return split_masks(data, protocol)[1], trained
    return data.labels >= 0, trained


def refuse_early(model_path, protocol: str, training: dict, traces) -> None:
    """check_protocol on the recordings `traces` as their metadata (a dataset: its manifest)
    describes them, before their features or labels are built (6.8 s on the main job's trace
    for a refusal that needs none of them)."""
    from .dataset import dataset_sources, is_dataset
    from .features import recording_source
    from ..trace.model import Trace
    from ..trace.reader import load
    sources = []
    for t in traces:
        if isinstance(t, Trace):
            sources.append(recording_source(t))
        elif is_dataset(t):
            sources += dataset_sources(t)
        else:
            sources.append(recording_source(load(t)))
    check_protocol(model_path, protocol, training, sources)


def check_protocol(model_path, protocol: str, training: dict, sources: list) -> list:
    """The recordings of `sources` the model was trained on (overlap); ModelError when
    `protocol` forbids scoring them with a model trained as `training` says: its settings were
    chosen on them (--validate), the held-out protocols on recordings it learned whole, the
    cross protocols on recordings or programs it saw."""
    tuned = overlap((training.get("validation") or {}).get("traces", []), sources)
    if tuned:
        raise ModelError(f"{model_path}: its settings were chosen on {', '.join(tuned)} "
                         f"(heapcast train --validate): score it on other recordings")
    trained = overlap(training.get("traces", []), sources)
    split = training.get("split", "all")
    if protocol in ("article", "time"):
        if trained and split != protocol:
            raise ModelError(f"{model_path}: trained with split {split!r} on "
                             f"{', '.join(trained)}: the {protocol!r} protocol needs a model "
                             f"trained with --split {protocol} (its test rows were learned)")
        return trained
    if trained:
        raise ModelError(f"{model_path}: was trained on {', '.join(trained)}: the {protocol!r} "
                         f"protocol scores recordings the model never saw")
    trained_progs = {t.get("program") for t in training.get("traces", [])}
    test_progs = {s.get("program") for s in sources}
    if protocol == "cross-program" and trained_progs & test_progs:
        raise ModelError(f"{model_path}: trained on {', '.join(sorted(trained_progs & test_progs))}"
                         f": cross-program needs a program the model was not trained on")
    if protocol == "cross-run" and trained_progs and not test_progs <= trained_progs:
        raise ModelError(f"{model_path}: trained on {', '.join(sorted(trained_progs))}, "
                         f"evaluated on {', '.join(sorted(test_progs))}: that is cross-program")
    return trained


def overlap(trained: list, sources: list) -> list:
    """The recordings of `sources` that are among `trained` (the same file, or the same
    program and event count)."""
    seen = {(os.path.realpath(t.get("path", "")), t.get("events")) for t in trained}
    progs = {(t.get("program"), t.get("events")) for t in trained}
    return [s["path"] for s in sources
            if (os.path.realpath(s["path"]), s["events"]) in seen
            or (s.get("program"), s["events"]) in progs]


def metrics(model, y: np.ndarray, pred: np.ndarray) -> dict:
    """top1/top5, allocation-only accuracy, the article's target, per-class and confusion."""
    task, vocab = model.task, model.vocab
    # "beyond" (the last free label) names no block: never right
    valid = y < model.n_labels - 1 if task == "free" else np.ones(len(y), bool)
    hit1 = (pred[:, 0] == y) & valid
    hitk = (pred == y[:, None]).any(1) & valid
    out = {"top1": _mean(hit1), "top5": _mean(hitk)}
    if task == "next":
        alloc = is_allocation_token(vocab, y)
        out["top1_alloc"] = _mean(hit1[alloc])
        out["top1_article_target"] = _article_top1(model, y, pred[:, 0])
        if vocab == "rich":
            table = rich_to_seed64()
            p = np.where(pred[:, 0] >= 0, table[np.maximum(pred[:, 0], 0)], 255)
            out["top1_seed64"] = _mean(p == table[y])
    elif task == "lifetime":
        out["top1_alloc"] = out["top1"]
        out["confusion"] = _confusion(y, pred[:, 0], len(label_names(task, vocab)))
    else:
        out["top1_alloc"] = None
        out["beyond_rank_fraction"] = _mean(~valid)
    out["per_class"] = _per_class(y, hit1, hitk, label_names(
        task, vocab, getattr(model, "free_group", "all"), getattr(model, "free_codes", None)))
    return out


def _article_top1(model, y: np.ndarray, p: np.ndarray):
    if model.target == "article":
        # The model outputs bit_length(class) already; the true classes are seed64.
        return _mean(p == article_target(y))
    if model.vocab == "rich":
        table = rich_to_seed64()
        y, p = table[y], np.where(p >= 0, table[np.maximum(p, 0)], 255)
    return _mean(article_target(p) == article_target(y))


def _per_class(y: np.ndarray, hit1: np.ndarray, hitk: np.ndarray, names: list) -> list:
    classes, counts = np.unique(y, return_counts=True)
    order = np.argsort(-counts, kind="stable")[:PER_CLASS_ROWS]
    rows = []
    for c, n in zip(classes[order].tolist(), counts[order].tolist()):
        sel = y == c
        rows.append({"class": int(c), "name": names[c] if 0 <= c < len(names) else str(c),
                     "events": int(n), "share": n / len(y), "top1": _mean(hit1[sel]),
                     "top5": _mean(hitk[sel])})
    return rows


def _confusion(y: np.ndarray, p: np.ndarray, n: int) -> list:
    m = np.zeros((n, n), np.int64)
    ok = (p >= 0) & (p < n)
    np.add.at(m, (y[ok], p[ok]), 1)
    return m.tolist()


def _mean(x: np.ndarray):
    return float(np.mean(x)) if len(x) else None


def format_result(r: dict) -> str:
    """A short text report of one evaluation."""
    def pct(v):
        return "-" if v is None else f"{100 * v:.2f}%"
    lines = [f"{r['model']} ({r['task']}, {r['vocab']}, target {r['target']}) under "
             f"{r['protocol']}: {r['events']:,} events" + (" (sampled)" if r["sampled"] else ""),
             f"  top-1 {pct(r['top1'])}   top-5 {pct(r['top5'])}   allocations top-1 "
             f"{pct(r.get('top1_alloc'))}"]
    if "top1_article_target" in r:
        lines.append(f"  top-1 on the article's (buggy) target: {pct(r['top1_article_target'])}"
                     f"   on the true classes: {pct(r['top1'])}")
    if "beyond_rank_fraction" in r:
        within = {"class": " of their size class", "site": " of their call site"}.get(
            r.get("free_group"), "")
        unseen = " (or in a group the model never saw freed)" if within else ""
        lines.append(f"  frees of blocks beyond the {FREE_YOUNG} youngest and {FREE_OLD} oldest"
                     f"{within}{unseen}: {pct(r['beyond_rank_fraction'])}")
    lines.append("  per class (most frequent first):")
    for c in r["per_class"][:12]:
        lines.append(f"    {c['name']:<28} {c['share'] * 100:6.2f}% of events   top-1 "
                     f"{pct(c['top1'])}")
    if "confusion" in r:
        lines.append("  confusion (rows: true class, columns: predicted):")
        lines += ["    " + " ".join(f"{v:>9}" for v in row) for row in r["confusion"]]
    return "\n".join(lines)
