"""Python call sites: CPython programs recorded end to end, each heap block attributed to the
Python line that allocated it (tests/programs/python/lines.py marks its lines "# at: NAME")."""
from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import heapcast
from heapcast.stats import format_stats
from heapcast.stats.symbolize import Symbolizer, python_symbol
from heapcast.trace.format import ALLOC_OPS
from heapcast.trace.model import is_python_frame

SCRIPT = Path(__file__).parent / "programs" / "python" / "lines.py"
PYFRAMES_H = Path(__file__).parents[1] / "native" / "recorder" / "pyframes.h"
LINES = {m.group(1): i for i, text in enumerate(SCRIPT.read_text().splitlines(), 1)
         if (m := re.search(r"# at: (\w+)", text))}



@dataclass(frozen=True)
class Py:
    """A CPython that the recorder reads the frames of."""
    exe: str
    minor: int
    include: str      # its headers (with internal/ where installed)

    @property
    def listcomp(self) -> str:
        """The function a list comprehension runs in: its own before 3.12 (PEP 709 inlines it)."""
        return "listcomp.<locals>.<listcomp>" if self.minor < 12 else "listcomp"


def _interpreters() -> list:
    """pytest params: this Python and, where installed, CPython 3.11, 3.12 and 3.13 (release
    builds; pyenv's, or on PATH); one not found is a skipped param."""
    roots = [os.environ.get("PYENV_ROOT", ""), str(Path.home() / ".pyenv")]
    params, seen = [], set()
    for minor in (11, 12, 13):
        found = [sys.executable] if sys.version_info[:2] == (3, minor) else []
        for root in filter(None, roots):
            found += sorted(glob.glob(f"{root}/versions/3.{minor}.*/bin/python3.{minor}"))
        found.append(f"python3.{minor}")
        py = None
        for exe in found:
            try:
                out = subprocess.run([exe, "-c", "import sys, sysconfig; print(sys.version_info[1], "
                                      "hasattr(sys, 'gettotalrefcount') or "
                                      "bool(sysconfig.get_config_var('Py_GIL_DISABLED')), "
                                      "sysconfig.get_paths()['include'])"],
                                     capture_output=True, text=True, timeout=20)
            except (OSError, subprocess.TimeoutExpired):
                continue
            fields = out.stdout.split(" ", 2) if out.returncode == 0 else []
            if len(fields) == 3 and int(fields[0]) == minor and fields[1] == "False":
                py = Py(exe, minor, fields[2].strip())
                break
        if py is not None and py.exe not in seen:
            seen.add(py.exe)
            params.append(pytest.param(py, id=f"3.{minor}"))
        else:
            params.append(pytest.param(None, id=f"3.{minor}", marks=pytest.mark.skip(
                reason=f"no CPython 3.{minor} release build here")))
    return params


@pytest.fixture(scope="module", params=_interpreters())
def py(request) -> Py:
    return request.param


def record(tmp_path, py: Py, *what, pymalloc=True, pymalloc_objects=False, **kw):
    """Records the script with `what`: under pymalloc (PYTHONMALLOC=malloc if not `pymalloc`),
    and with `pymalloc_objects` its allocations recorded too (record --pymalloc)."""
    env = {} if pymalloc else {"PYTHONMALLOC": "malloc"}
    r = heapcast.record([py.exe, SCRIPT, *what], output=tmp_path / "t", env=env,
                        progress=False, pymalloc=pymalloc_objects, **kw)
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


def record_script(tmp_path, py: Py, name: str, text: str, lo: int, hi: int):
    """Records a script of the test's own (`text`, written as `name`) with the default options
    and returns its one process and its allocations of sizes in [lo, hi), in event order."""
    script = tmp_path / name
    script.write_text(text)
    r = heapcast.record([py.exe, script], output=tmp_path / "t", progress=False)
    assert r.exit_code == 0
    (p,) = heapcast.load(r.path).processes
    ev = p.events
    return p, ev[np.isin(ev["op"], ALLOC_OPS) & (ev["size"] >= lo) & (ev["size"] < hi)]


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


