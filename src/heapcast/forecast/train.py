"""`heapcast train`: fit a forecasting model on traces (or datasets) and write its model file.

    train(["run-a"], "model.safetensors")                       # the default model: stateful GRU
    train(["run-a"], "ngram.safetensors", model="ngram", task="lifetime")
    train(["run-a"], "seed.safetensors", model="seed", split="article", max_steps=2000)

Under `torchrun --nproc_per_node N -m heapcast train ...` the neural models train with
DistributedDataParallel (gloo on CPU, nccl on GPUs, one GPU per process): each process steps
through its own share of the streams, gradients are averaged, and only rank 0 writes the model.

`split` says which rows may be learned from: "all" (for cross-run and cross-program
evaluation), or "article"/"time" (everything before the held-out part that `heapcast evaluate
--protocol article/time` scores). The model file records the split and the traces, so that
evaluate can refuse to score a model on what it was trained on.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np

from .dataset import load_features
from .models import (DEFAULT_MODEL, NEURAL, STREAM_MODELS, check_config, create_model, model_class,
                     save_model)
from .protocols import SPLITS, split_masks
from .select import calibrate_on_validation, choose_free_group, tune_on_validation
from .tasks import (DEFAULT_ORDER, FREE_GROUPS, TASKS, free_code_table, make_task, make_task_for,
                    rank_groupings)


def spread_rows(mask: np.ndarray, n: int, block: int = 16384) -> np.ndarray:
    """About `n` of the rows where `mask` is true, as blocks of `block` consecutive rows spread
    evenly over them (a subset that sees every phase of the program, unlike a prefix)."""
    rows = np.flatnonzero(mask)
    if len(rows) <= n:
        return mask
    blocks = np.array_split(rows, max(1, len(rows) // block))
    keep = np.linspace(0, len(blocks) - 1, max(1, n // block)).round().astype(int)
    out = np.zeros_like(mask)
    for b in np.unique(keep):
        out[blocks[b]] = True
    return out


def run_of_rows(feats) -> np.ndarray | None:
    """The input recording (index into feats.sources) of every row, or None when the sources do
    not say how many processes each has."""
    counts = [s.get("processes") for s in feats.sources]
    if not counts or None in counts or not len(feats):
        return None
    run_of_proc = np.repeat(np.arange(len(counts)), counts)
    proc = np.asarray(feats.columns["proc"], np.int64)
    if len(run_of_proc) <= int(proc.max()):
        return None
    return run_of_proc[proc]


def default_vocab(model: str) -> str:
    """The vocabulary a model reads unless told: the article's for `seed`, else `rich`."""
    return "seed64" if model == "seed" else "rich"


