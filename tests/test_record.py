"""End to end: real C programs with exactly known heap calls, recorded by `heapcast.record` and read
back with `heapcast.load`; every event is checked against what the program itself saw."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import heapcast
from heapcast.stats.summary import RECORDING_KEYS
from heapcast.stats.text import format_stats
from heapcast.trace.blocks import INHERITED, match, match_trace
from heapcast.trace.format import OP
from test_report import open_page

U64_MAX = 2**64 - 1
SIZE_MAX = U64_MAX
# ops.c's calls in order: (op, requested size, arg). It prints "<op> <addr> <old_addr>" for each.
OPS_CALLS = [
    ("malloc", 100, 0),
    ("calloc", 300, 10),
    ("realloc", 50, 0),                  # realloc(NULL, 50)
    ("realloc", 5000, 0),
    ("realloc", 4000, 0),
    ("realloc", 0, 0),                   # realloc(p, 0): frees p, returns NULL
    ("reallocarray", 63, 7),
    ("reallocarray", 9000, 100),
    ("posix_memalign", 200, 64),
    ("free", 0, 0),
    ("aligned_alloc", 512, 256),
    ("free", 0, 0),
    ("memalign", 300, 128),
    ("free", 0, 0),
    ("valloc", 1000, 4096),
    ("free", 0, 0),
    ("pvalloc", 5000, 4096),
    ("free", 0, 0),
    ("free", 0, 0),                      # free(NULL)
    ("malloc", SIZE_MAX, 0),             # fails
    ("calloc", U64_MAX, SIZE_MAX // 2),  # nmemb * size overflows: saturated, fails
    ("posix_memalign", 64, 3),           # bad alignment: EINVAL
    ("realloc", SIZE_MAX, 0),            # fails, the old block stays
    ("reallocarray", U64_MAX, SIZE_MAX // 2),  # overflows, the old block stays
    ("free", 0, 0),
    ("free", 0, 0),
]


def _printed_calls(stdout: str) -> list:
    """ops.c's lines "<op> <addr> <old>" as (op, addr, old) tuples."""
    rows = []
    for line in stdout.splitlines():
        if not line.startswith("errno "):
            name, addr, old = line.split()
            rows.append((name, int(addr, 16), int(old, 16)))
    return rows


def test_every_op_is_recorded_exactly_as_called(build, own, tmp_path, capfd):
    ops = build("ops")
    result = heapcast.record([ops], output=tmp_path / "t")
    out = capfd.readouterr().out
    assert result.exit_code == 0
    assert out.splitlines()[-1] == "errno 12 12 22 12"  # the failures set errno as without tracing
    printed = _printed_calls(out)
    assert [name for name, _, _ in printed] == [name for name, _, _ in OPS_CALLS]

    trace = heapcast.load(tmp_path / "t")
    assert len(trace.processes) == 1
    proc = trace.processes[0]
    assert proc.exe == os.path.realpath(ops) and proc.clean_exit and proc.lost_events == 0
    ev = own(proc)
    assert len(ev) == len(OPS_CALLS), f"expected one event per call, got {len(ev)}"
    for i, ((name, size, arg), (_, addr, old), e) in enumerate(zip(OPS_CALLS, printed, ev)):
        got = (heapcast.OPS[e["op"]], int(e["size"]), int(e["arg"]), int(e["addr"]), int(e["old_addr"]))
        assert got == (name, size, arg, addr, old), f"call {i}: {got} != {(name, size, arg, addr, old)}"
    assert (ev["tid"] == 0).all()
    assert (np.diff(ev["seq"].astype(np.int64)) > 0).all()
    assert (np.diff(ev["ts"].astype(np.int64)) >= 0).all()
    assert proc.start_ns <= ev["ts"][0] and ev["ts"][-1] <= proc.end_ns
    is_realloc = np.isin(ev["op"], [OP["realloc"], OP["reallocarray"]])
    assert (ev["free_lag"][is_realloc] >= 1).all() and (ev["free_lag"][~is_realloc] == 0).all()

    # Replay: every release finds its block, and only the 100-byte block is never freed.
    blocks = match(proc.events)
    assert blocks.unknown_releases == 0 and blocks.double_acquires == 0
    leaked_own = blocks.leaked[np.isin(proc.events["seq"][blocks.leaked], ev["seq"])]
    assert proc.events["seq"][leaked_own].tolist() == [ev["seq"][0]]


