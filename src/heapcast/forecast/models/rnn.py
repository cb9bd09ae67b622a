"""The learned models: stateful GRU/LSTM over long contiguous streams, truncated BPTT (and the
same inputs and loop for the causal Transformer of heapcast.forecast.models.transformer).

Instead of the article's 100-event windows (100 recurrent steps recomputed for every single
label), the training rows are laid out as `batch` contiguous segments run in parallel; the
network steps through them `bptt` events at a time, carrying its hidden state from one chunk to
the next (gradients stop at chunk edges). Every event is one recurrent step and one label.

Inputs at each step: the event's token (an embedding over the tokens seen in training, plus
"unknown" and "stream start"), its call-site key (hashed into `site_buckets` embeddings: the
article's "next step", context from the call stack) and its time-delta bucket (bit_length of the
ns since the previous event of the stream). For `next` and `free` the step that predicts row j
reads row j-1 (the future is never an input); for `lifetime` it reads row j itself (the
allocation is known when its lifetime is guessed).

With `ngram_hints` (the default) the network also reads, at each step, what a PPM n-gram model
(heapcast.forecast.models.ngram, with call sites) predicts for that row: its two best labels and
its confidence. The n-gram memorizes long exact sequences that a 128-unit state cannot; the
network learns when to follow it and when its own context (time deltas, longer history) knows
better; a learned boost of the hinted labels' logits per confidence level makes following it
cheap. So that it learns how far the n-gram can be trusted on data the n-gram has not seen,
training rows get hints from n-grams fitted on the other rows (cross-fitting over interleaved
blocks); prediction uses an n-gram fitted on all of them, stored in the model file.

For `next` and `free` the network also reads an in-run memory (`cache_orders`): for a few
context lengths k, the label that followed the latest earlier occurrence of the row's order-k
context (tokens with call sites) in this very stream. A model trained on one run meets another
input in another run: sizes that depend on the input repeat within the run, and this memory is
how the model adapts to them while it predicts, without learning from the test data's labels
ahead of time (every value it reads is of an event that has already happened).

With a validation run (`heapcast train --validate`, heapcast.forecast.select) the hints' n-gram
settings are chosen on it and, after training, `calibrate` fits only the logit boosts of the hints
and of the memory on it: how far to trust each when the input is another program.

Prediction runs the same way without gradients: segments start `warmup` events early so that
the hidden state is warm where scoring begins. Determinism: fixed seeds,
torch.use_deterministic_algorithms, a fixed thread count: the same run gives the same bytes.
"""
from __future__ import annotations

import math
import os
import sys
import time

import numpy as np
import torch
from torch import nn

from ..tasks import TaskData
from .base import Model, pad_k, training_summary

_BOS, _UNK = 0, 1      # reserved input token ids; training tokens start at 2
#: Confidence buckets of the n-gram hint: its top label's blended probability.
CONF_BOUNDS = np.array([0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99])
HINT_BLOCK = 8192      # rows per cross-fitting block
HINT_FOLDS = 2         # two: each fold's n-gram fits half the rows (fits are most of the hints' cost)


