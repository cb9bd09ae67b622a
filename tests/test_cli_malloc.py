"""The heavy subcommands' process runs with glibc's malloc told to keep large blocks
(heapcast.cli.MALLOC_TUNABLES, README "Heavy commands"): the command runs itself once more with
them, and gives GLIBC_TUNABLES back its value for the programs it may start. numpy in it leaves
huge pages alone (heapcast.cli.NUMPY_HUGEPAGE)."""
import json
import os
import subprocess
import sys

import pytest

import heapcast
from heapcast import cli

# A stand-in for the `heapcast` command: it takes the first step of main() for the subcommand
# it is given, then says what its programs would inherit, whether numpy asks for huge pages and
# how many page faults a block of 256 MiB costs after one was freed (numpy arrays, as the
# commands make them). (What the process was started with cannot be read back: ld.so cuts
# GLIBC_TUNABLES up in place.)
PROBE = r"""
import json, os, resource, sys
from heapcast import cli
cli._tune_malloc(sys.argv[1])
import numpy as np   # (after: the commands import it later, as here)
hugepage = bool((getattr(np, "_core", None) or np.core).multiarray._get_madvise_hugepage())
faults = []
for _ in range(3):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = np.ones(32 << 20)          # 256 MiB, written
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    del a
print(json.dumps({"now": os.environ.get("GLIBC_TUNABLES"), "marker": cli._TUNED in os.environ,
                  "faults": faults, "hugepage": hugepage}))
"""


def glibc() -> bool:
    try:
        os.confstr("CS_GNU_LIBC_VERSION")
        return True
    except (ValueError, OSError):
        return False


def probe(verb: str, **env) -> dict:
    full = {k: v for k, v in os.environ.items()
            if k not in ("GLIBC_TUNABLES", "HEAPCAST_MALLOC_TUNING", cli._TUNED,
                         cli.NUMPY_HUGEPAGE)}
    full.update(env)
    p = subprocess.run([sys.executable, "-c", PROBE, verb], env=full, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.mark.skipif(not glibc(), reason="GLIBC_TUNABLES is glibc's")
def test_a_heavy_subcommand_runs_with_the_settings_and_its_programs_do_not():
    out = probe("evaluate")
    assert out["now"] is None and not out["marker"]   # not passed on
    # A freed 256 MiB block is used again: no fresh pages for the second and third (without the
    # settings, each is a mapping of its own, every page of it a fault: below).
    assert out["faults"][1] < 64 and out["faults"][2] < 64, out["faults"]
    plain = probe("evaluate", HEAPCAST_MALLOC_TUNING="0")
    assert min(plain["faults"]) >= 100, plain["faults"]   # 128 huge pages or 65,536 small ones
    light = probe("record")
    assert min(light["faults"]) >= 100, light["faults"]
    theirs = probe("report", GLIBC_TUNABLES="glibc.malloc.arena_max=2")
    assert theirs["now"] == "glibc.malloc.arena_max=2"
    assert theirs["faults"][1] < 64 and theirs["faults"][2] < 64, theirs["faults"]


def test_numpy_in_a_heavy_subcommand_leaves_huge_pages_alone():
    """numpy's default (huge pages for arrays of 4 MiB or more) is kept for the light
    subcommands, with HEAPCAST_MALLOC_TUNING=0, and where the user's environment says."""
    assert probe("evaluate")["hugepage"] is False
    assert probe("stats", GLIBC_TUNABLES="glibc.malloc.trim_threshold=65536")["hugepage"] is False
    assert probe("record")["hugepage"] is True
    assert probe("train", HEAPCAST_MALLOC_TUNING="0")["hugepage"] is True
    assert probe("report", **{cli.NUMPY_HUGEPAGE: "1"})["hugepage"] is True


@pytest.mark.parametrize("theirs, started", [
    (None, cli.MALLOC_TUNABLES),
    ("", cli.MALLOC_TUNABLES),
    ("glibc.malloc.arena_max=2", "glibc.malloc.arena_max=2:" + cli.MALLOC_TUNABLES),
    ("glibc.malloc.trim_threshold=65536", None),    # their own malloc settings: not run again
    ("glibc.malloc.mmap_threshold=65536", None),
])
def test_what_the_command_runs_again_with(monkeypatch, theirs, started):
    seen = []

    class Again(Exception):
        pass

    def execv(path, argv):
        seen.append((path, list(argv), os.environ.get("GLIBC_TUNABLES"), os.environ[cli._TUNED]))
        raise Again
    monkeypatch.setattr(os, "execv", execv)
    monkeypatch.setattr(os, "confstr", lambda name: "glibc 2.36")
    monkeypatch.delenv(cli._TUNED, raising=False)
    monkeypatch.delenv("HEAPCAST_MALLOC_TUNING", raising=False)
    monkeypatch.setenv(cli.NUMPY_HUGEPAGE, "")    # (undone after the test: the call sets it)
    monkeypatch.delenv(cli.NUMPY_HUGEPAGE)
    if theirs is None:
        monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    else:
        monkeypatch.setenv("GLIBC_TUNABLES", theirs)
    if started is None:
        cli._tune_malloc("train")
        assert not seen
        return
    with pytest.raises(Again):
        cli._tune_malloc("train")
    assert seen == [(sys.executable, sys.orig_argv, started,
                     "" if theirs is None else "=" + theirs)]
    # The process run again: GLIBC_TUNABLES as the user had it, the marker gone.
    cli._tune_malloc("train")
    assert os.environ.get("GLIBC_TUNABLES") == theirs and cli._TUNED not in os.environ


def test_recording_and_python_calls_are_never_run_again(monkeypatch, tmp_path):
    def no_exec(*args):
        raise AssertionError(f"execv{args}")
    monkeypatch.setattr(os, "execv", no_exec)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv(cli._TUNED, raising=False)
    for verb in ("record", "finalize", "run", None):   # the program's own environment; --help
        cli._tune_malloc(verb)
    r = heapcast.record([sys.executable, "-c", "pass"], output=tmp_path / "t", progress=False)
    assert r.exit_code == 0
    # main() called from Python code runs in the caller's process, whatever the subcommand.
    assert cli.main(["stats", str(tmp_path / "t")]) == 0
    assert "GLIBC_TUNABLES" not in os.environ


@pytest.mark.skipif(not glibc(), reason="GLIBC_TUNABLES is glibc's")
def test_the_command_itself_gives_the_same_answer(tmp_path, cli_argv):
    r = heapcast.record([sys.executable, "-c", "x = [str(i) for i in range(2000)]"],
                        output=tmp_path / "t", env={"PYTHONMALLOC": "malloc"}, progress=False)
    assert r.exit_code == 0
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", cli._TUNED)}
    runs = [subprocess.run([*cli_argv, "stats", str(tmp_path / "t"), "--json"],
                           env={**env, **extra}, capture_output=True, text=True, timeout=120)
            for extra in ({}, {"HEAPCAST_MALLOC_TUNING": "0"})]
    for p in runs:
        assert p.returncode == 0, p.stderr
    assert json.loads(runs[0].stdout) == json.loads(runs[1].stdout)
