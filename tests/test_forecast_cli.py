"""`heapcast dataset/train/evaluate` end to end on real recordings made here: a small C program
run twice with different inputs, and a Python one-liner (another program)."""
import json
import sys

import numpy as np
import pytest

import heapcast
from conftest import record_inputs
from heapcast.forecast.cli import main



@pytest.fixture(scope="module")
def runs(tmp_path_factory, build):
    """Traces of programs/forecast_work.c with three inputs, and of a Python one-liner."""
    d = tmp_path_factory.mktemp("forecast")
    exe = build("forecast_work")
    out = record_inputs(exe, d, (("a", 3000, 1), ("b", 2000, 2), ("c", 1500, 3)))
    r = heapcast.record([sys.executable, "-c", "x = [str(i) * 3 for i in range(3000)]"],
                        output=d / "py", env={"PYTHONMALLOC": "malloc"}, progress=False)
    assert r.exit_code == 0
    out["py"] = d / "py"
    out["dir"] = d
    out["program"] = exe.name
    return out


def run_json(capsys, *args):
    capsys.readouterr()
    assert main([str(a) for a in args]) == 0
    return json.loads(capsys.readouterr().out)


def test_dataset_command(runs, tmp_path, capsys):
    assert main(["dataset", str(runs["a"]), str(runs["b"]), "-o", str(tmp_path / "ds"), "-q"]) == 0
    manifest = json.loads((tmp_path / "ds" / "dataset.json").read_text())
    events = heapcast.load(runs["a"]).event_count + heapcast.load(runs["b"]).event_count
    assert manifest["events"] == events
    assert [s["program"] for s in manifest["sources"]] == [runs["program"]] * 2
    seed64 = np.load(tmp_path / "ds" / "seed64.npy", mmap_mode="r")
    assert seed64.dtype == np.uint8 and len(seed64) == events
    assert (tmp_path / "ds" / "events.parquet").stat().st_size > 0
    # A dataset trains like the traces it holds (same stream order as the task's).
    one = tmp_path / "one"
    assert main(["dataset", str(runs["a"]), "-o", str(one), "-q"]) == 0
    for name, src in (("ds.safetensors", one), ("tr.safetensors", runs["a"])):
        assert main(["train", str(src), "-o", str(tmp_path / name), "--model", "ngram", "-q"]) == 0
    assert main(["evaluate", str(tmp_path / "ds.safetensors"), str(runs["b"]), "--protocol",
                 "cross-run", "--json"]) == 0
    from heapcast.forecast.modelfile import read_model_file
    assert read_model_file(tmp_path / "ds.safetensors")[0]["order8.ctx"].tolist() == \
        read_model_file(tmp_path / "tr.safetensors")[0]["order8.ctx"].tolist()


def test_ngram_cross_run_and_guards(runs, tmp_path, capsys):
    model = tmp_path / "ng.safetensors"
    assert main(["train", str(runs["a"]), "-o", str(model), "--model", "ngram", "-q"]) == 0
    r = run_json(capsys, "evaluate", model, runs["b"], "--protocol", "cross-run", "--json")
    for key in ("protocol", "task", "model", "events", "top1", "top5", "top1_article_target",
                "top1_alloc", "per_class"):
        assert key in r
    assert r["protocol"] == "cross-run" and r["model"] == "ngram" and r["task"] == "next"
    assert r["events"] == heapcast.load(runs["b"]).event_count
    assert r["top1"] > 0.8 and r["top5"] >= r["top1"]
    # Scoring a model on what it learned is refused, as is calling another program cross-run.
    assert main(["evaluate", str(model), str(runs["a"]), "--protocol", "cross-run"]) == 2
    assert "never saw" in capsys.readouterr().err
    assert main(["evaluate", str(model), str(runs["py"]), "--protocol", "cross-run"]) == 2
    assert "cross-program" in capsys.readouterr().err
    r = run_json(capsys, "evaluate", model, runs["py"], "--protocol", "cross-program", "--json")
    assert r["protocol"] == "cross-program" and 0 <= r["top1"] <= 1
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(model.read_bytes()[:-7])
    assert main(["evaluate", str(bad), str(runs["b"]), "--protocol", "cross-run"]) == 2
    assert "not a valid safetensors file, or truncated" in capsys.readouterr().err


