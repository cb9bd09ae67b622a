"""The allocator lab on a real recording (a C program compiled here, which forks), streamed
replay, lifetime labels against the forecasting stage's, and the `simulate` command line."""
import argparse
import importlib.util
import json
import os

import numpy as np
import pytest

import heapcast
from heapcast.lab import lifetime_classes, simulate
from heapcast.lab import replay as lab_replay
from heapcast.lab.cli import add_parsers
from heapcast.stats import stats



@pytest.fixture(scope="module")
def recorded(tmp_path_factory, build):
    """A recording of programs/churn.c: parent and forked child."""
    d = tmp_path_factory.mktemp("lab")
    r = heapcast.record([str(build("churn"))], output=d / "trace")
    assert r.exit_code == 0
    return heapcast.load(d / "trace")


def test_real_trace_replays_exactly_under_every_policy(recorded):
    assert len(recorded.processes) == 2 and recorded.processes[1].forked_from
    r = simulate(recorded, checked=True)
    assert r["unknown_frees"] == 0 and r["double_acquires"] == 0
    expected = stats(recorded)
    # The child starts with its parent's live blocks (so it frees none it does not know).
    for mine, theirs in zip(r["per_process"], expected["per_process"]):
        assert mine["peak_live_bytes"] == theirs["peak_live_bytes"]
        assert mine["unknown_frees"] == 0
    assert r["peak_live_bytes"] == expected["peak_live_bytes"]
    for name, v in r["policies"].items():
        assert v["peak_footprint_bytes"] >= r["peak_live_bytes"], name
        assert v["fragmentation"] >= 1.0
        assert v["live_bytes_at_peak"] + v["internal_bytes_at_peak"] + v["external_bytes_at_peak"] \
            == v["peak_footprint_bytes"]
        assert v["events_per_s"] > 0
    # At the end every policy holds the same live bytes: in the parent, what it never freed; in
    # the child, also the inherited blocks it did not free.
    for proc, theirs in zip(r["per_process"], expected["per_process"]):
        ends = {v["live_bytes"] for v in proc["policies"].values()}
        assert len(ends) == 1
    assert ends != {0}
    assert {v["live_bytes"] for v in r["per_process"][0]["policies"].values()} == \
        {expected["per_process"][0]["leaked_bytes"]}


def test_streamed_in_small_blocks_gives_the_same_result(recorded, monkeypatch):
    whole = simulate(recorded, policies="best-fit,glibc,oracle-lifetime,learned-lifetime")
    monkeypatch.setattr(lab_replay, "BLOCK_EVENTS", 97)
    streamed = simulate(recorded, policies="best-fit,glibc,oracle-lifetime,learned-lifetime")
    for name in whole["policies"]:
        for key in ("peak_footprint_bytes", "peak_pages_4k", "internal_bytes_at_peak", "moves"):
            assert whole["policies"][name][key] == streamed["policies"][name][key], (name, key)


def _figures(d):
    """A simulate() result without its timings (and its series as lists)."""
    if isinstance(d, dict):
        return {k: _figures(v) for k, v in d.items()
                if k not in ("seconds", "events_per_s", "driver_events_per_s", "wall_s", "driver_ns",
                             "ns")}
    if isinstance(d, (list, tuple)):
        return [_figures(v) for v in d]
    return d.tolist() if isinstance(d, np.ndarray) else d


def test_policies_side_by_side_give_what_each_gives_alone(recorded, monkeypatch):
    """The policies of a batch run on several threads (one per CPU): each has its own heap and
    reads the batch only, so every figure, the series too, is the one a single thread gives."""
    runs = []
    for threads in ("1", "4"):
        monkeypatch.setenv("HEAPCAST_LAB_THREADS", threads)   # (4: on batches of any size)
        runs.append(_figures(simulate(recorded, checked=True, series=True)))
    assert (runs[0].pop("threads"), runs[1].pop("threads")) == (1, 4)
    assert runs[0] == runs[1]
    assert len(runs[0]["policies"]) >= 9


# Runs simulate() with the lab library given (argv[1]) on a trace (argv[2]).
TSAN_PROBE = """
import sys
from pathlib import Path
import heapcast
from heapcast.lab import native
native.LIBRARY = Path(sys.argv[1])
from heapcast.lab import simulate
r = simulate(heapcast.load(sys.argv[2]), checked=True, series=True)
print("threads", r["threads"], "policies", len(r["policies"]))
"""