@pytest.mark.skipif(shutil.which("setarch") is None, reason="setarch (util-linux) is not installed")
@pytest.mark.parametrize("enabled", [True, False])
def test_the_conversion_pauses_the_garbage_collector_and_leaves_it_as_it_was(build, tmp_path,
                                                                             monkeypatch, enabled):
    """finalize runs with Python's cyclic collector paused (its objects are not cyclic, and
    collections walked every object of the process), then leaves it as the caller had it: a
    program that called heapcast.record with the collector off keeps it off."""
    import gc
    from heapcast.recorder import session
    seen = []
    scan = session._scan_raw

    def scan_noting(*args):   # (called by finalize, once per raw file)
        seen.append(gc.isenabled())
        return scan(*args)
    monkeypatch.setattr(session, "_scan_raw", scan_noting)
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        result = heapcast.record([build("ops")], output=tmp_path / "t")
        after = gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
    assert result.exit_code == 0 and result.events > 0
    assert seen == [False] and after is enabled


def test_output_and_heap_addresses_unchanged_by_tracing(build, untraced, tmp_path, capfd):
    """Without address randomization the traced program prints byte for byte what it prints
    untraced: the same exit code, and even the same heap addresses (the recorder never
    allocates from the program's heap)."""
    ops = build("ops")
    cmd = ["setarch", "-R", ops]
    if untraced(["setarch", "-R", "true"]).returncode != 0:
        pytest.skip("cannot turn address randomization off here (personality is not allowed)")
    plain = untraced(cmd)
    result = heapcast.record(cmd, output=tmp_path / "t", follow_children=True)
    assert result.exit_code == plain.returncode == 0
    assert capfd.readouterr().out == plain.stdout.decode()
    traced = [p for p in heapcast.load(tmp_path / "t").processes if p.exe == os.path.realpath(ops)]
    assert len(traced) == 1 and traced[0].event_count > len(OPS_CALLS)


def test_sixteen_threads_cross_thread_frees_replay_exactly(build, own, tmp_path, capfd):
    threads = build("threads")
    result = heapcast.record([threads], output=tmp_path / "t")
    assert result.exit_code == 0
    printed = dict(line.split() for line in capfd.readouterr().out.splitlines())
    proc, = heapcast.load(tmp_path / "t").processes
    assert proc.lost_events == 0 and proc.threads == 17
    ev = own(proc)
    counts = {name: int(np.count_nonzero(ev["op"] == OP[name])) for name in printed}
    assert counts == {name: int(n) for name, n in printed.items()}
    per_round = 16 * 20  # threads x rounds, 256 allocations each
    assert counts == {"malloc": per_round * 192 + 1, "calloc": per_round * 64,
                      "realloc": per_round * 32, "free": per_round * 256 + 1}
    assert set(np.unique(ev["tid"]).tolist()) == set(range(17))
    assert (ev["addr"][ev["op"] != OP["free"]] != 0).all()

    blocks = match(proc.events)
    assert blocks.unknown_releases == 0, "a free of an address that was not live"
    assert blocks.double_acquires == 0, "an address live twice"
    # Every free of the program but the last (main's free of its own array) is made by another
    # thread than the one that allocated the block.
    frees = np.flatnonzero(np.isin(proc.events["seq"], ev["seq"][ev["op"] == OP["free"]]))
    src = blocks.alloc_of[frees]
    assert (src >= 0).all()
    same_thread = proc.events["tid"][frees] == proc.events["tid"][src]
    assert np.flatnonzero(same_thread).tolist() == [len(frees) - 1]


def test_fork_children_continue_the_parents_heap(build, own, tmp_path, capfd):
    fork = build("fork")
    result = heapcast.record([fork], output=tmp_path / "t")
    assert result.exit_code == 0
    lines = {line.split()[0]: line.split()[1:] for line in capfd.readouterr().out.splitlines()}
    parent, child, grandchild = (int(lines[r][0]) for r in ("parent", "child", "grandchild"))
    a, b = (int(x, 16) for x in lines["parent"][1:3])

    trace = heapcast.load(tmp_path / "t")
    by_pid = {p.pid: p for p in trace.processes}
    assert set(by_pid) == {parent, child, grandchild}
    assert (by_pid[parent].forked_from, by_pid[child].forked_from,
            by_pid[grandchild].forked_from) == (0, parent, child)
    assert by_pid[child].ppid == parent and by_pid[grandchild].ppid == child
    assert by_pid[child].fork_seq > 0 and by_pid[grandchild].fork_seq > 0
    assert all(p.clean_exit and p.lost_events == 0 for p in trace.processes)

    for p, b_ in zip(trace.processes, match_trace(trace)):
        assert b_.unknown_releases == 0, f"process {p.pid}: a free of a block that was not live"
        assert b_.double_acquires == 0
    blocks = dict(zip((p.pid for p in trace.processes), match_trace(trace)))
    # The child's first call frees `a`; the grandchild's two free `b` and the child's `c`: blocks
    # that were live in its parent when it was forked.
    c = int(lines["child"][2], 16)
    for pid, frees in ((child, [a]), (grandchild, [b, c])):
        ev = own(by_pid[pid])[:len(frees)]
        assert ev["op"].tolist() == [OP["free"]] * len(frees) and ev["old_addr"].tolist() == frees
        idx = np.flatnonzero(np.isin(by_pid[pid].events["seq"], ev["seq"]))
        assert (blocks[pid].alloc_of[idx] == INHERITED).all()


