"""Release mode: `heapcast record --policy POLICY` runs a compiled policy inside the traced program
and logs its predictions; `heapcast evaluate --online` scores them. Online must equal offline
(`heapcast evaluate POLICY TRACE`) on the same recording, the program must run as without it,
threads give the same predictions on every run, and a bad POLICY is refused before the program
starts."""
import json

import numpy as np
import pytest

import heapcast
from heapcast.cli import main
from heapcast.forecast.train import train
from heapcast.policy import compile_policy
from heapcast.policy.evaluate import evaluate_policy
from heapcast.policy.online import evaluate_online, read_predictions
from heapcast.recorder.session import RecordError
from heapcast.trace.format import TraceError
from model_configs import TINY



@pytest.fixture(scope="module")
def work(tmp_path_factory, build):
    """forecast_work recorded once (run a) and policies trained on it."""
    d = tmp_path_factory.mktemp("online")
    exe = build("forecast_work")
    assert heapcast.record([exe, "3000", "1"], output=d / "a", progress=False).exit_code == 0
    out = {"dir": d, "exe": exe, "a": d / "a"}
    train([d / "a"], d / "life.safetensors", model="ngram", task="lifetime")
    compile_policy(d / "life.safetensors", d / "life.table", kind="table")
    out["table"] = d / "life.table"
    return out


def test_table_policy_online_equals_offline(work, tmp_path):
    r = heapcast.record([work["exe"], "2000", "2"], output=tmp_path / "b", policy=work["table"],
                        progress=False)
    assert r.exit_code == 0
    online = evaluate_online(tmp_path / "b")
    offline = evaluate_policy(work["table"], [tmp_path / "b"], "cross-run")
    assert online["events"] == offline["events"] == online["predictions_logged"] > 5000
    assert abs(online["top1"] - offline["top1"]) <= 0.001
    header, recs = read_predictions(next((tmp_path / "b").glob("*.pred")))
    assert header["task"] == "lifetime" and header["kind"] == "table" and not header["truncated"]
    assert (np.diff(recs["seq"].astype(np.int64)) > 0).all()
    assert ((recs["label"][:, 0] >= 0) & (recs["label"][:, 0] < 6)).all()
    assert ((recs["conf"] > 0) & (recs["conf"] <= 1)).all()


def test_next_event_table_online_equals_offline(work, tmp_path):
    """A next-event table: the recorder's per-thread stream (predict, then feed and prepare the
    next lookup) and `evaluate POLICY`'s whole-stream loop give the same predictions."""
    train([work["a"]], tmp_path / "next.safetensors", model="ngram", task="next")
    compile_policy(tmp_path / "next.safetensors", tmp_path / "next.table", kind="table",
                   min_count=1)
    r = heapcast.record([work["exe"], "2000", "2"], output=tmp_path / "b",
                        policy=tmp_path / "next.table", progress=False)
    assert r.exit_code == 0
    online = evaluate_online(tmp_path / "b")
    offline = evaluate_policy(tmp_path / "next.table", [tmp_path / "b"], "cross-run")
    assert online["events"] == offline["events"] > 5000
    assert online["top1"] == offline["top1"] and online["top5"] == offline["top5"]


