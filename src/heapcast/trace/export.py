"""`heapcast export --parquet`: a trace's events as one Parquet file (Arrow), streamed.

Columns: every EVENT_DTYPE field under its own name and type, plus `op_name` (dictionary-encoded
operation name), `pid` (the process's pid) and `callsite` (frame 0 of the event's location, 0 when
unknown; with bit 63 set, a Python frame: its low 32 bits are an id in `heapcast.python_frames`).
The file's key-value metadata holds `heapcast.processes` (JSON list of each process's metadata, as
in its META section), `heapcast.session` (the trace's session.json) and `heapcast.python_frames`
(JSON list, one entry per process as in `heapcast.processes`: its list of [id, file, function,
line], as in the PYFRAMES section; empty for a process without Python frames).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .format import EVENT_DTYPE, OPS, TraceError
from .model import Trace
from .reader import load
from .writer import open_private

PROCESSES_KEY = b"heapcast.processes"
SESSION_KEY = b"heapcast.session"
PYFRAMES_KEY = b"heapcast.python_frames"


def export_parquet(trace, out_path, row_group: int = 1 << 20) -> Path:
    """Writes the events of every process of `trace` (a Trace or a trace path) to `out_path`.

    Reads the trace block by block (`Trace.chunks(row_group)`): memory stays bounded by one block
    whatever the trace's size. zstd-compressed; created 0600 (events hold addresses) under a
    temporary name and renamed, so `out_path` is either complete or untouched. Returns `out_path`.
    """
    trace = trace if isinstance(trace, Trace) else load(trace)
    out = Path(out_path)
    schema = event_schema().with_metadata({
        PROCESSES_KEY: json.dumps([p.meta() for p in trace.processes]),
        SESSION_KEY: json.dumps(trace.session),
        PYFRAMES_KEY: json.dumps([[[k, f.file, f.function, f.line]
                                   for k, f in sorted(p.python_frames.items())]
                                  for p in trace.processes]),
    })
    callsites = [_callsites(p.locations) for p in trace.processes]
    tmp = out.with_name(out.name + ".tmp")
    try:
        with open_private(tmp) as f, pq.ParquetWriter(f, schema, compression="zstd",
                                                       use_dictionary=["op_name"]) as w:
            for block in trace.chunks(row_group):
                if len(block):
                    p = int(block["proc"][0])
                    proc = trace.processes[p]
                    table = _table(block, proc.pid, callsites[p], proc.source or trace.path, schema)
                    w.write_table(table, row_group_size=row_group)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out


def event_schema() -> pa.Schema:
    """The Arrow schema of exported events: EVENT_DTYPE's fields, then op_name, pid, callsite."""
    fields = [pa.field(name, pa.from_numpy_dtype(EVENT_DTYPE[name]), nullable=False)
              for name in EVENT_DTYPE.names]
    fields += [pa.field("op_name", pa.dictionary(pa.int8(), pa.string()), nullable=False),
               pa.field("pid", pa.int32(), nullable=False),
               pa.field("callsite", pa.uint64(), nullable=False)]
    return pa.schema(fields)


_OP_NAMES = pa.array(OPS, type=pa.string())


def _callsites(locations) -> np.ndarray:
    """Call site of each location id; location 0 (unknown, 0) exists even if the table is empty."""
    sites = np.zeros(max(len(locations), 1), dtype=np.uint64)
    sites[:len(locations)] = locations.callsites
    return sites


def _table(block: np.ndarray, pid: int, sites: np.ndarray, source, schema: pa.Schema) -> pa.Table:
    """One block of events of one process (as Trace.chunks() yields them) as an Arrow table."""
    op, loc = block["op"], block["loc"]
    if int(op.max()) >= len(OPS):
        raise TraceError(source, None, f"event seq {int(block['seq'][op.argmax()])} has "
                         f"operation code {int(op.max())}, expected 0..{len(OPS) - 1}")
    if int(loc.max()) >= len(sites):
        raise TraceError(source, None, f"event seq {int(block['seq'][loc.argmax()])} has "
                         f"location {int(loc.max())}, but the process has {len(sites)}")
    columns = [pa.array(block[name]) for name in EVENT_DTYPE.names]
    columns += [pa.DictionaryArray.from_arrays(pa.array(op.astype(np.int8)), _OP_NAMES),
                pa.array(np.full(len(block), pid, dtype=np.int32)),
                pa.array(sites[loc])]
    return pa.Table.from_arrays(columns, schema=schema)