def train(traces, output, model: str = DEFAULT_MODEL, task: str = "next", vocab: str | None = None,
          epochs: int = 1, split: str = "all", order: str | None = None, max_steps: int = 0,
          max_events: int = 0, config: dict | None = None, progress: bool = False,
          resume: bool = False, device: str = "cpu", validate=(),
          free_group: str | None = None) -> dict:
    """Trains `model` for `task` on `traces` and writes it to `output` (a .safetensors file).

    Returns a summary: what was trained, its statistics (`events_per_s` of the training loop)
    and `wall_s`/`events_per_s_wall` from the start, loading and featurizing included.
    `max_events` > 0 learns from about that many training rows only, blocks spread over them
    (spread_rows: a smaller training set that still sees every phase of the program; for gru
    and lstm only the network's steps: the n-gram of their hints learns from every row);
    `max_steps` > 0 stops the optimizer early, as an interrupted run would. Neural models write
    `<output>.ckpt` after each epoch and when they stop; `resume=True` continues from it, to the
    same bytes as an uninterrupted run. Under torchrun, only rank 0 writes (the summary's `rank`).

    `validate`: recordings (or datasets) that are neither trained nor tested on, on which
    heapcast.forecast.select chooses the n-gram's orders and call sites (ngram, and the gru's
    hints) and the gru's trust in its hints against its in-run memory (RNNModel.calibrate);
    the choices and their scores are in the summary's `validation`.

    `free_group` (task `free`): how labels name the freed block (heapcast.forecast.tasks
    FREE_GROUPS: `all` live blocks, or within its size `class` or call `site`); None: chosen
    on the validation runs when given (select.choose_free_group), else `all`.
    """
    t0 = time.perf_counter()
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r} (known: {', '.join(TASKS)})")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} (known: {', '.join(SPLITS)})")
    if epochs < 1:
        raise ValueError("epochs must be at least 1")
    if max_steps < 0 or max_events < 0:
        raise ValueError(f"max_steps and max_events must be 0 (no limit) or more, not "
                         f"{max_steps} and {max_events}")
    if free_group is not None and (task != "free" or free_group not in FREE_GROUPS):
        raise ValueError(f"free_group {free_group!r}: only for task 'free', one of "
                         f"{', '.join(FREE_GROUPS)}")
    vocab = vocab or default_vocab(model)
    order = order or DEFAULT_ORDER[task]
    importing = _import_in_background(model)
    if config:   # before the traces load (a neural model's module then imports here: ~1 s)
        check_config(model, config)
    # every grouping's ranks only when one is to be chosen on validation runs
    ranks = rank_groupings(task, free_group or (None if validate else "all"))
    feats = load_features(list(traces), order, need_ranks=ranks)
    if importing is not None:
        importing.join()
    m = create_model(model, task, vocab, config)
    data = make_task(feats, task, vocab)
    train_rows, _ = split_masks(data, split)
    if not (train_rows & (data.labels >= 0)).any():
        raise ValueError(f"no {task!r} labels to learn from in {', '.join(map(str, traces))}")
    vfeats = _validation_features(list(validate), feats, order, ranks) if validate else None
    grouping = None
    if task == "free":
        grouping = _set_free_labels(m, feats, train_rows, free_group, vfeats)
        data = make_task_for(feats, m)
    validation, val = None, None
    if validate:
        val, validation = _choose_on_validation(m, vfeats, data, train_rows, feats,
                                                fixed=set(config or {}))
        if grouping is not None:
            validation["free_group"] = grouping
    output = Path(output)
    options = {"epochs": epochs, "max_steps": max_steps, "progress": progress}
    if m.kind in STREAM_MODELS:
        # The network steps through a subset; the n-gram of its hints still learns from all.
        options.update(max_events=max_events, checkpoint=Path(str(output) + ".ckpt"),
                       resume=resume, device=device, runs=run_of_rows(feats))
    elif max_events:
        train_rows = spread_rows(train_rows, max_events)
    stats = m.fit(data, train_rows, **options)
    if validation is not None:
        validation["calibration"] = calibrate_on_validation(m, val)
    wall = time.perf_counter() - t0
    training = {"traces": feats.sources, "split": split, "order": order, "epochs": epochs,
                "validation": validation,
                "max_steps": max_steps, "max_events": max_events, "stats": stats, "wall_s": wall,
                "events_per_s_wall": stats.get("events", 0) / max(wall, 1e-9)}
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        save_model(m, output, training)
    _end_distributed()
    return {"model": m.kind, "task": task, "vocab": vocab, "output": str(output), "rank": rank,
            "world": int(os.environ.get("WORLD_SIZE", "1")), **training}


def _import_in_background(model: str):
    """For a neural model, starts importing torch, the model's module and torch._dynamo (which
    torch.optim imports when an optimizer is made: 1.5-3 s) on a thread while the traces load;
    returns the thread (None for other models). An import error is left to the main thread,
    which meets it again and reports it."""
    if model not in NEURAL:
        return None

    def work():
        try:
            model_class(model)
            import torch._dynamo  # noqa: F401
        except Exception:
            pass

    thread = threading.Thread(target=work, name="heapcast-import", daemon=True)
    thread.start()
    return thread


def _validation_features(validate: list, feats, order: str, ranks):
    """The features of the validation runs; ValueError for one that is a training run too."""
    from .evaluate import overlap
    vfeats = load_features(validate, order, need_ranks=ranks)
    same = overlap(feats.sources, vfeats.sources)
    if same:
        raise ValueError(f"{', '.join(same)}: a training run cannot be a validation run too")
    return vfeats


def _set_free_labels(m, feats, train_rows: np.ndarray, group: str | None, vfeats) -> dict | None:
    """Sets the free model `m`'s label space: `group` if given, else chosen on the validation
    features (if any), else `all`; a grouped space's code table from the training rows.
    Returns the choice's record when one was made."""
    record = None
    if group is None and vfeats is not None:
        group, table, candidates = choose_free_group(feats, train_rows, vfeats, m.vocab)
        record = {"group": group, "candidates": candidates}
    else:
        group = group or "all"
        table = None if group == "all" else free_code_table(feats, group, train_rows)
    m.free_group, m.free_codes = group, table
    return record


def _choose_on_validation(m, vfeats, data, train_rows, feats, fixed=()):
    """Sets into model `m` the settings chosen on the validation features `vfeats`
    (select.tune_on_validation); returns (their TaskData, the summary's `validation`)."""
    val = make_task_for(vfeats, m)
    return val, {"traces": vfeats.sources,
                 **tune_on_validation(m, data, train_rows, val, fixed,
                                      runs=run_of_rows(feats) if m.kind in STREAM_MODELS
                                      else None)}


def _end_distributed() -> None:
    """Leaves the torchrun process group (after rank 0 has written the model), if one was joined."""
    try:
        import torch.distributed as dist
    except ImportError:
        return
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
