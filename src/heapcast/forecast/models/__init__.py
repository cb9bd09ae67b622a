"""The forecasting models, by name, and model files: `load_model(path)`, `save_model(...)`.

Neural models import torch only when they are asked for: heapcast and its baselines work
without it.
"""
from __future__ import annotations

import importlib
from pathlib import Path

from ..modelfile import ModelError, read_model_file, read_model_meta, save_model_file
from ..names import DEFAULT_MODEL, MODEL_NAMES  # noqa: F401 (re-exported)
import numpy as np

from ..tasks import FREE_GROUPS, FREE_LABELS_VERSION
from ..vocab import get_vocab

#: name -> "module:Class". "gru" is the default model (`heapcast train` without --model).
MODELS = {
    "majority": "simple:Majority",
    "repeat-last": "simple:RepeatLast",
    "ngram": "ngram:NGram",
    "gru": "rnn:RNNModel",
    "lstm": "rnn:LSTMModel",
    "transformer": "transformer:TransformerModel",
    "seed": "seed:SeedModel",
}
assert tuple(MODELS) == MODEL_NAMES, "heapcast.forecast.names.MODEL_NAMES lists every model"
#: Models trained over long contiguous streams (truncated backpropagation, checkpoints, DDP).
STREAM_MODELS = ("gru", "lstm", "transformer")
NEURAL = (*STREAM_MODELS, "seed")


def model_class(name: str):
    """The class of model `name`; ValueError naming the known ones, or a clear message when a
    neural model is asked for and torch is missing."""
    try:
        module, cls = MODELS[name].split(":")
    except KeyError:
        raise ValueError(f"unknown model {name!r} (known: {', '.join(MODELS)})") from None
    try:
        mod = importlib.import_module(f"{__name__}.{module}")
    except ModuleNotFoundError as e:
        if e.name == "torch":
            raise ModelError(f"model {name!r} needs PyTorch: pip install 'heapcast[ml]'") from None
        raise
    return getattr(mod, cls)


#: Integer settings that count something and must be at least 1 (the other integer settings, such
#: as site_embed 0 for no call sites or warmup 0, may be 0).
AT_LEAST_ONE = frozenset(("hidden", "layers", "embed", "batch", "bptt", "threads", "site_buckets",
                          "heads", "memory", "window", "topk"))
#: Upper bounds (the n-gram's labels per context: its native count and the policy runtime keep
#: at most 64).
AT_MOST = {"topk": 64}


def check_config(name: str, config: dict | None) -> None:
    """Raises ValueError, naming the setting and what it expects, when `config` (settings given
    for a new model `name`: `heapcast train --set`, --hidden...) names a setting the model does
    not have, or gives one a value of the wrong kind or out of range. Each setting is checked
    against the kind of its default: a count at least 1, another integer at least 0, a real
    number above 0, a list of orders each at least 1. (Model files are not checked: their
    settings were checked when they were trained.)"""
    defaults = model_class(name).default_config()
    for key, value in (config or {}).items():
        if key not in defaults:
            raise ValueError(f"model {name!r} has no setting {key!r} (its settings: "
                             f"{', '.join(sorted(defaults))})")
        _check_setting(f"{name} setting {key!r}", key, value, defaults[key])


def _check_setting(what: str, key: str, value, default) -> None:
    if isinstance(default, dict):
        if not isinstance(value, dict):
            raise ValueError(f"{what}: expected an object of settings, not {value!r}")
        return   # (a nested model's settings: that model checks its own)
    if isinstance(default, bool) or default is None:
        if not isinstance(value, (bool, type(None))):
            raise ValueError(f"{what}: expected true or false, not {value!r}")
    elif isinstance(default, int):
        low = 1 if key in AT_LEAST_ONE else 0
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{what}: expected an integer of at least {low}, not {value!r}")
        if key in AT_MOST and value > AT_MOST[key]:
            raise ValueError(f"{what}: expected an integer from {low} to {AT_MOST[key]}, not "
                             f"{value!r}")
    elif isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
                or value == float("inf"):
            raise ValueError(f"{what}: expected a number above 0, not {value!r}")
    elif isinstance(default, list):
        if not isinstance(value, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value):
            raise ValueError(f"{what}: expected a list of integers of at least 1, not {value!r}")
    elif isinstance(default, str) and not isinstance(value, str):
        raise ValueError(f"{what}: expected a string, not {value!r}")


def create_model(name: str, task: str, vocab: str, config: dict | None = None):
    """A new, untrained model."""
    return model_class(name)(task, vocab, config)


