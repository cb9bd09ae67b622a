"""Shared fixtures of the end-to-end tests: C programs compiled once per session, the `heapcast`
command line, and a way to pick out the heap calls a program made itself."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

PROGRAMS = Path(__file__).parent / "programs"
# -fno-builtin: gcc would otherwise turn realloc(NULL, n) into malloc and drop free(NULL).
CFLAGS = ["-O1", "-g", "-fno-builtin", "-fno-omit-frame-pointer", "-pthread",
          "-Wno-use-after-free", "-Wno-alloc-size-larger-than", "-Wno-deprecated-declarations"]
# Runs heapcast's own command-line entry point with this interpreter (the installed one).
CLI = [sys.executable, "-c", "import sys; from heapcast.cli import main; sys.exit(main())"]


@pytest.fixture(scope="session")
def build(tmp_path_factory):
    """build(name, *flags) -> path of tests/programs/<name>.c compiled with gcc (cached per
    session and per flags)."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed: the end-to-end tests compile C programs")
    out_dir = tmp_path_factory.mktemp("programs")
    built = {}

    def _build(name: str, *flags: str) -> Path:
        key = (name, flags)
        if key not in built:
            exe = out_dir / f"{name}{len(built)}"
            cmd = ["gcc", *CFLAGS, *flags, "-o", str(exe), str(PROGRAMS / f"{name}.c")]
            done = subprocess.run(cmd, capture_output=True, text=True)
            assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stderr}"
            built[key] = exe
        return built[key]

    return _build


def assigner_table(assigner):
    """A LocationAssigner's location table, its rows joined (a conversion writes them in the
    parts it built them in: LocationAssigner.table_parts)."""
    from heapcast.trace.model import LocationTable
    offsets, flats = assigner.table_parts()
    return LocationTable(offsets, np.concatenate(flats))


def record_inputs(exe, out_dir: Path, inputs) -> dict:
    """Records `exe` once per (name, N, SEED) of `inputs` (`exe N SEED`) into out_dir/name;
    returns name -> trace directory."""
    import heapcast
    out = {}
    for name, n, seed in inputs:
        r = heapcast.record([exe, str(n), str(seed)], output=out_dir / name, progress=False)
        assert r.exit_code == 0
        out[name] = out_dir / name
    return out


def run_untraced(cmd, **kwargs) -> subprocess.CompletedProcess:
    """Runs cmd without the recorder (LD_PRELOAD and HEAPCAST_* removed), capturing its output."""
    env = {k: v for k, v in os.environ.items()
           if k != "LD_PRELOAD" and not k.startswith("HEAPCAST_")}
    return subprocess.run([str(c) for c in cmd], env=env, capture_output=True, timeout=60, **kwargs)


@pytest.fixture
def untraced():
    """untraced(cmd) -> CompletedProcess of cmd run without the recorder (stdout, stderr: bytes)."""
    return run_untraced


@pytest.fixture
def cli_argv():
    """The argv prefix that runs the `heapcast` command (for Popen)."""
    return list(CLI)


@pytest.fixture
def cli(cli_argv):
    """cli(*args) -> CompletedProcess of `heapcast ARGS...` (text output captured)."""
    def _cli(*args, **kwargs):
        return subprocess.run([*cli_argv, *map(str, args)], capture_output=True, text=True,
                              timeout=120, **kwargs)
    return _cli


def exe_range(process) -> tuple[int, int]:
    """Address range of the process's main executable, from its module map."""
    exe = os.path.realpath(process.exe)
    for snapshot in process.modules:
        for m in snapshot.modules:
            if m.path == exe:
                return m.start, m.end
    raise AssertionError(f"{exe} is not in the module map of process {process.pid}")


def own_events(process) -> np.ndarray:
    """The events of `process` whose call site lies in its main executable: the heap calls the
    program made itself, without those libc makes for it (stdio buffers, thread set-up)."""
    ev = process.events
    lo, hi = exe_range(process)
    callsite = process.locations.callsites[ev["loc"]]
    return ev[(callsite >= lo) & (callsite < hi)]


@pytest.fixture
def own():
    """own(process) -> the events the program's own code made (see own_events)."""
    return own_events


@pytest.fixture(scope="session")
def frag_trace(build, tmp_path_factory):
    """(program, trace) of tests/programs/alloc_frag.c, a pattern that fragments glibc,
    recorded once: the allocator tests run it under the oracle of its own recording."""
    import heapcast
    prog = build("alloc_frag")
    out = tmp_path_factory.mktemp("frag") / "frag.trace"
    assert heapcast.record([prog], output=out).exit_code == 0
    return prog, out