#: pyframes.h's PY_LAYOUT fields as each version's headers name them (None: not in it).
HEADER_FIELDS = {
    "rt_finalizing": ("offsetof(_PyRuntimeState, _finalizing)",) * 3,
    "rt_tstate_current": ("offsetof(_PyRuntimeState, gilstate.tstate_current)", None, None),
    "ts_thread_id": ("offsetof(PyThreadState, thread_id)",) * 3,
    "ts_cframe": ("offsetof(PyThreadState, cframe)",) * 2 + (None,),
    "cf_current": ("offsetof(_PyCFrame, current_frame)",) * 2 + (None,),
    "ts_current_frame": (None, None, "offsetof(PyThreadState, current_frame)"),
    "fr_code": ("offsetof(_PyInterpreterFrame, f_code)",) * 2
               + ("offsetof(_PyInterpreterFrame, f_executable)",),
    "fr_previous": ("offsetof(_PyInterpreterFrame, previous)",) * 3,
    "fr_instr": ("offsetof(_PyInterpreterFrame, prev_instr)",) * 2
                + ("offsetof(_PyInterpreterFrame, instr_ptr)",),
    "fr_is_entry": ("offsetof(_PyInterpreterFrame, is_entry)", None, None),
    "fr_owner": ("offsetof(_PyInterpreterFrame, owner)",) * 3,
    "co_filename": ("offsetof(PyCodeObject, co_filename)",) * 3,
    "co_qualname": ("offsetof(PyCodeObject, co_qualname)",) * 3,
    "co_linetable": ("offsetof(PyCodeObject, co_linetable)",) * 3,
    "co_firsttraceable": ("offsetof(PyCodeObject, _co_firsttraceable)",) * 3,
    "co_code": ("offsetof(PyCodeObject, co_code_adaptive)",) * 3,
    "co_firstlineno": ("offsetof(PyCodeObject, co_firstlineno)",) * 3,
    "bytes_size": ("offsetof(PyVarObject, ob_size)",) * 3,
    "bytes_data": ("offsetof(PyBytesObject, ob_sval)",) * 3,
    "str_length": ("offsetof(PyASCIIObject, length)",) * 3,
    "str_state": ("offsetof(PyASCIIObject, state)",) * 3,
    "str_ascii_data": ("sizeof(PyASCIIObject)",) * 3,
    "str_data": ("sizeof(PyCompactUnicodeObject)",) * 3,
}


