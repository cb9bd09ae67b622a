"""Results kept in a trace's directory (heapcast.trace.cache): `heapcast report` shows what
`heapcast evaluate` and `heapcast simulate` computed instead of computing it again, and never
a result of another trace, model or code."""
import json
import os
import stat

import pytest

import heapcast
from heapcast.trace import cache


@pytest.fixture(scope="module")
def work(tmp_path_factory, build):
    """churn.c recorded (a parent and its forked child), an n-gram trained on the first part of
    it, and that n-gram compiled into a table POLICY."""
    d = tmp_path_factory.mktemp("kept")
    assert heapcast.record([str(build("churn"))], output=d / "t.trace").exit_code == 0
    from heapcast.forecast.cli import main as forecast
    assert forecast(["train", str(d / "t.trace"), "--model", "ngram", "--split", "time",
                     "-o", str(d / "ngram.safetensors"), "-q"]) == 0
    from heapcast.cli import main
    assert main(["compile", str(d / "ngram.safetensors"), "--kind", "table",
                 "-o", str(d / "ngram.table")]) == 0
    return d


def run_json(capsys, *args):
    from heapcast.cli import main
    capsys.readouterr()
    assert main([str(a) for a in args]) == 0
    return json.loads(capsys.readouterr().out)


def test_report_shows_what_evaluate_and_simulate_computed(work, capsys, monkeypatch, tmp_path):
    trace_dir = work / "t.trace"
    model, policy = work / "ngram.safetensors", work / "ngram.table"
    evaluated = [run_json(capsys, "evaluate", m, trace_dir, "--protocol", "time", "--json")
                 for m in (model, policy)]
    simulated = run_json(capsys, "simulate", trace_dir, "--json")
    kept = sorted(p.name.split("-")[0] for p in (trace_dir / ".cache").iterdir())
    assert kept == ["features", "forecast", "forecast", "lab"]   # (features: feature_cache)
    assert stat.S_IMODE((trace_dir / ".cache").stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in (trace_dir / ".cache").iterdir())
    # The report computes none of it again.
    from heapcast.lab import replay
    from heapcast.report import forecast

    def again(*a, **k):
        raise AssertionError("computed again")
    monkeypatch.setattr(forecast, "predictions", again)
    monkeypatch.setattr(replay, "simulate", again)
    from heapcast.report.forecast import model_section
    from heapcast.report.sections import lab_section
    trace = heapcast.load(trace_dir)
    results = model_section([model, policy], trace)["results"]
    for r, e, name in zip(results, evaluated, ("ngram", "policy:table")):
        assert (r["model"], r["protocol"], r["events"]) == (name, "time", e["events"])
        assert r["top1"] == e["top1"] and r["top5"] == e["top5"]
        assert r["per_class"] == e["per_class"] and len(r["over_time"]["top1"]) > 1
        assert "trained_on_these_traces" not in r
    lab = lab_section(trace)
    assert set(lab["policies"]) == set(simulated["policies"])
    for name, v in simulated["policies"].items():
        assert lab["policies"][name]["peak_footprint_bytes"] == v["peak_footprint_bytes"]
    assert len(lab["series"]) == 2 and all(len(s["t"]) == len(s["live"]) > 1 for s in lab["series"])
    out = heapcast.report(trace, output=tmp_path / "r.html", model=[model, policy], lab=True)
    assert '"model":{"results"' in out.read_text()


