"""Python call sites: CPython programs recorded end to end, each heap block attributed to the
Python line that allocated it (tests/programs/python/lines.py marks its lines "# at: NAME")."""
from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

import heapcast
from heapcast.stats import format_stats
from heapcast.symbolize import Symbolizer, python_symbol
from heapcast.trace.format import ALLOC_OPS
from heapcast.trace.model import is_python_frame

SCRIPT = Path(__file__).parent / "programs" / "python" / "lines.py"
PYFRAMES_H = Path(__file__).parents[1] / "native" / "recorder" / "pyframes.h"
LINES = {m.group(1): i for i, text in enumerate(SCRIPT.read_text().splitlines(), 1)
         if (m := re.search(r"# at: (\w+)", text))}

pytestmark = pytest.mark.skipif(sys.version_info[:2] != (3, 11) or hasattr(sys, "gettotalrefcount"),
                                reason="Python frames are read from CPython 3.11 release builds")


def record(tmp_path, *what, pymalloc=True, **kw):
    env = {} if pymalloc else {"PYTHONMALLOC": "malloc"}
    r = heapcast.record([sys.executable, SCRIPT, *what], output=tmp_path / "t", env=env,
                        progress=False, **kw)
    assert r.exit_code == 0
    trace = heapcast.load(r.path)
    assert trace.lost_events == 0 and not trace.truncated
    return trace


def blocks_of_size(trace, size: int) -> list:
    """(process, event) of every allocation of exactly `size` bytes (malloc, or realloc from NULL
    under PYTHONMALLOC=malloc)."""
    out = []
    for p in trace.processes:
        ev = p.events
        for i in np.flatnonzero((ev["size"] == size) & np.isin(ev["op"], ALLOC_OPS)):
            out.append((p, ev[i]))
    return out


def frames_of(p, loc: int) -> list:
    """The Python frames (function, file, line) of a location, innermost first."""
    fr = p.locations.frames(int(loc))
    return [python_symbol(p, f) for f in fr[is_python_frame(fr)]]


def site(p, loc: int):
    """The innermost Python frame of a location (its call site without --stacks)."""
    frames = frames_of(p, loc)
    assert frames, f"location {loc} has no Python frame"
    return frames[0]


def assert_at(p, e, name: str, function: str) -> None:
    s = site(p, e["loc"])
    assert (Path(s.module).name, s.offset, s.function) == (SCRIPT.name, LINES[name], function)


