"""Compiled policies (heapcast compile, native/policy): the native runtime against the models it
was compiled from, on real recordings; keys and tokens against the trace tools; determinism;
damaged and mismatched POLICY files."""
import ctypes
import json
import os
import signal
import subprocess
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

import heapcast
from heapcast.cli import main
from heapcast.forecast.dataset import load_features
from heapcast.forecast.evaluate import evaluate
from heapcast.forecast.features import mix64
from heapcast.forecast.models import load_model
from heapcast.forecast.tasks import make_task
from heapcast.forecast.train import train
from heapcast.forecast.vocab import fine_size_class
from heapcast.policy import PolicyError, compile_policy
from heapcast.policy.compile import _P, _PAD_TOKEN, context_hashes, table_key
from heapcast.policy.evaluate import evaluate_policy, predict_streams
from heapcast.policy.fileformat import ABI, cfg_array, write_policy
from heapcast.policy.native import Policy, library
from model_configs import TINY

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, build):
    """Two recordings of tests/programs/forecast_work.c with different inputs."""
    d = tmp_path_factory.mktemp("policy")
    exe = build("forecast_work")
    out = {"dir": d}
    for name, n, seed in (("a", 3000, 1), ("b", 2000, 2)):
        r = heapcast.record([exe, str(n), str(seed)], output=d / name, progress=False)
        assert r.exit_code == 0
        out[name] = d / name
    return out


@pytest.fixture(scope="module")
def gru(runs):
    """The default model (GRU, n-gram hints, in-run memory) trained on run a, tiny."""
    path = runs["dir"] / "gru.safetensors"
    train([runs["a"]], path, model="gru", task="next", config=TINY)
    return path


@pytest.fixture(scope="module")
def rnn_policy(runs, gru):
    path = runs["dir"] / "gru.policy"
    compile_policy(gru, path, kind="rnn")
    return path


def test_rnn_policy_predicts_what_the_model_predicts(runs, gru, rnn_policy):
    offline = evaluate(gru, [runs["b"]], "cross-run")
    native = evaluate_policy(rnn_policy, [runs["b"]], "cross-run")
    assert native["events"] == offline["events"] > 10000
    assert abs(native["top1"] - offline["top1"]) <= 0.001, (native["top1"], offline["top1"])
    assert native["model"] == "policy:rnn" and native["runtime"] == "native"
    # Row by row too: the same top label almost everywhere (the model's batched prediction
    # restarts its state between segments; the runtime runs each stream from its start).
    model = load_model(gru)
    data = make_task(load_features([runs["b"]], "thread"), "next", "rich")
    rows = np.flatnonzero(data.labels >= 0)
    want = np.zeros(len(data), bool)
    want[rows] = True
    same = model.predict(data, rows, 1)[:, 0] == predict_streams(Policy(rnn_policy), data, want)[rows, 0]
    assert same.mean() >= 0.99


def test_int8_and_pruned_variants_report_their_own_accuracy(runs, gru, rnn_policy, tmp_path):
    fp32 = evaluate_policy(rnn_policy, [runs["b"]], "cross-run")["top1"]
    for name, opts in (("int8", {"int8": True}), ("prune", {"prune": 0.25}),
                       ("both", {"int8": True, "prune": 0.5})):
        spec = compile_policy(gru, tmp_path / f"{name}.policy", kind="rnn", **opts)
        assert spec["rnn"]["kept_units"] == TINY["hidden"] - round(opts.get("prune", 0) * 32)
        r = evaluate_policy(tmp_path / f"{name}.policy", [runs["b"]], "cross-run")
        assert r["model"].startswith("policy:rnn-") and 0.0 < r["top1"] <= 1.0
        if name == "int8":
            assert abs(r["top1"] - fp32) < 0.05       # int8 weights lose little here
    assert (tmp_path / "int8.policy").stat().st_size < rnn_policy.stat().st_size