@pytest.mark.parametrize("follow", [True, False])
def test_exec_is_traced_only_with_follow_children(build, tmp_path, capfd, follow):
    prog = build("exec")
    result = heapcast.record([prog], output=tmp_path / "t", follow_children=follow)
    assert result.exit_code == 0
    out = capfd.readouterr().out
    assert "child exit 0" in out
    child_pid = int(out.split("child ")[1].split()[0])
    trace = heapcast.load(tmp_path / "t")
    execd = [p for p in trace.processes if p.argv[1:] == ["child"]]
    malloc_4002 = [p.pid for p in trace.processes
                   if ((p.events["op"] == OP["malloc"]) & (p.events["size"] == 4002)).any()]
    session = json.loads((tmp_path / "t" / "session.json").read_text())
    if follow:
        assert len(execd) == 1 and execd[0].pid == child_pid and execd[0].image >= 1
        assert execd[0].exe == os.path.realpath(prog)
        assert malloc_4002 == [child_pid]
        assert result.untraced == [] and session["untraced_processes"] == 0
        assert "untraced" not in result.summary()
    else:
        assert execd == [] and malloc_4002 == []
        # the child that ran untraced is named, not left for the user to wonder about
        root_pid = trace.processes[0].pid
        assert result.untraced == [{"pid": child_pid, "ppid": root_pid,
                                    "exe": os.path.realpath(prog), "argv": [str(prog), "child"]}]
        assert session["untraced_processes"] == 1 and session["untraced"] == result.untraced
        assert (f"heapcast: note: 1 process that the program started ran untraced "
                f"({os.path.basename(os.path.realpath(prog))}): children that exec another "
                "program are recorded with --follow-children" in result.summary())
    assert not (tmp_path / "t" / "untraced.log").exists()
    root = [p for p in trace.processes if p.forked_from == 0 and p.image == 0]
    assert len(root) == 1 and ((root[0].events["size"] == 4001)).any()


def test_session_says_how_long_the_program_ran_and_what_came_after(build, tmp_path):
    """session.json's wall_s is the program's own run (a pause of 0.3 s at its end included),
    after_exit_s the wait from its end until the trace was complete; together they are the
    record call's whole wait, less only its start. Converted at exit, the wait after it is the
    whole conversion of 800,000 events, which takes time."""
    prog = build("phases", "-pthread")
    for live, args in ((True, ["1", "2", "10", "300000"]), (False, ["2", "2", "100000", "0"])):
        out = tmp_path / f"t{int(live)}"
        t0 = time.monotonic()
        r = heapcast.record([str(prog), *args], output=out, live=live, progress=False)
        whole = time.monotonic() - t0
        session = json.loads((out / "session.json").read_text())
        assert r.exit_code == 0 and session["after_exit_s"] == round(r.after_exit_s, 6)
        assert session["wall_s"] == round(r.wall_s, 6)
        assert r.after_exit_s > 0 and r.wall_s + r.after_exit_s <= whole
        if live:   # two pauses of 0.3 s: the program's run, not the wait after it
            assert r.wall_s >= 0.6 > r.after_exit_s
        else:
            assert r.events >= 800_000 and r.live_events == 0
            assert r.after_exit_s > 0.02, r.after_exit_s
        d = heapcast.stats(out)   # and `heapcast stats` says so
        assert d["recording"] == {k: session[k] for k in RECORDING_KEYS}
        assert (f"recording   the program ran {r.wall_s:.2f} s; the trace was complete "
                f"{r.after_exit_s:.2f} s after its end, {r.live_events:,} of its "
                f"{d['events']:,} events converted while it ran") in format_stats(d)
        if live:   # and the report's cards
            dom, console, _ = open_page(heapcast.report(out, output=tmp_path / "page.html"),
                                        tmp_path)
            assert console == [] and (f"{r.wall_s:.2f} s + {r.after_exit_s:.2f} s" in dom and
                                      "the program's run, then the wait after its end" in dom)
    # a trace file alone has no session.json: no line
    d = heapcast.stats(next((tmp_path / "t0").glob("*.hct")))
    assert d["recording"] == {} and "recording" not in format_stats(d)