def test_policies_side_by_side_under_thread_sanitizer(recorded, tmp_path):
    """The lab compiled with -fsanitize=thread, its policies on four threads (every batch): no
    data race reported (a deliberate one is: checked when this test was written)."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    tsan = subprocess.run(["gcc", "-print-file-name=libtsan.so"], capture_output=True,
                          text=True).stdout.strip()
    if not Path(tsan).is_file():
        pytest.skip("no libtsan (gcc's ThreadSanitizer runtime)")
    root = Path(__file__).resolve().parent.parent / "native" / "lab"
    sources = sorted(str(p) for p in root.glob("*.c"))
    lib = tmp_path / "libheapcast_lab.so"
    built = subprocess.run(["gcc", "-std=gnu11", "-O1", "-g", "-fPIC", "-shared", "-pthread",
                            "-fsanitize=thread", "-o", str(lib), *sources],
                           capture_output=True, text=True)
    if built.returncode:
        pytest.skip(f"cannot build with -fsanitize=thread: {built.stderr.strip()[-200:]}")
    env = {**os.environ, "HEAPCAST_LAB_THREADS": "4", "LD_PRELOAD": str(Path(tsan).resolve()),
           "TSAN_OPTIONS": "halt_on_error=1 exitcode=66"}
    done = subprocess.run([sys.executable, "-c", TSAN_PROBE, str(lib), str(recorded.path)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "ThreadSanitizer" not in done.stderr, done.stderr[-3000:]
    assert done.stdout.split()[:2] == ["threads", "4"]


def test_lifetime_classes_match_the_forecasting_labels(recorded):
    lifetime = pytest.importorskip("heapcast.forecast.lifetime")
    from heapcast.trace.blocks import match
    p = recorded.processes[0]
    theirs = lifetime.lifetime_labels(p.events, match(p.events))["cls"]
    mine = lifetime_classes(p).astype(np.int16)
    mine[mine == 255] = -1
    assert np.array_equal(mine, theirs)


def test_simulate_command_json_and_plot(recorded, tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="heapcast")
    add_parsers(parser.add_subparsers(dest="verb", required=True))
    argv = ["simulate", str(recorded.path), "--policy", "first-fit,segregated", "--json"]
    plot = tmp_path / "footprint.png" if importlib.util.find_spec("matplotlib") else None
    if plot is not None:
        argv += ["--plot", str(plot)]
    a = parser.parse_args(argv)
    assert a.func(a) == 0
    d = json.loads(capsys.readouterr().out)
    assert set(d["policies"]) == {"first-fit", "segregated"}
    for v in d["policies"].values():
        for key in ("peak_footprint_bytes", "peak_pages_4k", "fragmentation",
                    "internal_bytes_at_peak", "events_per_s"):
            assert key in v
    assert d["peak_live_bytes"] > 0
    if plot is not None:
        assert plot.stat().st_size > 10_000


def test_learned_lifetime_is_placed_as_heapcast_run_places_it(recorded, tmp_path, capsys):
    # Fed the true classes, learned-lifetime is the oracle's segregation over the same placement:
    # by default heapcast's packer (what `heapcast run` does with a compiled policy's classes),
    # or the fit asked for (simulate --learned-over).
    truth = []
    for p in recorded.processes:
        c = lifetime_classes(p).astype(np.int16)
        c[c == 255] = -1
        truth.append(c)
    for over in ("heapcast", "best-fit"):
        kw = {} if over == "heapcast" else {"learned_over": over}
        r = simulate(recorded, policies="oracle-lifetime,learned-lifetime", predicted=truth,
                     checked=True, **kw)
        learned = r["policies"]["learned-lifetime"]
        assert learned["placement"] == f"lifetime over {over}"
        for proc in r["per_process"]:
            kernels = proc["policies"]
            assert kernels[f"learned-lifetime@{over}"]["peak_footprint"] == \
                kernels[f"oracle-lifetime@{over}"]["peak_footprint"], over
    parser = argparse.ArgumentParser(prog="heapcast")
    add_parsers(parser.add_subparsers(dest="verb", required=True))
    a = parser.parse_args(["simulate", str(recorded.path), "--policy", "learned-lifetime",
                           "--learned-over", "first-fit", "--json"])
    assert a.func(a) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["policies"]["learned-lifetime"]["placement"] == "lifetime over first-fit"
    with pytest.raises(SystemExit):
        parser.parse_args(["simulate", str(recorded.path), "--learned-over", "buddy"])


def test_learned_lifetime_with_a_lifetime_model(recorded, tmp_path):
    forecast_train = pytest.importorskip("heapcast.forecast.train")
    model = tmp_path / "lifetime.model"
    forecast_train.train([recorded.path], model, model="ngram", task="lifetime")
    r = simulate(recorded, policies="oracle-lifetime,learned-lifetime", model=model, checked=True)
    assert r["predictor"] == f"model {model}"
    assert r["prediction"]["accuracy"] > 0.5
    assert r["unknown_frees"] == 0


def test_model_needs_a_lifetime_model(recorded, tmp_path):
    bogus = tmp_path / "not-a-model"
    bogus.write_text("nothing")
    with pytest.raises((ValueError, OSError)):
        simulate(recorded, policies="learned-lifetime", model=bogus)
