"""`seed`: the article's network and protocol, in PyTorch.

Sliding windows of the 100 previous seed64 tokens of a thread predict the next one: a frozen
one-hot Embedding(64, 64) -> LSTM(128, return_sequences) -> LSTM(64) -> Dense(64) + softmax,
categorical cross-entropy, RMSprop (lr 1e-3, rho 0.9, epsilon 1e-8: Keras 2.0's defaults) with
clipnorm 1 (Keras 2.0 clips the global norm), batch 128, samples shuffled every epoch, Keras'
initializers (Glorot-uniform kernels, orthogonal recurrent kernels, forget-gate bias 1). One
difference remains: Keras 2.0's LSTM gates used hard_sigmoid, PyTorch's use sigmoid.

`target="article"` (the default, for reproduction) trains on the article's buggy labels,
`seed64_class.bit_length()`; `target="true"` on the true classes. Windows reaching before a
stream's start (which the article never scored) are padded with class 0.

The article's model is slow (about 100 recurrent steps per label): `max_steps` caps the
batches, and the statistics report samples/s.
"""
from __future__ import annotations

import sys
import time

import numpy as np
import torch
from torch import nn

from ..tasks import TaskData
from ..vocab import article_target
from .base import Model, pad_k, training_summary
from .rnn import _keras_like_init, _setup_torch

WINDOW = 100


class SeedNet(nn.Module):
    """The article's Keras Sequential model."""

    def __init__(self, hidden: int = 128):
        super().__init__()
        self.embed = nn.Embedding(64, 64)
        with torch.no_grad():
            self.embed.weight.copy_(torch.eye(64))
        self.embed.weight.requires_grad_(False)
        self.lstm1 = nn.LSTM(64, hidden, batch_first=True)
        self.lstm2 = nn.LSTM(hidden, hidden // 2, batch_first=True)
        self.head = nn.Linear(hidden // 2, 64)

    def forward(self, x):
        out, _ = self.lstm1(self.embed(x))
        out, _ = self.lstm2(out)
        return self.head(out[:, -1])


def windows(data: TaskData, rows: np.ndarray, window: int = WINDOW) -> np.ndarray:
    """The `window` tokens before each row in its stream (int64, class 0 before the start)."""
    start = np.repeat(data.offsets[:-1], np.diff(data.offsets))[rows]
    idx = rows[:, None] - window + np.arange(window)[None, :]
    ok = idx >= start[:, None]
    return np.where(ok, data.tokens[np.where(ok, idx, 0)].astype(np.int64), 0)


class SeedModel(Model):
    """The article's LSTM on sliding windows (see the module docstring)."""

    kind = "seed"
    tasks = ("next",)
    vocabs = ("seed64",)
    needs_torch = True

    @classmethod
    def default_config(cls) -> dict:
        return {"target": "article", "hidden": 128, "batch": 128, "lr": 1e-3, "rho": 0.9,
                "epsilon": 1e-8, "clipnorm": 1.0, "window": WINDOW, "seed": 0, "threads": 2}

    def __init__(self, task: str, vocab: str, config: dict | None = None):
        super().__init__(task, vocab, config)
        if self.config["target"] not in ("article", "true"):
            raise ValueError(f"seed target must be 'article' or 'true', not "
                             f"{self.config['target']!r}")
        self.target = self.config["target"]
        self.net = SeedNet(self.config["hidden"])

    def fit(self, data: TaskData, train: np.ndarray, epochs: int = 1, max_steps: int = 0,
            progress: bool = True, **options) -> dict:
        self.check_data(data, fitting=True)
        c = self.config
        _setup_torch(c)
        self.net = SeedNet(c["hidden"])
        _keras_like_init(self.net, "lstm")
        samples = np.flatnonzero(train & (data.labels >= 0)
                                 & (data.position_in_stream() >= c["window"]))
        y_all = data.labels.astype(np.int64)
        if self.target == "article":
            y_all = article_target(y_all).astype(np.int64)
        params = [p for p in self.net.parameters() if p.requires_grad]
        opt = torch.optim.RMSprop(params, lr=c["lr"], alpha=c["rho"], eps=c["epsilon"])
        rng = np.random.default_rng(c["seed"])
        per_epoch = -(-len(samples) // c["batch"])
        total = per_epoch * epochs if not max_steps else min(per_epoch * epochs, max_steps)
        from tqdm import tqdm
        bar = tqdm(total=total, desc="train seed", unit="batch", disable=not progress,
                   file=sys.stderr, leave=False)
        t0, step, seen, losses = time.perf_counter(), 0, 0, []
        self.net.train()
        while step < total:
            order = rng.permutation(samples)          # Keras: shuffle=True, every epoch
            for b in range(per_epoch):
                if step >= total:
                    break
                rows = order[b * c["batch"]:(b + 1) * c["batch"]]
                x = torch.from_numpy(windows(data, rows, c["window"]))
                y = torch.from_numpy(y_all[rows])
                loss = nn.functional.cross_entropy(self.net(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(params, c["clipnorm"])
                opt.step()
                losses.append(float(loss.detach()))
                seen += len(rows)
                step += 1
                bar.update()
        bar.close()
        return training_summary(seen, time.perf_counter() - t0, losses,
                                samples=int(len(samples)), steps=step,
                                epochs=seen / max(len(samples), 1))

    @torch.no_grad()
    def predict(self, data: TaskData, rows: np.ndarray, k: int = 5) -> np.ndarray:
        self.check_data(data)
        _setup_torch(self.config)
        self.net.eval()
        out = np.empty((len(rows), k), np.int64)
        step = 2048
        for s in range(0, len(rows), step):
            x = torch.from_numpy(windows(data, rows[s:s + step], self.config["window"]))
            out[s:s + step] = pad_k(torch.topk(self.net(x), k, dim=-1).indices.numpy(), k)
        return out

    def tensors(self) -> dict:
        return {f"net.{k}": v.detach().cpu().numpy() for k, v in self.net.state_dict().items()}

    def load_tensors(self, tensors: dict) -> None:
        self.net = SeedNet(self.config["hidden"])
        self.net.load_state_dict({k[4:]: torch.from_numpy(np.array(v))
                                  for k, v in tensors.items() if k.startswith("net.")})