def test_table_policy_for_lifetimes(runs, tmp_path):
    life = tmp_path / "life.safetensors"
    train([runs["a"]], life, model="ngram", task="lifetime")
    majority = tmp_path / "maj.safetensors"
    train([runs["a"]], majority, model="majority", task="lifetime")
    spec = compile_policy(life, tmp_path / "life.table", kind="table", ctx=(8, 2))
    assert spec["table"]["entries"] > 0 and spec["table"]["distilled_from"] == [str(runs["a"])]
    # the context lengths asked for: those that kept entries are stored, the others dropped
    t = spec["table"]
    assert sorted(t["context"] + t["context_without_entries"], reverse=True) == [8, 2]
    assert all(t["per_level"][f"context {k}"] > 0 for k in t["context"])
    r = evaluate_policy(tmp_path / "life.table", [runs["b"]], "cross-run")
    base = evaluate(majority, [runs["b"]], "cross-run")["top1"]
    assert r["model"] == "policy:table" and r["events"] > 1000
    assert r["top1"] > base + 0.05, (r["top1"], base)
    assert len(r["confusion"]) == 6
    # dropping the lengths without entries changed no prediction: the table compiled with only
    # the kept lengths scores the same
    kept = compile_policy(life, tmp_path / "kept.table", kind="table", ctx=t["context"])
    again = evaluate_policy(tmp_path / "kept.table", [runs["b"]], "cross-run")
    assert kept["table"]["context"] == t["context"] and again["top1"] == r["top1"]
    assert again["confusion"] == r["confusion"]


def test_table_lookups_equal_a_plain_back_off_over_its_entries(runs, tmp_path):
    """The runtime's one-probe lookup ((site, token) slot, its context flags, the context filter,
    bucket probing) answers what a dictionary back-off over the same entries answers: the most
    specific level whose key the table holds, else the default."""
    from safetensors.numpy import load_file
    from heapcast.forecast.dataset import load_features
    from heapcast.forecast.tasks import make_task
    from heapcast.policy.compile import CTX_LEVEL, table_inputs
    model = tmp_path / "next.safetensors"
    train([runs["a"]], model, model="ngram", task="next")
    sizes = {}
    for m in (1, 2):
        spec = compile_policy(model, tmp_path / f"next{m}.table", kind="table", ctx=(16, 4),
                              min_count=m)
        sizes[m] = spec["table"]["entries"]
    assert sizes[2] < sizes[1]
    path = tmp_path / "next1.table"
    # the slots start on a cache line of the file: the runtime probes them in place
    blob = path.read_bytes()
    hlen = int.from_bytes(blob[:8], "little")
    assert (8 + hlen + json.loads(blob[8:8 + hlen])["tab.slots"]["data_offsets"][0]) % 64 == 0
    t = load_file(str(path))
    filled = t["tab.slots"][:, 0] != 0
    entry = dict(zip(t["tab.slots"][filled, 0].tolist(),
                     (t["tab.slots"][filled, 1] & np.uint64(0xFFFFFF)).tolist()))
    data = make_task(load_features([runs["b"]], "thread"), "next", "rich")
    site, tok = table_inputs(data)
    pos = data.position_in_stream()
    ctx = context_hashes(data.tokens, pos, (16, 4))
    levels = [table_key(CTX_LEVEL + k, site, tok, ctx[k]) for k in (16, 4)]
    levels += [table_key(2, site, tok, 0), table_key(1, site, tok * 0, 0),
               table_key(0, site * 0, tok, 0)]
    want = np.ones(len(data), bool)
    native = predict_streams(Policy(path), data, want)
    expected = np.tile(t["tab.default"].astype(np.int64), (len(data), 1))
    answered = np.zeros(len(levels), np.int64)
    for i, keys in reversed(list(enumerate(levels))):   # the most specific present wins
        hit = np.array([k in entry for k in keys.tolist()])
        lists = np.array([entry.get(k, 0) for k in keys.tolist()])
        expected[hit] = t["tab.lists"][lists[hit]]
        answered[i] = hit.sum()
    assert len(data) > 1000 and (answered[:2] > 0).all(), answered   # both context levels used
    assert np.array_equal(native, expected)


