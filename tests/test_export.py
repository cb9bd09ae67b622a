"""`heapcast export --parquet`: every event, column by column, read back with pyarrow."""
import json
import stat

import numpy as np
import pyarrow.parquet as pq
import pytest

import heapcast
from heapcast.trace.export import PROCESSES_KEY, SESSION_KEY, export_parquet
from heapcast.trace.format import EVENT_DTYPE, OPS, TraceError
from heapcast.trace.model import LocationTable, Process, Trace
from heapcast.trace.writer import write_process_file, write_session

STACKS = [[], [0x401000, 0x402000], [0xFFFFFFFFFF600123], [0x401050, 0x1, 0x2]]


def random_events(n, seed, n_locs):
    """n events of every op with random fields (seq increasing with gaps)."""
    rng = np.random.default_rng(seed)
    ev = np.zeros(n, EVENT_DTYPE)
    ev["seq"] = np.cumsum(rng.integers(1, 3, n))
    ev["ts"] = 10**9 + np.cumsum(rng.integers(0, 500, n))
    for name in ("addr", "old_addr", "size", "arg"):
        ev[name] = rng.integers(0, 2**63, n, dtype=np.uint64) * (rng.random(n) < 0.5)
    ev["loc"] = rng.integers(0, n_locs, n)
    ev["tid"] = rng.integers(0, 4, n)
    ev["free_lag"] = rng.integers(0, 3, n)
    ev["op"] = rng.integers(0, len(OPS), n)
    return ev


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory):
    """A trace of two processes (3000 and 2000 events), written by heapcast's own writer."""
    d = tmp_path_factory.mktemp("trace")
    for pid, n, stacks in ((100, 3000, STACKS), (101, 2000, [])):
        p = Process(index=0, pid=pid, ppid=1, exe=f"/bin/p{pid}", argv=[f"p{pid}", "-x"],
                    locations=LocationTable.from_lists(stacks))
        write_process_file(d / f"{pid}.hct", p, random_events(n, pid, max(len(stacks), 1)))
    write_session(d, {"command": ["p100"], "exit_code": 0, "truncated": False})
    return d


def test_round_trip_in_several_row_groups(trace_dir, tmp_path):
    trace = heapcast.load(trace_dir)
    out = export_parquet(trace, tmp_path / "e.parquet", row_group=1000)
    assert out == tmp_path / "e.parquet"
    assert stat.S_IMODE(out.stat().st_mode) == 0o600            # events hold addresses
    f = pq.ParquetFile(out)
    assert f.metadata.num_row_groups == 5 and f.metadata.num_rows == 5000
    assert f.schema_arrow.field("op_name").type.value_type == "string"   # dictionary-encoded
    table = f.read()
    assert table.column_names == [*EVENT_DTYPE.names, "op_name", "pid", "callsite"]
    ev = trace.events
    for name in EVENT_DTYPE.names:
        got = table.column(name).to_numpy()
        assert got.dtype == EVENT_DTYPE[name], name
        np.testing.assert_array_equal(got, ev[name], err_msg=name)
    assert table.column("op_name").to_pylist() == [OPS[op] for op in ev["op"]]
    pids = np.array([p.pid for p in trace.processes])[ev["proc"]]
    np.testing.assert_array_equal(table.column("pid").to_numpy(), pids)
    sites = [p.locations.callsites for p in trace.processes]
    expected = [int(sites[proc][loc]) if len(sites[proc]) else 0
                for proc, loc in ev[["proc", "loc"]]]
    assert table.column("callsite").to_pylist() == expected      # exact, as Python ints
    assert set(expected) == {0, 0x401000, 0xFFFFFFFFFF600123, 0x401050}


def test_processes_and_session_in_key_value_metadata(trace_dir, tmp_path):
    trace = heapcast.load(trace_dir)
    out = export_parquet(trace_dir, tmp_path / "e.parquet")       # a path works as well
    meta = pq.read_metadata(out).metadata
    assert json.loads(meta[PROCESSES_KEY]) == [p.meta() for p in trace.processes]
    assert json.loads(meta[PROCESSES_KEY])[1]["argv"] == ["p101", "-x"]
    assert json.loads(meta[SESSION_KEY]) == {"command": ["p100"], "exit_code": 0,
                                             "truncated": False}


def test_in_memory_trace_and_empty_trace(tmp_path):
    ev = random_events(50, 1, 4)
    p = Process(index=0, pid=7, _events=ev, event_count=50,
                locations=LocationTable.from_lists(STACKS))
    table = pq.read_table(export_parquet(Trace(tmp_path, [p]), tmp_path / "m.parquet"))
    np.testing.assert_array_equal(table.column("size").to_numpy(), ev["size"])
    empty = pq.read_table(export_parquet(Trace(tmp_path, []), tmp_path / "none.parquet"))
    assert empty.num_rows == 0 and empty.column_names[-3:] == ["op_name", "pid", "callsite"]


def test_location_outside_the_table_is_an_error(tmp_path):
    ev = random_events(10, 2, 4)
    ev["loc"][5] = 9
    p = Process(index=0, pid=7, _events=ev, event_count=10, source="x/7.hct",
                locations=LocationTable.from_lists(STACKS))
    with pytest.raises(TraceError, match=r"x/7.hct: event seq \d+ has location 9, but the "
                                         r"process has 4"):
        export_parquet(Trace(tmp_path, [p]), tmp_path / "bad.parquet")
    assert list(tmp_path.iterdir()) == []                           # no partial file left


def test_cli_export(trace_dir, tmp_path, cli):
    done = cli("export", trace_dir, "--parquet", tmp_path / "c.parquet")
    assert done.returncode == 0, done.stderr
    assert pq.read_metadata(tmp_path / "c.parquet").num_rows == 5000
