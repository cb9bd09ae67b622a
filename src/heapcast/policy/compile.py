"""`heapcast compile`: a trained forecasting model -> a POLICY the native runtime executes.

- `rnn`: the default model's own network (a GRU with call-site buckets, time deltas, n-gram hints
  and the in-run memory), rewritten for a step at a time: every embedding table is multiplied by
  its slice of the GRU's input weights ahead of time (native/policy/rnn.c says why), the n-gram's
  context tables get open-addressing indexes, and `--int8` / `--prune F` give smaller, faster
  variants whose accuracy `heapcast evaluate POLICY` measures.
- `table`: a distilled lookup for nanosecond budgets. The model predicts every row of some traces
  (its training traces, or `--data`); per key (call site + token + the k tokens before, then
  coarser keys) the table keeps the labels it predicted most often there and how often the top
  one was predicted; unseen keys fall back to coarser ones, then to the model's commonest answer.
  Any model kind compiles to a table.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..trace.cache import file_digest
from .fileformat import ABI, KINDS, TASK_IDS, VOCAB_IDS, PolicyError, cfg_array, write_policy
from .names import COMPILE_KINDS, DEFAULT_CTX  # noqa: F401 (re-exported)
from .native import TOPK, index_build

CTX_LEVEL = 100          # the key level of a context of K tokens is CTX_LEVEL + K
_PAD_TOKEN = 0xFFFF
_P = np.uint64(0x100000001B3)
_CTX_MUL = np.uint64(0x9E3779B97F4A7C15)
_KEY_MUL = np.uint64(0xD6E8FEB86659FD93)


def compile_policy(model_path, output, kind: str = "rnn", int8: bool = False, prune: float = 0.0,
                   data=None, ctx=DEFAULT_CTX, max_rows: int = 2_000_000,
                   min_count: int = 2, placement: str = "lab", align: int = 16) -> dict:
    """Compiles the model file at `model_path` into a POLICY at `output`; returns its spec.

    `kind`: "rnn" (the default GRU's network) or "table" (distilled on `data`: traces or
    datasets, by default the model's training traces; `ctx`: the context lengths, in tokens,
    of its most specific keys, backed off longest first; context keys seen fewer than
    `min_count` times left out; `max_rows` rows at most). `int8` and `prune` (a fraction of
    hidden units to drop) apply to rnn. A lifetime table also carries whether heapcast's
    allocator should place blocks by lifetime class, in one group or on glibc's malloc:
    `placement` "lab" (the allocator lab's verdict on the same traces, policy.placement), or
    "lifetime", "one", "glibc" (forced); `align` 16 or 8: the alignment of heapcast's packer that
    the lab judges and that `heapcast run` uses with this policy (8: classes every 8 bytes, as
    `heapcast run --align 8`). PolicyError (a ValueError) names the file and why it
    cannot compile."""
    from ..forecast.models import load_model
    if kind not in KINDS:
        raise PolicyError(f"unknown policy kind {kind!r} (known: {', '.join(KINDS)})")
    if not 0.0 <= prune < 1.0:
        raise PolicyError(f"--prune {prune}: expected a fraction of hidden units in [0, 1)")
    if min_count < 1:
        raise PolicyError(f"--min-count {min_count}: expected 1 or more")
    from .placement import ALIGNS, PLACEMENTS
    if placement not in PLACEMENTS:
        raise PolicyError(f"--placement {placement!r}: expected one of {', '.join(PLACEMENTS)}")
    if align not in ALIGNS:
        raise PolicyError(f"--align {align}: expected 16 (glibc's guarantee) or 8")
    if kind == "table" and (int8 or prune):
        raise PolicyError("--int8 and --prune apply to --kind rnn (a table has no weights)")
    model_path = Path(model_path)
    model = load_model(model_path)
    spec = {"kind": kind, "task": model.task, "vocab": model.vocab,
            "vocab_version": model.meta.get("vocab_version"),
            "model": {"path": str(model_path), "sha256": file_digest(model_path), "kind": model.kind,
                      "config": model.config, "target": model.target},
            "training": model.meta.get("training", {}),
            "outputs": {"labels": int(model.n_labels), "topk": TOPK,
                        "what": f"{model.task} labels of vocabulary {model.vocab} "
                                f"(docs/vocabularies.md)"}}
    if model.task == "free":
        spec["outputs"]["free_group"] = model.free_group
        if model.free_codes is not None:   # label i names the code free_codes[i]
            spec["outputs"]["free_codes"] = [int(c) for c in model.free_codes]
    if model.target != "true":
        raise PolicyError(f"{model_path}: a model trained on the article's buggy target cannot "
                          f"be compiled (its outputs are not the task's labels)")
    if kind == "rnn":
        tensors = _rnn_tensors(model, model_path, int8, prune, spec)
    else:
        tensors, distilled = _table_tensors(model, model_path, data, ctx, max_rows, spec,
                                            min_count)
        if model.task == "lifetime":
            # the allocator's placement, judged by the lab on the classes this very table
            # predicts (run by the native runtime from a provisional file, never left at `output`)
            import tempfile
            from .placement import lab_placement
            with tempfile.TemporaryDirectory(prefix="heapcast-compile-") as tmp:
                provisional = Path(tmp) / "table.policy"
                write_policy(provisional, tensors, spec, align="tab.slots")
                spec["placement"] = lab_placement(provisional, spec["table"]["distilled_from"],
                                                  distilled, placement, align)
            tensors["alloc.lifetime_groups"] = np.array(
                [int(spec["placement"]["lifetime_groups"])], np.int32)
    # a table's slots start on a cache line of the file: the runtime probes them in place
    write_policy(output, tensors, spec, align="tab.slots" if kind == "table" else None)
    spec["output"] = str(output)
    spec["bytes"] = Path(output).stat().st_size
    return spec


# ---- rnn ------------------------------------------------------------------------------------

def _rnn_tensors(model, path, int8: bool, prune: float, spec: dict) -> dict:
    if model.kind != "gru":
        raise PolicyError(f"{path}: a {model.kind!r} model; --kind rnn compiles the default GRU "
                          f"(`heapcast train` without --model); use --kind table for any model")
    c = model.config
    if c.get("layers", 1) != 1:
        raise PolicyError(f"{path}: config layers={c['layers']}: --kind rnn compiles one GRU layer")
    sd = {k: v.detach().cpu().numpy().astype(np.float64) for k, v in model.net.state_dict().items()}
    H = int(c["hidden"])
    w_ih, b_ih = sd["rnn.weight_ih_l0"], sd["rnn.bias_ih_l0"]
    w_hh, b_hh = sd["rnn.weight_hh_l0"], sd["rnn.bias_hh_l0"]
    n_out = len(model.classes)
    caches = model._cache_orders()
    hints = bool(c["ngram_hints"]) and model.ngram is not None
    # The input columns of W_ih, in the order StreamNet.forward concatenates its embeddings.
    col = 0

    def project(emb: np.ndarray) -> np.ndarray:
        nonlocal col
        w = w_ih[:, col:col + emb.shape[1]]
        col += emb.shape[1]
        return emb @ w.T

    t = {}
    t["p.tok"] = project(sd["tok.weight"]) + b_ih
    site_buckets = c["site_buckets"] if c["site_embed"] else 0
    if site_buckets:
        t["p.site"] = project(sd["site.weight"])
    if c["dt_embed"]:
        t["p.dt"] = project(sd["dt.weight"])
    if hints:       # hint1 and hint2 read the same embedding through consecutive columns
        e = sd["hint.weight"].shape[1]
        t["p.hint1"] = sd["hint.weight"] @ w_ih[:, col:col + e].T
        t["p.hint2"] = sd["hint.weight"] @ w_ih[:, col + e:col + 2 * e].T
        col += 2 * e
        t["p.conf"] = project(sd["conf.weight"])
        t["boost"] = sd["boost.weight"]
    if caches:
        e = sd["cache.0.weight"].shape[1]
        for i in range(len(caches)):       # the orders' embeddings are summed: same columns
            t[f"p.cache{i}"] = sd[f"cache.{i}.weight"] @ w_ih[:, col:col + e].T
        col += e
        t["cache_boost"] = sd["cache_boost"]
    if col != w_ih.shape[1]:
        raise PolicyError(f"{path}: the network reads {w_ih.shape[1]} input columns, the compiler "
                          f"accounted for {col}: a model of another layout")
    t = {k: v.astype(np.float32) for k, v in t.items()}
    if caches:
        t["cache_orders"] = np.array(caches, np.int32)
    head_w, head_b = sd["head.weight"], sd["head.bias"]
    # Pruning drops whole hidden units: the least used, by the weight they carry out.
    kept = np.arange(H, dtype=np.int32)
    if prune:
        score = (w_hh ** 2).sum(0) + (head_w ** 2).sum(0)
        drop = int(round(prune * H))
        kept = np.sort(np.argsort(score, kind="stable")[drop:]).astype(np.int32)
    t["kept"] = kept
    t["b.hh"] = b_hh.astype(np.float32)
    t["b.head"] = head_b.astype(np.float32)
    if int8:
        for name, w in (("hh", w_hh.T), ("head", head_w.T)):       # [H, outputs]
            w = w[kept]
            scale = np.abs(w).max(0) / 127.0
            scale[scale == 0] = 1.0
            q = np.clip(np.rint(w / scale), -127, 127).astype(np.int8)
            if len(q) % 2:
                q = np.concatenate([q, np.zeros((1, q.shape[1]), np.int8)])
            # by pairs of kept units, interleaved per output: [pairs, outputs * 2]
            t[f"q.{name}"] = np.ascontiguousarray(
                q.reshape(-1, 2, q.shape[1]).transpose(0, 2, 1)).reshape(len(q) // 2, -1)
            t[f"q.{name}_scale"] = scale.astype(np.float32)
    else:
        t["w.hh_t"] = np.ascontiguousarray(w_hh.T).astype(np.float32)
        t["w.head_t"] = np.ascontiguousarray(head_w.T).astype(np.float32)
    vocab_size = 64 if model.vocab == "seed64" else 1002
    toks = np.arange(vocab_size)
    i = np.minimum(np.searchsorted(model.input_tokens, toks), len(model.input_tokens) - 1)
    t["tok_map"] = np.where(model.input_tokens[i] == toks, i + 2, 1).astype(np.int32)
    t["classes"] = model.classes.astype(np.int64)
    col_of = np.full(model.n_labels, -1, np.int32)
    col_of[model.classes] = np.arange(n_out, dtype=np.int32)
    t["class_of_label"] = col_of
    ng = _ngram_tensors(model, t) if hints else {}
    shift = model.task != "lifetime"
    t["cfg"] = cfg_array(abi=ABI, kind=KINDS["rnn"], task=TASK_IDS[model.task],
                         vocab=VOCAB_IDS[model.vocab], n_labels=model.n_labels, shift=shift,
                         hidden=H, n_out=n_out, n_in_tokens=len(model.input_tokens) + 2,
                         site_buckets=site_buckets, n_dt=64 if c["dt_embed"] else 0,
                         hints=hints, n_cache=len(caches), int8=int8, **ng)
    spec["inputs"] = {"token": "the event's token (previous event for next/free)",
                      "site": f"call-site key hashed into {site_buckets} buckets",
                      "dt": "bit_length of ns since the previous event",
                      "ngram_hints": hints, "memory_orders": caches}
    spec["rnn"] = {"cell": "gru", "hidden": H, "kept_units": int(len(kept)), "int8": int8,
                   "prune": prune}
    return t


def _ngram_tensors(model, t: dict) -> dict:
    """The hint n-gram's tables with their indexes (into `t`); returns its cfg settings."""
    ng = model.ngram
    orders = sorted(int(m) for m in ng.tables)
    t["ng.orders"] = np.array(orders, np.int32)
    for m in orders:
        tab = ng.tables[m]
        E = len(tab["ctx"])
        t[f"ng{m}.ctx"] = tab["ctx"].astype(np.uint64, copy=False)   # (the model's own arrays)
        t[f"ng{m}.n"] = tab["n"].astype(np.uint32, copy=False)
        t[f"ng{m}.d"] = tab["d"].astype(np.uint32, copy=False)
        t[f"ng{m}.tok"], t[f"ng{m}.cnt"] = ng.dense_table(m)   # (uint16 or uint32 labels)
        bits = max(4, (2 * E).bit_length())
        t[f"ng{m}.slots"] = index_build(t[f"ng{m}.ctx"], bits)
    labels = ng.classes
    i = np.minimum(np.searchsorted(model.classes, labels), len(model.classes) - 1)
    t["ng.to_hint"] = np.where(model.classes[i] == labels, i + 1, 0).astype(np.int32)
    base = ng.unigram / max(ng.unigram.sum(), 1)
    t["ng.base"] = base.astype(np.float64)
    t["ng.base_order"] = np.lexsort((np.arange(len(base)), -base)).astype(np.int32)
    return {"ng_orders": len(orders), "ng_sites": ng._use_sites(), "ng_dt": bool(ng.config["dt"]),
            "ng_topk": int(ng.config["topk"]) if orders else 1,
            "ng_classes": len(labels)}


# ---- table ----------------------------------------------------------------------------------

def table_key(level: int, site: np.ndarray, token: np.ndarray, ctx) -> np.ndarray:
    """The table's key of each row at `level` (0 token, 1 site, 2 site+token, CTX_LEVEL + K a
    context of K tokens whose rolling hash is `ctx`, see context_hashes), as native/policy/table.c
    hc_table_key computes it: one odd multiplication of (level, site, token, context), a
    bijection, so distinct inputs never share a key."""
    x = (site.astype(np.uint64) << np.uint64(16)) ^ token.astype(np.uint64)
    if level >= CTX_LEVEL:
        x = x ^ (np.asarray(ctx, np.uint64) * _CTX_MUL)
    k = (x ^ (np.uint64(level) << np.uint64(56))) * _KEY_MUL
    k[k == 0] = 1
    return k


def context_hashes(tokens: np.ndarray, pos: np.ndarray, lengths, rows=None) -> dict:
    """{k: the rolling hash of the k tokens before each of `rows` (all by default; newest first,
    padding before a stream's start), as native/policy/table.c hc_table_ctx_push keeps it for a
    stream} for every k of `lengths`, in one pass: the hash of the k newest tokens is a step of
    the hash of more. Computed at `rows` only (a distilled table's 2M rows of a 13.6M-event
    trace: three contexts 9.6 s -> under 1 s)."""
    rows = np.arange(len(tokens)) if rows is None else np.asarray(rows, np.int64)
    tok = tokens.astype(np.uint64)
    at = pos[rows]
    h = np.zeros(len(rows), np.uint64)
    out = {}
    for i in range(1, max(lengths, default=0) + 1):
        t = tok[np.where(at >= i, rows - i, 0)]
        t[at < i] = np.uint64(_PAD_TOKEN)
        h = h * _P + t + np.uint64(1)
        if i in lengths:
            out[i] = h.copy()
    return out


def table_inputs(data) -> tuple:
    """(site, token) of every row's table key: of the row itself for lifetime, of the row before
    it for next and free (nothing before a stream's start)."""
    pos = data.position_in_stream()
    site, tok = data.sites.astype(np.uint32), data.tokens.astype(np.uint32)
    if data.shift:
        prev = np.arange(len(data)) - 1
        first = pos == 0
        site = np.where(first, 0, site[np.maximum(prev, 0)]).astype(np.uint32)
        tok = np.where(first, _PAD_TOKEN, tok[np.maximum(prev, 0)]).astype(np.uint32)
    return site, tok


def _votes(keys: np.ndarray, labels: np.ndarray):
    """Per distinct key: its top labels by vote (best first, -1 padding) and the top share."""
    order = np.lexsort((labels, keys))
    k, lab = keys[order], labels[order]
    pair_start = np.ones(len(k), bool)
    pair_start[1:] = (k[1:] != k[:-1]) | (lab[1:] != lab[:-1])
    ps = np.flatnonzero(pair_start)
    pk, pl = k[ps], lab[ps]
    pc = np.diff(np.append(ps, len(k)))
    # per key: pairs sorted by count desc, label asc
    o = np.lexsort((pl, -pc, pk))
    pk, pl, pc = pk[o], pl[o], pc[o]
    key_start = np.ones(len(pk), bool)
    key_start[1:] = pk[1:] != pk[:-1]
    ks = np.flatnonzero(key_start)
    rank = np.arange(len(pk)) - np.repeat(ks, np.diff(np.append(ks, len(pk))))
    keys_u = pk[ks]
    top = np.full((len(ks), TOPK), -1, np.int16)
    sel = rank < TOPK
    top[np.cumsum(key_start)[sel] - 1, rank[sel]] = pl[sel]
    total = np.add.reduceat(pc, ks)
    conf = (pc[ks] / total).astype(np.float32)
    return keys_u, top, conf, total


def _table_tensors(model, path, data, ctx, max_rows: int, spec: dict, min_count: int) -> tuple:
    """(the table's tensors, the TaskData it was distilled from, in process order for a lifetime
    model as the allocator lab reads it)."""
    from ..forecast.dataset import load_features, load_task_for
    from ..forecast.tasks import DEFAULT_ORDER, make_task
    from ..forecast.train import spread_rows
    lens = sorted({int(k) for k in ([ctx] if isinstance(ctx, int) else ctx) if int(k)},
                  reverse=True)
    if any(not 1 <= k <= 32 for k in lens) or len(lens) > 8:
        raise PolicyError(f"--ctx {','.join(map(str, lens))}: expected up to 8 context lengths "
                          f"of 1..32 tokens")
    training = model.meta.get("training", {})
    if not data:
        data = [t.get("path") for t in training.get("traces", [])]
        missing = [d for d in data if not d or not Path(d).exists()]
        if not data or missing:
            raise PolicyError(f"{path}: --kind table distils the model's predictions on traces; "
                              f"its training traces ({', '.join(map(str, missing)) or 'none'}) "
                              f"are not here: give some with --data TRACE...")
    order = training.get("order", DEFAULT_ORDER[model.task])
    feats, td = load_task_for(data, order, model)
    rows = np.flatnonzero(td.labels >= 0)
    if max_rows and len(rows) > max_rows:
        rows = np.flatnonzero(spread_rows(td.labels >= 0, max_rows) & (td.labels >= 0))
    if not len(rows):
        raise PolicyError(f"{path}: the traces given have no rows of task {model.task!r} to "
                          f"distil the table from")
    pred = model.predict(td, rows, k=1)[:, 0]
    ok = pred >= 0
    rows, pred = rows[ok], pred[ok]
    site, tok = table_inputs(td)
    site, tok = site[rows], tok[rows]
    zero = np.zeros(len(rows), np.uint64)
    # (level, keys of the rows): longest context first, then (site, token), site, token
    ctx = context_hashes(td.tokens, td.position_in_stream(), tuple(lens), rows)
    chain = [(CTX_LEVEL + k, table_key(CTX_LEVEL + k, site, tok, ctx[k])) for k in lens]
    chain += [(2, table_key(2, site, tok, zero)), (1, table_key(1, site, tok * 0, zero)),
              (0, table_key(0, site * 0, tok, zero))]
    answers = [_votes(keys, pred) for _, keys in chain]
    nctx = len(lens)
    st_keys = answers[nctx][0]
    st_flags = np.zeros(len(st_keys), np.uint64)
    entries = []
    for i, (level, keys) in enumerate(chain):
        ku, top, conf, seen = answers[i]
        flags = np.zeros(len(ku), np.uint64)
        if level >= CTX_LEVEL:
            # a context whose top label is its parent's changes nothing, and one seen fewer than
            # min_count times may be an anecdote: both are left out (the lookup backs off, as an
            # n-gram's); min_count > 1 trades a little accuracy for a smaller, faster table
            first_row = np.unique(keys, return_index=True)[1]
            pku, ptop = answers[i + 1][:2]
            keep = (seen >= min_count) & \
                (ptop[np.searchsorted(pku, chain[i + 1][1][first_row]), 0] != top[:, 0])
            # the (site, token) slot says which context lengths hold entries under it
            under = np.searchsorted(st_keys, chain[nctx][1][first_row[keep]])
            st_flags[under] |= np.uint64(1 << i)
        else:
            keep = np.ones(len(ku), bool)
        entries.append([level, ku[keep], top[keep], conf[keep], flags[keep]])
    entries[nctx][4] = st_flags
    # a context length that kept no entry would only cost every event of a stream a rolling hash
    # (the runtime moves one per length): dropped, and the (site, token) flags renumbered
    used = [i for i in range(nctx) if len(entries[i][1])]
    dropped = [lens[i] for i in range(nctx) if i not in used]
    if dropped:
        renumbered = np.zeros_like(st_flags)
        for new, old_bit in enumerate(used):
            renumbered |= ((st_flags >> np.uint64(old_bit)) & np.uint64(1)) << np.uint64(new)
        entries[nctx][4] = renumbered
        entries = [entries[i] for i in used] + entries[nctx:]
        lens = [lens[i] for i in used]
        nctx = len(lens)
    keys = np.concatenate([e[1] for e in entries])
    labels = np.concatenate([e[2] for e in entries])
    conf = np.concatenate([e[3] for e in entries])
    flags = np.concatenate([e[4] for e in entries])
    keys, first = np.unique(keys, return_index=True)     # a cross-level collision keeps one
    labels, conf, flags = labels[first], conf[first], flags[first]
    bits = max(4, (2 * len(keys)).bit_length())
    slots = index_build(keys, bits)
    filled = slots > 0
    # one 16-byte slot per key: key; index of its top-k list (distinct lists stored once) with
    # the context flags in the high byte; confidence (docs/policy-format.md)
    lists, list_of = np.unique(labels, axis=0, return_inverse=True)
    if len(lists) >= 1 << 24:
        raise PolicyError(f"{path}: {len(lists):,} distinct top-{TOPK} lists; a table holds at "
                          f"most {1 << 24:,}")
    tab_slots = np.zeros((1 << bits, 2), np.uint64)
    # a one-hash Bloom filter of the context keys, 16 bits per key (about 6% false positives):
    # a lookup probes a context slot only when the filter says it may be there
    ctx_keys = np.concatenate([e[1] for e in entries[:nctx]] or [np.zeros(0, np.uint64)])
    fbits = max(6, int(16 * len(ctx_keys)).bit_length())
    filt = np.zeros(1 << (fbits - 6), np.uint64)
    pos = ctx_keys >> np.uint64(64 - fbits)     # a key's high bits (keys are multiplicative hashes)
    np.bitwise_or.at(filt, (pos >> np.uint64(6)).astype(np.int64),
                     np.uint64(1) << (pos & np.uint64(63)))
    e = slots[filled] - 1
    tab_slots[filled, 0] = keys[e]
    tab_slots[filled, 1] = list_of.reshape(-1)[e].astype(np.uint64) | \
        (flags[e] << np.uint64(24)) | (conf[e].view(np.uint32).astype(np.uint64) << np.uint64(32))
    _, default, dconf, _ = _votes(np.zeros(len(pred), np.uint64), pred)
    if not len(lists):
        lists = np.full((1, TOPK), -1, np.int16)
    t = {"tab.slots": tab_slots, "tab.lists": lists.astype(np.int16), "tab.ctx_filter": filt,
         "tab.default": default[0], "tab.default_conf": dconf[:1],
         "cfg": cfg_array(abi=ABI, kind=KINDS["table"], task=TASK_IDS[model.task],
                          vocab=VOCAB_IDS[model.vocab], n_labels=model.n_labels,
                          shift=model.task != "lifetime", tab_ctx=len(lens), tab_bits=bits)}
    if lens:
        t["tab.ctx_lens"] = np.array(lens, np.int32)
    # which key levels hold entries (the runtime probes only those): bit 1 token, 2 site,
    # 3 site+token, 4.. the contexts, longest highest (docs/policy-format.md)
    bit = {0: 1, 1: 2, 2: 3, **{CTX_LEVEL + k: 3 + len(lens) - i for i, k in enumerate(lens)}}
    t["tab.level_mask"] = np.array([sum(1 << bit[lv] for lv, ku, *_ in entries if len(ku))],
                                   np.int32)
    spec["inputs"] = {"site": "call-site key", "token": "the event's token (previous event for "
                      "next/free)", "context_tokens": lens}
    names = {2: "site+token", 1: "site", 0: "token"}
    spec["table"] = {"entries": int(len(keys)), "slots": 1 << bits, "context": lens,
                     "context_without_entries": dropped,
                     "distilled_rows": int(len(rows)), "distilled_from": [str(d) for d in data],
                     "per_level": {names.get(lv, f"context {lv - CTX_LEVEL}"): int(len(e[1]))
                                   for lv, *e in entries}}
    if model.task == "lifetime" and order != "process":
        td = make_task(load_features(list(data), "process"), model.task, model.vocab)
    return t, td