def test_keys_and_tokens_match_the_trace_tools():
    lib = library()
    rng = np.random.default_rng(1)
    sizes = np.concatenate([np.arange(70), rng.integers(0, 1 << 40, 500)]).astype(np.uint64)
    for op in (0, 1, 2, 3, 4):
        native = [lib.hc_rich_token(op, int(s), 0, 0) for s in sizes]
        assert native == (op * 125 + fine_size_class(sizes)).tolist()
    assert lib.hc_rich_token(4, 0, 1, 0) == 1000 and lib.hc_rich_token(4, 64, 0, 1) == 1001
    crc, offs = 0x1234ABCD, rng.integers(0, 1 << 30, 100).astype(np.uint64)
    k = mix64((np.uint64(crc) << np.uint64(40)) ^ offs)
    folded = ((k >> np.uint64(32)) ^ k).astype(np.uint32)
    assert [lib.hc_site_key(crc, int(o)) for o in offs] == folded.tolist()
    site = rng.integers(0, 1 << 32, 200).astype(np.uint32)
    tok = rng.integers(0, 1002, 200).astype(np.uint32)
    ctx = rng.integers(0, 1 << 63, 200).astype(np.uint64)
    for level in (0, 1, 2, 104):
        assert [lib.hc_table_key(level, int(s), int(t), int(c)) for s, t, c in
                zip(site, tok, ctx)] == table_key(level, site, tok, ctx).tolist()
    # the context of the first rows of a stream is padded
    h = context_hashes(np.array([5, 6, 7], np.uint16), np.array([0, 1, 2]), (2,))[2]
    assert h[0] != h[1] != h[2]
    # several lengths at some rows, in one pass, as the rolling hash computed row by row
    tokens = rng.integers(0, 1002, 500).astype(np.uint16)
    pos = np.r_[np.arange(300), np.arange(200)]        # two streams
    rows = np.sort(rng.choice(500, 120, replace=False))
    many = context_hashes(tokens, pos, (9, 2, 4), rows)
    for k in (2, 4, 9):
        want = []
        for r in rows.tolist():
            v = 0
            for i in range(1, k + 1):
                t = int(tokens[r - i]) if pos[r] >= i else _PAD_TOKEN
                v = (v * int(_P) + t + 1) % 2**64
            want.append(v)
        assert many[k].tolist() == want, k


def test_the_runtime_crc32_is_zlibs():
    """hc_crc32 (the folding path on CPUs with PCLMULQDQ, slicing on the rest of the bytes) checks
    POLICY files against zlib's CRC-32: every length, alignment and starting value agrees."""
    lib = library()
    lib.hc_crc32.restype = ctypes.c_uint32
    lib.hc_crc32.argtypes = [ctypes.c_uint32, ctypes.c_char_p, ctypes.c_size_t]
    rng = np.random.default_rng(3)
    data = rng.integers(0, 256, 1 << 20, np.uint8).tobytes()
    lengths = list(range(0, 300)) + [1023, 1024, 4097, 65536 + 15, len(data) - 63]
    for n in lengths:
        off, start = int(rng.integers(0, 64)), int(rng.integers(0, 1 << 32))
        chunk = data[off:off + n]
        assert lib.hc_crc32(0, chunk, len(chunk)) == zlib.crc32(chunk), n
        assert lib.hc_crc32(start, chunk, len(chunk)) == zlib.crc32(chunk, start), n


