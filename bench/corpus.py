"""The benchmark corpus: real programs, each recorded twice with different inputs.

Used by the forecasting and allocator-lab benchmarks (cross-run protocols train on run "a" and test
on run "b"). Recordings are cached under bench/corpus/ (delete it to record again).

The cross-input programs (CROSS_INPUT, cached under bench/corpus-x/) are recorded three times,
and their runs are *different programs for the same engine*: two Python scripts, two SQL
workloads, two Perl scripts, two C files of different style for cc1. Run "a" is trained on, "v"
(a third program for the engine) is the validation run, "b" is tested on (bench/forecast_table.py,
protocol `cross-input`).

    python bench/corpus.py            # record whatever is missing, print the table
    python bench/corpus.py --list     # what is there
    python bench/corpus.py --cross    # the cross-input programs
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import heapcast

ROOT = Path(__file__).resolve().parent
CACHE = ROOT / "corpus"
INPUTS = CACHE / "inputs"
CROSS_CACHE = ROOT / "corpus-x"
CROSS_RUNS = ("a", "v", "b")
PYTHON = sys.executable


@dataclass
class Program:
    """One program of the corpus: how to make its two inputs and how to run it on one."""

    name: str
    kind: str                    # what the program is, for tables
    follow_children: bool = False
    python: bool = True          # Python call sites in CPython (heapcast record's default)
    extra: bool = False          # recorded only when asked for by name (--programs)
    exe: str = ""                # the executable (default: the name)

    def prepare(self, run: str) -> list:
        """Writes the input of run "a" or "b" (cross-input: "a", "v", "b") and returns the
        command line."""
        return PREPARE[self.name](run)

    def env(self) -> dict:
        return {"PYTHONMALLOC": "malloc"} if self.executable().startswith("python") else {}

    def executable(self) -> str:
        return self.exe or self.name


def _python(run):
    n, seed = (60000, 1) if run == "a" else (45000, 2)
    script = INPUTS / "py_work.py"
    script.write_text(
        "import json, re, random, collections, sys\n"
        "n, seed = int(sys.argv[1]), int(sys.argv[2])\n"
        "random.seed(seed)\n"
        "d = {str(i): [i, str(i) * (1 + i % 4), {'k': i, 'v': random.random()}] for i in range(n)}\n"
        "s = json.dumps(d)\n"
        "o = json.loads(s)\n"
        "c = collections.Counter(re.findall(r'\\d+', s[:n * 8]))\n"
        "words = sorted(set(w for w in s.split('\"') if w.isalpha()))\n"
        "print(len(o), len(c), len(words))\n")
    return [PYTHON, str(script), str(n), str(seed)]


def _sqlite(run):
    rows, groups = (120000, 97) if run == "a" else (80000, 53)
    sql = INPUTS / f"sqlite-{run}.sql"
    sql.write_text(
        "CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, grp INTEGER, payload BLOB);\nBEGIN;\n"
        f"WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {rows})\n"
        f"INSERT INTO t(name, grp, payload) SELECT hex(randomblob(8 + i % 24)), i % {groups}, "
        "randomblob(i % 200) FROM n;\nCOMMIT;\nCREATE INDEX t_name ON t(name);\n"
        "SELECT grp, count(*), sum(length(payload)) FROM t GROUP BY grp ORDER BY 3 DESC LIMIT 3;\n"
        "DELETE FROM t WHERE grp % 3 = 0;\nSELECT count(*) FROM t WHERE name LIKE 'A%';\n")
    return ["sh", "-c", f"exec sqlite3 :memory: < {sql}"]


def _c_source(run, functions):
    rng = random.Random(run)
    lines = ["#include <stdio.h>", "#include <stdlib.h>", "#include <string.h>"]
    for i in range(functions):
        ops = " ".join(f"x = x * {rng.randint(3, 99)} + (x >> {rng.randint(1, 7)}) ^ {rng.randint(0, 999)};"
                       for _ in range(rng.randint(3, 12)))
        lines.append(f"static long f{i}(long x) {{ if (x > {rng.randint(10, 1000)}) "
                     f"{{ {ops} }} return x + {i}; }}")
    lines.append("int main(int argc, char **argv) { long x = argc;")
    lines += [f"  x += f{i}(x);" for i in range(functions)]
    lines.append('  printf("%ld\\n", x); return 0; }')
    return "\n".join(lines) + "\n"


def _gcc(run):
    src = INPUTS / f"gen-{run}.c"
    src.write_text(_c_source(run, 400 if run == "a" else 250))
    return ["gcc", "-O2", "-c", str(src), "-o", str(INPUTS / f"gen-{run}.o")]


def _cxx(run):
    rng = random.Random("cxx" + run)
    n = 60 if run == "a" else 40
    body = ["#include <map>", "#include <string>", "#include <vector>", "#include <algorithm>",
            "#include <memory>", "#include <iostream>"]
    for i in range(n):
        t = rng.choice(["int", "long", "std::string", "double"])
        body.append(f"struct S{i} {{ std::vector<{t}> v; std::map<std::string, {t}> m; "
                    f"std::unique_ptr<int> p; }};")
        body.append(f"template <class T> T g{i}(T x) {{ std::vector<T> a(3, x); "
                    f"std::sort(a.begin(), a.end()); return a[{rng.randint(0, 2)}]; }}")
    body.append("int main() { long s = 0;")
    body += [f"  s += g{i}<long>({i}); S{i} x{i}; s += x{i}.v.size();" for i in range(n)]
    body.append("  std::cout << s << std::endl; }")
    src = INPUTS / f"gen-{run}.cc"
    src.write_text("\n".join(body) + "\n")
    return ["g++", "-O1", "-c", str(src), "-o", str(INPUTS / f"gencc-{run}.o")]


def _jq(run):
    rng = random.Random("jq" + run)
    n = 40000 if run == "a" else 25000
    data = [{"id": i, "name": f"n{rng.randint(0, 999)}", "tags": [f"t{rng.randint(0, 30)}"
             for _ in range(rng.randint(0, 5))], "score": rng.random()} for i in range(n)]
    path = INPUTS / f"jq-{run}.json"
    path.write_text(json.dumps(data))
    return ["jq", "-c", "group_by(.name) | map({name: .[0].name, n: length, "
            "tags: (map(.tags[]) | unique), best: (max_by(.score).id)}) | length", str(path)]


def _make(run):
    """GNU make dry-running (-n) a generated Makefile: variables, pattern substitutions and a
    dependency graph, all strings on make's malloc'd heap."""
    rng = random.Random("make" + run)
    n = 20000 if run == "a" else 14000
    lines = [".PHONY: all", "%.c: ; @:", "%.h: ; @:"]
    for i in range(n):
        heads = " ".join(f"h{rng.randint(0, n // 4)}.h" for _ in range(rng.randint(1, 6)))
        lines.append(f"V{i} := {heads} $(subst x,y,{'x' * rng.randint(1, 40)})")
        lines.append(f"o{i}.o: s{i}.c $(filter %.h,$(V{i}))\n"
                     f"\t@echo cc -c $< -o $@ $(patsubst %.h,-I%,$(filter %.h,$^)) "
                     f"$(words $(V{i}))")
    lines.append("all: " + " ".join(f"o{i}.o" for i in range(n)))
    path = INPUTS / f"Makefile-{run}"
    path.write_text("\n".join(lines) + "\n")
    return ["make", "-n", "-s", "-r", "-f", str(path), "all"]


def _tcl(run):
    """tclsh: dicts of lists, string building and a sort (Tcl's objects on the C heap)."""
    n = 400000 if run == "a" else 270000
    script = INPUTS / "work.tcl"
    script.write_text(
        "set n [lindex $argv 0]\nset d [dict create]\n"
        "for {set i 0} {$i < $n} {incr i} {\n"
        "  dict lappend d k[expr {$i * 7 % 6000}] [string repeat x [expr {$i % 37}]]\n}\n"
        "set l {}\nforeach {k v} $d { lappend l [list $k [llength $v] [join $v ,]] }\n"
        "set s [lsort -index 1 -integer $l]\nputs [llength $s]\n")
    return ["tclsh", str(script), str(n)]


def _perl(run):
    n = 150000 if run == "a" else 90000
    script = INPUTS / "work.pl"
    script.write_text(
        "my ($n, $seed) = @ARGV; srand($seed); my %h; my @a;\n"
        "for my $i (1..$n) { my $k = 'k' . int(rand($n / 3)); push @{$h{$k}}, $i;\n"
        "  push @a, join(',', map { $_ * 2 } 1..($i % 7)); shift @a if @a > 500; }\n"
        "my @keys = sort { scalar(@{$h{$b}}) <=> scalar(@{$h{$a}}) } keys %h;\n"
        "print scalar(@keys), \"\\n\";\n")
    return ["perl", str(script), str(n), "1" if run == "a" else "2"]


# ---- cross-input: each run is another program for the same engine -----------------------

_PY_SCRIPTS = {
    # a: dicts, JSON, regex (the corpus's python script's kind of work)
    "a": "import json, re, random\nrandom.seed(1)\n"
         "d = {str(i): [i, str(i) * (1 + i % 4), {'k': i, 'v': random.random()}] "
         "for i in range(40000)}\n"
         "s = json.dumps(d)\no = json.loads(s)\n"
         "print(len(o), len(re.findall(r'\\d+', s[:200000])))\n",
    # v: a tokenizer and a word-frequency table over generated text
    "v": "import collections, random\nrandom.seed(3)\n"
         "words = [''.join(random.choice('abcdefgh') for _ in range(random.randint(2, 9))) "
         "for _ in range(3000)]\n"
         "text = ' '.join(random.choice(words) for _ in range(150000))\n"
         "c = collections.Counter(text.split())\n"
         "pairs = collections.Counter(zip(text.split()[:-1], text.split()[1:]))\n"
         "print(len(c), c.most_common(3)[0][1], len(pairs))\n",
    # b: objects in a tree, sorting, string formatting, a class-based simulation
    "b": "import random\nrandom.seed(2)\n"
         "class Node:\n    __slots__ = ('key', 'left', 'right', 'tag')\n"
         "    def __init__(self, key):\n        self.key, self.left, self.right = key, None, None\n"
         "        self.tag = f'node-{key:06d}'\n"
         "def insert(root, key):\n    node = root\n    while True:\n"
         "        side = 'left' if key < node.key else 'right'\n"
         "        nxt = getattr(node, side)\n        if nxt is None:\n"
         "            setattr(node, side, Node(key))\n            return\n        node = nxt\n"
         "root = Node(500000)\nfor _ in range(30000):\n    insert(root, random.randrange(10**6))\n"
         "rows = [(random.random(), str(i), [i] * (i % 5)) for i in range(40000)]\n"
         "rows.sort()\nout = ['%s:%d' % (r[1], len(r[2])) for r in rows]\n"
         "print(len(out), root.tag)\n",
}


def _cross_input(name: str, text: str) -> str:
    """Writes a cross-input program's input file; returns its path."""
    path = CROSS_CACHE / "inputs" / name
    path.write_text(text)
    return str(path)


def _python_x(run):
    return [PYTHON, _cross_input(f"script-{run}.py", _PY_SCRIPTS[run])]


_SQL = {
    "a": "CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, grp INTEGER, payload BLOB);\nBEGIN;\n"
         "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 60000)\n"
         "INSERT INTO t(name, grp, payload) SELECT hex(randomblob(8 + i % 24)), i % 97, "
         "randomblob(i % 200) FROM n;\nCOMMIT;\nCREATE INDEX t_name ON t(name);\n"
         "SELECT grp, count(*), sum(length(payload)) FROM t GROUP BY grp ORDER BY 3 DESC LIMIT 3;\n"
         "DELETE FROM t WHERE grp % 3 = 0;\n",
    "v": "CREATE TABLE kv(k TEXT PRIMARY KEY, v TEXT) WITHOUT ROWID;\nBEGIN;\n"
         "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 40000)\n"
         "INSERT INTO kv SELECT printf('key%08d', i * 7919 % 1000003), "
         "substr(hex(randomblob(40)), 1, 10 + i % 60) FROM n;\nCOMMIT;\n"
         "UPDATE kv SET v = v || upper(v) WHERE k LIKE 'key0%';\n"
         "SELECT count(*), max(length(v)) FROM kv;\n",
    "b": "CREATE TABLE a(id INTEGER PRIMARY KEY, x INTEGER, s TEXT);\n"
         "CREATE TABLE b(id INTEGER PRIMARY KEY, a_id INTEGER, y REAL);\nBEGIN;\n"
         "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000)\n"
         "INSERT INTO a(x, s) SELECT i % 101, printf('%d-%s', i, hex(randomblob(3))) FROM n;\n"
         "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 50000)\n"
         "INSERT INTO b(a_id, y) SELECT 1 + i * 31 % 20000, i * 0.5 FROM n;\nCOMMIT;\n"
         "CREATE INDEX b_a ON b(a_id);\n"
         "SELECT a.x, count(*), avg(b.y), group_concat(substr(a.s, 1, 3)) FROM a JOIN b "
         "ON b.a_id = a.id GROUP BY a.x ORDER BY 2 DESC LIMIT 5;\n"
         "SELECT s FROM a WHERE s LIKE '%F%' ORDER BY s DESC LIMIT 3;\n",
}


def _sqlite_x(run):
    return ["sh", "-c", f"exec sqlite3 :memory: < {_cross_input(f'work-{run}.sql', _SQL[run])}"]


_PERL = {
    "a": "my %h; my @a;\nfor my $i (1..100000) { my $k = 'k' . ($i * 7 % 30000); "
         "push @{$h{$k}}, $i;\n  push @a, join(',', map { $_ * 2 } 1..($i % 7)); "
         "shift @a if @a > 500; }\nprint scalar(keys %h), \"\\n\";\n",
    "v": "my $text = join(' ', map { ('alpha', 'beta', 'gamma', 'delta')[$_ % 4] . $_ } "
         "1..60000);\nmy %c; $c{$_}++ for split / /, $text;\n"
         "my @s = sort { $c{$b} <=> $c{$a} || $a cmp $b } keys %c;\nprint scalar(@s), \"\\n\";\n",
    "b": "my @lines = map { sprintf('%05d;%s;%d', $_, 'x' x ($_ % 13), $_ * 3) } 1..60000;\n"
         "my %by; for (@lines) { my ($id, $pad, $v) = split /;/; "
         "(my $t = $pad) =~ s/x/y/g; $by{length $t} .= \"$id,\"; }\n"
         "my $n = 0; $n += length($by{$_}) for keys %by; my $r = reverse join('', @lines[0..999]);\n"
         "print $n, ' ', length($r), \"\\n\";\n",
}


def _perl_x(run):
    return ["perl", _cross_input(f"work-{run}.pl", _PERL[run])]


def _c_structs(seed, count):
    """C of another style than _c_source: structs, switch statements, macros, loops."""
    rng = random.Random(seed)
    lines = ["#include <stdlib.h>", "#include <string.h>",
             "#define CLAMP(x, lo, hi) ((x) < (lo) ? (lo) : (x) > (hi) ? (hi) : (x))"]
    for i in range(count):
        fields = "int f0; " + " ".join(f"{rng.choice(['int', 'long', 'char *', 'double'])} f{j};"
                                       for j in range(1, rng.randint(2, 8)))
        lines.append(f"struct s{i} {{ {fields} struct s{i} *next; }};")
        cases = " ".join(f"case {c}: acc += CLAMP(p->f0 * {c}, 0, {rng.randint(50, 500)}); break;"
                         for c in range(rng.randint(2, 9)))
        lines.append(f"int walk{i}(struct s{i} *p, int k) {{ int acc = 0; "
                     f"for (int n = 0; p && n < k; p = p->next, n++) {{ switch (n % 9) {{ {cases} "
                     f"default: acc ^= n; }} }} return acc; }}")
    lines.append("int main(void) { int t = 0;")
    lines += [f"  t += walk{i}(0, {i});" for i in range(count)]
    lines.append("  return t & 1; }")
    return "\n".join(lines) + "\n"


def _gcc_x(run):
    code = _c_source("xa", 300) if run == "a" else _c_structs("x" + run, 120 if run == "v" else 180)
    return ["gcc", "-O2", "-c", _cross_input(f"style-{run}.c", code), "-o",
            str(CROSS_CACHE / "inputs" / f"style-{run}.o")]


PREPARE = {"python-x": _python_x, "sqlite3-x": _sqlite_x, "perl-x": _perl_x, "gcc-x": _gcc_x,
           "python": _python, "python-native": _python, "sqlite3": _sqlite, "gcc": _gcc,
           "g++": _cxx, "jq": _jq, "perl": _perl, "make": _make, "tclsh": _tcl}
PROGRAMS = [
    Program("python", "CPython 3 (dict/json/regex), PYTHONMALLOC=malloc, Python call sites"),
    # The same recordings with native call sites (record --no-python): what Python call sites
    # give the forecasters. Not in the default table (cross-program would see python twice).
    Program("python-native", "CPython 3 as above, native call sites (--no-python)", python=False,
            extra=True),
    Program("sqlite3", "SQLite shell, in-memory database"),
    Program("gcc", "GCC compiling a generated C file (cc1)", follow_children=True),
    Program("g++", "G++ compiling generated C++ (cc1plus, C++)", follow_children=True),
    Program("jq", "jq grouping a JSON array (C)"),
    Program("perl", "Perl hashes and strings"),
    # Two more Debian programs whose peak RSS is mostly malloc'd heap, for the allocator table
    # (bench/alloc_table.py); not in the forecasting tables.
    Program("make", "GNU make dry-running a generated Makefile (C strings)", extra=True),
    Program("tclsh", "Tcl 8.6 dicts, lists and strings", extra=True),
]


CROSS_INPUT = [
    Program("python-x", "CPython: dicts/JSON | text counting (validation) | objects, sort "
            "(test)", exe="python"),
    Program("sqlite3-x", "SQLite: inserts, index, group by | key-value updates (validation) | "
            "join, group_concat (test)", exe="sqlite3"),
    Program("perl-x", "Perl: hashes of arrays | word counts (validation) | split, s///, "
            "strings (test)", exe="perl"),
    Program("gcc-x", "cc1: arithmetic functions | structs, switch, macros (validation, test: "
            "other code of that style)", follow_children=True, exe="gcc"),
]


def trace_path(program: str, run: str) -> Path:
    cross = any(p.name == program for p in CROSS_INPUT)
    return (CROSS_CACHE if cross else CACHE) / f"{program}-{run}"


def ensure(programs=None, runs=("a", "b"), quiet=False, cross=False) -> dict:
    """Records whatever is missing; returns {(program, run): trace path} for the available ones.
    `cross`: the cross-input programs (runs a, v, b) instead of the corpus's."""
    (CROSS_CACHE / "inputs" if cross else INPUTS).mkdir(parents=True, exist_ok=True)
    runs = CROSS_RUNS if cross else runs
    out = {}
    for prog in CROSS_INPUT if cross else PROGRAMS:
        if (prog.name not in programs) if programs else prog.extra:
            continue
        exe = prog.executable()
        if shutil.which(PYTHON if exe.startswith("python") else exe) is None:
            if not quiet:
                print(f"corpus: {prog.name} is not installed, skipped", file=sys.stderr)
            continue
        for run in runs:
            path = trace_path(prog.name, run)
            session = path / "session.json"
            if not session.exists() or json.loads(session.read_text()).get("exit_code"):
                if path.exists():
                    shutil.rmtree(path)
                r = heapcast.record(prog.prepare(run), output=path, env=prog.env(),
                                    follow_children=prog.follow_children, progress=False,
                                    python=prog.python)
                if r.exit_code != 0:
                    raise RuntimeError(f"{prog.name} run {run} exited with {r.exit_code}")
                if not quiet:
                    print(r.summary(), file=sys.stderr)
            out[(prog.name, run)] = path
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", help="comma-separated subset")
    ap.add_argument("--list", action="store_true", help="list what is cached")
    ap.add_argument("--cross", action="store_true", help="the cross-input programs")
    a = ap.parse_args(argv)
    progs = a.programs.split(",") if a.programs else None
    traces = ensure(progs, cross=a.cross) if not a.list else {
        (p.name, r): trace_path(p.name, r)
        for p in (CROSS_INPUT if a.cross else PROGRAMS) for r in (CROSS_RUNS if a.cross else "ab")
        if (trace_path(p.name, r) / "session.json").exists()}
    print(f"{'program':10} {'run':3} {'events':>12} {'processes':>9}  path")
    for (name, run), path in traces.items():
        t = heapcast.load(path)
        print(f"{name:10} {run:3} {t.event_count:>12,} {len(t.processes):>9}  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