def save_model(model, path, training: dict) -> Path:
    """Writes a trained model (weights as safetensors, settings and `training` as metadata)."""
    vocab = get_vocab(model.vocab)
    meta = {"model": model.kind, "task": model.task, "vocab": vocab.name,
            "vocab_version": vocab.version, "target": model.target, "config": model.config,
            "training": training}
    tensors = model.tensors()
    if model.task == "free":
        meta["free_labels_version"] = FREE_LABELS_VERSION
        meta["free_group"] = model.free_group
        if model.free_codes is not None:
            tensors = {**tensors, "free_codes": np.asarray(model.free_codes, np.int64)}
    return save_model_file(path, tensors, meta)


#: Settings that model files written before them lack, with the value that says what such a
#: file's tables hold: the n-gram kept every context before `prune_once` (a GRU's hints too).
_BEFORE = {"prune_once": False}


def _as_trained(kind: str, config: dict | None) -> dict:
    """A model file's settings, with what a file written before a setting existed did."""
    config = dict(config or {})
    if kind == "ngram":
        return {**_BEFORE, **config}
    if isinstance(config.get("ngram"), dict):   # a learned model's hint n-gram
        config["ngram"] = {**_BEFORE, **config["ngram"]}
    return config


def load_model(path, task: str | None = None, vocab: str | None = None):
    """Reads a model file; ModelError when it is corrupt, of an unknown kind or version, or not
    of the `task`/`vocab` asked for (when given). The model's metadata is in `.meta`."""
    path = Path(path)
    tensors, meta = read_model_file(path)
    check_model_meta(path, meta, task, vocab)
    kind, v = meta["model"], meta.get("vocab")
    model = create_model(kind, meta["task"], v, _as_trained(kind, meta.get("config")))
    model.target = meta.get("target", "true")
    if model.task == "free":
        _load_free_labels(path, model, meta, tensors)
    try:
        model.load_tensors(tensors)
    except (KeyError, ValueError, RuntimeError, TypeError) as e:
        raise ModelError(f"{path}: tensors do not fit a {kind} model: {e}") from None
    model.meta = meta
    return model


def check_model_file(path, task: str | None = None, vocab: str | None = None) -> dict:
    """What load_model checks from a model file's header alone (its layout and size, kind,
    vocabulary, versions, task), without reading its tensors: a GB-sized n-gram is not read
    twice by a command that checks its inputs first. Returns the metadata; ModelError as
    load_model (a damaged tensor is found when the model is loaded)."""
    meta = read_model_meta(path)
    check_model_meta(Path(path), meta, task, vocab)
    return meta


def check_model_meta(path: Path, meta: dict, task: str | None, vocab: str | None) -> None:
    """ModelError unless `meta` describes a model this heapcast can load, of `task`/`vocab`."""
    kind = meta.get("model")
    if kind not in MODELS:
        raise ModelError(f"{path}: unknown model kind {kind!r}")
    v = meta.get("vocab")
    try:
        known = get_vocab(v)
    except ValueError as e:
        raise ModelError(f"{path}: {e}") from None
    if meta.get("vocab_version") != known.version:
        raise ModelError(f"{path}: vocabulary {v!r} version {meta.get('vocab_version')}, this "
                         f"heapcast has version {known.version}")
    if meta.get("task") == "free" and meta.get("free_labels_version", 1) != FREE_LABELS_VERSION:
        raise ModelError(f"{path}: a free model of label version "
                         f"{meta.get('free_labels_version', 1)}, this heapcast has version "
                         f"{FREE_LABELS_VERSION} (docs/vocabularies.md): train it again")
    group = meta.get("free_group", "all")
    if meta.get("task") == "free" and group not in FREE_GROUPS:
        raise ModelError(f"{path}: unknown free grouping {group!r} (known: "
                         f"{', '.join(FREE_GROUPS)})")
    if task is not None and meta.get("task") != task:
        raise ModelError(f"{path}: a model for task {meta.get('task')!r}, not {task!r}")
    if vocab is not None and v != vocab:
        raise ModelError(f"{path}: a model of vocabulary {v!r}, not {vocab!r}")


def _load_free_labels(path, model, meta: dict, tensors: dict) -> None:
    """Sets a free model's label space from its file (and takes its code table out of the
    tensors the model itself reads)."""
    group = meta.get("free_group", "all")   # (a known one: check_model_meta)
    model.free_group = group
    if group == "all":
        return
    codes = tensors.pop("free_codes", None)
    if codes is None or codes.ndim != 1 or (len(codes) > 1 and (np.diff(codes) <= 0).any()):
        raise ModelError(f"{path}: a {group!r}-grouped free model needs its tensor free_codes "
                         f"(sorted, distinct codes)")
    model.free_codes = np.asarray(codes, np.int64)
