"""heapcast.stats.symbolize on real ELF files: programs compiled here with gcc/g++, and this process's libc."""
import ctypes
import os
import shutil
import subprocess

import numpy as np
import pytest

from heapcast.stats.symbolize import Symbolizer, load_symbol_table
from heapcast.trace.model import Module, ModuleSnapshot, Process

SOURCE = r"""
static int counter;
__attribute__((noinline)) static int hidden_helper(int x) { counter += x; return counter * 3; }
__attribute__((noinline)) int heapcast_alpha(int x) { return hidden_helper(x) + 1; }
__attribute__((noinline)) int heapcast_beta(int x) { return heapcast_alpha(x) * 2; }
int main(int argc, char **argv) { return heapcast_beta(argc) & 1; }
"""
BASE = 0x555555554000  # where a PIE would be loaded: the load bias


def compile_c(tmp_path, name, source, *flags, compiler="gcc"):
    if shutil.which(compiler) is None:
        pytest.skip(f"{compiler} is not installed")
    src = tmp_path / (name + (".cc" if compiler == "g++" else ".c"))
    src.write_text(source)
    exe = tmp_path / name
    subprocess.run([compiler, "-O1", "-g", "-Wl,--build-id", *flags, "-o", str(exe), str(src)],
                   check=True, capture_output=True)
    return exe


def nm_functions(path) -> dict:
    """name -> (address, size) of the code symbols, as binutils' nm reads them (size 0: unknown)."""
    out = subprocess.run(["nm", "-S", "--defined-only", str(path)], check=True, capture_output=True,
                         text=True).stdout
    funcs = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in "tTW":
            funcs[parts[3]] = (int(parts[0], 16), int(parts[1], 16))
        elif len(parts) == 3 and parts[1] in "tTW":
            funcs[parts[2]] = (int(parts[0], 16), 0)
    return funcs


def exe_module(exe, funcs, base=BASE):
    lo = min(a for a, _ in funcs.values())
    hi = max(a + s for a, s in funcs.values())
    return Module(str(exe), base, base + lo - 0x100, base + hi + 0x100)


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sym")
    exe = compile_c(tmp, "prog", SOURCE)
    return exe, nm_functions(exe)


def test_functions_by_address_including_return_addresses_at_the_end(program):
    exe, funcs = program
    mod = exe_module(exe, funcs)
    names = ["heapcast_alpha", "heapcast_beta", "hidden_helper", "main"]
    # A return address is looked up one byte back: one just past a function's end is still it.
    addrs = [BASE + funcs[n][0] + 1 for n in names] + [BASE + funcs[n][0] + funcs[n][1] for n in names]
    syms = Symbolizer().lookup(addrs, [mod])
    assert [s.function for s in syms] == names + names
    assert {s.module for s in syms} == {"prog"}
    assert [s.offset for s in syms[:4]] == [funcs[n][0] + 1 for n in names]
    # As plain code addresses (return_addresses=False), the function's first byte is the function.
    plain = Symbolizer(return_addresses=False).lookup([BASE + funcs[n][0] for n in names], [mod])
    assert [s.function for s in plain] == names


def test_vectorized_lookup_agrees_with_one_by_one(program):
    exe, funcs = program
    mod = exe_module(exe, funcs)
    rng = np.random.default_rng(1)
    addrs = rng.integers(mod.start, mod.end, 5000, dtype=np.uint64)
    sym = Symbolizer()
    many = sym.lookup(addrs, [mod])
    assert many[:50] == [sym.lookup([a], [mod])[0] for a in addrs[:50].tolist()]
    # Every address inside a function (as nm sizes it) gets that function's name; elsewhere the
    # nearest symbol below only when it has no size (it then runs up to the next symbol).
    unsized = {n for n, (_, size) in funcs.items() if size == 0}
    for a, s in zip(addrs.tolist(), many):
        v = a - 1 - BASE
        inside = [n for n, (lo, size) in funcs.items() if lo <= v < lo + size]
        if inside:
            assert s.function == inside[0]
        else:
            assert s.function == "?" or s.function in unsized


def test_unknown_addresses_and_unreadable_modules(tmp_path, program):
    exe, funcs = program
    text = tmp_path / "not-elf.so"
    text.write_text("hello")
    mods = [Module("linux-vdso.so.1", 0x1000, 0x1000, 0x2000),
            Module("/nonexistent/libgone.so (deleted)", 0x10000, 0x10000, 0x20000),
            Module(str(text), 0x30000, 0x30000, 0x40000),
            Module(str(tmp_path), 0x50000, 0x50000, 0x60000)]          # a directory
    syms = Symbolizer().lookup([0x1800, 0x10800, 0x30800, 0x50800, 0x90000, 0], mods)
    assert [(s.function, s.module) for s in syms] == [
        ("?", "linux-vdso.so.1"), ("?", "libgone.so (deleted)"), ("?", "not-elf.so"),
        ("?", os.path.basename(tmp_path)), ("?", "?"), ("?", "?")]
    assert syms[4].offset == 0x90000            # outside every module: the address itself
    assert Symbolizer().lookup([0x1234], []) == [("?", "?", 0x1234)]