def test_processes_that_ran_untraced_are_counted_and_the_first_named(tmp_path):
    """Without --follow-children, every child that exec'd another program is counted (a shell
    loop of 150), session.json names the first UNTRACED_KEPT, and the note names each program
    once; a line of the log cut short (a process killed in its write) is passed over."""
    from heapcast.recorder import session as recording
    out = tmp_path / "t"
    result = heapcast.record(["sh", "-c", "i=0; while [ $i -lt 150 ]; do /bin/true; "
                              "i=$((i+1)); done; exec /bin/true"], output=out, progress=False)
    assert result.exit_code == 0 and not result.problems
    assert len(result.untraced) == 150   # (the exec in place is the program itself: traced)
    assert {os.path.basename(u["exe"]) for u in result.untraced} == {"true"}
    assert len({u["pid"] for u in result.untraced}) == 150
    session = json.loads((out / "session.json").read_text())
    assert session["untraced_processes"] == 150
    assert session["untraced"] == result.untraced[:recording.UNTRACED_KEPT]
    assert "note: 150 processes that the program started ran untraced (true):" in \
        result.summary()
    log = tmp_path / recording.UNTRACED_LOG
    log.write_bytes(b"U 1f 1 2f62696e2f6c73 6c7300\nU 20 1 2f62\nU 21 1 zz 00\n")
    assert recording._untraced(tmp_path) == [{"pid": 31, "ppid": 1, "exe": "/bin/ls",
                                              "argv": ["ls"]}]
    assert not list(tmp_path.glob(recording.UNTRACED_LOG + "*"))
    assert recording._untraced(tmp_path) == []   # (no log: nothing ran untraced)


def test_module_map_from_the_start_written_only_by_images_that_allocate(tmp_path):
    """The module map is listed once when a process image starts and written at its first call
    site, in force from the start: the shell's has it, and /bin/true, which allocates nothing
    (run as a child and exec'd in place), writes none: a first version that wrote it at the
    start gave `sh -c` of 200 short programs 118 bytes an event against 89."""
    result = heapcast.record(["sh", "-c", "/bin/true; exec /bin/true"], output=tmp_path / "t",
                             follow_children=True, progress=False)
    assert result.exit_code == 0
    procs = heapcast.load(tmp_path / "t").processes
    shells = [p for p in procs if p.event_count]
    trues = [p for p in procs if os.path.basename(p.exe) == "true"]
    assert len(trues) == 2 and all(p.event_count == 0 and p.modules == [] for p in trues)
    assert shells
    for p in shells:
        first = p.modules[0]
        assert first.seq <= int(p.events["seq"][0])
        assert any("libc" in os.path.basename(m.path) for m in first.modules)


@pytest.mark.parametrize("pidfd", [True, False])
def test_exit_from_a_thread(build, own, tmp_path, capfd, monkeypatch, pidfd):
    """(Without a pidfd, as on a kernel before 5.3, `record` waits with Popen's polling.)"""
    if not pidfd:
        monkeypatch.delattr(os, "pidfd_open", raising=False)
    prog = build("thread_exit")
    result = heapcast.record([prog], output=tmp_path / "t")
    assert result.exit_code == 7
    worker = [int(x, 16) for x in capfd.readouterr().out.split()[1:]]
    proc, = heapcast.load(tmp_path / "t").processes
    assert proc.clean_exit and proc.threads == 2
    ev = own(proc)
    got = [(int(e["tid"]), heapcast.OPS[e["op"]], int(e["size"]), int(e["addr"] or e["old_addr"]))
           for e in ev]
    assert got[1:] == [(1, "malloc", 1001, worker[0]), (1, "malloc", 1002, worker[1]),
                       (1, "malloc", 1003, worker[2]), (1, "free", 0, worker[1])]
    assert got[0][:3] == (0, "malloc", 1000)


