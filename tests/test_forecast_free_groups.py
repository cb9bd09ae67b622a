"""Grouped `free` labels (heapcast train --free-group): the freed block named by its rank within
its own size class or call site, the group named too. Hand-computed codes, a real program whose
two pools interleave at random (tests/programs/free_pools.c), the choice on a validation run,
model files and compiled policies."""
import json

import numpy as np
import pytest

from heapcast.forecast.cli import main
from heapcast.forecast.features import featurize
from heapcast.forecast.modelfile import ModelError, read_model_file, save_model_file
from heapcast.forecast.models import load_model
from heapcast.forecast.tasks import (FREE_BEYOND, FREE_YOUNG, free_block_codes, free_code_table,
                                     grouped_free_labels, label_names, make_task)
from conftest import record_inputs
from test_forecast_free import trace_of   # ("malloc", name, site, size) / ("free", name) steps

OLDEST = FREE_YOUNG


def test_codes_by_hand():
    # Site 1 is a queue of 24- and 100-byte blocks, site 2 a stack of 24-byte ones.
    steps = [("malloc", "a1", 1, 24), ("malloc", "b1", 2, 24), ("malloc", "a2", 1, 100),
             ("malloc", "b2", 2, 24), ("malloc", "a3", 1, 24),
             ("free", "b2"),          # all: rank 1 of 5 (young end 1); site 2: its youngest
             ("free", "a1"),          # all: the oldest; site 1: its oldest; class 5: oldest
             ("free", "a2"),          # all: b1 a2 a3: rank 1, 1 older -> young end 1;
                                      # site 1: a2 a3 -> oldest; class 7: the only one -> 0
             ("free", "b1")]          # all: b1 a3 -> oldest; site 2: the only one -> 0;
                                      # class 5: b1 a3 -> oldest
    f = featurize([trace_of(steps)], order="process")
    frees = f.columns["free_rank"] >= 0
    site = f.columns["site"][[0, 1]].astype(np.int64)           # keys of sites 1 and 2
    assert make_task(f, "free", "rich").labels[frees].tolist() == [1, OLDEST, 1, OLDEST]
    codes = free_block_codes(f.columns, "site")[frees]
    assert codes.tolist() == [site[1] * FREE_BEYOND, site[0] * FREE_BEYOND + OLDEST,
                              site[0] * FREE_BEYOND + OLDEST, site[1] * FREE_BEYOND]
    # size classes: 24 bytes -> 5, 100 bytes -> 7 (the article's bit_length)
    cls = free_block_codes(f.columns, "class")[frees]
    # (b2: a1 b1 [b2] a3 in class 5, rank 1 from the young end)
    assert cls.tolist() == [5 * FREE_BEYOND + 1, 5 * FREE_BEYOND + OLDEST, 7 * FREE_BEYOND + 0,
                            5 * FREE_BEYOND + OLDEST]
    # The label space: the most frequent codes of the rows given, sorted; others are beyond.
    table = free_code_table(f, "class", limit=2)
    assert table.tolist() == [5 * FREE_BEYOND + 1, 5 * FREE_BEYOND + OLDEST]   # ties: lower
    data = make_task(f, "free", "rich", "class", table)
    assert data.n_labels == 3 and data.beyond == 2
    assert data.labels[frees].tolist() == [0, 1, 2, 1]
    assert (data.labels[~frees] == -1).all()
    assert label_names("free", "rich", "class", table) == [
        "class 5, youngest 1", "class 5, oldest 0", "beyond"]
    assert grouped_free_labels(np.array([-1, -2, 7]), np.zeros(0, np.int64)).tolist() == [-1, 0, 0]
    with pytest.raises(ValueError, match="code table"):
        make_task(f, "free", "rich", "site")


@pytest.fixture(scope="module")
def pools(tmp_path_factory, build):
    """Recordings of programs/free_pools.c with three inputs (a: train, b: test, c: validate)."""
    return record_inputs(build("free_pools"), tmp_path_factory.mktemp("pools"),
                         (("a", 3000, 1), ("b", 2000, 2), ("c", 1500, 3)))


def run_json(capsys, *args):
    capsys.readouterr()
    assert main([str(a) for a in args]) == 0
    return json.loads(capsys.readouterr().out)