def test_time_protocol_needs_the_time_split(runs, tmp_path, capsys):
    model = tmp_path / "t.safetensors"
    assert main(["train", str(runs["a"]), "-o", str(model), "--model", "ngram", "--split",
                 "time", "-q"]) == 0
    r = run_json(capsys, "evaluate", model, runs["a"], "--protocol", "time", "--json")
    events = heapcast.load(runs["a"]).event_count
    assert r["trained_on_these_traces"] and 0 < r["events"] < 0.3 * events
    everything = tmp_path / "all.safetensors"
    assert main(["train", str(runs["a"]), "-o", str(everything), "--model", "ngram", "-q"]) == 0
    assert main(["evaluate", str(everything), str(runs["a"]), "--protocol", "time"]) == 2
    assert "--split time" in capsys.readouterr().err


def test_a_refused_protocol_is_refused_before_the_features_are_built(runs, tmp_path, capsys,
                                                                      monkeypatch):
    """The protocol's refusals need only what the recordings' metadata (a dataset's manifest)
    says of them (program, event count), not their features: a model or its compiled policy is
    refused at once."""
    import heapcast.forecast.evaluate as fe
    import heapcast.policy.evaluate as pe
    from heapcast.cli import main as heapcast_main   # (evaluate of a POLICY is registered there)
    everything = tmp_path / "all.safetensors"
    assert main(["train", str(runs["a"]), "-o", str(everything), "--model", "ngram", "-q"]) == 0
    table = tmp_path / "all.policy"
    assert heapcast_main(["compile", str(everything), "--kind", "table", "-o", str(table)]) == 0
    dataset = tmp_path / "a.dataset"
    assert main(["dataset", str(runs["a"]), "-o", str(dataset), "--no-parquet", "-q"]) == 0

    def no_features(*args, **kwargs):
        raise AssertionError("features built for an evaluation the protocol refuses")

    monkeypatch.setattr(fe, "load_task_for", no_features)
    monkeypatch.setattr(pe, "load_task_for", no_features)
    for model, trace, protocol, says in (
            (everything, runs["a"], "time", "--split time"),
            (everything, runs["a"], "cross-run", "never saw"),
            (everything, runs["py"], "cross-run", "cross-program"),
            (everything, dataset, "cross-run", "never saw"),
            (table, dataset, "time", "--split time"),
            (table, runs["a"], "time", "--split time")):
        capsys.readouterr()
        assert heapcast_main(["evaluate", str(model), str(trace), "--protocol", protocol]) == 2
        assert says in capsys.readouterr().err


def test_gru_lifetime_and_the_lab_entry_point(runs, tmp_path, capsys):
    pytest.importorskip("torch")
    from heapcast.forecast.lifetime import predict_lifetime_classes
    model = tmp_path / "life.safetensors"
    assert main(["train", str(runs["a"]), "-o", str(model), "--task", "lifetime", "--hidden",
                 "32", "--batch", "16", "--threads", "1", "--epochs", "2", "-q"]) == 0
    r = run_json(capsys, "evaluate", model, runs["b"], "--protocol", "cross-run", "--json")
    assert r["model"] == "gru" and r["task"] == "lifetime" and len(r["confusion"]) == 6
    assert r["top1"] > 0.8
    process = heapcast.load(runs["b"]).processes[0]
    classes = predict_lifetime_classes(model, process)
    assert classes.dtype == np.int8 and len(classes) == process.event_count
    allocs = np.isin(process.events["op"], [0, 1, 2]) & (process.events["addr"] != 0)
    assert (classes[~allocs] == -1).all() and (classes[allocs] >= 0).all()
    ng = tmp_path / "next.safetensors"
    assert main(["train", str(runs["a"]), "-o", str(ng), "--model", "ngram", "-q"]) == 0
    with pytest.raises(ValueError, match="not a lifetime model"):
        predict_lifetime_classes(ng, process)


def test_seed_reproduction_reports_both_targets(runs, tmp_path, capsys):
    pytest.importorskip("torch")
    model = tmp_path / "seed.safetensors"
    assert main(["train", str(runs["a"]), "-o", str(model), "--model", "seed", "--split",
                 "article", "--max-steps", "20", "--threads", "1", "-q"]) == 0
    r = run_json(capsys, "evaluate", model, runs["a"], "--protocol", "article",
                 "--max-samples", "400", "--json")
    assert r["model"] == "seed" and r["vocab"] == "seed64" and r["target"] == "article"
    assert r["events"] == 400 and r["sampled"]
    # Trained on bit_length(class), it is scored on that and on the true classes side by side.
    assert r["top1_article_target"] > r["top1"]


