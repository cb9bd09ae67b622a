"""ONNX export of the default forecaster's network step, and a step-by-step runner in onnxruntime.

`export_onnx(MODEL, OUT)` writes ONE recurrent step of a GRU or LSTM model
(heapcast.forecast.models.rnn.StreamNet) as an ONNX graph, so that any ONNX runtime can run the
network the way a policy does: one event in, a prediction out, the recurrent state carried by the
caller. The graph's inputs are the per-step ids the network reads, each int64 of shape [batch]
(the ids RNNModel._inputs builds for a row):

    tok      input token id (0 stream start, 1 unknown, 2 + index into `input_tokens`)
    site     call-site bucket (only if the model embeds call sites)
    dt       time-delta bucket (only if the model embeds time deltas)
    hint1, hint2, conf   the n-gram's two best labels (class id + 1, 0 none) and its confidence
             bucket (only with n-gram hints)
    cache0 .. cacheN-1   the in-run memory's label per cache order (class id + 1, 0 none)

then the recurrent state `h` (and `c` for an LSTM), float32 [layers, batch, hidden], zeros at the
start of a stream. Outputs: `logits` float32 [batch, classes] over the model's label classes, and
the new state `h_out` (and `c_out`). The n-gram that computes the hints and the in-run memory are
not part of the graph (they are lookups, not a network): the caller provides their ids.

The model's description is in the ONNX model's metadata_props (all values strings, JSON where
structured): format, task, vocab, model kind, classes (label of each output), input_tokens,
config, conf_bounds, inputs, state, and model_sha256 (of the model file's bytes).

The export uses PyTorch's TorchScript-based exporter (`dynamo=False`: a fixed, small graph of
standard ops, opset ONNX_OPSET, no onnxscript needed) and checks the result: the ONNX checker,
then one step in onnxruntime against the torch network on sample inputs.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from ..forecast.modelfile import ModelError

FORMAT = "heapcast-onnx-step"
FORMAT_VERSION = 1
#: ScatterElements with reduction="add" (the hint boosts) needs opset 16 or later.
ONNX_OPSET = 17
#: The per-step inputs in RNNModel._inputs' order (then one "cacheI" per cache order).
STEP_INPUTS = ("tok", "site", "dt", "hint1", "hint2", "conf")
EXPORTABLE = ("gru", "lstm")


def _need(module: str, extra: str = "ml"):
    import importlib
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name == module.split(".")[0]:
            raise ModelError(f"ONNX export needs the {module.split('.')[0]!r} package: "
                             f"pip install 'heapcast[{extra}]'") from None
        raise


def _load_exportable(model_path: Path):
    """The model at `model_path` if it is a GRU/LSTM stream model; ModelError otherwise."""
    from ..forecast.models import load_model
    from ..forecast.modelfile import read_model_file
    # The kind first, from the metadata alone: a model that cannot be exported is refused with
    # what it is, even where torch is not installed.
    _, meta = read_model_file(model_path)
    kind = meta.get("model")
    if meta.get("checkpoint"):
        raise ModelError(f"{model_path}: a training checkpoint, not a model: export the model "
                         f"file that `heapcast train` wrote")
    if kind not in EXPORTABLE:
        raise ModelError(f"{model_path}: a {kind!r} model; ONNX export exports the recurrent "
                         f"network of a {' or '.join(EXPORTABLE)} model (the default model) only")
    model = load_model(model_path)
    if model.cell not in EXPORTABLE:
        raise ModelError(f"{model_path}: network cell {model.cell!r} cannot be exported")
    return model


def step_input_names(net) -> list:
    """Names of the per-step id inputs that network `net` (a StreamNet) reads, in graph order."""
    names = ["tok"]
    if net.site is not None:
        names.append("site")
    if net.dt is not None:
        names.append("dt")
    if net.hint is not None:
        names += ["hint1", "hint2", "conf"]
    names += [f"cache{i}" for i in range(net.caches)]
    return names


def _step_module(net, lstm: bool):
    """A torch module running one step of `net` on [batch] ids and the state tensors."""
    import torch

    slots = step_input_names(net)
    everything = [*STEP_INPUTS, *(f"cache{i}" for i in range(net.caches))]

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, *xs):
            ids = dict(zip(slots, xs))
            state = xs[len(slots):]
            zero = torch.zeros_like(xs[0])
            # Ids the network does not read are zeros (its forward still takes them).
            full = [ids.get(name, zero).unsqueeze(0) for name in everything]
            logits, new = self.net(*full, state=(state[0], state[1]) if lstm else state[0])
            news = new if lstm else (new,)
            return (logits[0], *news)

    return Step().eval(), slots


def _sample_inputs(net, slots: list, hidden: int, layers: int, lstm: bool, batch: int = 3):
    """Deterministic sample inputs in each input's range (for tracing and the export check)."""
    import torch
    rng = np.random.default_rng(0)
    ranges = {"tok": net.tok.num_embeddings}
    if net.site is not None:
        ranges["site"] = net.site.num_embeddings
    if net.dt is not None:
        ranges["dt"] = net.dt.num_embeddings
    if net.hint is not None:
        ranges.update(hint1=net.hint.num_embeddings, hint2=net.hint.num_embeddings,
                      conf=net.conf.num_embeddings)
    for i in range(net.caches):
        ranges[f"cache{i}"] = net.cache[i].num_embeddings
    ids = [torch.from_numpy(rng.integers(0, ranges[s], batch).astype(np.int64)) for s in slots]
    states = [torch.from_numpy(rng.standard_normal((layers, batch, hidden)).astype(np.float32)
                               * 0.5) for _ in range(2 if lstm else 1)]
    return ids, states