class StreamNet(nn.Module):
    """Embeddings -> GRU/LSTM -> linear head over the model's label classes.

    Inputs per step (int64, time-major): token, site bucket, dt bucket, with n-gram hints the
    n-gram's two best labels (as output class ids + 1, 0 none) and its confidence bucket, then
    one in-run memory label per cache order (output class id + 1, 0 none).
    """

    def __init__(self, cell: str, n_tokens: int, n_sites: int, n_dt: int, n_out: int, cfg: dict,
                 hints: bool = False, caches: int = 0):
        super().__init__()
        self.tok = nn.Embedding(n_tokens, cfg["embed"])
        width = cfg["embed"]
        self.site = nn.Embedding(n_sites, cfg["site_embed"]) if n_sites else None
        width += cfg["site_embed"] if n_sites else 0
        self.dt = nn.Embedding(n_dt, cfg["dt_embed"]) if n_dt else None
        width += cfg["dt_embed"] if n_dt else 0
        if hints:
            self.hint = nn.Embedding(n_out + 1, cfg["hint_embed"])
            self.conf = nn.Embedding(len(CONF_BOUNDS) + 1, 8)
            width += 2 * cfg["hint_embed"] + 8
            # A direct path too: the hinted labels' logits get a learned boost per confidence
            # bucket, so that following a sure n-gram costs the network nothing to learn.
            self.boost = nn.Embedding(len(CONF_BOUNDS) + 1, 2)
            with torch.no_grad():       # start out following the n-gram, more when it is sure
                self.boost.weight[:, 0] = 2.0 * torch.arange(1.0, len(CONF_BOUNDS) + 2)
                self.boost.weight[:, 1] = 2.0
        else:
            self.hint = self.conf = self.boost = None
        self.caches = caches
        if caches:
            # One embedding per order, summed: the recurrent layer's input grows by one width,
            # not one per order (its input product is most of a training step).
            self.cache = nn.ModuleList(nn.Embedding(n_out + 1, cfg["hint_embed"])
                                       for _ in range(caches))
            width += cfg["hint_embed"]
            self.cache_boost = nn.Parameter(torch.ones(caches))  # direct path, as for hints
        if cell == "transformer":
            from .transformer import CausalCore
            self.rnn = CausalCore(width, cfg)
        else:
            rnn = nn.GRU if cell == "gru" else nn.LSTM
            self.rnn = rnn(width, cfg["hidden"], num_layers=cfg["layers"])
        self.head = nn.Linear(cfg["hidden"], n_out)

    def forward(self, tok, site, dt, hint1, hint2, conf, *cache, state=None):
        """(logits over the output classes, new recurrent state) of a time-major chunk."""
        parts = [self.tok(tok)]
        if self.site is not None:
            parts.append(self.site(site))
        if self.dt is not None:
            parts.append(self.dt(dt))
        if self.hint is not None:
            parts += [self.hint(hint1), self.hint(hint2), self.conf(conf)]
        if cache:
            parts.append(sum(emb(c) for emb, c in zip(self.cache, cache)))
        out, state = self.rnn(torch.cat(parts, -1), state)
        return self._logits(out, hint1, hint2, conf, cache), state

    def _logits(self, out, hint1, hint2, conf, cache):
        logits = self.head(out)
        boosts = []
        if self.boost is not None:
            boost = self.boost(conf)
            boosts += [(hint1, boost[..., 0]), (hint2, boost[..., 1])]
        boosts += [(c, self.cache_boost[i].expand_as(c)) for i, c in enumerate(cache)]
        if not boosts:
            return logits
        # One scatter for all of them: each hinted label's logit gets its boost (0 for "none").
        labels = torch.stack([label for label, _ in boosts], -1)
        values = torch.stack([b for _, b in boosts], -1) * (labels > 0)
        return logits.scatter_add(-1, (labels - 1).clamp(min=0), values)


def _detach(state):
    if state is None:
        return None
    return tuple(s.detach() for s in state) if isinstance(state, tuple) else state.detach()


def _thread_groups(batch: int, threads: int) -> list:
    """Column ranges [lo, hi) dealing `batch` segments into up to `threads` equal groups."""
    n = max(1, min(threads, batch))
    edges = [batch * i // n for i in range(n + 1)]
    return list(zip(edges[:-1], edges[1:]))


def _split_state(state, groups: list, dim: int) -> list:
    """A recurrent state over all segments (segments along `dim`), cut into one per group
    (None stays None)."""
    if state is None:
        return [None] * len(groups)
    if isinstance(state, tuple):
        return [tuple(s.narrow(dim, lo, hi - lo) for s in state) for lo, hi in groups]
    return [state.narrow(dim, lo, hi - lo) for lo, hi in groups]


def _join_state(states: list, dim: int):
    """The inverse of _split_state."""
    if states[0] is None:
        return None
    if isinstance(states[0], tuple):
        return tuple(torch.cat(parts, dim) for parts in zip(*states))
    return torch.cat(states, dim)


class _GroupPool:
    """Worker threads for _group_step, each set to one torch thread (the OpenMP thread count
    is per calling thread); none for a single group."""

    def __init__(self, n: int):
        from concurrent.futures import ThreadPoolExecutor
        self.threads = torch.get_num_threads()     # the workers' setting leaks to this thread
        self.pool = ThreadPoolExecutor(n, initializer=torch.set_num_threads, initargs=(1,)) \
            if n > 1 else None

    def map(self, fn, items: list) -> list:
        if self.pool is None:
            return [fn(item) for item in items]
        return [f.result() for f in [self.pool.submit(fn, item) for item in items]]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
            torch.set_num_threads(self.threads)


def _group_step(net, params: list, chunk: list, states: list, groups: list, labelled: int,
                pool: _GroupPool):
    """One training step, each group of segments on its own thread: sets every parameter's
    .grad to the gradient of the step's mean loss over its `labelled` rows; returns (that loss,
    the groups' new states)."""
    def run(i):
        lo, hi = groups[i]
        *xs, lb = (t[:, lo:hi] for t in chunk)
        logits, state = net(*xs, state=states[i])
        if not labelled:
            return None, 0.0, _detach(state)
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), lb.reshape(-1),
                                           ignore_index=-1, reduction="sum")
        grads = torch.autograd.grad(loss / labelled, params, allow_unused=True)
        return grads, float(loss.detach()), _detach(state)

    out = pool.map(run, range(len(groups)))
    if labelled:
        for j, p in enumerate(params):      # in group order: the same sum on every run
            parts = [g[j] for g, _, _ in out if g[j] is not None]
            p.grad = sum(parts[1:], parts[0].clone()) if parts else None
    return sum(loss for _, loss, _ in out) / max(labelled, 1), [st for _, _, st in out]