def test_abort_keeps_the_events_and_exits_134(build, own, cli, tmp_path):
    prog = build("abort")
    done = cli("record", "-o", tmp_path / "t", "--", prog)
    assert done.returncode == 134  # 128 + SIGABRT, as a shell reports it
    assert done.stdout.startswith("allocated ")
    summary = done.stderr.strip().splitlines()[-1]
    assert summary.startswith("heapcast: ") and " events, 1 process" in summary
    assert str(tmp_path / "t") in summary

    proc, = heapcast.load(tmp_path / "t").processes
    assert not proc.clean_exit
    ev = own(proc)
    assert ev["op"].tolist() == [OP["malloc"]] * 10 + [OP["free"]]
    assert ev["size"][:10].tolist() == list(range(2001, 2011))
    assert ev["old_addr"][10] == ev["addr"][0]
    assert int(done.stdout.split()[1], 16) == ev["addr"][9]


def _default_interrupts():
    """In a child: SIGINT and SIGQUIT at their default, as in a terminal's foreground job, even
    when the tests run in a background job (a shell's `&` starts it with both ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


@pytest.mark.parametrize("ignored", [False, True])
def test_the_program_gets_interrupt_signals_as_it_would_untraced(cli, tmp_path, ignored):
    """record catches SIGINT and SIGQUIT while the program runs (^C reaches both through the
    terminal; record finalizes after the program); the program starts with them at their
    default, or ignored when record itself was started with them ignored, as a shell's `&` does."""
    def dispose():   # either way, whatever the test runner was started with (`&` ignores both)
        for sig in (signal.SIGINT, signal.SIGQUIT):
            signal.signal(sig, signal.SIG_IGN if ignored else signal.SIG_DFL)
    probe = ("import signal as s; print(*['ign' if h == s.SIG_IGN else 'dfl' if h == s.SIG_DFL "
             "else 'handler' for h in map(s.getsignal, (s.SIGINT, s.SIGQUIT))])")
    done = cli("record", "-o", tmp_path / "t", "--", sys.executable, "-c", probe,
               preexec_fn=dispose)
    assert done.returncode == 0, done.stderr
    # (CPython installs its own SIGINT handler at start-up unless SIGINT is ignored)
    assert done.stdout.split() == (["ign", "ign"] if ignored else ["handler", "dfl"])


def test_interrupt_of_the_terminal_ends_the_program_and_the_trace_is_kept(cli_argv, tmp_path):
    """^C: SIGINT to the whole foreground process group. The program dies of it (130, as a
    shell reports it); record survives it and writes the whole trace."""
    rec = subprocess.Popen([*cli_argv, "record", "-o", str(tmp_path / "t"), "--", "sleep", "30"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True, preexec_fn=_default_interrupts)
    try:
        deadline = time.monotonic() + 60
        while not list((tmp_path / "t").glob("*.raw")):   # the program runs (its raw file)
            assert rec.poll() is None and time.monotonic() < deadline, rec.communicate()
            time.sleep(0.02)
        time.sleep(0.2)
        os.killpg(rec.pid, signal.SIGINT)
        out, err = rec.communicate(timeout=60)
    finally:
        if rec.poll() is None:
            rec.kill()
    assert rec.returncode == 130, err
    proc, = heapcast.load(tmp_path / "t").processes
    assert proc.event_count > 0 and not proc.clean_exit
    assert json.loads((tmp_path / "t" / "session.json").read_text())["exit_code"] == 130


def test_numpy_loads_without_blas_threads_and_the_program_keeps_its_environment(cli, tmp_path):
    """record imports numpy with one OpenBLAS thread (its extra threads spin ~0.1 s of CPU each
    at start-up, taken from the program) and without huge pages for its arrays, unless the user
    chose otherwise; the program's
    environment is the user's, untouched."""
    probe = ("import os, heapcast.recorder.session as s; s.OWN_PROCESS = True; "
             "s.import_quietly(); "
             "import numpy._core.multiarray as m; "
             "print(os.environ.get('OPENBLAS_NUM_THREADS'), len(os.listdir('/proc/self/task')), "
             "os.environ.get('NUMPY_MADVISE_HUGEPAGE'), int(m._get_madvise_hugepage()))")
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_NUM_THREADS", "NUMPY_MADVISE_HUGEPAGE")}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    # one thread, numpy's huge pages off, the environment as it was
    assert done.stdout.split() == ["None", "1", "None", "0"], done.stderr
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env={**env, "OPENBLAS_NUM_THREADS": "2", "NUMPY_MADVISE_HUGEPAGE": "1"})
    out = done.stdout.split()
    assert out[0] == "2" and out[2:] == ["1", "1"], done.stderr   # the user's choices kept
    # heapcast.record() called in a user's process: numpy loads with the environment as it is
    # (another of its threads could read os.environ meanwhile)
    done = subprocess.run([sys.executable, "-c", probe.replace("s.OWN_PROCESS = True; ", "")],
                          env=env, capture_output=True, text=True)
    out = done.stdout.split()
    assert out[0] == "None" and out[2:] == ["None", "1"], done.stderr
    show = "import os; print(os.environ.get('OPENBLAS_NUM_THREADS'))"
    done = cli("record", "-o", tmp_path / "t", "--", sys.executable, "-c", show, env=env)
    assert done.returncode == 0 and done.stdout.split() == ["None"], done.stderr