def test_pools_are_named_within_their_call_site(pools, tmp_path, capsys):
    scores = {}
    for group in ("all", "site", "class"):
        model = tmp_path / f"{group}.safetensors"
        assert main(["train", str(pools["a"]), "-o", str(model), "--model", "ngram", "--task",
                     "free", "--free-group", group, "-q"]) == 0
        r = run_json(capsys, "evaluate", model, pools["b"], "--protocol", "cross-run", "--json")
        assert r["free_group"] == group
        scores[group] = r["top1"]
    # Among all live blocks the rank of a pool's oldest block depends on the random
    # interleaving; within its call site (or size class: each pool has its own) it is always
    # the oldest.
    assert scores["site"] > 0.99 and scores["class"] > 0.99 and scores["all"] < 0.7
    m = load_model(tmp_path / "site.safetensors")
    assert m.free_group == "site" and m.n_labels == len(m.free_codes) + 1
    names = label_names("free", "rich", "site", m.free_codes)
    assert any(n.endswith("oldest 0") for n in names)
    # A dataset (version 3) holds every grouping's columns: the same label space as the trace.
    from heapcast.forecast.dataset import build_dataset
    build_dataset([pools["a"]], tmp_path / "ds", order="process", parquet=False)
    assert main(["train", str(tmp_path / "ds"), "-o", str(tmp_path / "ds.safetensors"),
                 "--model", "ngram", "--task", "free", "--free-group", "site", "-q"]) == 0
    assert load_model(tmp_path / "ds.safetensors").free_codes.tolist() == m.free_codes.tolist()
    # A grouped model without its code table is refused with a clear error.
    tensors, meta = read_model_file(tmp_path / "site.safetensors")
    del tensors["free_codes"]
    save_model_file(tmp_path / "damaged.safetensors", tensors, meta)
    with pytest.raises(ModelError, match="free_codes"):
        load_model(tmp_path / "damaged.safetensors")
    assert main(["train", str(pools["a"]), "-o", str(tmp_path / "x.safetensors"),
                 "--free-group", "site", "-q"]) == 2         # the next task has no free groups
    assert "only for task 'free'" in capsys.readouterr().err


def test_grouping_is_chosen_on_the_validation_run(pools, tmp_path, capsys):
    from heapcast.forecast.select import choose_free_group
    s = run_json(capsys, "train", pools["a"], "-o", tmp_path / "v.safetensors", "--model",
                 "ngram", "--task", "free", "--validate", pools["c"], "--json", "-q")
    choice = s["validation"]["free_group"]
    assert choice["group"] in ("class", "site")
    # Recomputed from the training and validation runs alone: the same choice and scores.
    fa = featurize([pools["a"]], "process")
    fc = featurize([pools["c"]], "process")
    group, table, candidates = choose_free_group(fa, np.ones(len(fa), bool), fc, "rich")
    assert (group, candidates) == (choice["group"], choice["candidates"])
    assert load_model(tmp_path / "v.safetensors").free_codes.tolist() == table.tolist()
    r = run_json(capsys, "evaluate", tmp_path / "v.safetensors", pools["b"], "--protocol",
                 "cross-run", "--json")
    assert r["top1"] > 0.99
    # A grouping given on the command line is kept, not chosen.
    s = run_json(capsys, "train", pools["a"], "-o", tmp_path / "w.safetensors", "--model",
                 "ngram", "--task", "free", "--free-group", "all", "--validate", pools["c"],
                 "--json", "-q")
    assert "free_group" not in s["validation"]
    assert load_model(tmp_path / "w.safetensors").free_codes is None


def test_grouped_gru_and_its_compiled_policy(pools, tmp_path, capsys):
    pytest.importorskip("torch")
    model = tmp_path / "g.safetensors"
    assert main(["train", str(pools["a"]), "-o", str(model), "--task", "free", "--free-group",
                 "site", "--hidden", "16", "--batch", "8", "--threads", "1", "-q"]) == 0
    r = run_json(capsys, "evaluate", model, pools["b"], "--protocol", "cross-run", "--json")
    assert r["top1"] > 0.95
    # Compiled into a table, the policy carries the label space and scores the same frees.
    from heapcast.policy.compile import compile_policy
    from heapcast.policy.fileformat import read_spec
    policy = tmp_path / "g.policy"
    compile_policy(model, policy, kind="table", data=[pools["a"]])
    spec = read_spec(policy)
    assert spec["outputs"]["free_group"] == "site"
    assert spec["outputs"]["free_codes"] == load_model(model).free_codes.tolist()
    from heapcast.cli import main as heapcast_main
    capsys.readouterr()
    assert heapcast_main(["evaluate", str(policy), str(pools["b"]), "--protocol", "cross-run",
                          "--json"]) == 0
    p = json.loads(capsys.readouterr().out)
    assert p["events"] == r["events"] and p["top1"] > 0.95