def _ddp_step(net, chunk: list, state, labelled: int):
    """One training step under torchrun: every rank joins DDP's gradient exchange, even one
    whose chunk has no labels. Returns (the mean loss, the new state)."""
    *xs, lb = chunk
    logits, state = net(*xs, state=state)
    if labelled:
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                           lb.reshape(-1), ignore_index=-1)
    else:
        loss = logits.sum() * 0.0
    loss.backward()
    return float(loss.detach()), _detach(state)


class RNNModel(Model):
    """Stateful GRU (kind "gru", the default model) or LSTM (kind "lstm")."""

    kind = "gru"
    needs_torch = True

    @classmethod
    def default_config(cls) -> dict:
        return {"hidden": 128, "layers": 1, "embed": 48, "site_embed": 32, "site_buckets": 4096,
                "dt_embed": 8, "batch": 128, "bptt": 64, "lr": 6e-3, "clip": 1.0,
                "warmup": 256, "seed": 0, "threads": 2, "ngram_hints": True, "hint_embed": 32,
                "ngram": {"sites": True, "topk": 3}, "cache_orders": [4, 8, 16]}

    def __init__(self, task: str, vocab: str, config: dict | None = None):
        from .ngram import NGram
        super().__init__(task, vocab, config)
        self.cell = self.kind
        self.config["ngram"] = {**NGram.default_config(), **self.config["ngram"]}
        self.ngram = None

    # ---- inputs ----------------------------------------------------------------------------

    def _token_ids(self, tokens: np.ndarray) -> np.ndarray:
        """Model input id of each vocabulary token (UNK for tokens unseen in training)."""
        i = np.searchsorted(self.input_tokens, tokens)
        i = np.minimum(i, len(self.input_tokens) - 1)
        return np.where(self.input_tokens[i] == tokens, i + 2, _UNK).astype(np.int64)

    def _cache_orders(self) -> list:
        """The in-run memory's context lengths (none for lifetime: its labels are not known
        when the next allocation happens)."""
        return [] if self.task == "lifetime" else list(self.config["cache_orders"])

    def _memory_ngram(self):
        """The n-gram whose contexts the in-run memory looks up (tokens with call sites)."""
        from .ngram import NGram
        return NGram(self.task, self.vocab, {"sites": True, "orders": self._cache_orders()})

    def _shared_contexts(self, data: TaskData) -> tuple:
        """Context hashes of `data` (contexts()) for the hints' n-gram and for the in-run
        memory: one rolling hash for both when they read the same symbols (tokens with call
        sites, the default); None for the one that must hash its own."""
        from .ngram import NGram
        if not self.config["ngram_hints"]:
            return None, None
        hint = NGram(self.task, self.vocab, self.config["ngram"])
        orders = set(hint.config["orders"])
        same = hint._use_sites() and not hint.config["dt"]
        if same:
            orders |= set(self._cache_orders())
        ctx = hint.contexts(data, sorted(orders))
        return ctx, ctx if same and self._cache_orders() else None

    def _cache(self, data: TaskData, contexts: dict | None = None) -> list:
        """The in-run memory of every row, per cache order, as output class id + 1 (0: none);
        `contexts`: the memory's contexts of `data` (_shared_contexts), if hashed already."""
        orders = self._cache_orders()
        if not orders:
            return []
        ng = self._memory_ngram()
        recent = ng.recent_continuations(data, orders, contexts)
        out = []
        for m in orders:
            lab = recent[m]
            i = np.minimum(np.searchsorted(self.classes, lab), len(self.classes) - 1)
            out.append(np.where((lab >= 0) & (self.classes[i] == lab), i + 1, 0).astype(np.int64))
        return out

    def _inputs(self, data: TaskData, hints=None, cache=None, contexts=None) -> list:
        """Per-row input ids: token, site bucket and dt of the previous row for shifted tasks
        (of the row itself for lifetime), then the n-gram hints for the row (`hints`: their
        arrays, else computed with the model's n-gram, from `contexts` if given), then the
        in-run memory (`cache`: its arrays, else computed over `data`)."""
        tok = self._token_ids(data.tokens.astype(np.int64))
        buckets = self.config["site_buckets"]
        site = np.where(data.sites == 0, 0, 1 + data.sites.astype(np.int64) % max(buckets - 1, 1))
        dt = data.dt.astype(np.int64)
        if data.shift:
            start = np.zeros(len(data), bool)
            start[data.offsets[:-1][data.offsets[:-1] < len(data)]] = True
            tok, site, dt = (np.concatenate([[_BOS], a[:-1]]) for a in (tok, site, dt))
            tok[start], site[start], dt[start] = _BOS, 0, 0
        if hints is None:
            hints = self._hints(data, self.ngram, np.arange(len(data)), contexts) \
                if self.ngram else \
                [np.zeros(len(data), np.int64)] * 3
        if cache is None:
            cache = self._cache(data)
        return [tok, site, dt, *hints, *cache]

    def _hints(self, data: TaskData, ngram, rows: np.ndarray, contexts=None) -> list:
        """The n-gram's two best labels for `rows` (output class id + 1, 0: none or unknown)
        and its confidence bucket, as arrays over all rows of `data` (0 elsewhere)."""
        labels, probs = ngram.predict_proba(data, rows, 2, contexts)
        out = [np.zeros(len(data), np.int64) for _ in range(3)]
        for c in range(2):
            i = np.minimum(np.searchsorted(self.classes, labels[:, c]), len(self.classes) - 1)
            out[c][rows] = np.where(self.classes[i] == labels[:, c], i + 1, 0)
        out[2][rows] = np.searchsorted(CONF_BOUNDS, probs[:, 0], "right")
        return out

    def _fit_hints(self, part: TaskData, keep: np.ndarray, runs: np.ndarray | None,
                   contexts: dict) -> list:
        """Hints for the training rows in `keep` that do not come from an n-gram that learned
        those very rows (cross-fitting): with several training runs (`runs`: the run of every
        row), each run gets the predictions of an n-gram fitted on the other runs, which is what
        the model meets on a run it was not trained on; with one, rows are dealt into
        HINT_FOLDS folds by blocks of HINT_BLOCK (so that every fold sees every phase of the
        program) and each fold gets an n-gram fitted on the other folds. The model keeps an
        n-gram fitted on all rows for prediction. `contexts`: the n-gram's contexts() of
        `part`, hashed once for all the fits."""
        from .ngram import NGram
        n = len(part)
        if runs is not None and len(np.unique(runs)) > 1:
            fold = np.unique(runs, return_inverse=True)[1]
        else:
            fold = (np.arange(n) // HINT_BLOCK) % HINT_FOLDS
        hints = [np.zeros(n, np.int64) for _ in range(3)]
        for f in range(int(fold.max()) + 1 if n else 0):
            score = (fold == f) & keep
            if not score.any() or not ((fold != f) & (part.labels >= 0)).any():
                continue
            ng = NGram(self.task, self.vocab, self.config["ngram"])
            ng.fit(part, fold != f, contexts=contexts)
            for h, new in zip(hints, self._hints(part, ng, np.flatnonzero(score), contexts)):
                h[score] = new[score]
        self.ngram = NGram(self.task, self.vocab, self.config["ngram"])
        self.ngram.fit(part, np.ones(n, bool), contexts=contexts)
        return hints

    def _net(self) -> "StreamNet":
        c = self.config
        return StreamNet(self.cell, len(self.input_tokens) + 2,
                         c["site_buckets"] if c["site_embed"] else 0,
                         64 if c["dt_embed"] else 0, len(self.classes), c,
                         hints=bool(c["ngram_hints"]), caches=len(self._cache_orders()))

    # ---- training --------------------------------------------------------------------------

    def fit(self, data: TaskData, train: np.ndarray, epochs: int = 1, max_steps: int = 0,
            max_events: int = 0, progress: bool = True, checkpoint=None, resume: bool = False,
            device: str = "cpu", runs: np.ndarray | None = None, **options) -> dict:
        """Trains on the rows where `train` is true (each stream's part must be a prefix, as
        every split makes). `max_events` > 0: the network steps through about that many of them
        (blocks spread over all, train.spread_rows), the n-gram of its hints learns from all.
        `runs`: the training run (recording) of every row of `data`, for leave-one-run-out
        hints (_fit_hints) when there are several.
        `max_steps` > 0 stops early; `checkpoint` (a path) gets the state every epoch and when
        stopping; with `resume`, training continues from it. `finetune=True` continues training
        a trained model (its weights, label classes, input tokens and n-gram kept; the n-gram's
        hints on the new rows are what it predicts for data it never saw). `prepared` (a dict):
        models fitted on the same data and rows with the same n-gram settings share their
        inputs (hints, in-run memory) through it: the first fills it, the others read it."""
        from ..train import spread_rows
        self.check_data(data, fitting=True)
        c = self.config
        _setup_torch(c)
        t0 = time.perf_counter()
        part = data.select(train)
        y = part.labels
        finetune = bool(options.get("finetune")) and getattr(self, "net", None) is not None
        if not finetune:
            self.classes = np.unique(y[y >= 0])
            self.input_tokens = np.unique(part.tokens).astype(np.int64)
        world, rank = _distributed()
        if world > 1 and device.startswith("cuda"):   # torchrun: one GPU per process
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
            torch.cuda.set_device(device)
        if finetune:
            self.net = self.net.to(device)
        else:
            self.net = self._net().to(device)
            _keras_like_init(self.net, self.cell)
            self.ngram = None
        opt = torch.optim.Adam(self.net.parameters(), lr=c["lr"])
        keep = spread_rows(np.ones(len(part), bool), max_events) if max_events else \
            np.ones(len(part), bool)
        prepared = options.get("prepared")    # select.choose_hidden: probes share the inputs
        if prepared and not finetune:
            inputs, self.ngram = prepared["inputs"], prepared["ngram"]
        else:
            hint_ctx, memory_ctx = self._shared_contexts(part)
            hints = self._fit_hints(part, keep, None if runs is None else runs[train],
                                    hint_ctx) if c["ngram_hints"] and not finetune else None
            inputs = self._inputs(part, hints, self._cache(part, memory_ctx))
            del hint_ctx, memory_ctx
            if prepared is not None and not finetune:
                prepared.update(inputs=inputs, ngram=self.ngram)
        i = np.minimum(np.searchsorted(self.classes, np.maximum(y, 0)), len(self.classes) - 1)
        lab = np.where((y >= 0) & (self.classes[i] == y), i, -1)   # labels the model has
        if max_events:
            inputs, lab = [a[keep] for a in inputs], lab[keep]
        grid = _segments(len(lab), c["batch"] * world)[:, rank::world]
        tensors = [_gather(a, grid, device) for a in (*inputs, lab)]
        steps_per_epoch = math.ceil(grid.shape[0] / c["bptt"])
        rows_per_step = np.add.reduceat((grid >= 0).sum(1), np.arange(0, grid.shape[0], c["bptt"]))
        total = steps_per_epoch * epochs          # the learning-rate schedule's length
        stop = min(total, max_steps) if max_steps else total
        net = self.net
        if world > 1:
            net = nn.parallel.DistributedDataParallel(
                self.net, device_ids=[torch.device(device).index] if device.startswith("cuda")
                else None)
        # On CPU without torchrun, the step's segments are dealt to `threads` Python threads,
        # one torch thread each: the step's ops are too small for torch's own intra-op threads
        # (2 of them ran no faster than 1), while two halves of the batch run in parallel in
        # 0.55-0.6x the time. The gradient is the same sum, added in a fixed order.
        groups = _thread_groups(grid.shape[1], int(c.get("threads") or 1)) \
            if world == 1 and device == "cpu" else [(0, grid.shape[1])]
        params = list(self.net.parameters())
        step, state, losses = 0, None, []
        if resume and checkpoint is not None and os.path.exists(checkpoint):
            step, state = _load_checkpoint(checkpoint, self, opt, device)
        # Segments run along dim 1 of a GRU/LSTM state, dim 0 of a Transformer's memory.
        seg_dim = 0 if self.cell == "transformer" else 1
        states = _split_state(state, groups, seg_dim)
        from tqdm import tqdm
        bar = tqdm(total=stop, initial=step, desc=f"train {self.kind}", unit="step",
                   disable=not progress or rank != 0, file=sys.stderr, leave=False)
        pool = _GroupPool(len(groups))
        events = 0
        try:
            while step < stop:
                s = (step % steps_per_epoch) * c["bptt"]
                if s == 0:
                    states = [None] * len(groups)
                for g in opt.param_groups:           # linear decay to 10% of the rate
                    g["lr"] = c["lr"] * (1.0 - 0.9 * step / total)
                chunk = [t[s:s + c["bptt"]] for t in tensors]
                labelled = int((chunk[-1] >= 0).sum())
                opt.zero_grad(set_to_none=True)
                if world > 1:
                    loss, states[0] = _ddp_step(net, chunk, states[0], labelled)
                else:
                    loss, states = _group_step(self.net, params, chunk, states, groups,
                                               labelled, pool)
                if labelled or world > 1:
                    nn.utils.clip_grad_norm_(params, c["clip"])
                    opt.step()
                if labelled:
                    losses.append(loss)
                events += int(rows_per_step[step % steps_per_epoch])
                step += 1
                bar.update()
                if checkpoint is not None and rank == 0 and (step % steps_per_epoch == 0
                                                             or step == stop):
                    _save_checkpoint(checkpoint, self, opt, step,
                                     _join_state(states, seg_dim))
        finally:
            pool.close()
        bar.close()
        return training_summary(events * world, time.perf_counter() - t0, losses,
                                rows=int(len(lab)), steps=int(stop), epochs=epochs)

    def calibrate(self, val: TaskData, rows: np.ndarray, epochs: int = 2) -> dict:
        """Fits how far the trained network trusts the offline n-gram's hints against its
        in-run memory, on a validation run (heapcast.forecast.select): only the logit boosts
        of the hinted labels (`boost`, per confidence bucket) and of the memory's labels
        (`cache_boost`) learn, over the validation run's first rows up to the last of `rows`,
        with everything else frozen. Returns the boosts and the validation loss before/after."""
        c = self.config
        names = ("boost.weight", "cache_boost")
        chosen = {n: p for n, p in self.net.named_parameters() if n in names}
        params = list(chosen.values())
        if not params or not len(rows):
            return {}
        _setup_torch(c)
        val = val.select(np.arange(len(val)) <= int(rows.max()))
        inputs = self._inputs(val)
        y = val.labels
        i = np.minimum(np.searchsorted(self.classes, np.maximum(y, 0)), len(self.classes) - 1)
        lab = np.where((y >= 0) & (self.classes[i] == y), i, -1)   # unseen labels: no loss
        grid = _segments(len(lab), c["batch"])
        tensors = [_gather(a, grid, "cpu") for a in (*inputs, lab)]
        for p in self.net.parameters():
            p.requires_grad_(False)
        for p in params:
            p.requires_grad_(True)
        opt = torch.optim.Adam(params, lr=0.05)
        losses = []
        self.net.train()
        groups = _thread_groups(grid.shape[1], int(c.get("threads") or 1))
        pool = _GroupPool(len(groups))
        try:
            for epoch in range(epochs):
                states, total, count = [None] * len(groups), 0.0, 0
                for s in range(0, grid.shape[0], c["bptt"]):
                    chunk = [t[s:s + c["bptt"]] for t in tensors]
                    labelled = int((chunk[-1] >= 0).sum())
                    opt.zero_grad(set_to_none=True)
                    loss, states = _group_step(self.net, params, chunk, states, groups,
                                               labelled, pool)
                    if labelled:
                        opt.step()
                        total, count = total + loss * labelled, count + labelled
                losses.append(total / max(count, 1))
        finally:
            pool.close()
        for p in self.net.parameters():
            p.requires_grad_(True)
        self.net.eval()
        return {"rows": int((lab >= 0).sum()), "loss_first_epoch": losses[0],
                "loss_last_epoch": losses[-1],
                **{n: p.detach().numpy().round(3).tolist() for n, p in chosen.items()}}

    # ---- prediction ------------------------------------------------------------------------

    @torch.no_grad()
    def predict(self, data: TaskData, rows: np.ndarray, k: int = 5) -> np.ndarray:
        self.check_data(data)
        _setup_torch(self.config)
        self.net.eval()
        if not len(rows):
            return np.zeros((0, k), np.int64)
        # Rows long before the first scored one only warm up the state: skip them.
        first = max(0, int(rows.min()) - self.config["warmup"])
        hint_ctx, memory_ctx = self._shared_contexts(data)
        cache = self._cache(data, memory_ctx)    # over everything: the memory of the whole run
        if first:
            data = data.select(np.arange(len(data)) >= first)
            rows = rows - first
            cache = [c[first:] for c in cache]
            hint_ctx = {m: h[first:] for m, h in hint_ctx.items()} if hint_ctx else None
        n = len(data)
        inputs = self._inputs(data, cache=cache, contexts=hint_ctx)
        want = np.zeros(n, bool)
        want[rows] = True
        batch, warm = self.config["batch"], self.config["warmup"]
        seg = max(1, math.ceil(n / batch))
        starts = np.arange(0, n, seg)
        # Row index at each (step, segment): `warm` rows of history, then the scored rows.
        steps = np.arange(-warm, seg)[:, None] + starts[None, :]
        valid = (steps >= 0) & (steps < n)
        scored = valid & (np.arange(-warm, seg) >= 0)[:, None]
        idx = np.where(valid, steps, 0)
        out = np.full((n, k), -1, np.int64)
        state = None
        chunk = 512
        for s in range(0, steps.shape[0], chunk):
            ix, ok = idx[s:s + chunk], valid[s:s + chunk]
            xs = [torch.from_numpy(np.where(ok, a[ix], _BOS if i == 0 else 0))
                  for i, a in enumerate(inputs)]
            logits, state = self.net(*xs, state=state)
            sel = scored[s:s + chunk] & want[ix]
            if not sel.any():
                continue
            logits = logits[torch.from_numpy(sel)]
            best = torch.topk(logits, min(k, logits.shape[-1]), dim=-1).indices.numpy()
            out[ix[sel]] = pad_k(self.classes[best], k)
        return out[rows]

    # ---- state -----------------------------------------------------------------------------

    def tensors(self) -> dict:
        out = {f"net.{name}": t.detach().cpu().numpy() for name, t in self.net.state_dict().items()}
        out["classes"] = self.classes.astype(np.int64)
        out["input_tokens"] = self.input_tokens.astype(np.int64)
        if self.ngram is not None:
            out.update({f"ngram.{k}": v for k, v in self.ngram.tensors().items()})
        return out

    def load_tensors(self, tensors: dict) -> None:
        from .ngram import NGram
        self.classes = np.asarray(tensors["classes"], np.int64)
        self.input_tokens = np.asarray(tensors["input_tokens"], np.int64)
        self.net = self._net()
        state = {name[4:]: torch.from_numpy(np.array(arr)) for name, arr in tensors.items()
                 if name.startswith("net.")}
        self.net.load_state_dict(state)
        self.ngram = None
        if self.config["ngram_hints"]:
            self.ngram = NGram(self.task, self.vocab, self.config["ngram"])
            self.ngram.free_group, self.ngram.free_codes = self.free_group, self.free_codes
            self.ngram.load_tensors({k[6:]: v for k, v in tensors.items()
                                     if k.startswith("ngram.")})


class LSTMModel(RNNModel):
    """The same stateful network with LSTM cells."""

    kind = "lstm"


def _setup_torch(cfg: dict) -> None:
    torch.manual_seed(cfg["seed"])
    # torch.use_deterministic_algorithms(True) without its import of torch._inductor (3 s of
    # every `heapcast train`, 10 on a busy machine): only the flag matters here.
    torch._C._set_deterministic_algorithms(True)
    if cfg.get("threads"):
        torch.set_num_threads(int(cfg["threads"]))


def _keras_like_init(net: "StreamNet", cell: str) -> None:
    """Glorot-uniform input weights, orthogonal recurrent weights, zero biases (forget-gate bias
    1 for LSTMs): trains faster than PyTorch's uniform default, and is what Keras does."""
    for name, p in net.named_parameters():
        if "weight_hh" in name:
            nn.init.orthogonal_(p)
        elif "weight_ih" in name or name == "head.weight":
            nn.init.xavier_uniform_(p)
        elif "bias" in name:
            nn.init.zeros_(p)
            if cell == "lstm" and "bias_ih" in name:     # gates i, f, g, o
                h = p.shape[0] // 4
                with torch.no_grad():
                    p[h:2 * h] = 1.0


def _segments(n: int, batch: int) -> np.ndarray:
    """(length, batch) row indices laying n rows out as `batch` contiguous segments; -1 pads."""
    batch = max(1, min(batch, n))
    seg = math.ceil(n / batch)
    grid = np.arange(seg * batch, dtype=np.int64).reshape(batch, seg).T
    return np.where(grid < n, grid, -1)


def _gather(values: np.ndarray, grid: np.ndarray, device: str):
    pad = -1 if values.dtype.kind == "i" and values.min(initial=0) < 0 else 0
    out = np.where(grid >= 0, values[np.maximum(grid, 0)], pad)
    return torch.from_numpy(np.ascontiguousarray(out)).to(device)


def _distributed() -> tuple[int, int]:
    """(world size, rank) under torchrun, (1, 0) otherwise."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 1, 0
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return world, dist.get_rank()


def _save_checkpoint(path, model: RNNModel, opt, step: int, state) -> None:
    """Weights, Adam's moments, the step and the hidden state: resuming repeats the exact run."""
    from ..modelfile import save_model_file
    tensors = {f"model.{k}": v for k, v in model.tensors().items()}
    for i, s in opt.state_dict()["state"].items():
        for key, val in s.items():
            tensors[f"opt.{i}.{key}"] = val.detach().cpu().numpy().reshape(-1)
    states = state if isinstance(state, tuple) else (state,) if state is not None else ()
    for i, h in enumerate(states):
        tensors[f"hidden.{i}"] = h.detach().cpu().numpy()
    save_model_file(path, tensors, {"checkpoint": True, "model": model.kind, "step": step,
                                    "task": model.task, "vocab": model.vocab,
                                    "config": model.config})


def _load_checkpoint(path, model: RNNModel, opt, device: str):
    """Restores what _save_checkpoint wrote; returns (step, hidden state)."""
    from ..modelfile import ModelError, read_model_file
    tensors, meta = read_model_file(path)
    mine = {"model": model.kind, "task": model.task, "vocab": model.vocab, "config": model.config}
    if not meta.get("checkpoint") or any(meta.get(k) != v for k, v in mine.items()):
        raise ModelError(f"{path}: not a checkpoint of this training run (model "
                         f"{meta.get('model')!r}, task {meta.get('task')!r}, other settings): "
                         f"delete it or drop --resume")
    if not np.array_equal(tensors.get("model.classes"), model.classes):
        raise ModelError(f"{path}: checkpoint of a run on other data (label classes differ)")
    # Into the existing network: the optimizer holds its parameters.
    model.net.load_state_dict({k[10:]: torch.from_numpy(np.array(v)).to(device)
                               for k, v in tensors.items() if k.startswith("model.net.")})
    sd = opt.state_dict()
    sd["state"] = {}
    for i, p in enumerate(model.net.parameters()):
        if f"opt.{i}.step" in tensors:
            moment = {key: torch.from_numpy(np.array(tensors[f"opt.{i}.{key}"])).reshape(p.shape)
                      for key in ("exp_avg", "exp_avg_sq")}
            sd["state"][i] = {"step": torch.tensor(float(tensors[f"opt.{i}.step"][0])), **moment}
    # Adam's constructor-time state (the parameters' order) stays; only moments are restored.
    opt.load_state_dict(sd)
    hidden = []
    while f"hidden.{len(hidden)}" in tensors:
        hidden.append(torch.from_numpy(np.array(tensors[f"hidden.{len(hidden)}"])).to(device))
    state = (hidden[0] if model.kind == "gru" else tuple(hidden)) if hidden else None
    return int(meta["step"]), state