def export_onnx(model_path, out_path) -> Path:
    """Exports one step of the GRU/LSTM network of the model file at `model_path` to the ONNX
    file `out_path` (written atomically) and returns its path.

    Raises ModelError naming the file for a model that cannot be exported (n-gram, seed,
    Transformer, a checkpoint, a damaged file) or when torch/onnx are not installed."""
    model_path, out_path = Path(model_path), Path(out_path)
    model = _load_exportable(model_path)
    torch = _need("torch")
    onnx = _need("onnx", "onnx")
    net = model.net.eval()
    lstm = model.cell == "lstm"
    cfg = model.config
    step, slots = _step_module(net, lstm)
    ids, states = _sample_inputs(net, slots, cfg["hidden"], cfg["layers"], lstm)
    state_names = ["h", "c"] if lstm else ["h"]
    outputs = ["logits", *(f"{s}_out" for s in state_names)]
    axes = {name: {0: "batch"} for name in slots}
    axes.update({name: {1: "batch"} for name in state_names + outputs[1:]})
    axes["logits"] = {0: "batch"}
    tmp = out_path.with_name(out_path.name + ".tmp")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    import warnings
    with warnings.catch_warnings():
        # The TorchScript exporter warns that it is deprecated and about RNNs with a batch size
        # other than 1; the batch axis is dynamic and checked below.
        warnings.simplefilter("ignore")
        with torch.no_grad():
            torch.onnx.export(step, tuple(ids + states), str(tmp), input_names=slots + state_names,
                              output_names=outputs, dynamic_axes=axes, opset_version=ONNX_OPSET,
                              dynamo=False, do_constant_folding=True)
    try:
        proto = onnx.load(str(tmp))
        proto.producer_name = "heapcast"
        proto.doc_string = (f"One step of heapcast's {model.cell.upper()} forecaster for task "
                            f"{model.task!r} ({model_path.name}); see metadata_props.")
        meta = _metadata(model, model_path, slots, state_names)
        del proto.metadata_props[:]
        for key, value in meta.items():
            proto.metadata_props.add(key=key, value=value)
        onnx.checker.check_model(proto)
        onnx.save(proto, str(tmp))
        _check_against_torch(tmp, step, ids, states, model_path)
        os.replace(tmp, out_path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return out_path


def _metadata(model, model_path: Path, slots: list, state_names: list) -> dict:
    from ..forecast.models.rnn import CONF_BOUNDS
    from ..forecast.vocab import get_vocab
    cfg = model.config
    return {
        "format": FORMAT, "format_version": str(FORMAT_VERSION),
        "task": model.task, "vocab": model.vocab, "vocab_version": str(get_vocab(model.vocab).version),
        "model": model.kind, "target": model.target,
        "classes": json.dumps([int(c) for c in model.classes]),
        "input_tokens": json.dumps([int(t) for t in model.input_tokens]),
        "config": json.dumps(cfg, sort_keys=True),
        "conf_bounds": json.dumps([float(b) for b in CONF_BOUNDS]),
        "cache_orders": json.dumps(model._cache_orders()),
        "inputs": json.dumps(slots),
        "state": json.dumps({"names": state_names, "shape": [cfg["layers"], "batch",
                                                             cfg["hidden"]]}),
        "model_sha256": hashlib.sha256(model_path.read_bytes()).hexdigest(),
    }


def _check_against_torch(path: Path, step, ids: list, states: list, model_path: Path) -> None:
    """One batched step in onnxruntime must give torch's logits and state (float tolerance)."""
    import torch
    ort = _need("onnxruntime", "onnx")
    sess = _session(ort, path)
    names = [i.name for i in sess.get_inputs()]
    got = sess.run(None, dict(zip(names, [t.numpy() for t in ids + states])))
    with torch.no_grad():
        want = [t.numpy() for t in step(*ids, *states)]
    for g, w, name in zip(got, want, [o.name for o in sess.get_outputs()]):
        if g.shape != w.shape or not np.allclose(g, w, rtol=1e-4, atol=1e-4):
            raise RuntimeError(f"{model_path}: the exported ONNX step disagrees with the torch "
                               f"network on output {name!r} (max difference "
                               f"{np.abs(g - w).max() if g.shape == w.shape else 'shape'})")


def _session(ort, path, threads: int = 1):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def onnx_metadata(path) -> dict:
    """The heapcast metadata of an exported ONNX step (JSON values decoded); ModelError naming the
    file when it is not one."""
    onnx = _need("onnx", "onnx")
    path = Path(path)
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as e:      # onnx raises DecodeError and others for a damaged file
        raise ModelError(f"{path}: not a readable ONNX model ({e})") from None
    props = {p.key: p.value for p in proto.metadata_props}
    if props.get("format") != FORMAT:
        raise ModelError(f"{path}: metadata format is {props.get('format')!r}, expected "
                         f"{FORMAT!r} (an ONNX step exported by heapcast)")
    if props.get("format_version") != str(FORMAT_VERSION):
        raise ModelError(f"{path}: format version {props.get('format_version')!r}; this "
                         f"heapcast reads version {FORMAT_VERSION}")
    out = dict(props)
    for key in ("classes", "input_tokens", "config", "conf_bounds", "cache_orders", "inputs",
                "state"):
        out[key] = json.loads(props[key])
    return out


class OnnxStepper:
    """One stream run through an exported step in onnxruntime (1 intra-op thread by default),
    one event per call from Python, the recurrent state kept between calls."""

    def __init__(self, path, threads: int = 1):
        ort = _need("onnxruntime", "onnx")
        self.meta = onnx_metadata(path)
        self.session = _session(ort, path, threads)
        self.classes = np.asarray(self.meta["classes"], np.int64)
        self.inputs = list(self.meta["inputs"])
        self.state_names = list(self.meta["state"]["names"])
        layers, _, hidden = self.meta["state"]["shape"]
        self._zero = np.zeros((layers, 1, hidden), np.float32)
        self.reset()

    def reset(self) -> None:
        """Back to the start of a stream (zero state)."""
        self.state = [self._zero] * len(self.state_names)

    def step(self, ids: dict) -> np.ndarray:
        """Feeds one step (`ids`: input name -> int64 array of shape [1]); returns its logits
        over the model's classes (float32, [classes])."""
        feed = {name: ids[name] for name in self.inputs}
        feed.update(zip(self.state_names, self.state))
        logits, *self.state = self.session.run(None, feed)
        return logits[0]

    def stream(self, inputs: list, rows=None, k: int = 5) -> np.ndarray:
        """Runs `inputs` (the per-row id arrays RNNModel._inputs builds: tok, site, dt, hint1,
        hint2, conf, then one per cache order) one event per call from a zero state; returns the
        top-k class indices (best first; among equal logits the lower index first) of each row
        in `rows` (all when None), computed at each step as a policy would."""
        from ..forecast.models.base import top_k
        names = [*STEP_INPUTS, *(f"cache{i}" for i in range(len(inputs) - len(STEP_INPUTS)))]
        if len(inputs) < len(STEP_INPUTS) or set(self.inputs) - set(names):
            raise ValueError(f"the ONNX step reads {', '.join(self.inputs)}; got {len(inputs)} "
                             f"input arrays ({', '.join(names[:len(inputs)])})")
        n = len(inputs[0])
        columns = {name: np.ascontiguousarray(a, dtype=np.int64).reshape(n, 1)
                   for name, a in zip(names, inputs) if name in self.inputs}
        rows = np.arange(n) if rows is None else np.asarray(rows, np.int64)
        want = np.zeros(n, bool)
        want[rows] = True
        out = np.full((n, min(k, len(self.classes))), -1, np.int64)
        self.reset()
        for i in range(int(rows.max()) + 1 if len(rows) else 0):
            logits = self.step({name: col[i] for name, col in columns.items()})
            if want[i]:
                out[i] = top_k(logits[None, :], k)[0]
        return out[rows]


def run_onnx(onnx_path, inputs: list, rows=None, k: int = 5, threads: int = 1) -> np.ndarray:
    """Runs a whole stream through the exported step at `onnx_path` in onnxruntime (`threads`
    intra-op threads), one event per call, from a zero state; returns the top-k labels (int64,
    best first, -1 padding) of each row in `rows` (all rows when None), as RNNModel.predict does.

    `inputs` are the per-row id arrays that RNNModel._inputs builds (tok, site, dt, hint1, hint2,
    conf, then one per cache order), all of one length. The state is not reset at stream starts
    inside `inputs` (the token id 0 marks them, as in RNNModel.predict's sequential run)."""
    from ..forecast.models.base import pad_k
    stepper = OnnxStepper(onnx_path, threads)
    try:
        best = stepper.stream(inputs, rows, k)
    except ValueError as e:
        raise ValueError(f"{onnx_path}: {e}") from None
    return pad_k(np.where(best >= 0, stepper.classes[np.maximum(best, 0)], -1), k)