def _mapped_base(name: str) -> int:
    """Load address of the library whose file is `name`, from /proc/self/maps."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and parts[5].endswith("/" + name) and int(parts[2], 16) == 0:
                return int(parts[0].split("-")[0], 16)
    raise AssertionError(f"{name} is not mapped")


def test_call_sites_of_this_process_resolve_as_recorded_keys():
    lib = library()
    lib.hc_site_of_address.restype = ctypes.c_uint32
    lib.hc_site_of_address.argtypes = [ctypes.c_uint64]
    libc = ctypes.CDLL("libc.so.6")
    addr = ctypes.cast(libc.malloc, ctypes.c_void_p).value
    base = _mapped_base("libc.so.6")
    ra = addr + 5
    want = lib.hc_site_key(zlib.crc32(b"libc.so.6"), ra - base)
    assert lib.hc_site_of_address(ra) == want != 0
    assert lib.hc_site_of_address(ra) == want          # cached
    assert lib.hc_site_of_address(8) == 0              # in no module


def test_a_fork_child_keys_call_sites_while_the_loaders_lock_is_held(build):
    """glibc's fork leaves dl_iterate_phdr's lock as another thread held it: a child forked then
    must key the call sites of a library loaded since the runtime last looked (the policy runtime
    runs inside the recorder and the allocator of any child) without that lock."""
    lib = library()
    lib.hc_site_of_address.restype = ctypes.c_uint32
    lib.hc_site_of_address.argtypes = [ctypes.c_uint64]
    assert lib.hc_site_of_address(ctypes.cast(ctypes.CDLL(None).malloc, ctypes.c_void_p).value) != 0
    extra_path = build("fork_phdr", "-DLIB", "-shared", "-fPIC")
    extra = ctypes.CDLL(str(extra_path))        # loaded after the runtime's map was made
    ra = ctypes.cast(extra.extra_alloc, ctypes.c_void_p).value + 5
    want = lib.hc_site_key(zlib.crc32(extra_path.name.encode()), ra - _mapped_base(extra_path.name))
    libdl = ctypes.CDLL(None)
    callback_t = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    inside, go = threading.Event(), threading.Event()

    def hold(info, size, data):
        inside.set()
        go.wait(30)
        return 1

    callback = callback_t(hold)
    holder = threading.Thread(target=libdl.dl_iterate_phdr, args=(callback, None))
    holder.start()
    try:
        assert inside.wait(10)
        pid = os.fork()
        if pid == 0:
            os._exit(0 if lib.hc_site_of_address(ra) == want else 1)
        deadline = time.monotonic() + 10
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        if done[0] == 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        assert done[0] == pid, "the child hung"
        assert os.waitstatus_to_exitcode(done[1]) == 0, "the child keyed the call site wrongly"
    finally:
        go.set()
        holder.join()
    assert lib.hc_site_of_address(ra) == want != 0


def test_predictions_are_deterministic_across_runs_and_threads(runs, rnn_policy, monkeypatch):
    """predict_streams runs a trace's streams side by side (one thread per CPU): the same
    predictions as one stream after another, and as four callers at once."""
    data = make_task(load_features([runs["b"], runs["a"]], "thread"), "next", "rich")
    want = data.labels >= 0
    assert len(data.offsets) - 1 >= 2
    first = predict_streams(Policy(rnn_policy), data, want)
    assert np.array_equal(first, predict_streams(Policy(rnn_policy), data, want))
    with monkeypatch.context() as m:   # one CPU: the streams one after another
        m.setattr(os, "sched_getaffinity", lambda pid: {0})
        assert np.array_equal(first, predict_streams(Policy(rnn_policy), data, want))
    with monkeypatch.context() as m:   # more threads than streams
        m.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
        assert np.array_equal(first, predict_streams(Policy(rnn_policy), data, want))
    # four threads running the streams at once (ctypes releases the GIL)
    policy = Policy(rnn_policy)
    results = [None] * 4

    def work(i):
        results[i] = predict_streams(policy, data, want)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(np.array_equal(first, r) for r in results)


def test_damaged_and_mismatched_policies_are_refused(runs, gru, rnn_policy, tmp_path):
    blob = rnn_policy.read_bytes()
    cut = tmp_path / "cut.policy"
    cut.write_bytes(blob[:len(blob) // 2])
    with pytest.raises(PolicyError, match=r"cut\.policy.*(exceeds|data offsets)"):
        Policy(cut)
    flipped = tmp_path / "flipped.policy"
    flipped.write_bytes(blob[:-100] + bytes([blob[-100] ^ 0xFF]) + blob[-99:])
    with pytest.raises(PolicyError, match=r"flipped\.policy: tensor data is corrupt \(CRC-32"):
        Policy(flipped)
    with pytest.raises(PolicyError, match=r"gru\.safetensors: no heapcast_kind"):
        Policy(gru)
    bad_abi = tmp_path / "abi.policy"
    write_policy(bad_abi, {"cfg": cfg_array(abi=7, kind=1)}, {"kind": "table"})
    with pytest.raises(PolicyError, match=r"abi\.policy: cfg\[abi\] is 7"):
        Policy(bad_abi)
    missing = tmp_path / "missing.policy"
    write_policy(missing, {"cfg": cfg_array(abi=ABI, kind=1, task=2, n_labels=6, tab_bits=4)},
                 {"kind": "table"})
    with pytest.raises(PolicyError, match=r"missing\.policy: tensor tab\.slots: expected "
                                          r"uint64\[16, 2\]"):
        Policy(missing)
    with pytest.raises(PolicyError, match="not a regular file|is a directory"):
        Policy(tmp_path)
    # the command line says so in one line, exit status 2
    assert main(["evaluate", str(flipped), str(runs["b"]), "--protocol", "cross-run"]) == 2


def test_compile_refuses_what_it_cannot_compile(runs, tmp_path, capsys):
    ngram = tmp_path / "ng.safetensors"
    train([runs["a"]], ngram, model="ngram", task="next")
    with pytest.raises(PolicyError, match=r"ng\.safetensors: a 'ngram' model; --kind rnn"):
        compile_policy(ngram, tmp_path / "x.policy", kind="rnn")
    with pytest.raises(PolicyError, match="--prune 1.5"):
        compile_policy(ngram, tmp_path / "x.policy", kind="rnn", prune=1.5)
    with pytest.raises(PolicyError, match="--int8 and --prune apply to --kind rnn"):
        compile_policy(ngram, tmp_path / "x.policy", kind="table", int8=True)
    # a table needs traces: the training traces are found from the model's metadata
    assert main(["compile", str(ngram), "--kind", "table", "-o", str(tmp_path / "t.policy"),
                 "--json"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert spec["kind"] == "table" and spec["model"]["kind"] == "ngram"
    assert len(spec["model"]["sha256"]) == 64
    assert main(["evaluate", str(tmp_path / "t.policy"), str(runs["b"]), "--protocol",
                 "cross-run", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "policy:table"


def test_compile_onnx_from_the_command_line(gru, tmp_path, capsys):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from heapcast.policy.onnx_export import onnx_metadata
    assert main(["compile", str(gru), "--onnx", "-o", str(tmp_path / "step.onnx")]) == 0
    assert onnx_metadata(tmp_path / "step.onnx")["task"] == "next"


def test_a_policy_is_the_same_bytes_every_time_it_is_written(tmp_path):
    """The header's keys (tensors, then every metadata string) come sorted: safetensors writes
    its metadata in a hash map's order, and the same model compiled twice gave other bytes. The
    padded, aligned layout is kept."""
    import json
    import struct
    tensors = {"cfg": cfg_array(abi=ABI, kind=1, task=2, n_labels=6, tab_bits=4),
               "w": np.arange(64, dtype=np.float32), "keys": np.arange(16, dtype=np.uint64)}
    spec = {"kind": "table", "model": {"sha256": "ab" * 32}, "note": "é\"\\\n"}
    blobs = []
    for i in range(4):
        write_policy(tmp_path / f"{i}.policy", tensors, spec, align="w")
        blobs.append((tmp_path / f"{i}.policy").read_bytes())
    assert all(b == blobs[0] for b in blobs)
    n = struct.unpack("<Q", blobs[0][:8])[0]
    header = json.loads(blobs[0][8:8 + n])
    assert list(header) == sorted(header)
    assert list(header["__metadata__"]) == sorted(header["__metadata__"])
    assert (8 + n + header["w"]["data_offsets"][0]) % 64 == 0
    assert json.loads(header["__metadata__"]["heapcast_policy"])["note"] == "é\"\\\n"


def test_a_policy_is_written_in_safetensors_own_layout_from_the_arrays(tmp_path):
    """write_policy writes the file itself, from the arrays' memory (safetensors' `save` built
    it in memory four times over): the data section is byte for byte the one safetensors lays
    out, the header parses with safetensors, and every dtype and shape (0-d and empty too) reads
    back; the CRC in the header is the data section's."""
    import json
    import struct
    import zlib
    from safetensors import safe_open
    from safetensors.numpy import save
    rng = np.random.default_rng(2)
    tensors = {"cfg": cfg_array(abi=ABI, kind=1, task=2, n_labels=6, tab_bits=4),
               "a.u64": rng.integers(0, 2**63, (3, 5), dtype=np.uint64),
               "b.i64": np.array(-7, np.int64), "c.f64": rng.random(3),
               "d.f32": rng.random((2, 3)).astype(np.float32),
               "e.u32": np.arange(3, dtype=np.uint32),
               "f.i32": np.zeros(0, np.int32), "g.u16": np.arange(5, dtype=np.uint16),
               "h.i16": -np.arange(3, dtype=np.int16), "i.i8": np.arange(-3, 4, dtype=np.int8),
               "j.u8": np.arange(7, dtype=np.uint8), "k.bool": np.array([True, False, True]),
               "l.f16": np.arange(3, dtype=np.float16), "m.big": np.arange(4, dtype=">i4")}
    path = write_policy(tmp_path / "all.policy", tensors, {"kind": "table"}, align="e.u32")
    blob = path.read_bytes()
    n = struct.unpack("<Q", blob[:8])[0]
    assert n % 8 == 0 and (8 + n + json.loads(blob[8:8 + n])["e.u32"]["data_offsets"][0]) % 64 == 0
    theirs = save({k: np.ascontiguousarray(v, v.dtype.newbyteorder("<")) for k, v in
                   tensors.items()})
    assert blob[8 + n:] == theirs[8 + struct.unpack("<Q", theirs[:8])[0]:]
    with safe_open(str(path), framework="numpy") as f:
        meta = f.metadata()
        for name, want in tensors.items():
            got = f.get_tensor(name)     # (a 0-d array is stored as one value, as before)
            assert np.array_equal(got, np.atleast_1d(want)), name
    assert int(meta["heapcast_crc32"]) == zlib.crc32(blob[8 + n:])
    # A tensor whose offset no padding of the header can align: written unpadded, readable.
    odd = write_policy(tmp_path / "odd.policy", tensors, {"kind": "table"}, align="j.u8")
    n = struct.unpack("<Q", odd.read_bytes()[:8])[0]
    header = json.loads(odd.read_bytes()[8:8 + n])
    assert header["j.u8"]["data_offsets"][0] % 8 and header["__metadata__"]["heapcast_pad"] == ""
    with safe_open(str(odd), framework="numpy") as f:
        assert np.array_equal(f.get_tensor("j.u8"), tensors["j.u8"])
    with pytest.raises(PolicyError, match="dtype complex128, which a POLICY cannot hold"):
        write_policy(tmp_path / "c.policy", {"z": np.zeros(2, complex)}, {"kind": "table"})


