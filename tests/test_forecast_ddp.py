"""Multi-process training with torchrun (DistributedDataParallel over gloo on this CPU): the
processes step through their shares of the streams in lockstep, and rank 0 alone writes a model
that has learned the stream."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from heapcast.trace.writer import write_process_file

from test_forecast_models import periodic_trace

torch = pytest.importorskip("torch")


def test_torchrun_two_processes(tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        torchrun = shutil.which("torchrun")
    if not torchrun:
        pytest.skip("torchrun is not installed")
    trace = periodic_trace(periods=400)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    hct = tmp_path / "a" / "periodic.hct"
    write_process_file(hct, trace.processes[0], trace.processes[0].events)
    out = tmp_path / "gru.safetensors"
    cfg = ["--set", "hidden=32", "--set", "batch=8", "--set", "bptt=32", "--set", "lr=0.01",
           "--set", "threads=1", "--set", "warmup=32"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", "-m", "heapcast",
                        "train", str(hct), "--model", "gru", "--epochs", "8", "--quiet", *cfg,
                        "-o", str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr.count("heapcast: trained gru") == 1      # rank 0 speaks for both
    assert "on 2 processes" in r.stderr

    from heapcast.forecast.evaluate import evaluate
    other = tmp_path / "b" / "periodic.hct"    # another recording of the same program
    run_b = periodic_trace(periods=300)
    write_process_file(other, run_b.processes[0], run_b.processes[0].events)
    res = evaluate(out, [other], "cross-run")
    assert res["events"] == 6 * 300           # every event of run b is scored
    assert res["top1"] >= 0.99
