"""The benchmark corpus: real programs, each recorded twice with different inputs.

Used by the forecasting and allocator-lab benchmarks (cross-run protocols train on run "a" and test
on run "b"). Recordings are cached under bench/corpus/ (delete it to record again).

    python bench/corpus.py            # record whatever is missing, print the table
    python bench/corpus.py --list     # what is there
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
PYTHON = sys.executable


@dataclass
class Program:
    """One program of the corpus: how to make its two inputs and how to run it on one."""

    name: str
    kind: str                    # what the program is, for tables
    follow_children: bool = False
    python: bool = True          # Python call sites in CPython (heapcast record's default)
    extra: bool = False          # recorded only when asked for by name (--programs)

    def prepare(self, run: str) -> list:
        """Writes the input of run "a" or "b" and returns the command line."""
        return PREPARE[self.name](run)

    def env(self) -> dict:
        return {"PYTHONMALLOC": "malloc"} if self.name.startswith("python") else {}


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


PREPARE = {"python": _python, "python-native": _python, "sqlite3": _sqlite, "gcc": _gcc, "g++": _cxx, "jq": _jq,
           "perl": _perl}
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
]


def trace_path(program: str, run: str) -> Path:
    return CACHE / f"{program}-{run}"


def ensure(programs=None, runs=("a", "b"), quiet=False) -> dict:
    """Records whatever is missing; returns {(program, run): trace path} for the available ones."""
    INPUTS.mkdir(parents=True, exist_ok=True)
    out = {}
    for prog in PROGRAMS:
        if (prog.name not in programs) if programs else prog.extra:
            continue
        if shutil.which(PYTHON if prog.name.startswith("python") else prog.name) is None:
            if not quiet:
                print(f"corpus: {prog.name} is not installed, skipped", file=sys.stderr)
            continue
        for run in runs:
            path = trace_path(prog.name, run)
            if not (path / "session.json").exists():
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
    a = ap.parse_args(argv)
    progs = a.programs.split(",") if a.programs else None
    traces = ensure(progs) if not a.list else {
        (p.name, r): trace_path(p.name, r) for p in PROGRAMS for r in "ab"
        if (trace_path(p.name, r) / "session.json").exists()}
    print(f"{'program':10} {'run':3} {'events':>12} {'processes':>9}  path")
    for (name, run), path in traces.items():
        t = heapcast.load(path)
        print(f"{name:10} {run:3} {t.event_count:>12,} {len(t.processes):>9}  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