@pytest.mark.parametrize("how", ["pymalloc", "malloc", "--pymalloc", "--no-python"])
def test_a_python_program_on_pymalloc_is_told_what_the_trace_leaves_out(tmp_path, how):
    """On pymalloc (CPython's default) the objects of up to 512 bytes never call malloc: `record`
    says so at the end (and in session.json), naming the process, unless PYTHONMALLOC=malloc
    or --pymalloc recorded them; a native program gets no such note."""
    code = "d = {i: str(i) for i in range(20000)}"
    out = tmp_path / "t"
    env = {"PYTHONMALLOC": "malloc" if how == "malloc" else "pymalloc"}
    result = heapcast.record([sys.executable, "-c", code], output=out, env=env,
                             pymalloc=how == "--pymalloc", python=how != "--no-python",
                             progress=False)
    assert result.exit_code == 0 and not result.problems
    pid = heapcast.load(out).processes[0].pid
    session = json.loads((out / "session.json").read_text())
    assert session["notes"] == result.notes
    if how in ("pymalloc", "--no-python"):   # (without Python frames: by the executable's name)
        exe = os.path.basename(os.path.realpath(sys.executable))
        assert result.notes == [
            f"{exe} (pid {pid}) ran on pymalloc: CPython's objects of up to 512 bytes are not "
            "malloc calls, and are not in the trace (`record --pymalloc`, or PYTHONMALLOC=malloc "
            "in the environment, records them)"]
        assert f"heapcast: note: {exe} (pid {pid}) ran on pymalloc" in result.summary()
    else:
        assert result.notes == [] and result.events > 20000
    native = heapcast.record(["/bin/ls", "/"], output=tmp_path / "n", env=env, progress=False)
    assert native.notes == []


def test_the_pymalloc_note_follows_each_processs_own_environment(tmp_path):
    """The note takes PYTHONMALLOC from each process (its .mods file), not from what `record`
    was given: a child started with PYTHONMALLOC=malloc is not named, its sibling on pymalloc is;
    and `heapcast finalize` of an interrupted recording says the same."""
    py, code = sys.executable, "d = {i: str(i) for i in range(20000)}"
    script = (f"PYTHONMALLOC=malloc {py} -c '{code}'; PYTHONMALLOC=pymalloc {py} -c '{code}'; "
              f"{py} -c '{code}'")
    result = heapcast.record(["sh", "-c", script], output=tmp_path / "t", follow_children=True,
                             env={"PYTHONMALLOC": "malloc"}, progress=False)
    assert result.exit_code == 0 and not result.problems
    procs = [p for p in heapcast.load(tmp_path / "t").processes
             if os.path.basename(p.exe).startswith("python")]
    assert len(procs) == 3
    small = sorted(procs, key=lambda p: p.event_count)[0]   # pymalloc's: the fewest events
    exe = os.path.basename(small.exe)
    assert result.notes == [f"{exe} (pid {small.pid}) ran on pymalloc: CPython's objects of up "
                            "to 512 bytes are not malloc calls, and are not in the trace "
                            "(`record --pymalloc`, or PYTHONMALLOC=malloc in the environment, "
                            "records them)"]
    # the recorder alone (as a killed `record` leaves the directory), then finalize by hand
    from heapcast.recorder.session import finalize, recorder_library
    raw = tmp_path / "raw"
    raw.mkdir()
    for malloc in ("pymalloc", "malloc"):
        subprocess.run([py, "-c", code], check=True, env={
            **os.environ, "PYTHONMALLOC": malloc, "LD_PRELOAD": str(recorder_library()),
            "HEAPCAST_DIR": str(raw), "HEAPCAST_FOLLOW": "1"})
    by_hand = finalize(raw, progress=False)
    assert len(by_hand.notes) == 1 and " ran on pymalloc: " in by_hand.notes[0]