def test_a_library_in_an_unloaded_ones_place_is_keyed_as_itself(build):
    """dlclose forgets the runtime's module map and its cache of call sites: an address of a
    library loaded where an unloaded one was is keyed by the new one's name and base, not by
    the old one's (the recorder's and the allocator's policies key the sites of a program's
    plugins). The runtime's dlclose is exported where it is preloaded."""
    lib = library()
    alpha = build("dl_loader", "-DLIB", "-shared", "-fPIC")
    beta = build("dl_loader", "-DLIB", "-DBETA", "-shared", "-fPIC")
    where = str(Path(lib._name).parent)
    exe = build("site_swap", f"-L{where}", f"-Wl,-rpath,{where}", "-Wl,--no-as-needed",
                "-lheapcast_policy", "-ldl")
    done = subprocess.run([str(exe), str(alpha), str(beta)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    rows = {name: (int(ra, 16), int(base, 16), int(key))
            for name, ra, base, key in (line.split() for line in done.stdout.splitlines())}
    for name, path in (("alpha", alpha), ("beta", beta)):
        ra, base, key = rows[name]
        assert key == lib.hc_site_key(zlib.crc32(path.name.encode()), ra - base) != 0, name
    assert rows["alpha"][1] == rows["beta"][1], "the loader put beta elsewhere: nothing tested"
    for so in ("libheapcast_recorder.so", "libheapcast_alloc.so"):
        syms = subprocess.run(["nm", "-D", "--defined-only", str(Path(where) / so)],
                              capture_output=True, text=True, check=True).stdout.split()
        assert "dlclose" in syms and "hc_modules_changed" not in syms, so