def test_stripped_program_with_debuginfo_by_build_id_and_by_debuglink(tmp_path, program):
    exe, funcs = program
    debug_root = tmp_path / "debug"
    stripped = tmp_path / "stripped"
    dbg = tmp_path / "prog.debug"
    subprocess.run(["objcopy", "--only-keep-debug", str(exe), str(dbg)], check=True)
    subprocess.run(["strip", "-o", str(stripped), str(exe)], check=True)
    mod = exe_module(stripped, funcs)
    addr = BASE + funcs["hidden_helper"][0] + 4     # a static function: only in .symtab
    assert Symbolizer(debug_root=str(debug_root)).lookup([addr], [mod])[0].function == "?"

    note = subprocess.run(["readelf", "-n", str(stripped)], check=True, capture_output=True,
                          text=True).stdout
    build_id = note.split("Build ID:")[1].split()[0]
    by_id = debug_root / ".build-id" / build_id[:2] / (build_id[2:] + ".debug")
    by_id.parent.mkdir(parents=True)
    shutil.copy(dbg, by_id)
    [sym] = Symbolizer(debug_root=str(debug_root)).lookup([addr], [mod])
    assert (sym.function, sym.module) == ("hidden_helper", "stripped")

    linked = tmp_path / "linked"
    subprocess.run(["objcopy", f"--add-gnu-debuglink={dbg}", str(stripped), str(linked)], check=True)
    [sym] = Symbolizer(debug_root=str(tmp_path / "empty")).lookup([addr], [exe_module(linked, funcs)])
    assert (sym.function, sym.module) == ("hidden_helper", "linked")


def test_cxx_names_are_demangled(tmp_path):
    exe = compile_c(tmp_path, "cxx", "namespace heapcast { __attribute__((noinline)) int twice(int x)"
                    " { return 2 * x; } }\nint main(int c, char **) { return heapcast::twice(c); }\n",
                    compiler="g++")
    funcs = nm_functions(exe)
    addr = BASE + funcs["_ZN8heapcast5twiceEi"][0] + 1
    [sym] = Symbolizer().lookup([addr], [exe_module(exe, funcs)])
    assert sym.function == ("heapcast::twice(int)" if shutil.which("c++filt") else "_ZN8heapcast5twiceEi")
    [raw] = Symbolizer(demangle=False).lookup([addr], [exe_module(exe, funcs)])
    assert raw.function == "_ZN8heapcast5twiceEi"


def own_modules():
    """This process's module map from /proc/self/maps: (path, load bias, start, end) per file."""
    mods = {}
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) < 6 or not parts[5].startswith("/"):
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            path, offset = parts[5].strip(), int(parts[2], 16)
            m = mods.setdefault(path, [path, lo - offset, lo, hi])
            m[1], m[2], m[3] = min(m[1], lo - offset), min(m[2], lo), max(m[3], hi)
    return list(mods.values())


def test_libc_malloc_resolves_in_this_process():
    libc = ctypes.CDLL(None)
    malloc = ctypes.cast(libc.malloc, ctypes.c_void_p).value
    free = ctypes.cast(libc.free, ctypes.c_void_p).value
    syms = Symbolizer().lookup([malloc + 1, free + 1], own_modules())
    assert all(s.module.startswith("libc") for s in syms), syms
    assert syms[0].function in ("malloc", "__libc_malloc") and syms[1].function in ("free", "__libc_free")


def test_module_map_at_each_seq_and_cache(program):
    """An address of a library dlopen'ed later is unknown before the snapshot that loads it."""
    exe, funcs = program
    lib = Module(str(exe), 0x7F0000000000, 0x7F0000000000, 0x7F0000010000)
    p = Process(index=0, pid=1, modules=[ModuleSnapshot(0, []), ModuleSnapshot(50, [lib])])
    addr = lib.base + funcs["heapcast_beta"][0] + 2
    sym = Symbolizer()
    got = sym.symbolize(p, [addr, addr, addr], seqs=[10, 50, 99])
    assert [s.function for s in got] == ["?", "heapcast_beta", "heapcast_beta"]
    assert sym.symbolize(p, [addr])[0].function == "heapcast_beta"   # default: the last snapshot
    assert sym.table(str(exe)) is sym.table(str(exe))


def test_symbol_table_of_libc_has_aliases_merged():
    path = next(m[0] for m in own_modules() if os.path.basename(m[0]).startswith("libc.so"))
    tab = load_symbol_table(path)
    assert len(tab.names) > 1000
    assert np.all(np.diff(tab.starts.astype(np.int64)) > 0) and np.all(tab.ends > tab.starts)
    assert "malloc" in tab.names and "__libc_malloc" not in tab.names
