"""Symbolization: code addresses of a traced process -> (function, module).

A process's module map (Process.modules_at) says which ELF object holds an address and at which load
bias (`base`), so the object's own virtual address is `addr - base`. Function symbols come from the
object's .symtab, else from separate debuginfo (/usr/lib/debug/.build-id/xx/rest.debug via the
NT_GNU_BUILD_ID note, or .gnu_debuglink), else from .dynsym. Symbol tables are read straight into
numpy and looked up with np.searchsorted, cached per module path. C++ names are demangled through one
batched `c++filt` call when binutils is installed.

Nothing here raises for a module that cannot be read ("linux-vdso.so.1", a deleted file, a foreign
architecture): its addresses resolve to function "?".

Python frames (frame values with PY_FRAME_TAG, recorded in CPython programs) need no symbol
table: they resolve to Symbol(function, file, line) from the process's python_frames.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..trace.model import PY_FRAME_TAG

UNKNOWN = "?"
DEBUG_ROOT = "/usr/lib/debug"

_STT_FUNC, _STT_GNU_IFUNC = 2, 10
_SHN_UNDEF = 0
# Elf{32,64}_Sym, in file order of their fields.
_SYM64 = [("name", "u4"), ("info", "u1"), ("other", "u1"), ("shndx", "u2"), ("value", "u8"),
          ("size", "u8")]
_SYM32 = [("name", "u4"), ("value", "u4"), ("size", "u4"), ("info", "u1"), ("other", "u1"),
          ("shndx", "u2")]


class Symbol(NamedTuple):
    """What an address resolved to: the function's name, the module's file name (basename), and the
    address within the module (its ELF virtual address, stable across runs and processes; the
    address itself when no module holds it)."""

    function: str
    module: str
    offset: int


@dataclass
class SymbolTable:
    """The function symbols of one ELF object, sorted by start address (object virtual addresses)."""

    starts: np.ndarray   # uint64, sorted, unique
    ends: np.ndarray     # uint64, exclusive
    names: list

    @classmethod
    def empty(cls) -> "SymbolTable":
        return cls(np.zeros(0, np.uint64), np.zeros(0, np.uint64), [])

    def lookup(self, vaddrs: np.ndarray) -> np.ndarray:
        """Index into `names` of the symbol containing each virtual address, -1 where none does."""
        vaddrs = np.asarray(vaddrs, np.uint64)
        i = np.searchsorted(self.starts, vaddrs, side="right").astype(np.int64) - 1
        ok = i >= 0
        ok[ok] = vaddrs[ok] < self.ends[i[ok]]
        return np.where(ok, i, -1)


def _read_symbols(elf, section_name: str) -> tuple[np.ndarray, list]:
    """Function symbols of one symbol table section: a (value, size) record array and names."""
    sec = elf.get_section_by_name(section_name)
    if sec is None or sec["sh_type"] not in ("SHT_SYMTAB", "SHT_DYNSYM") or sec["sh_size"] == 0:
        return np.zeros(0, [("value", "u8"), ("size", "u8")]), []
    endian = "<" if elf.little_endian else ">"
    fields = _SYM64 if elf.elfclass == 64 else _SYM32
    dtype = np.dtype([(n, endian + t) for n, t in fields])
    data = sec.data()
    syms = np.frombuffer(data, dtype, count=len(data) // dtype.itemsize)
    kind = syms["info"] & 0xF
    keep = ((kind == _STT_FUNC) | (kind == _STT_GNU_IFUNC)) & (syms["shndx"] != _SHN_UNDEF) \
        & (syms["value"] != 0)
    syms = syms[keep]
    strtab = elf.get_section(sec["sh_link"]).data()
    names = []
    for off in syms["name"].tolist():
        end = strtab.find(b"\0", off)
        names.append(strtab[off:end if end >= 0 else len(strtab)].decode("utf-8", "replace"))
    out = np.empty(len(syms), [("value", "u8"), ("size", "u8")])
    out["value"], out["size"] = syms["value"], syms["size"]
    return out, names


def _build_id(elf) -> str | None:
    """The NT_GNU_BUILD_ID note of an ELF object, as hex, if it has one."""
    for sec in elf.iter_sections():
        if sec["sh_type"] != "SHT_NOTE":
            continue
        for note in sec.iter_notes():
            if note["n_type"] == "NT_GNU_BUILD_ID":
                return note["n_desc"]
    return None


def _debuglink(elf) -> str | None:
    """The file name in .gnu_debuglink (the CRC that follows it is not checked)."""
    sec = elf.get_section_by_name(".gnu_debuglink")
    if sec is None:
        return None
    name = sec.data().split(b"\0", 1)[0]
    return name.decode("utf-8", "replace") or None


def debug_file_candidates(path: str, build_id: str | None, debuglink: str | None,
                          debug_root: str = DEBUG_ROOT) -> list:
    """Where separate debuginfo for `path` may live, in the order gdb looks."""
    out = []
    if build_id and len(build_id) > 2:
        out.append(os.path.join(debug_root, ".build-id", build_id[:2], build_id[2:] + ".debug"))
    if debuglink:
        d = os.path.dirname(os.path.realpath(path))
        out += [os.path.join(d, debuglink), os.path.join(d, ".debug", debuglink),
                os.path.join(debug_root, d.lstrip("/"), debuglink)]
    return [p for p in out if os.path.realpath(p) != os.path.realpath(path)]


def _best_names(starts: np.ndarray, names: list, order: np.ndarray) -> tuple[np.ndarray, list]:
    """One name per distinct start address: among aliases (malloc, __libc_malloc, __malloc) the one
    with the fewest leading underscores, then the shortest."""
    starts = starts[order]
    first = np.ones(len(starts), bool)
    first[1:] = starts[1:] != starts[:-1]
    group_starts = np.flatnonzero(first)
    bounds = np.append(group_starts, len(starts))
    chosen = []
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        cands = [names[k] for k in order[a:b].tolist()]
        chosen.append(cands[0] if b - a == 1 else
                      min(cands, key=lambda s: (len(s) - len(s.lstrip("_")), len(s), s)))
    return group_starts, chosen


def load_symbol_table(path: str, debug_root: str = DEBUG_ROOT) -> SymbolTable:
    """Reads the function symbols of the ELF file at `path` (and of its debuginfo, if separate).

    Returns an empty table when the file is missing or unreadable or not ELF.
    """
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    parts, names = [], []
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            recs, n = _read_symbols(elf, ".symtab")
            if not n:
                for dbg in debug_file_candidates(path, _build_id(elf), _debuglink(elf), debug_root):
                    try:
                        with open(dbg, "rb") as g:
                            recs, n = _read_symbols(ELFFile(g), ".symtab")
                    except (OSError, ELFError, ValueError):
                        continue
                    if n:
                        break
            parts.append(recs)
            names += n
            # .dynsym too: a debug file or symtab may lack exported aliases; duplicates merge below.
            recs, n = _read_symbols(elf, ".dynsym")
            parts.append(recs)
            names += n
    except (OSError, ELFError, ValueError, KeyError, IndexError, AssertionError):
        return SymbolTable.empty()
    if not names:
        return SymbolTable.empty()
    recs = np.concatenate(parts)
    order = np.argsort(recs["value"], kind="stable")
    firsts, chosen = _best_names(recs["value"], names, order)
    starts = recs["value"][order][firsts]
    # A symbol's end: its size, the largest among its aliases; size 0 -> up to the next symbol.
    sizes = np.maximum.reduceat(recs["size"][order], firsts)
    nxt = np.append(starts[1:], starts[-1] + np.uint64(1))
    ends = np.where(sizes > 0, starts + sizes, nxt)
    return SymbolTable(starts, ends, chosen)


def _module_fields(m) -> tuple[str, int, int, int]:
    """(path, base, start, end) of a Module or of a [path, base, start, end] row."""
    if hasattr(m, "path"):
        return m.path, int(m.base), int(m.start), int(m.end)
    return str(m[0]), int(m[1]), int(m[2]), int(m[3])


class Symbolizer:
    """Maps code addresses to Symbol(function, module), caching symbol tables per module path.

    `return_addresses=True` (the default) treats addresses as return addresses, as call sites and
    stack frames are: the call instruction is just before them, so `addr - 1` is what gets looked up
    (a call at the very end of a function, to a noreturn function, would otherwise resolve to the
    next function).
    """

    def __init__(self, debug_root: str = DEBUG_ROOT, demangle: bool = True,
                 return_addresses: bool = True):
        self.debug_root = debug_root
        self.return_addresses = return_addresses
        self._tables: dict = {}
        self._demangled: dict = {}
        self._cxxfilt = shutil.which("c++filt") if demangle else None

    def table(self, path: str) -> SymbolTable:
        """The (cached) symbol table of the module at `path`."""
        tab = self._tables.get(path)
        if tab is None:
            # Relative names ("linux-vdso.so.1") are no file of the traced process: never open them.
            tab = (load_symbol_table(path, self.debug_root) if os.path.isabs(path)
                   else SymbolTable.empty())
            self._tables[path] = tab
        return tab

    def lookup(self, addrs, modules) -> list:
        """Symbols of `addrs` (any int sequence) under one module map (list of Module or rows).

        Address 0 and addresses outside every module give Symbol("?", "?", addr)."""
        addrs = np.asarray(addrs, np.uint64).reshape(-1)
        out = [Symbol(UNKNOWN, UNKNOWN, a) for a in addrs.tolist()]
        mods = sorted((_module_fields(m) for m in modules), key=lambda m: m[2])
        if not len(addrs) or not mods:
            return out
        starts = np.array([m[2] for m in mods], np.uint64)
        ends = np.array([m[3] for m in mods], np.uint64)
        probe = addrs - np.uint64(1) if self.return_addresses else addrs
        probe = np.where(addrs == 0, addrs, probe)
        mi = np.searchsorted(starts, probe, side="right").astype(np.int64) - 1
        inside = (mi >= 0) & (addrs != 0)
        inside[inside] = probe[inside] < ends[mi[inside]]
        raw = {}
        for k in np.unique(mi[inside]).tolist():
            path, base = mods[k][0], mods[k][1]
            sel = np.flatnonzero(inside & (mi == k))
            tab = self.table(path)
            vaddrs = addrs[sel] - np.uint64(base % (1 << 64))  # wraps like the CPU's arithmetic
            probes = vaddrs - np.uint64(1) if self.return_addresses else vaddrs
            module = os.path.basename(path) or UNKNOWN
            for j, s, v in zip(sel.tolist(), tab.lookup(probes).tolist(), vaddrs.tolist()):
                raw[j] = (tab.names[s] if s >= 0 else UNKNOWN, module, v)
        self._demangle({f for f, _, _ in raw.values()})
        for j, (f, module, v) in raw.items():
            out[j] = Symbol(self._demangled.get(f, f), module, v)
        return out

    def symbolize(self, process, addrs, seqs=None) -> list:
        """Symbols of `addrs` in `process`, each under the module map in force at its seq
        (`seqs`: one per address; default: the last snapshot, which knows every dlopen)."""
        addrs = np.asarray(addrs, np.uint64).reshape(-1)
        py = (addrs & np.uint64(PY_FRAME_TAG)) != 0
        if py.any():
            out = [None] * len(addrs)
            native = np.flatnonzero(~py)
            if len(native):
                for j, sym in zip(native.tolist(), self.symbolize(
                        process, addrs[native], None if seqs is None else np.asarray(seqs)[native])):
                    out[j] = sym
            for j in np.flatnonzero(py).tolist():
                out[j] = python_symbol(process, int(addrs[j]))
            return out
        snaps = process.modules
        if not snaps:
            return self.lookup(addrs, [])
        if seqs is None:
            return self.lookup(addrs, snaps[-1].modules)
        snap_seqs = np.array([s.seq for s in snaps], np.uint64)
        which = np.searchsorted(snap_seqs, np.asarray(seqs, np.uint64), side="right") - 1
        which = np.maximum(which, 0)
        out = [None] * len(addrs)
        for k in np.unique(which).tolist():
            sel = np.flatnonzero(which == k)
            for j, sym in zip(sel.tolist(), self.lookup(addrs[sel], snaps[k].modules)):
                out[j] = sym
        return out

    def _demangle(self, names) -> None:
        """Demangles the C++ names among `names` not seen yet, in one c++filt run."""
        todo = sorted(n for n in names if n.startswith("_Z") and n not in self._demangled
                      and "\n" not in n)
        if not todo:
            return
        result = todo
        if self._cxxfilt:
            try:
                proc = subprocess.run([self._cxxfilt], input="\n".join(todo) + "\n",
                                      capture_output=True, text=True, timeout=60)
                lines = proc.stdout.splitlines()
                if proc.returncode == 0 and len(lines) == len(todo):
                    result = lines
            except (OSError, subprocess.SubprocessError):
                pass
        self._demangled.update(zip(todo, result))


def python_symbol(process, frame: int) -> Symbol:
    """The Symbol of a Python frame value: (function, file, line); "?" for an id the process
    does not define (a definition that a kill cut off)."""
    f = process.python_frames.get(int(frame) & 0xFFFFFFFF)
    return Symbol(f.function, f.file, f.line) if f is not None else Symbol(UNKNOWN, UNKNOWN, 0)
