"""The .mods companion of a raw file (heapcast.trace.mods): parsed as it grows, while the program
runs, it must read exactly as the whole file read once after the exit."""
from __future__ import annotations

import pytest

from heapcast.trace.format import TraceError
from heapcast.trace.mods import ModsFile
from heapcast.trace.model import Module, PyFrame


def hx(s: str) -> str:
    return s.encode().hex()


LINES = [f"X {hx('/usr/bin/prog')}", f"A {hx('prog' + chr(0) + '-v' + chr(0))}", f"C {hx('/tmp')}",
         "M 1", f"m 400000 401000 402000 {hx('/usr/bin/prog')}", "m 7f0000 7f1000 7f2000",
         f"P 0 c {hx('a.py')} {hx('main')}",   # between a snapshot's lines
         f"m 7f5000 7f6000 7f7000 {hx('/lib/libc.so.6')}", "E",
         f"P 1 1e {hx('a.py')} {hx('f')}", f"P 2 3 {hx('b.py')} {hx('<module>')}",
         "Y 2a", "M 50", f"m 400000 401000 402000 {hx('/usr/bin/prog')}", "E",
         f"P 3 4 {hx('a.py')} {hx('f')}"]


def fields(m: ModsFile) -> tuple:
    return m.exe, m.argv, m.cwd, m.modules, m.python_frames, m.pymalloc_seq


def test_parsed_as_it_grows_it_reads_as_the_whole_file(tmp_path):
    text = "".join(line + "\n" for line in LINES).encode()
    path = tmp_path / "1.mods"
    whole = tmp_path / "2.mods"
    whole.write_bytes(text)
    once = ModsFile(whole)
    once.update()
    assert once.exe == "/usr/bin/prog" and once.argv == ["prog", "-v"] and once.cwd == "/tmp"
    assert [s.seq for s in once.modules] == [1, 0x50] and once.pymalloc_seq == 0x2a
    assert once.modules[0].modules[1] == Module("/usr/bin/prog", 0x7f0000, 0x7f1000, 0x7f2000)
    assert once.python_frames[1] == PyFrame("a.py", "f", 0x1e) and len(once.python_frames) == 4
    growing = ModsFile(path)
    growing.update(final=False)   # no file yet: nothing
    for cut in range(0, len(text), 23):   # appended in pieces cut anywhere, lines included
        with open(path, "ab") as f:
            f.write(text[cut:cut + 23])
        growing.update(final=False)
    growing.update(final=True)
    assert fields(growing) == fields(once)


def test_a_line_cut_short_waits_and_is_an_error_at_the_end(tmp_path):
    path = tmp_path / "1.mods"
    path.write_bytes(f"X {hx('/p')}\nP 0 c {hx('a.py')}".encode())   # its function not yet
    m = ModsFile(path)
    m.update(final=False)
    assert m.exe == "/p" and not m.python_frames
    with pytest.raises(TraceError, match="line 2: malformed module map line"):
        m.update(final=True)


def test_of_snapshots_with_the_same_seq_the_last_is_kept(tmp_path):
    """The recorder writes a snapshot per library that a call site first lies in, "M seq +": the
    last one plus that library, with the last one's seq. The reader keeps one per seq (the later
    holds), so that N libraries do not leave N lists of up to N modules in the trace; a "+" that
    is not a "+" is a malformed line."""
    lib = [f"m {7 + i:x}0000 {7 + i:x}1000 {7 + i:x}2000 {hx(f'/lib/l{i}.so')}" for i in range(3)]
    lines = ["M 1", lib[0], "E", "M 1 +", lib[1], "E", "M 1 +", lib[2], "E", "M 9", lib[2], "E"]
    path = tmp_path / "1.mods"
    path.write_bytes("".join(line + "\n" for line in lines).encode())
    m = ModsFile(path)
    m.update()
    assert [(s.seq, [x.path for x in s.modules]) for s in m.modules] == [
        (1, ["/lib/l0.so", "/lib/l1.so", "/lib/l2.so"]), (9, ["/lib/l2.so"])]
    bad = tmp_path / "2.mods"
    bad.write_bytes(b"M 1 x\nE\n")
    with pytest.raises(TraceError, match="line 1: malformed module map line"):
        ModsFile(bad).update()
