"""Real programs traced end to end: CPython (every object through malloc) and the sqlite3 shell.
Their output and exit code must not change, the trace must replay without a single free of an
address that was not live, and `heapcast stats` must summarize it."""
from __future__ import annotations

import json
import shutil
import sys

import pytest

import heapcast
from heapcast.trace.blocks import match_trace
from heapcast.trace.format import HEAP_OPS

PYTHON_CODE = """
import json, sys
d = {i: [str(i) * (i % 7), {"k": i}] for i in range(30000)}
s = json.dumps(d)
back = json.loads(s)
words = sorted(set(s.split('"')))
print(len(s), len(back), len(words), sum(len(w) for w in words))
sys.exit(3)
"""

SQL = """
create table t(a integer primary key, b text);
with recursive c(x) as (select 1 union all select x + 1 from c where x < 20000)
  insert into t select x, printf('%08d-%s', x * 7919 % 100003, hex(x)) from c;
create index tb on t(b);
select count(*), sum(length(b)), max(a) from t;
select substr(b, 1, 2) as p, count(*) from t group by p order by p limit 3;
delete from t where a % 3 = 0;
select count(*) from t;
"""


def _check_trace(path, min_events: int):
    """Loads a recorded trace and checks what any real program's trace must satisfy."""
    trace = heapcast.load(path)
    assert trace.event_count >= min_events and trace.lost_events == 0 and not trace.truncated
    for p, blocks in zip(trace.processes, match_trace(trace)):
        assert blocks.unknown_releases == 0, f"process {p.pid}: a free of an address that was not live"
        assert blocks.double_acquires == 0, f"process {p.pid}: an address live twice"
    return trace


def _check_stats(d: dict, trace) -> None:
    assert d["events"] == trace.event_count and d["processes"] == len(trace.processes)
    assert set(HEAP_OPS) <= set(d["ops"]) and d["ops"]["malloc"] > 0 and d["ops"]["free"] > 0
    assert sum(d["ops"][op] for op in HEAP_OPS) == d["events"]
    assert d["unknown_frees"] == 0 and d["lost_events"] == 0 and not d["truncated"]
    assert d["peak_live_bytes"] > 0 and d["peak_rss_bytes"] > 0 and d["threads"] >= 1


def test_python_traced_end_to_end(untraced, tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("PYTHONMALLOC", "malloc")  # every object through malloc, not pymalloc
    cmd = [sys.executable, "-c", PYTHON_CODE]
    plain = untraced(cmd)
    assert plain.returncode == 3, plain.stderr
    result = heapcast.record(cmd, output=tmp_path / "t")
    out = capfd.readouterr().out
    assert result.exit_code == 3 and out == plain.stdout.decode()
    trace = _check_trace(tmp_path / "t", min_events=100_000)
    proc, = trace.processes
    assert proc.argv[1:] == ["-c", PYTHON_CODE] and proc.clean_exit
    assert len(proc.rss) > 0 and (proc.rss["rss"] > 0).all()
    _check_stats(heapcast.stats(trace), trace)


def test_sqlite3_traced_end_to_end(untraced, cli, tmp_path):
    sqlite3 = shutil.which("sqlite3")
    if sqlite3 is None:
        pytest.skip("the sqlite3 shell is not installed (Debian: apt-get install -y sqlite3)")
    cmd = [sqlite3, ":memory:", SQL]
    plain = untraced(cmd)
    assert plain.returncode == 0, plain.stderr
    done = cli("record", "-o", tmp_path / "t", "--", *cmd)
    assert done.returncode == 0 and done.stdout == plain.stdout.decode()
    assert "heapcast: " in done.stderr and ", 0 lost)" in done.stderr
    trace = _check_trace(tmp_path / "t", min_events=20_000)

    shown = cli("stats", tmp_path / "t", "--json")
    assert shown.returncode == 0, shown.stderr
    d = json.loads(shown.stdout)
    _check_stats(d, trace)
    assert d == json.loads(json.dumps(heapcast.stats(trace)))
