"""ONNX export of the default model's network step (heapcast.policy.onnx_export): on a real
recording, onnxruntime stepping through the exported graph predicts what the torch model predicts;
models that cannot be exported are refused with the file's name."""
import json

import numpy as np
import pytest

import heapcast
from heapcast.forecast.dataset import load_features
from heapcast.forecast.modelfile import ModelError
from heapcast.forecast.models import load_model
from heapcast.forecast.tasks import make_task
from heapcast.forecast.train import train

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from heapcast.policy.onnx_export import (OnnxStepper, export_onnx, onnx_metadata,  # noqa: E402
                                         run_onnx)

TINY = {"hidden": 24, "batch": 16, "threads": 1, "embed": 16, "site_embed": 8,
        "site_buckets": 256, "hint_embed": 8, "warmup": 32}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, build):
    """Two recordings of programs/forecast_work.c with different inputs (train on a, test b)."""
    d = tmp_path_factory.mktemp("onnx")
    exe = build("forecast_work")
    for name, n, seed in (("a", 1500, 1), ("b", 1000, 2)):
        r = heapcast.record([exe, str(n), str(seed)], output=d / name, progress=False)
        assert r.exit_code == 0
    return d


@pytest.fixture(scope="module")
def models(runs):
    """A small default GRU and an LSTM for `next`, and a GRU for `lifetime`, trained on run a."""
    out = {}
    for name, model, task in (("gru", "gru", "next"), ("lstm", "lstm", "next"),
                              ("life", "gru", "lifetime")):
        out[name] = runs / f"{name}.safetensors"
        train([runs / "a"], out[name], model=model, task=task, config=TINY)
    return out


def sequential_predict(model_path, trace, k=5):
    """The torch model's own predict() on every labelled row of `trace`, run as one sequential
    stream from a zero state (one segment, no warm-up): the way a policy sees the events."""
    model = load_model(model_path)
    data = make_task(load_features([trace], model.meta["training"]["order"],
                                   need_ranks=model.task == "free"), model.task, model.vocab)
    rows = np.flatnonzero(data.labels >= 0)
    model.config.update(batch=1, warmup=0)
    return model, data, rows, model.predict(data, rows, k)


@pytest.mark.parametrize("name", ["gru", "lstm", "life"])
def test_onnxruntime_predicts_what_torch_predicts(runs, models, tmp_path, name):
    out = export_onnx(models[name], tmp_path / f"{name}.onnx")
    assert out == tmp_path / f"{name}.onnx" and not (tmp_path / f"{name}.onnx.tmp").exists()
    model, data, rows, want = sequential_predict(models[name], runs / "b")
    assert len(rows) > 2000
    got = run_onnx(out, model._inputs(data), rows, k=5)
    assert got.shape == want.shape
    assert (got[:, 0] == want[:, 0]).all()          # the same top-1 on every row
    assert (got == want).mean() > 0.999             # top-5 too, but for float near-ties
    # It predicts something real (not a constant), as well as the torch model does.
    assert len(np.unique(got[:, 0])) >= 3
    assert (got[:, 0] == data.labels[rows]).mean() > 0.5


def test_the_graph_and_its_metadata(models, tmp_path):
    path = export_onnx(models["gru"], tmp_path / "step.onnx")
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto)
    model = load_model(models["gru"])
    meta = onnx_metadata(path)
    assert meta["task"] == "next" and meta["vocab"] == "rich" and meta["model"] == "gru"
    assert meta["classes"] == model.classes.tolist()
    assert meta["input_tokens"] == model.input_tokens.tolist()
    assert meta["config"] == json.loads(json.dumps(model.config))
    import hashlib
    assert meta["model_sha256"] == hashlib.sha256(models["gru"].read_bytes()).hexdigest()
    # Inputs: the ids the network reads, then the state; outputs: logits and the new state.
    names = [i.name for i in proto.graph.input]
    assert names == ["tok", "site", "dt", "hint1", "hint2", "conf", "cache0", "cache1", "cache2",
                     "h"] == meta["inputs"] + ["h"]
    assert [o.name for o in proto.graph.output] == ["logits", "h_out"]
    # Any batch: three streams in one call give each stream's own step.
    stepper = OnnxStepper(path)
    sess = stepper.session
    rng = np.random.default_rng(1)
    feed = {n: rng.integers(0, 3, 3).astype(np.int64) for n in meta["inputs"]}
    feed["h"] = rng.standard_normal((1, 3, TINY["hidden"])).astype(np.float32)
    logits, h = sess.run(None, feed)
    assert logits.shape == (3, len(model.classes)) and h.shape == (1, 3, TINY["hidden"])
    one, _ = sess.run(None, {**{n: v[1:2] for n, v in feed.items() if n != "h"},
                             "h": feed["h"][:, 1:2]})
    assert np.allclose(one[0], logits[1], atol=1e-5)
    # Too few id arrays for what the step reads: a clear error naming the file.
    with pytest.raises(ValueError, match=r"step\.onnx: the ONNX step reads tok, site, dt, "):
        run_onnx(path, [np.zeros(5, np.int64)] * 6)


def test_models_that_cannot_be_exported(runs, models, tmp_path):
    ngram = tmp_path / "ngram.safetensors"
    train([runs / "a"], ngram, model="ngram")
    with pytest.raises(ModelError, match=r"ngram\.safetensors: a 'ngram' model; ONNX export"):
        export_onnx(ngram, tmp_path / "x.onnx")
    # The kind is read from the metadata: a Transformer (or seed) is refused before loading.
    from heapcast.forecast.modelfile import save_model_file
    for kind in ("transformer", "seed"):
        other = save_model_file(tmp_path / f"{kind}.safetensors", {"x": np.zeros(2)},
                                {"model": kind, "task": "next", "vocab": "rich"})
        with pytest.raises(ModelError, match=rf"{kind}\.safetensors: a '{kind}' model"):
            export_onnx(other, tmp_path / "x.onnx")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(models["gru"].read_bytes()[:-9])
    with pytest.raises(ModelError, match=r"bad\.safetensors: .*truncated"):
        export_onnx(bad, tmp_path / "x.onnx")
    not_model = tmp_path / "text.safetensors"
    not_model.write_text("hello, this is not a model at all")
    with pytest.raises(ModelError, match="text.safetensors"):
        export_onnx(not_model, tmp_path / "x.onnx")
    with pytest.raises(FileNotFoundError):
        export_onnx(tmp_path / "missing.safetensors", tmp_path / "x.onnx")
    assert not (tmp_path / "x.onnx").exists()
    # An ONNX file that heapcast did not export is refused by the runner, by name.
    plain = tmp_path / "plain.onnx"
    proto = onnx.load(str(export_onnx(models["gru"], tmp_path / "ok.onnx")))
    del proto.metadata_props[:]
    onnx.save(proto, str(plain))
    with pytest.raises(ModelError, match=r"plain\.onnx: metadata format is None"):
        onnx_metadata(plain)
    (tmp_path / "junk.onnx").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(ModelError, match=r"junk\.onnx: not a readable ONNX model"):
        onnx_metadata(tmp_path / "junk.onnx")