def test_train_draws_its_progress_bar_on_a_terminal_only(runs, tmp_path, capsys, monkeypatch):
    """Redirected to a file, a training's bar was hundreds of carriage-returned updates (the
    main job's log); record, stats and report already drew theirs on a terminal only."""
    pytest.importorskip("torch")
    model = tmp_path / "seed.safetensors"
    args = ["train", str(runs["a"]), "-o", str(model), "--model", "seed", "--max-steps", "3",
            "--threads", "1"]
    capsys.readouterr()
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "batch/s" not in err and "trained seed" in err, err
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert main(args) == 0
    assert "batch/s" in capsys.readouterr().err
    assert main(args + ["-q"]) == 0
    assert "batch/s" not in capsys.readouterr().err


def test_heapcast_command_has_the_forecast_verbs(runs):
    from heapcast.cli import build_parser
    sub = next(a for a in build_parser()._actions if a.dest == "verb")
    if "train" not in sub.choices:
        pytest.skip("heapcast.cli does not register heapcast.forecast.cli.add_parsers yet")
    for verb in ("dataset", "train", "evaluate"):
        assert verb in sub.choices


def test_the_whole_command_line_is_built_without_numpy():
    """`heapcast --help` (every verb's parser) imports no numpy, torch, pyarrow or matplotlib:
    they load when a command that needs them runs."""
    import subprocess
    code = ("import sys; from heapcast.cli import build_parser; "
            "sub = next(a for a in build_parser()._actions if a.dest == 'verb'); "
            "heavy = [m for m in ('numpy', 'torch', 'pyarrow', 'matplotlib') if m in sys.modules]; "
            "print(len(sub.choices), heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    verbs, heavy = out.stdout.split(" ", 1)
    assert int(verbs) >= 12 and heavy.strip() == "[]", out.stdout


def test_multi_trace_training_with_validation(runs, tmp_path, capsys):
    from heapcast.forecast.features import featurize
    from heapcast.forecast.models import load_model
    from heapcast.forecast.select import choose_ngram
    from heapcast.forecast.tasks import make_task
    from heapcast.forecast.train import run_of_rows
    model = tmp_path / "v.safetensors"
    s = run_json(capsys, "train", runs["a"], runs["py"], "-o", model, "--model", "ngram",
                 "--validate", runs["c"], "--json", "-q")
    assert [t["path"] for t in s["traces"]] == [str(runs["a"]), str(runs["py"])]
    v = s["validation"]
    assert [t["path"] for t in v["traces"]] == [str(runs["c"])] and len(v["candidates"]) == 20
    # The choice is the best candidate on the validation run, recomputed here from it alone.
    train = make_task(featurize([runs["a"], runs["py"]], "thread"), "next", "rich")
    val = make_task(featurize([runs["c"]], "thread"), "next", "rich")
    chosen, candidates = choose_ngram("next", "rich", train, np.ones(len(train), bool), val)
    assert candidates == v["candidates"] and chosen == v["ngram"]
    m = load_model(model)
    assert m.config["orders"] == chosen["orders"] and m.config["sites"] == chosen["sites"]
    # Scored on a recording it was neither trained nor tuned on; the validation run is refused,
    # and a training run cannot be a validation run.
    r = run_json(capsys, "evaluate", model, runs["b"], "--protocol", "cross-run", "--json")
    assert r["top1"] > 0.8
    assert main(["evaluate", str(model), str(runs["c"]), "--protocol", "cross-run"]) == 2
    assert "chosen on" in capsys.readouterr().err
    assert main(["train", str(runs["a"]), "-o", str(tmp_path / "x.safetensors"), "--model",
                 "ngram", "--validate", str(runs["a"]), "-q"]) == 2
    assert "cannot be a validation run" in capsys.readouterr().err
    # Every row knows its recording (the gru's hints are cross-fitted leave-one-run-out).
    f = featurize([runs["a"], runs["py"]], "thread")
    na = heapcast.load(runs["a"]).event_count
    runs_of = run_of_rows(f)
    assert (runs_of[f.columns["proc"] < len(heapcast.load(runs["a"]).processes)] == 0).all()
    assert np.bincount(runs_of).tolist() == [na, len(f) - na]


def test_gru_on_two_runs_with_a_calibrated_trust(runs, tmp_path, capsys):
    pytest.importorskip("torch")
    model = tmp_path / "g.safetensors"
    s = run_json(capsys, "train", runs["a"], runs["b"], "-o", model, "--validate", runs["c"],
                 "--hidden", "16", "--batch", "8", "--threads", "1", "--json", "-q")
    cal = s["validation"]["calibration"]
    from heapcast.forecast.models import load_model
    m = load_model(model)
    assert cal["rows"] > 1000 and len(cal["cache_boost"]) == len(m.config["cache_orders"])
    # The calibrated boosts are the model's.
    assert np.allclose(m.net.cache_boost.detach().numpy(), cal["cache_boost"], atol=1e-3)
    assert cal["loss_last_epoch"] <= cal["loss_first_epoch"]
    assert main(["evaluate", str(model), str(runs["c"]), "--protocol", "cross-run"]) == 2


def test_gru_chooses_memory_and_size_on_validation(runs, tmp_path, capsys, monkeypatch):
    """Without --hidden, the recurrent size is the best of the probes on the validation run and
    the in-run memory's orders the best of its candidates there; a size given is kept."""
    pytest.importorskip("torch")
    from heapcast.forecast import select
    from heapcast.forecast.features import featurize
    from heapcast.forecast.models import load_model
    from heapcast.forecast.tasks import make_task
    monkeypatch.setattr(select, "HIDDEN_CANDIDATES", (8, 16))
    monkeypatch.setattr(select, "PROBE_EVENTS", 3000)
    model = tmp_path / "g.safetensors"
    s = run_json(capsys, "train", runs["a"], "-o", model, "--validate", runs["c"],
                 "--batch", "8", "--threads", "1", "--set", "embed=8", "--json", "-q")
    v = s["validation"]
    hid, mem = v["hidden"], v["memory"]
    assert [c["hidden"] for c in hid["candidates"]] == [8, 16]
    assert hid["hidden"] == max(hid["candidates"], key=lambda c: c["top1"])["hidden"]
    assert len(mem["candidates"]) == len(select.MEMORY_CANDIDATES)
    assert mem["orders"] == max(mem["candidates"], key=lambda c: c["top1"])["orders"]
    m = load_model(model)
    assert m.config["hidden"] == hid["hidden"] and m.config["cache_orders"] == mem["orders"]
    assert m.net.rnn.hidden_size == hid["hidden"]
    # The memory's scores are recomputed from the validation run alone.
    val = make_task(featurize([runs["c"]], "thread"), "next", "rich")
    assert select.choose_memory(m, val) == (mem["orders"], mem["candidates"])
    # A size the user gives is not chosen.
    s = run_json(capsys, "train", runs["a"], "-o", tmp_path / "h.safetensors", "--validate",
                 runs["c"], "--hidden", "12", "--batch", "8", "--threads", "1", "--json", "-q")
    assert "hidden" not in s["validation"] and load_model(tmp_path / "h.safetensors") \
        .config["hidden"] == 12


@pytest.mark.parametrize("args, says", [
    (["--batch", "-4"], "gru setting 'batch': expected an integer of at least 1, not -4"),
    (["--set", "warmpu=5"], "model 'gru' has no setting 'warmpu' (its settings: batch, bptt,"),
    (["--set", "lr=0"], "gru setting 'lr': expected a number above 0, not 0"),
    (["--set", "ngram_hints=3"], "gru setting 'ngram_hints': expected true or false, not 3"),
    (["--set", "cache_orders=[4, 0]"], "gru setting 'cache_orders': expected a list of integers"),
    (["--model", "ngram", "--hidden", "8"], "model 'ngram' has no setting 'hidden'"),
    (["--model", "ngram", "--set", "orders=[1, 2.5]"], "ngram setting 'orders': expected a list"),
    (["--model", "ngram", "--set", "topk=65"],
     "ngram setting 'topk': expected an integer from 1 to 64, not 65"),
    (["--model", "seed", "--no-sites"], "--no-sites: model 'seed' reads no call sites"),
    (["--max-steps", "-1"], "max_steps and max_events must be 0 (no limit) or more"),
])
def test_train_refuses_settings_the_model_does_not_have(runs, tmp_path, capsys, args, says):
    """A misspelt or out-of-range setting is an error naming it before anything is read or
    trained (before: --set warmpu=5 was ignored, and --batch -4 trained 200,000 steps)."""
    model = tmp_path / "m.safetensors"
    capsys.readouterr()
    assert main(["train", str(runs["a"]), "-o", str(model), "-q", *args]) == 2
    err = capsys.readouterr().err
    assert says in err, err
    assert not model.exists()


def test_evaluate_refuses_a_negative_sample_count(runs, tmp_path, capsys):
    model = tmp_path / "m.safetensors"
    assert main(["train", str(runs["a"]), "-o", str(model), "--model", "majority", "-q"]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(model), str(runs["b"]), "--protocol", "cross-run",
                 "--max-samples", "-3"]) == 2
    assert "max_samples must be 0 (every row) or more, not -3" in capsys.readouterr().err