def test_layout_matches_the_interpreter_headers(tmp_path):
    """pyframes.h's CPython 3.11 offsets are the interpreter's own (its internal headers)."""
    include = Path(sysconfig.get_paths()["include"])
    if not (include / "internal" / "pycore_frame.h").exists():
        pytest.skip("this Python has no internal headers")
    fields = {
        "PY_RT_TSTATE_CURRENT": "offsetof(_PyRuntimeState, gilstate.tstate_current)",
        "PY_RT_FINALIZING": "offsetof(_PyRuntimeState, _finalizing)",
        "PY_TS_CFRAME": "offsetof(PyThreadState, cframe)",
        "PY_TS_THREAD_ID": "offsetof(PyThreadState, thread_id)",
        "PY_CF_CURRENT": "offsetof(_PyCFrame, current_frame)",
        "PY_FR_CODE": "offsetof(_PyInterpreterFrame, f_code)",
        "PY_FR_PREVIOUS": "offsetof(_PyInterpreterFrame, previous)",
        "PY_FR_PREV_INSTR": "offsetof(_PyInterpreterFrame, prev_instr)",
        "PY_FR_IS_ENTRY": "offsetof(_PyInterpreterFrame, is_entry)",
        "PY_FR_OWNER": "offsetof(_PyInterpreterFrame, owner)",
        "PY_OWNED_BY_GENERATOR": "FRAME_OWNED_BY_GENERATOR",
        "PY_CO_FIRSTLINENO": "offsetof(PyCodeObject, co_firstlineno)",
        "PY_CO_FILENAME": "offsetof(PyCodeObject, co_filename)",
        "PY_CO_QUALNAME": "offsetof(PyCodeObject, co_qualname)",
        "PY_CO_LINETABLE": "offsetof(PyCodeObject, co_linetable)",
        "PY_CO_FIRSTTRACEABLE": "offsetof(PyCodeObject, _co_firsttraceable)",
        "PY_CO_CODE": "offsetof(PyCodeObject, co_code_adaptive)",
        "PY_STR_LENGTH": "offsetof(PyASCIIObject, length)",
        "PY_STR_STATE": "offsetof(PyASCIIObject, state)",
        "PY_STR_ASCII_DATA": "sizeof(PyASCIIObject)",
        "PY_STR_DATA": "sizeof(PyCompactUnicodeObject)",
    }
    defined = dict(re.findall(r"#define (PY_\w+) (\d+)", PYFRAMES_H.read_text()))
    assert set(fields) <= set(defined)
    src = tmp_path / "layout.c"
    src.write_text("#define Py_BUILD_CORE 1\n#include <Python.h>\n#include <internal/pycore_frame.h>\n"
                   "#include <internal/pycore_runtime.h>\n"
                   "#include <stddef.h>\n" + "".join(
                       f'_Static_assert({expr} == {defined[name]}, "{name}");\n'
                       for name, expr in fields.items()))
    done = subprocess.run(["gcc", "-fsyntax-only", f"-I{include}", str(src)], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("pymalloc", [True, False], ids=["pymalloc", "PYTHONMALLOC=malloc"])
def test_known_lines_end_to_end(tmp_path, pymalloc):
    trace = record(tmp_path, "basic", pymalloc=pymalloc)
    (p, e), = blocks_of_size(trace, 100_004)
    assert_at(p, e, "dict_big", "dict_growth")
    comps = blocks_of_size(trace, 1002)
    assert len(comps) >= 300
    for p, e in comps[-300:]:
        assert_at(p, e, "listcomp", "listcomp.<locals>.<listcomp>")
    # stats: the script's own lines among the top call sites
    d = heapcast.stats(trace, top=50)
    named = {(Path(s["module"]).name, s["offset"], s["function"]): s
             for s in d["top_callsites_by_bytes"] if s["python"]}
    assert named[(SCRIPT.name, LINES["dict_big"], "dict_growth")]["bytes"] >= 100_004
    assert named[(SCRIPT.name, LINES["listcomp"], "listcomp.<locals>.<listcomp>")]["count"] >= 300
    assert named[(SCRIPT.name, LINES["dict"], "dict_growth")]["bytes"] > 50_000  # its resizes
    assert f"{SCRIPT}:{LINES['dict_big']}" in format_stats(d)
    # without --stacks a location still holds the Python stack: the program's own lines under
    # library code (dict_growth's keep.append is the script's own, main and <module> too)
    (p, e), = blocks_of_size(trace, 100_004)
    assert [s.function for s in frames_of(p, e["loc"])] == ["dict_growth", "main", "<module>"]
    own = {(Path(s["module"]).name, s["offset"]) for s in d["top_program_lines_by_bytes"]}
    assert (SCRIPT.name, LINES["dict_big"]) in own
    assert not any(s["module"].startswith("<frozen") for s in d["top_program_lines_by_bytes"])


def test_threads_each_see_their_own_frames(tmp_path):
    trace = record(tmp_path, "threads")
    tids = set()
    for k in range(4):
        found = blocks_of_size(trace, 70_001 + k)
        assert len(found) == 20
        for p, e in found:
            assert_at(p, e, "worker", "worker")
            tids.add(int(e["tid"]))
    assert len(tids) == 4 and 0 not in tids   # four threads, none of them the main one


def test_generator_and_async(tmp_path):
    trace = record(tmp_path, "gen")
    for i in range(3):
        (p, e), = blocks_of_size(trace, 110_002 + i)
        assert_at(p, e, "gen", "gen")
        (p, e), = blocks_of_size(trace, 120_002 + i + 1)
        assert_at(p, e, "consume", "consume")
        (p, e), = blocks_of_size(trace, 130_002 + i)
        assert_at(p, e, "task", "task")


@pytest.mark.parametrize("unwind", ["fp", "dwarf"])
def test_exception_unwinds_frames_in_stacks(tmp_path, unwind):
    trace = record(tmp_path, "exc", stacks=24, unwind=unwind)
    (p, e), = blocks_of_size(trace, 140_002)
    assert [s.function for s in frames_of(p, e["loc"])] == ["deep"] * 6 + ["catcher", "main",
                                                                           "<module>"]
    assert_at(p, e, "deep", "deep")
    (p, e), = blocks_of_size(trace, 150_002)   # after the exception: no frame of deep is left
    assert [s.function for s in frames_of(p, e["loc"])] == ["catcher", "main", "<module>"]
    assert_at(p, e, "catcher", "catcher")
    if unwind == "dwarf":   # complete native stacks: Python frames sit where the interpreter ran them
        syms = Symbolizer().symbolize(p, p.locations.frames(int(e["loc"])))
        names = [s.function for s in syms]
        assert names.index("<module>") < names.index("PyEval_EvalCode")


def test_fork_and_exec(tmp_path):
    trace = record(tmp_path, "fork", "exec")
    (child, e), = blocks_of_size(trace, 160_002)
    assert child.forked_from and child.pid != trace.processes[0].pid
    assert_at(child, e, "child", "child_work")
    (p, e), = blocks_of_size(trace, 150_002)     # in the image that exec started
    assert p.image == 1
    assert_at(p, e, "catcher", "catcher")


def test_c_extension_and_subinterpreter(tmp_path):
    trace = record(tmp_path, "ext", "sub")
    p = trace.processes[0]
    ev = p.events
    at_zlib = [i for i in np.flatnonzero(np.isin(ev["op"], ALLOC_OPS))
               if frames_of(p, ev["loc"][i])[:1]
               and frames_of(p, ev["loc"][i])[0].offset == LINES["zlib"]]
    # zlib's deflate state and window (allocated by the C extension, with the GIL released)
    assert sum(int(ev["size"][i]) for i in at_zlib) > 300_000
    (p, e), = blocks_of_size(trace, 170_002)
    s = site(p, e["loc"])
    assert (s.module, s.function, s.offset) == ("<string>", "<module>", 1)


def test_daemon_threads_allocating_while_the_interpreter_exits(tmp_path):
    """Py_Finalize frees the thread states of daemon threads that still run C code: the recorder
    stops reading Python frames then, and the program exits as it would untraced."""
    for k in range(3):
        (tmp_path / str(k)).mkdir()
        trace = record(tmp_path / str(k), "daemon")
        assert trace.processes[0].clean_exit


def test_parquet_export_resolves_python_call_sites(tmp_path):
    import json

    import pyarrow.parquet as pq

    from heapcast.export import export_parquet
    trace = record(tmp_path, "basic")
    table = pq.read_table(export_parquet(trace, tmp_path / "e.parquet"))
    frames = {k: (file, func, line) for k, file, func, line in
              json.loads(table.schema.metadata[b"heapcast.python_frames"])[0]}
    sizes, sites = table.column("size").to_numpy(), table.column("callsite").to_numpy()
    site = int(sites[np.flatnonzero(sizes == 100_004)[0]])
    assert site >> 63 == 1
    assert frames[site & 0xFFFFFFFF] == (str(SCRIPT), "dict_growth", LINES["dict_big"])


def test_no_python_records_native_call_sites(tmp_path):
    trace = record(tmp_path, "basic", python=False)
    p = trace.processes[0]
    assert not p.python_frames and not is_python_frame(p.locations.flat).any()
    (p, e), = blocks_of_size(trace, 100_004)
    assert p.locations.frames(int(e["loc"]))[0] != 0


def test_forecast_keys_of_python_call_sites_are_stable_across_runs(tmp_path):
    """dataset/train/lab key call sites by location_keys: a Python line keys the same in every
    run (file name, function, line; not addresses), and different lines key differently."""
    from heapcast.forecast.features import location_keys
    keys = []
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        trace = record(tmp_path / run, "basic")
        (p, big), = blocks_of_size(trace, 100_004)
        (_, comp) = blocks_of_size(trace, 1002)[-1]
        site_keys, _ = location_keys(p)
        keys.append((int(site_keys[big["loc"]]), int(site_keys[comp["loc"]])))
    assert keys[0] == keys[1] and keys[0][0] != keys[0][1] and 0 not in keys[0]