def test_rnn_policy_online_equals_offline_and_every_n(work, tmp_path, capsys):
    pytest.importorskip("torch")
    gru = tmp_path / "gru.safetensors"
    train([work["a"]], gru, model="gru", task="next", config=TINY)
    compile_policy(gru, tmp_path / "gru.policy", kind="rnn")
    assert main(["record", "-o", str(tmp_path / "b"), "--policy", str(tmp_path / "gru.policy"),
                 "--", str(work["exe"]), "2000", "2"]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--online", str(tmp_path / "b"), "--json"]) == 0
    online = json.loads(capsys.readouterr().out)
    offline = evaluate_policy(tmp_path / "gru.policy", [tmp_path / "b"], "cross-run")
    assert online["events"] == offline["events"] > 10000
    assert abs(online["top1"] - offline["top1"]) <= 0.001, (online["top1"], offline["top1"])
    # every 16th event: a sixteenth of the predictions, scored the same way
    heapcast.record([work["exe"], "2000", "2"], output=tmp_path / "c",
                    policy=tmp_path / "gru.policy", policy_every=16, progress=False)
    sparse = evaluate_online(tmp_path / "c")
    assert sparse["every"] == 16
    assert abs(sparse["predictions_logged"] - online["events"] / 16) <= 2
    assert abs(sparse["top1"] - online["top1"]) < 0.05


def test_threads_get_the_same_predictions_on_every_run(work, build, tmp_path):
    exe = build("threads")
    first = tmp_path / "t0"
    assert heapcast.record([exe], output=first, progress=False).exit_code == 0
    train([first], tmp_path / "ng.safetensors", model="ngram", task="next")
    compile_policy(tmp_path / "ng.safetensors", tmp_path / "next.table", kind="table")
    runs = []
    for i in (1, 2):
        r = heapcast.record([exe], output=tmp_path / f"t{i}", policy=tmp_path / "next.table",
                            progress=False)
        assert r.exit_code == 0
        trace = heapcast.load(tmp_path / f"t{i}")
        ev = trace.processes[0].events
        tid_of = dict(zip(ev["seq"].tolist(), ev["tid"].tolist()))
        _, recs = read_predictions(next((tmp_path / f"t{i}").glob("*.pred")))
        assert len(recs) == len(ev)             # one prediction per event, none lost
        per_thread = {}
        for seq, label in zip(recs["seq"].tolist(), recs["label"][:, 0].tolist()):
            per_thread.setdefault(tid_of[seq], []).append(label)
        runs.append(sorted(per_thread.values()))
    assert runs[0] == runs[1]
    assert len(runs[0]) == 17


def test_program_output_and_status_are_unchanged(work, build, untraced, tmp_path):
    exe = build("fork")
    plain = untraced([exe])
    r = heapcast.record([exe], output=tmp_path / "f", policy=work["table"], progress=False)
    assert r.exit_code == plain.returncode == 0
    preds = sorted((tmp_path / "f").glob("*.pred"))
    assert len(preds) == len(heapcast.load(tmp_path / "f").processes) == 3   # each process its own
    assert evaluate_online(tmp_path / "f")["events"] > 0


def test_bad_policies_are_refused_before_the_program_starts(work, tmp_path, capsys):
    bad = tmp_path / "bad.policy"
    bad.write_bytes(work["table"].read_bytes()[:-50])
    with pytest.raises(RecordError, match=r"bad\.policy"):
        heapcast.record([work["exe"], "10", "1"], output=tmp_path / "x", policy=bad,
                        progress=False)
    assert not (tmp_path / "x").exists()
    assert main(["record", "-o", str(tmp_path / "y"), "--policy", str(tmp_path / "none.policy"),
                 "--", str(work["exe"]), "10", "1"]) != 0
    assert "none.policy" in capsys.readouterr().err
    train([work["a"]], tmp_path / "free.safetensors", model="ngram", task="free")
    compile_policy(tmp_path / "free.safetensors", tmp_path / "free.table", kind="table")
    with pytest.raises(RecordError, match="'free' task cannot run online"):
        heapcast.record([work["exe"], "10", "1"], output=tmp_path / "z",
                        policy=tmp_path / "free.table", progress=False)
    # a trace without predictions, and a damaged predictions file, say so
    with pytest.raises(TraceError, match="no predictions"):
        evaluate_online(work["a"])
    junk = tmp_path / "junk.pred"
    junk.write_bytes(b"x" * 200)
    with pytest.raises(TraceError, match=r"junk\.pred, offset 0: not a predictions file"):
        read_predictions(junk)
    # version 1 files (32-byte records) are still read; an unknown version is refused
    from heapcast.policy.online import HEADER, RECORD
    h = np.zeros(1, HEADER)
    h["magic"], h["version"], h["task"], h["vocab"] = b"HCPRED1\0", 1, 0, 1
    r = np.zeros(2, RECORD)
    r["seq"], r["label"], r["conf"] = [7, 9], [[3, 1, -1, -1, -1], [2, -1, -1, -1, -1]], 0.5
    old = tmp_path / "old.pred"
    old.write_bytes(h.tobytes() + r.tobytes())
    header, recs = read_predictions(old)
    assert header["task"] == "next" and np.array_equal(recs, r)
    h["version"] = 9
    old.write_bytes(h.tobytes())
    with pytest.raises(TraceError, match=r"old\.pred, offset 8: predictions format version 9"):
        read_predictions(old)


def test_development_mode_logs_features_and_fine_tunes(work, tmp_path):
    """--log-features writes what each decision read; a model fine-tuned on the logs of another
    input's run scores higher on that input than before."""
    pytest.importorskip("torch")
    exe = work["exe"]
    base = tmp_path / "base.safetensors"
    # a model that has seen little: a short run, a few steps
    small = heapcast.record([exe, "200", "1"], output=tmp_path / "small", progress=False)
    assert small.exit_code == 0
    train([tmp_path / "small"], base, model="gru", task="next", config=TINY, max_steps=3)
    compile_policy(base, tmp_path / "base.policy", kind="rnn")
    field = tmp_path / "field"
    r = heapcast.record([exe, "3000", "7"], output=field, policy=tmp_path / "base.policy",
                        log_features=True, progress=False)
    assert r.exit_code == 0
    from heapcast.policy.online import read_features
    header, feats = read_features(next(field.glob("*.features")))
    _, preds = read_predictions(next(field.glob("*.pred")))
    assert header["task"] == "next" and len(feats) == len(preds) == heapcast.load(field).event_count
    assert np.array_equal(feats["seq"], preds["seq"])
    assert np.array_equal(feats["pred"], preds["label"][:, :3])      # the decision it logged
    assert np.array_equal(feats["label"], feats["token"])            # next: the event's token
    tuned = tmp_path / "tuned.safetensors"
    assert main(["train", "--from-log", str(field), "--init", str(base), "-o", str(tuned),
                 "-q"]) == 0
    heapcast.record([exe, "2000", "9"], output=tmp_path / "test", progress=False)
    from heapcast.forecast.evaluate import evaluate
    before = evaluate(base, [tmp_path / "test"], "cross-run")["top1"]
    after = evaluate(tuned, [tmp_path / "test"], "cross-run")["top1"]
    assert after > before + 0.02, (before, after)
    assert main(["train", "--from-log", str(field), "-o", str(tmp_path / "x.safetensors")]) == 2
