"""A small causal Transformer over the same long contiguous streams (`--model transformer`).

It reads exactly what the GRU reads (heapcast.forecast.models.rnn: token, call site, time delta,
the n-gram's hints, the in-run memory) and trains in the same loop: the streams are laid out as
`batch` contiguous segments and stepped through `bptt` events at a time, every event one label.
In place of a recurrent state it carries a memory (Transformer-XL style): each layer attends to
its own inputs of the last `memory` events before the chunk (kept, without gradients, from the
previous step) and to the chunk's events up to itself. Positions are relative: each head adds a
fixed linear penalty per event of distance to its attention scores (ALiBi), so the same weights
serve any chunk length and any memory length.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from .rnn import RNNModel


class Block(nn.Module):
    """Pre-norm attention + MLP, nanoGPT's block with a memory of earlier inputs."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q = nn.Linear(d, d)
        self.kv = nn.Linear(d, 2 * d)
        self.proj = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mem, bias):
        """x: (batch, T, d); mem: (batch, M, d) earlier inputs of this block; bias: (heads, T,
        M + T) additive attention bias (distance penalty, -inf for the future)."""
        b, t, d = x.shape
        h = self.ln1(x)
        ctx = torch.cat([self.ln1(mem), h], 1)
        q = self.q(h).view(b, t, self.heads, d // self.heads).transpose(1, 2)
        k, v = self.kv(ctx).split(d, -1)
        k = k.view(b, -1, self.heads, d // self.heads).transpose(1, 2)
        v = v.view(b, -1, self.heads, d // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class CausalCore(nn.Module):
    """The recurrent layer's stand-in: (time-major inputs, state) -> (outputs, new state), where
    the state is each block's inputs of the last `memory` events."""

    def __init__(self, width: int, cfg: dict):
        super().__init__()
        d, heads = cfg["hidden"], cfg["heads"]
        if d % heads:
            raise ValueError(f"hidden ({d}) must be a multiple of heads ({heads})")
        self.memory = cfg["memory"]
        self.inp = nn.Linear(width, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(cfg["layers"]))
        self.ln = nn.LayerNorm(d)
        # ALiBi slopes: a geometric series, one per head.
        self.register_buffer("slopes", torch.tensor([2.0 ** (-8.0 * (i + 1) / heads)
                                                     for i in range(heads)]), persistent=False)

    def _bias(self, t: int, m: int, device) -> torch.Tensor:
        qpos = torch.arange(m, m + t, device=device)[:, None]
        kpos = torch.arange(m + t, device=device)[None, :]
        dist = (qpos - kpos).float()
        bias = -self.slopes[:, None, None] * dist
        return bias.masked_fill(dist < 0, -math.inf)

    def forward(self, x, state=None):
        x = self.inp(x).transpose(0, 1)                  # (batch, T, d)
        b, t, d = x.shape
        mems = list(state) if state is not None else [x.new_zeros(b, 0, d)] * len(self.blocks)
        bias = self._bias(t, mems[0].shape[1], x.device)
        new = []
        for block, mem in zip(self.blocks, mems):
            new.append(torch.cat([mem, x], 1)[:, -self.memory:])
            x = block(x, mem, bias)
        return self.ln(x).transpose(0, 1), tuple(new)


class TransformerModel(RNNModel):
    """The GRU's inputs and training loop with a causal Transformer in place of the GRU."""

    kind = "transformer"

    @classmethod
    def default_config(cls) -> dict:
        return {**super().default_config(), "hidden": 128, "heads": 4, "layers": 2,
                "memory": 128, "lr": 1e-3, "batch": 32}
