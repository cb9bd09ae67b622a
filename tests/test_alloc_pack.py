"""heapcast's packing backend (`heapcast run --backend pack`, native/alloc/pack.c): pages of freed
blocks go back to the kernel, a randomized stress of every entry point from several threads keeps
every block's contents, fork while other threads allocate never hangs the child, real programs
run, the backend switch reaches the allocator (and a wrong one is refused), and blocks of two
lifetime groups never share a span. glibc's semantics under the packer are checked by
tests/test_alloc_run.py, whose heap maps include the packer."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from heapcast.alloc import AllocError, environment

try:
    environment("none", check=False)
except AllocError as e:   # pragma: no cover - only where libmimalloc-dev was missing at install
    pytest.skip(str(e), allow_module_level=True)

PACK = {"HEAPCAST_ALLOC_BACKEND": "pack"}


def under(cmd, backend="pack", extra=None, timeout=120, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEAPCAST_")}
    env.update(environment("none", backend=backend))
    env.update(extra or {})
    return subprocess.run([str(c) for c in cmd], env=env, capture_output=True, timeout=timeout, **kw)


def rss(stdout: bytes) -> tuple[float, float, float]:
    word, before, peak, after = stdout.split()
    assert word == b"rss"
    return float(before), float(peak), float(after)


def test_freed_pages_go_back_to_the_kernel(build, untraced):
    prog = build("pack_rss")
    got = under([prog])
    assert got.returncode == 0, got.stderr
    before, peak, after = rss(got.stdout)
    assert peak - before > 190          # 200 MB of small blocks were resident
    # all freed: what stays is the metadata and the dirty-page budget, not the blocks
    assert after - before < 0.1 * (peak - before), (before, peak, after)
    # the same program keeps its pages under glibc and under the mimalloc backend: the test
    # measures the packer, not the program
    for other in (untraced([prog]), under([prog], backend="mimalloc")):
        assert other.returncode == 0
        b, p, a = rss(other.stdout)
        assert a - b > 0.5 * (p - b), (b, p, a)


@pytest.mark.parametrize("extra", [{}, {"HEAPCAST_ALLOC_HEAPS": "0000001"},
                                   {"HEAPCAST_PACK_SPAN": "14", "HEAPCAST_PACK_DIRTY": "0"},
                                   {"HEAPCAST_PACK_GRAIN": "8", "STRESS_MIN_ALIGN": "8"}],
                         ids=["group0", "group1", "16k-spans-no-dirty-budget", "align8"])
def test_randomized_stress_keeps_every_blocks_contents(build, extra):
    got = under([build("pack_stress")], extra=extra, timeout=300)
    assert got.returncode == 0, (got.stdout, got.stderr)
    assert got.stdout == b"ok 400000\n"


def test_fork_while_threads_allocate_never_hangs_the_child(build):
    got = under([build("pack_fork_threads")], timeout=120)
    assert got.returncode == 0, got.stderr      # SIGALRM (-14) if a child hung
    assert got.stdout == b"forks 40 ok 40\n"


def test_python_and_sqlite3_run_under_the_packer():
    code = ("import json, threading, sqlite3, zlib\n"
            "def work(): [json.loads(json.dumps({'k': list(range(i % 50))})) for i in range(3000)]\n"
            "ts = [threading.Thread(target=work) for _ in range(4)]\n"
            "[t.start() for t in ts]; [t.join() for t in ts]\n"
            "big = bytearray(); [big.extend(b'x' * 100000) for _ in range(40)]\n"   # mremap'd
            "db = sqlite3.connect(':memory:')\n"
            "db.execute('create table t(a)')\n"
            "db.executemany('insert into t values (?)', [(i,) for i in range(20000)])\n"
            "print(db.execute('select count(*), sum(a) from t').fetchone(), len(big),"
            " zlib.crc32(bytes(big)))\n")
    got = under([sys.executable, "-c", code], extra={"PYTHONMALLOC": "malloc"})
    assert got.returncode == 0, got.stderr
    import zlib
    assert got.stdout.decode() == f"(20000, 199990000) 4000000 {zlib.crc32(b'x' * 4000000)}\n"
    if shutil.which("sqlite3"):
        sql = b"create table t(a, b); insert into t select value, hex(value) from generate_series(1, 50000);" \
              b"create index i on t(b); delete from t where a % 3 = 0; select count(*), sum(a), max(b) from t;"
        want = subprocess.run(["sqlite3", ":memory:"], input=sql, capture_output=True, timeout=60)
        got = under(["sqlite3", ":memory:"], input=sql)
        assert want.stdout == b"33334|833366667|39393938\n"
        assert got.returncode == 0 and got.stdout == want.stdout, got.stderr


def test_backend_switch(cli, tmp_path):
    env = cli("run", "--env", "--backend", "pack")
    assert env.returncode == 0
    lines = dict(line.split("=", 1) for line in env.stdout.splitlines())
    assert lines["HEAPCAST_ALLOC_BACKEND"] == "pack"
    assert dict(line.split("=", 1) for line in cli("run", "--env").stdout.splitlines())[
        "HEAPCAST_ALLOC_BACKEND"] == "pack"                                   # the default
    assert dict(line.split("=", 1) for line in cli("run", "--env", "--backend", "mimalloc")
                .stdout.splitlines())["HEAPCAST_ALLOC_BACKEND"] == "mimalloc"
    # the packer serves the program: it reserves its region, one mapping of 32 GiB, which the
    # mimalloc backend does not have; the library preloaded with no backend named is the packer
    probe = [sys.executable, "-c", "import re; print(sum(int(b, 16) - int(a, 16) >= 32 << 30 "
             "for a, b in re.findall(r'^([0-9a-f]+)-([0-9a-f]+)', open('/proc/self/maps').read(), re.M)))"]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HEAPCAST_")}
    pack = subprocess.run(probe, env={**clean, **lines}, capture_output=True, text=True)
    mim = subprocess.run(probe, env={**clean, **environment("none", backend="mimalloc")},
                         capture_output=True, text=True)
    bare = {k: v for k, v in environment("none").items() if k != "HEAPCAST_ALLOC_BACKEND"}
    unnamed = subprocess.run(probe, env={**clean, **bare}, capture_output=True, text=True)
    assert pack.stdout == unnamed.stdout == "1\n" and mim.stdout == "0\n", (pack, mim, unnamed)
    done = cli("run", "--backend", "pack", "--", "sh", "-c", "exit 5")
    assert done.returncode == 5
    with pytest.raises(AllocError, match="backend 'bogus'"):
        environment("none", backend="bogus")
    # a wrong value reaching the allocator directly: an error under the check, a warning otherwise
    bad = {**os.environ, **environment("none", check=False), "HEAPCAST_ALLOC_BACKEND": "bogus"}
    checked = subprocess.run(["true"], env={**bad, "HEAPCAST_ALLOC_CHECK": "1"},
                             capture_output=True, text=True)
    assert checked.returncode == 97 and "HEAPCAST_ALLOC_BACKEND=bogus" in checked.stderr
    warned = subprocess.run(["true"], env=bad, capture_output=True, text=True)
    assert warned.returncode == 0 and "using the packer" in warned.stderr
    # the packer's library has no mimalloc: asked for it directly, it says which library has
    wrong = {**bad, "HEAPCAST_ALLOC_BACKEND": "mimalloc"}
    checked = subprocess.run(["true"], env={**wrong, "HEAPCAST_ALLOC_CHECK": "1"},
                             capture_output=True, text=True)
    assert checked.returncode == 97 and "libheapcast_alloc_mimalloc.so" in checked.stderr


def test_the_packers_library_loads_nothing_but_itself():
    """What is loaded into every program run under the packer counts in its resident memory:
    mimalloc (its fallback before) and libm cost 0.45 MiB on a program that used neither. cat
    links neither, so whatever of them is mapped came with the allocator."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HEAPCAST_")}
    maps = subprocess.run(["cat", "/proc/self/maps"], env={**clean, **environment("none")},
                          capture_output=True, text=True, check=True).stdout
    assert "libheapcast_alloc.so" in maps
    assert "libmimalloc" not in maps and "libm.so" not in maps and "libm-" not in maps
    mim = subprocess.run(["cat", "/proc/self/maps"],
                         env={**clean, **environment("none", backend="mimalloc")},
                         capture_output=True, text=True, check=True).stdout
    assert "libheapcast_alloc_mimalloc.so" in mim and "libmimalloc" in mim