def test_layout_matches_the_interpreter_headers(py, tmp_path):
    """pyframes.h's offsets for this CPython version are the interpreter's own (its internal
    headers), and so are the frame owner values it reads."""
    include = Path(py.include)
    if not (include / "internal" / "pycore_frame.h").exists():
        pytest.skip("this Python has no internal headers")
    table = {m.group(1): [int(m.group(k)) for k in (2, 3, 4)] for m in re.finditer(
        r"X\((\w+), (-?\d+), (-?\d+), (-?\d+)\)", PYFRAMES_H.read_text())}
    assert set(table) == set(HEADER_FIELDS)
    k = py.minor - 11
    asserts = []
    for name, exprs in HEADER_FIELDS.items():
        if exprs[k] is None:
            assert table[name][k] == -1, name
        else:
            asserts.append(f'_Static_assert({exprs[k]} == {table[name][k]}, "{name}");')
    owners = {"PY_OWNED_BY_GENERATOR": "FRAME_OWNED_BY_GENERATOR"}
    if py.minor >= 12:
        owners["PY_OWNED_BY_CSTACK"] = "FRAME_OWNED_BY_CSTACK"
    defined = dict(re.findall(r"#define (PY_\w+) (\d+)", PYFRAMES_H.read_text()))
    asserts += [f'_Static_assert({expr} == {defined[name]}, "{name}");'
                for name, expr in owners.items()]
    asserts.append(f'_Static_assert(offsetof(PyObject, ob_type) == {defined["PY_OB_TYPE"]}, "ob");')
    # pyframes.h's struct py_range is CPython's PyCodeAddressRange, which it hands to
    # _PyCode_CheckLineNumber
    asserts += [f'_Static_assert({expr} == {value}, "py_range");' for expr, value in (
        ("sizeof(PyCodeAddressRange)", 40), ("offsetof(PyCodeAddressRange, ar_end)", 4),
        ("offsetof(PyCodeAddressRange, ar_line)", 8),
        ("offsetof(PyCodeAddressRange, opaque.computed_line)", 16),
        ("offsetof(PyCodeAddressRange, opaque.lo_next)", 24),
        ("offsetof(PyCodeAddressRange, opaque.limit)", 32))]
    src = tmp_path / "layout.c"
    src.write_text("#define Py_BUILD_CORE 1\n#include <Python.h>\n#include <internal/pycore_frame.h>\n"
                   "#include <internal/pycore_runtime.h>\n#include <stddef.h>\n"
                   + "\n".join(asserts) + "\n")
    done = subprocess.run(["gcc", "-fsyntax-only", f"-I{include}", str(src)], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("pymalloc", [True, False], ids=["pymalloc", "PYTHONMALLOC=malloc"])
def test_known_lines_end_to_end(py, tmp_path, pymalloc):
    trace = record(tmp_path, py, "basic", pymalloc=pymalloc)
    (p, e), = blocks_of_size(trace, 100_004)
    assert_at(p, e, "dict_big", "dict_growth")
    comps = blocks_of_size(trace, 1002)
    assert len(comps) >= 300
    for p, e in comps[-300:]:
        assert_at(p, e, "listcomp", py.listcomp)
    # stats: the script's own lines among the top call sites
    d = heapcast.stats(trace, top=50)
    named = {(Path(s["module"]).name, s["offset"], s["function"]): s
             for s in d["top_callsites_by_bytes"] if s["python"]}
    assert named[(SCRIPT.name, LINES["dict_big"], "dict_growth")]["bytes"] >= 100_004
    assert named[(SCRIPT.name, LINES["listcomp"], py.listcomp)]["count"] >= 300
    assert named[(SCRIPT.name, LINES["dict"], "dict_growth")]["bytes"] > 50_000  # its resizes
    assert f"{SCRIPT}:{LINES['dict_big']}" in format_stats(d)
    # without --stacks a location still holds the Python stack: the program's own lines under
    # library code (dict_growth's keep.append is the script's own, main and <module> too)
    (p, e), = blocks_of_size(trace, 100_004)
    assert [s.function for s in frames_of(p, e["loc"])] == ["dict_growth", "main", "<module>"]
    own = {(Path(s["module"]).name, s["offset"]) for s in d["top_program_lines_by_bytes"]}
    assert (SCRIPT.name, LINES["dict_big"]) in own
    assert not any(s["module"].startswith("<frozen") for s in d["top_program_lines_by_bytes"])


def test_threads_each_see_their_own_frames(py, tmp_path):
    trace = record(tmp_path, py, "threads")
    tids = set()
    for k in range(4):
        found = blocks_of_size(trace, 70_001 + k)
        assert len(found) == 20
        for p, e in found:
            assert_at(p, e, "worker", "worker")
            tids.add(int(e["tid"]))
    assert len(tids) == 4 and 0 not in tids   # four threads, none of them the main one


def test_generator_and_async(py, tmp_path):
    trace = record(tmp_path, py, "gen")
    for i in range(3):
        (p, e), = blocks_of_size(trace, 110_002 + i)
        assert_at(p, e, "gen", "gen")
        (p, e), = blocks_of_size(trace, 120_002 + i + 1)
        assert_at(p, e, "consume", "consume")
        (p, e), = blocks_of_size(trace, 130_002 + i)
        assert_at(p, e, "task", "task")


@pytest.mark.parametrize("unwind", ["fp", "dwarf"])
def test_exception_unwinds_frames_in_stacks(py, tmp_path, unwind):
    trace = record(tmp_path, py, "exc", stacks=24, unwind=unwind)
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


def test_fork_and_exec(py, tmp_path):
    trace = record(tmp_path, py, "fork", "exec")
    (child, e), = blocks_of_size(trace, 160_002)
    assert child.forked_from and child.pid != trace.processes[0].pid
    assert_at(child, e, "child", "child_work")
    (p, e), = blocks_of_size(trace, 150_002)     # in the image that exec started
    assert p.image == 1
    assert_at(p, e, "catcher", "catcher")


def events_at(p, line: int, ops=ALLOC_OPS) -> np.ndarray:
    """The events of `p` whose call site is the script's line `line`."""
    ev = p.events
    locs = {int(loc) for loc in np.unique(ev["loc"])
            if (f := frames_of(p, loc)[:1]) and Path(f[0].module).name == SCRIPT.name
            and f[0].offset == line}
    return ev[np.isin(ev["op"], ops) & np.isin(ev["loc"], list(locs))]


def test_pymalloc_allocations(py, tmp_path):
    """record --pymalloc: pymalloc's objects (which never reach malloc) are events of their Python
    lines, in threads and in a fork child; an object over 512 bytes, which pymalloc passes on to
    malloc, is one event, not two."""
    trace = record(tmp_path, py, "pymalloc", pymalloc_objects=True)
    main, child = trace.processes
    assert 0 < main.pymalloc_seq < 100_000 and child.forked_from == main.pid
    small = events_at(main, LINES["small"])
    # 20,000 tuples and 20,000 ints in the main thread, 3 x 5,000 tuples and ints in threads
    assert len(small) >= 2 * (20_000 + 15_000)
    assert len(set(small["tid"].tolist())) == 4
    assert (small["size"] <= 512).mean() > 0.99
    medium = events_at(main, LINES["medium"])
    # bytes(600) and bytes(601) objects (calloc'd: 633 and 634 bytes), each once; the rest are
    # the list's growth and the ints
    counts = np.unique(medium["size"][medium["size"] > 600], return_counts=True)[1]
    assert sorted(counts[counts >= 100].tolist()) == [500, 500]
    assert len(events_at(child, LINES["small"])) >= 2 * 7000
    assert child.pymalloc_seq == child.fork_seq
    # Its frees are matched to its allocations: the tuples are freed at exit or never.
    d = heapcast.stats(trace)
    assert d["pymalloc_recorded"] and "pymalloc    recorded" in format_stats(d)
    # Without it, pymalloc's objects are not events.
    (tmp_path / "plain").mkdir()
    plain = record(tmp_path / "plain", py, "pymalloc")
    assert plain.processes[0].pymalloc_seq == -1
    assert len(events_at(plain.processes[0], LINES["small"])) < 1000   # the lists' growth


def test_c_extension_and_subinterpreter(py, tmp_path):
    trace = record(tmp_path, py, "ext", "sub")
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


@pytest.mark.parametrize("pymalloc", [False, True], ids=["", "--pymalloc"])
def test_daemon_threads_allocating_while_the_interpreter_exits(py, tmp_path, pymalloc):
    """Py_Finalize frees the thread states of daemon threads that still run C code: the recorder
    stops reading Python frames then, and the program exits as it would untraced (also with
    pymalloc's allocators wrapped, which the exiting interpreter still calls)."""
    for k in range(3):
        (tmp_path / str(k)).mkdir()
        trace = record(tmp_path / str(k), py, "daemon", pymalloc_objects=pymalloc)
        assert trace.processes[0].clean_exit
        assert (trace.processes[0].pymalloc_seq > 0) == pymalloc


def test_pymalloc_without_python_says_so(tmp_path):
    r = heapcast.record(["/bin/true"], output=tmp_path / "t", progress=False, pymalloc=True)
    assert r.exit_code == 0
    assert any(p.startswith("--pymalloc: no process ran CPython") for p in r.problems)


def test_pymalloc_with_extensions_subinterpreters_and_exec(py, tmp_path):
    """record --pymalloc through a C extension, a subinterpreter, exceptions and an exec'd
    interpreter (which wraps its own allocators again)."""
    trace = record(tmp_path, py, "ext", "sub", "exec", pymalloc_objects=True)
    first, second = trace.processes
    assert first.pymalloc_seq > 0 and second.image == 1 and second.pymalloc_seq > 0
    (p, e), = blocks_of_size(trace, 150_002)     # the exec'd image's catcher, as without it
    assert p is second
    assert_at(p, e, "catcher", "catcher")


def test_parquet_export_resolves_python_call_sites(py, tmp_path):
    import json

    import pyarrow.parquet as pq

    from heapcast.trace.export import export_parquet
    trace = record(tmp_path, py, "basic")
    table = pq.read_table(export_parquet(trace, tmp_path / "e.parquet"))
    frames = {k: (file, func, line) for k, file, func, line in
              json.loads(table.schema.metadata[b"heapcast.python_frames"])[0]}
    sizes, sites = table.column("size").to_numpy(), table.column("callsite").to_numpy()
    site = int(sites[np.flatnonzero(sizes == 100_004)[0]])
    assert site >> 63 == 1
    assert frames[site & 0xFFFFFFFF] == (str(SCRIPT), "dict_growth", LINES["dict_big"])


def test_no_python_records_native_call_sites(py, tmp_path):
    trace = record(tmp_path, py, "basic", python=False)
    p = trace.processes[0]
    assert not p.python_frames and not is_python_frame(p.locations.flat).any()
    (p, e), = blocks_of_size(trace, 100_004)
    assert p.locations.frames(int(e["loc"]))[0] != 0


def test_forecast_keys_of_python_call_sites_are_stable_across_runs(py, tmp_path):
    """dataset/train/lab key call sites by location_keys: a Python line keys the same in every
    run (file name, function, line; not addresses), and different lines key differently."""
    from heapcast.forecast.features import location_keys
    keys = []
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        trace = record(tmp_path / run, py, "basic")
        (p, big), = blocks_of_size(trace, 100_004)
        (_, comp) = blocks_of_size(trace, 1002)[-1]
        site_keys, _ = location_keys(p)
        keys.append((int(site_keys[big["loc"]]), int(site_keys[comp["loc"]])))
    assert keys[0] == keys[1] and keys[0][0] != keys[0][1] and 0 not in keys[0]


def test_more_call_sites_than_a_first_location_table_holds(py, tmp_path):
    """A function of 6,000 allocating lines, run three times: its call sites are more than a
    thread's first location table holds (16,384 slots, half full at most), which now grows.
    It started over instead, again and again, so that each event defined its location and
    Python frame anew (20 definitions a line at 4,000 lines), each a scan of the line table
    from its start: 87 s against 0.1 s untraced. Each line is defined once: its allocations'
    instruction and its store's, where the list it replaces is freed, share the definition
    (they had one each); and every line is the right one: the lines are defined in a jumping
    order (odd ones run in odd rounds: the line table's walk goes back), which the walk
    continued from the last definition must follow."""
    from heapcast.recorder.session import recorder_library
    n = 6000
    script = tmp_path / "sites.py"
    body = [f"        if r % 2 == {i % 2}: x{i % 7} = [r, {i}]" for i in range(n)]
    script.write_text("import sys\ndef work(rounds):\n    for r in range(rounds):\n"
                      + "\n".join(body) + "\nwork(3)\n")
    out = tmp_path / "raw"
    out.mkdir()
    env = {**os.environ, "LD_PRELOAD": str(recorder_library()), "HEAPCAST_DIR": str(out),
           "PYTHONMALLOC": "malloc"}
    done = subprocess.run([py.exe, script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    work = "work".encode().hex()
    defined = sum(line.split()[-1] == work for mods in out.glob("*.mods")
                  for line in mods.read_text().splitlines() if line.startswith("P "))
    assert n <= defined <= n + 20, defined
    heapcast.finalize(out)
    trace = heapcast.load(out)
    lines = set()
    for p in trace.processes:
        ev = p.events
        for loc in np.unique(ev["loc"][np.isin(ev["op"], ALLOC_OPS)]):
            frames = frames_of(p, loc)
            if frames and frames[0].function == "work":
                lines.add(frames[0].offset)
    assert lines == set(range(4, n + 4)) | {3}, sorted(lines - set(range(3, n + 4)))[:5]


def test_code_compiled_again_and_again_is_named_by_its_own_lines(py, tmp_path):
    """20,000 functions compiled one after another (exec of each one's source, its def on a line
    of its own), each called once and then freed: new code objects take the memory of freed
    ones, and so may their name objects, and the recorder's keys (code object and line, guarded
    by the line table's address, the first line and the names: their objects and their ends)
    must not take a new one for an old one. Every block is at its own function's line. (With
    the name objects' addresses alone, 8 or 9 of 20,000 helper calls on 3.13 were recorded under
    an earlier caller; with 2,000 functions one run of the suite in dozens.)"""
    n = 20_000
    p, blocks = record_script(
        tmp_path, py, "again.py",
        "def helper(n):\n"
        "    return bytearray(n)\n"
        f"for i in range({n}):\n"
        "    ns = {'helper': helper}\n"
        "    exec(compile('\\n' * (i % 97) + f'def f_{i}(n):\\n    return bytearray(n)\\n'"
        " + f'def g_{i}(n):\\n    return helper(n)\\n', f'gen_{i % 3}.py', 'exec'), ns)\n"
        "    keep = ns[f'f_{i}'](100_000 + 8 * i), ns[f'g_{i}'](300_000 + 8 * i)\n"
        "    del ns, keep\n", 100_000, 300_008 + 8 * n)
    alloc = blocks[blocks["size"] < 100_008 + 8 * n]
    seen = []
    for e in alloc:   # (the interpreter's own blocks of such sizes are not in gen_*.py)
        i, frames = (int(e["size"]) - 100_000) // 8, frames_of(p, e["loc"])
        s = frames[0] if frames else None
        if s is not None and Path(s.module).name.startswith("gen_"):
            assert (s.function, s.offset, Path(s.module).name) == (f"f_{i}", i % 97 + 2,
                                                                   f"gen_{i % 3}.py"), (i, s)
            seen.append(i)
    assert sorted(seen) == list(range(n))
    # a helper that lives on, called from functions compiled again and again: the location (a
    # Python stack) of each call is its own caller's
    called = blocks[blocks["size"] >= 300_000]
    seen = []
    for e in called:
        frames = frames_of(p, e["loc"])
        if frames and frames[0].function == "helper":
            i = (int(e["size"]) - 300_000) // 8
            assert (frames[1].function, frames[1].offset) == (f"g_{i}", i % 97 + 4), (i, frames)
            seen.append(i)
    assert sorted(seen) == list(range(n))


def test_stack_keys_with_the_memo_are_the_keys_without_it(build):
    """pyframes.h's stack key against itself without the thread's memo of its last stack, over
    400,000 fake frame chains in the layouts of 3.11 and 3.12 changed at random between two keys
    (frames pushed and popped, a frame's instruction or code object changed, a frame taken out of
    the chain with its memory intact, shim frames; tests/programs/pyframes_memo.c): every key is
    the one computed from scratch, and two keys are equal exactly when their stacks are; and,
    with the frames out of the chain made unreadable half the time (as a frame whose data stack
    chunk was freed), no key reads one. A memo check left out (a frame's previous, its
    instruction, or its shim kind) fails it, and a check that reads the held frames before
    their links are checked crashes it."""
    done = subprocess.run([str(build("pyframes_memo"))], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    word, keys, hits = done.stdout.split()
    assert word == "ok" and int(keys) == 400_000
    assert 0.2 * int(keys) < int(hits) < 0.8 * int(keys)   # both paths taken often


def test_stacks_that_end_alike_each_keep_their_own_frames(py, tmp_path):
    """The recorder hashes only the outer frames that differ from the thread's last event's
    (pyframes.h, py_outer): consecutive allocations through call paths that differ in their inner
    frames only (two callers, recursion 0-24 deep, so that stacks of more than 16 frames are cut
    to their innermost 16), in their outermost frame only (two lines of the module calling the
    same path), and a generator resumed by two consumers at different depths, must each be
    recorded with their own frames. The blocks are kept: no event comes between two of them."""
    n = 3000
    p, blocks = record_script(
        tmp_path, py, "paths.py",
        "def leaf(n):\n"
        "    return bytearray(n)\n"
        "def via_a(n):\n"
        "    return leaf(n)\n"
        "def via_b(n):\n"
        "    return leaf(n)\n"
        "def down(d, n, f):\n"
        "    return f(n) if d == 0 else down(d - 1, n, f)\n"
        "def gen():\n"
        "    n = yield\n"
        "    while True:\n"
        "        n = yield leaf(n)\n"
        "g = gen()\n"
        "next(g)\n"
        "def consume_1(n):\n"
        "    return g.send(n)\n"
        "def consume_2(n):\n"
        "    return consume_1(n)\n"
        f"keep = [None] * {n}\n"
        f"for i in range({n}):\n"
        "    size = 600 + 8 * i\n"
        "    d, f = i // 3 * 7 % 25, (via_a if i // 3 % 2 else via_b)\n"
        "    if i % 3 == 0:\n"
        "        keep[i] = down(d, size, f)\n"
        "    elif i % 3 == 1:\n"
        "        keep[i] = down(d, size, f)\n"
        "    elif i % 6 == 2:\n"
        "        keep[i] = consume_1(size)\n"
        "    else:\n"
        "        keep[i] = consume_2(size)\n", 600, 600 + 8 * n)
    seen = set()
    for e in blocks:
        frames = frames_of(p, e["loc"])
        if not frames or frames[0].function != "leaf":
            continue   # (the interpreter's own blocks of such sizes)
        i = (int(e["size"]) - 600) // 8
        if i % 3 == 2:
            want = [("leaf", 2), ("gen", 12), ("consume_1", 16)] + \
                ([] if i % 6 == 2 else [("consume_2", 18)]) + \
                [("<module>", 28 if i % 6 == 2 else 30)]
        else:
            via = i // 3 % 2
            want = [("leaf", 2), ("via_a" if via else "via_b", 4 if via else 6)] + \
                [("down", 8)] * (i // 3 * 7 % 25 + 1) + [("<module>", 24 if i % 3 == 0 else 26)]
        assert [(s.function, s.offset) for s in frames] == want[:16], i
        seen.add(i)
    assert seen == set(range(n))
