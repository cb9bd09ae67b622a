"""The `.mods` companion of a raw file (docs/trace-format.md, "Raw files"): the program's path,
arguments and directory (and PYTHONMALLOC where it is set), its module snapshots, its Python frame definitions and where pymalloc
recording began, one text line each, appended by the recorder in whole lines (a Python frame's
line in one write(2), a module snapshot in one writev: other threads' lines fall between a
snapshot's lines, never inside one).

A Python program's file holds a line per Python frame it allocated from (33,000 for py_dicts):
parsing it all after the exit took 40 ms of `heapcast record`'s wait. So the converter that runs
beside the program (heapcast.recorder.live) parses the complete lines as they come, and the
conversion after the exit parses only what was added since."""
from __future__ import annotations

from pathlib import Path

from .format import TraceError
from .model import Module, ModuleSnapshot, PyFrame


def hex_text(field: str) -> str:
    """The text of a hex-encoded field of the recorder's (recorder.c, tb_hexbytes): any byte
    survives, as surrogate escapes where it is not UTF-8."""
    return bytes.fromhex(field.strip()).decode("utf-8", "surrogateescape")


class ModsFile:
    """A `.mods` file parsed so far: update() parses what was appended since the last call."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.exe, self.argv, self.cwd = "", [], ""
        self.modules: list[ModuleSnapshot] = []
        self.python_frames: dict[int, PyFrame] = {}
        self.pymalloc_seq = -1
        self.python_malloc = ""   # PYTHONMALLOC as the process had it ("" unset)
        self._offset = 0      # bytes parsed
        self._lineno = 0      # lines parsed
        self._snap = None     # a snapshot whose lines are not all there yet
        self._text: dict[str, str] = {}   # hex field -> its text (file names repeat)

    def update(self, final: bool = True) -> None:
        """Parses the lines appended since the last call: every one with `final` (the process
        has ended; a last line cut short is an error, as in a file read whole), else only the
        complete ones (the recorder may be writing the next). A missing file reads as empty."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return
        if not final:
            data = data[:data.rfind(b"\n") + 1]
        self._offset += len(data)
        for line in data.decode("ascii", "replace").splitlines():
            self._lineno += 1
            try:
                self._line(line)
            except (ValueError, IndexError):
                raise TraceError(self.path, None,
                                 f"line {self._lineno}: malformed module map line {line!r}")

    def _unhex(self, s: str) -> str:
        text = self._text.get(s)
        if text is None:
            text = self._text[s] = hex_text(s)
        return text

    def _line(self, line: str) -> None:
        if line.startswith("P "):   # a Python frame (most lines of a Python program's file);
            # may fall inside a snapshot's lines
            _, fid, src_line, file, func = line.split(" ")
            self.python_frames[int(fid, 16)] = PyFrame(self._unhex(file), self._unhex(func),
                                                       int(src_line, 16))
        elif line.startswith("X "):
            self.exe = self._unhex(line[2:])
        elif line.startswith("A "):
            self.argv = self._unhex(line[2:]).split("\0")[:-1] if line[2:] else []
        elif line.startswith("C "):
            self.cwd = self._unhex(line[2:])
        elif line.startswith("V "):
            self.python_malloc = self._unhex(line[2:])
        elif line.startswith("M "):
            seq, plus = line[2:].partition(" ")[::2]
            if plus not in ("", "+"):
                raise ValueError(line)
            # "M seq +": the last snapshot plus the lines that follow (a library added)
            before = list(self.modules[-1].modules) if plus and self.modules else []
            self._snap = ModuleSnapshot(int(seq, 16), before)
        elif line.startswith("m ") and self._snap is not None:
            parts = line.split(" ")
            path = self._unhex(parts[4]) if len(parts) > 4 else ""
            self._snap.modules.append(Module(path or self.exe, int(parts[1], 16),
                                             int(parts[2], 16), int(parts[3], 16)))
        elif line == "E" and self._snap is not None:
            # Of two snapshots with the same seq the later holds: the recorder writes one per
            # library that a call site first lies in ("M seq +"), the last plus that library,
            # with the last one's seq. Kept apart, a program that loads N libraries would keep
            # N lists of up to N modules in its .hct.
            if self.modules and self.modules[-1].seq == self._snap.seq:
                self.modules[-1] = self._snap
            else:
                self.modules.append(self._snap)
            self._snap = None
        elif line.startswith("Y "):   # pymalloc recorded from this seq on
            self.pymalloc_seq = int(line[2:], 16)
