"""What every forecasting model is: fit on TaskData rows, predict the top-k labels of rows, and
turn itself into tensors + metadata for a model file (heapcast.forecast.modelfile)."""
from __future__ import annotations

import numpy as np

from ..tasks import TaskData, n_labels


class Model:
    """Base class. Subclasses set `kind`, and implement fit, predict, tensors and load_tensors.

    `target` is the label space the model's outputs live in: "true" for all models, except the
    article's network trained as the article did (`--target article`, the buggy labels).
    """

    kind = ""
    tasks = ("next", "free", "lifetime")
    vocabs = ("seed64", "rich")
    needs_torch = False

    def __init__(self, task: str, vocab: str, config: dict | None = None):
        if task not in self.tasks:
            raise ValueError(f"model {self.kind!r} does not do task {task!r} "
                             f"(it does: {', '.join(self.tasks)})")
        if vocab not in self.vocabs:
            raise ValueError(f"model {self.kind!r} does not read vocabulary {vocab!r} "
                             f"(it reads: {', '.join(self.vocabs)})")
        self.task, self.vocab = task, vocab
        self.config = {**self.default_config(), **(config or {})}
        self.target = "true"
        # A `free` model's label space (heapcast.forecast.tasks): grouped by `class` or `site`,
        # the code of each label (free_code_table), set before fit; None for `all`.
        self.free_group = "all"
        self.free_codes = None

    @classmethod
    def default_config(cls) -> dict:
        return {}

    @property
    def n_labels(self) -> int:
        return n_labels(self.task, self.vocab, self.free_codes)

    def check_data(self, data: TaskData, fitting: bool = False) -> None:
        """Raises ValueError when `data` is not of this model's task, vocabulary and label
        space. `fitting`: a model not yet fitted on grouped `free` labels takes data's."""
        if (data.task, data.vocab) != (self.task, self.vocab):
            raise ValueError(f"a {self.kind} model for task {self.task!r} on vocabulary "
                             f"{self.vocab!r} cannot read data of task {data.task!r}, "
                             f"vocabulary {data.vocab!r}")
        if fitting and self.free_codes is None:
            self.free_group, self.free_codes = data.free_group, data.free_codes
        same = (self.free_codes is None and data.free_codes is None) or (
            self.free_codes is not None and data.free_codes is not None
            and np.array_equal(self.free_codes, data.free_codes))
        if not same:
            raise ValueError(f"a {self.kind} model with {self.free_group!r} free labels cannot "
                             f"read data labelled with {data.free_group!r} ones")

    def fit(self, data: TaskData, train: np.ndarray, **options) -> dict:
        """Learns from the rows where `train` is true (all rows before them are history).
        Returns training statistics (at least `events` and `seconds`)."""
        raise NotImplementedError

    def predict(self, data: TaskData, rows: np.ndarray, k: int = 5) -> np.ndarray:
        """The k most likely labels (int64, best first, -1 padding) of each row in `rows`,
        given everything before it in its stream (and the row's own event for lifetime)."""
        raise NotImplementedError

    def tensors(self) -> dict:
        """The learned state as named numpy arrays."""
        raise NotImplementedError

    def load_tensors(self, tensors: dict) -> None:
        """Restores the learned state from `tensors()`' output (arrays may be read-only)."""
        raise NotImplementedError


def training_summary(events: int, seconds: float, losses: list, **extra) -> dict:
    """What a neural model's fit() returns: events learned from, `extra` counts, the time, the
    rate and the final loss (mean of the last 20 steps)."""
    return {"events": events, **extra, "seconds": seconds,
            "events_per_s": events / max(seconds, 1e-9),
            "final_loss": float(np.mean(losses[-20:])) if losses else None}


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest scores per row, best first (deterministic; among equal scores
    inside the k, lower index first)."""
    k = min(k, scores.shape[1])
    if k <= 2 < scores.shape[1]:
        # The n-gram's hints need two: argmax passes are several times faster than a partition
        # (argmax takes the lowest index among equal scores, as the general path does).
        first = scores.argmax(1)
        if k == 1:
            return first[:, None]
        rest = scores.copy()
        rest[np.arange(len(rest)), first] = -np.inf
        return np.stack([first, rest.argmax(1)], 1)
    if k < scores.shape[1]:
        part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    else:
        part = np.broadcast_to(np.arange(k), scores.shape)
    vals = np.take_along_axis(scores, part, 1)
    order = np.lexsort((part, -vals), axis=1)
    return np.take_along_axis(part, order, 1)


def pad_k(pred: np.ndarray, k: int) -> np.ndarray:
    """Pads a (rows, j) prediction with -1 columns up to k."""
    if pred.shape[1] >= k:
        return pred[:, :k]
    return np.concatenate([pred, np.full((len(pred), k - pred.shape[1]), -1, pred.dtype)], 1)