def test_lifetime_groups_get_spans_of_their_own(frag_trace, untraced):
    """The fragmenting pattern (tests/programs/alloc_frag.c: rounds of short/long pairs of a
    growing size) with the oracle's classes: short and long blocks of one size go to different
    groups' spans, the short ones' spans drain and go back. In one group the packer keeps as much
    as glibc (every round's size is a class of its own, long blocks pin every page)."""
    prog, trace = frag_trace

    def peak_kb(policy, extra=None):
        env = {k: v for k, v in os.environ.items() if not k.startswith("HEAPCAST_")}
        env.update(environment(policy, backend="pack"))
        env.update(extra or {})
        done = subprocess.run([str(prog)], env=env, capture_output=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return int(done.stdout.split()[3]), done.stderr.decode()

    glibc = int(untraced([prog]).stdout.split()[3])
    one, _ = peak_kb("none")
    grouped, dump = peak_kb(f"oracle:{trace}", {"HEAPCAST_PACK_DEBUG": "1"})
    assert grouped < 0.75 * one and grouped < 0.75 * glibc, (glibc, one, grouped)
    # the debug dump at exit lists spans per group: blocks sit in more than one group
    groups = {line.split()[1] for line in dump.splitlines() if line.startswith("pack g")}
    assert len(groups) >= 2, dump


def test_align_8_gives_8_byte_blocks_only_where_the_size_allows(build, cli):
    """--align 8: the packer's classes every 8 bytes, so blocks of 24, 40, 56 bytes are 8-byte
    aligned (less memory, as mimalloc's); sizes in multiples of 16 and every request for 16 stay
    16-byte aligned. The default keeps glibc's 16 for every block, and the mimalloc backend
    refuses --align 8."""
    exe = build("pack_align_probe")

    def least(extra):
        got = under([exe], extra=extra)
        assert got.returncode == 0, got.stderr
        first, second, third = got.stdout.decode().splitlines()
        assert second == "misaligned 0"
        assert third == "null", f"malloc returned NULL (size:count){third[4:]}; {got.stderr}"
        return {int(s): int(a) for s, a in (p.split(":") for p in first.split())}

    default = least({})
    assert set(default.values()) == {16}
    eight = least({"HEAPCAST_PACK_GRAIN": "8"})
    assert all(eight[s] == 8 for s in (1, 8, 24, 40, 56)), eight
    assert all(eight[s] == 16 for s in (16, 32, 48, 64, 31, 47)), eight
    env = cli("run", "--env", "--align", "8")
    assert env.returncode == 0 and "HEAPCAST_PACK_GRAIN=8" in env.stdout
    refused = cli("run", "--align", "8", "--backend", "mimalloc", "--", "true")
    assert refused.returncode != 0 and "only the packer" in refused.stderr


def test_freed_big_mappings_are_reused_and_calloc_still_reads_zero(build):
    """Blocks over 256 KiB: a freed mapping is kept for the next big request it fits, so a
    program that allocates and frees a large buffer in a loop does not fault in every page each
    time; calloc's block from a reused mapping still reads zero, realloc keeps the contents; a
    bigger request that none fits gives the smaller ones back (they are unmapped). Without the cache (HEAPCAST_PACK_BIG_CACHE=0) the same program gives the same results."""
    prog = build("pack_big_reuse")
    for extra, reused in (({}, 1), ({"HEAPCAST_PACK_BIG_CACHE": "0"}, None)):
        got = under([prog], extra=extra)
        assert got.returncode == 0, got.stderr
        lines = {line.split()[0]: line.split()[-1] for line in got.stdout.decode().splitlines()}
        assert {k: v for k, v in lines.items() if k != "reused"} == {
            "calloc": "1", "usable": "1", "realloc": "1", "churn": "1", "smaller": "1"}, got.stdout
        if reused is not None:
            assert lines["reused"] == "1", got.stdout


def test_without_its_region_the_packer_leaves_every_block_to_glibc(build, tmp_path):
    """Under an address-space limit the packer cannot reserve its 32 GiB region: the program
    still runs, with glibc's own malloc serving every block (a warning says so), glibc's
    semantics intact, and the --log summary names the backend that served it."""
    import json
    import resource

    def limited():
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))

    prog = build("alloc_semantics")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HEAPCAST_")}
    want = subprocess.run([prog], env=clean, capture_output=True, text=True,
                          preexec_fn=limited, timeout=120)
    env = {**clean, **environment("none"), "HEAPCAST_ALLOC_LOG": str(tmp_path / "log")}
    got = subprocess.run([prog], env=env, capture_output=True, text=True, preexec_fn=limited,
                         timeout=120)
    assert want.returncode == 0 and got.returncode == 0, got.stderr
    assert "could not reserve its address space; using glibc's malloc" in got.stderr
    assert got.stdout == want.stdout
    logs = list(tmp_path.glob("log.*.json"))
    assert len(logs) == 1 and json.loads(logs[0].read_text())["backend"] == "glibc"