def test_a_changed_trace_model_or_option_is_computed_again(build, capsys, tmp_path):
    from conftest import record_inputs
    runs = record_inputs(build("forecast_work"), tmp_path, (("a", 3000, 1), ("b", 2000, 2)))
    model, trace_dir = tmp_path / "ngram.safetensors", runs["b"]
    from heapcast.forecast.cli import main as forecast
    assert forecast(["train", str(runs["a"]), "--model", "ngram", "--split", "time", "-o",
                     str(model), "-q"]) == 0
    e = run_json(capsys, "evaluate", model, trace_dir, "--protocol", "cross-run", "--json")
    from heapcast.forecast.evaluate import kept_for_report
    kept = kept_for_report(model, trace_dir, "time")
    assert kept is not None and kept["protocol"] == "cross-run" and kept["events"] == e["events"]
    assert kept["top1"] == e["top1"]
    # the protocol the report would not score with: not taken
    run_json(capsys, "evaluate", model, trace_dir, "--protocol", "time", "--json")
    assert kept_for_report(model, trace_dir, "time")["protocol"] == "cross-run"
    # another model file (the same bytes: the same model)
    twin = tmp_path / "twin.safetensors"
    twin.write_bytes(model.read_bytes())
    assert kept_for_report(twin, trace_dir, "time")["top1"] == kept["top1"]
    twin.write_bytes(model.read_bytes() + b" ")
    assert kept_for_report(twin, trace_dir, "time") is None
    # a sampled evaluation keeps nothing
    import shutil
    shutil.rmtree(trace_dir / ".cache")
    run_json(capsys, "evaluate", model, trace_dir, "--protocol", "cross-run", "--json",
             "--max-samples", "10")
    assert kept_for_report(model, trace_dir, "time") is None
    from heapcast.forecast.evaluate import evaluate
    evaluate(model, [trace_dir], "cross-run", k=3)      # another top-k than the report's
    assert kept_for_report(model, trace_dir, "time") is None
    run_json(capsys, "evaluate", model, trace_dir, "--protocol", "cross-run", "--json")
    assert kept_for_report(model, trace_dir, "time") is not None
    # the trace written again (a .hct with another modification time)
    hct = next(trace_dir.glob("*.hct"))
    st = hct.stat()
    os.utime(hct, ns=(st.st_atime_ns, st.st_mtime_ns + 10 ** 9))
    assert kept_for_report(model, trace_dir, "time") is None
    # simulate with other options keeps nothing for the report
    run_json(capsys, "simulate", trace_dir, "--policy", "buddy", "--json")
    run_json(capsys, "simulate", trace_dir, "--align", "8", "--json")
    from heapcast.lab.report import kept_for_report as lab_kept
    assert lab_kept(trace_dir) is None
    run_json(capsys, "simulate", trace_dir, "--json")
    assert lab_kept(trace_dir) is not None


def test_keys_and_files(tmp_path, monkeypatch):
    assert cache.key(tmp_path, a=1) is None            # not a trace directory
    (tmp_path / "1.hct").write_bytes(b"x")
    k = cache.key(tmp_path, a=1)
    assert k != cache.key(tmp_path, a=2) and k == cache.key(tmp_path, a=1)
    cache.save(tmp_path, "forecast", k, {"v": 1})
    assert cache.load(tmp_path, "forecast", k) == {"v": 1}
    assert cache.load(tmp_path, "lab", k) is None
    # heapcast's code changed: another key for the same parts, which replaces the older entry
    monkeypatch.setattr(cache, "_code_identity", "other code")
    k2 = cache.key(tmp_path, a=1)
    assert k2 != k and k2.split("-")[0] == k.split("-")[0]
    assert cache.load(tmp_path, "forecast", k2) is None
    cache.save(tmp_path, "forecast", k2, {"v": 2})
    assert [p.name for p in (tmp_path / ".cache").iterdir()] == [f"forecast-{k2}.json"]
    # an entry that is not what its name says, or not JSON: computed again
    (tmp_path / ".cache" / f"forecast-{k2}.json").write_text(json.dumps({"key": k, "result": 3}))
    assert cache.load(tmp_path, "forecast", k2) is None
    (tmp_path / ".cache" / f"forecast-{k2}.json").write_text("{")
    assert cache.load(tmp_path, "forecast", k2) is None
    # a directory where nothing can be kept: no error, nothing kept
    other = tmp_path / "ro"
    other.mkdir()
    (other / "1.hct").write_bytes(b"x")
    (other / ".cache").write_text("a file, not a directory")
    k3 = cache.key(other, a=1)
    cache.save(other, "lab", k3, {"v": 1})
    assert cache.load(other, "lab", k3) is None and sorted(p.name for p in other.iterdir()) == \
        [".cache", "1.hct"]
