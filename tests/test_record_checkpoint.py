"""Checkpoints of the conversion while the program runs (heapcast.recorder.checkpoint): the log
gives back the last complete checkpoint, a torn record is ignored and a damaged one named; the
numbering and the trace file go on from a checkpoint as they would have gone on unbroken."""
from __future__ import annotations

import json
import zlib

import numpy as np
import pytest
from conftest import assigner_table

import heapcast
from heapcast.recorder import checkpoint
from heapcast.trace.format import EVENT_DTYPE
from heapcast.trace.model import Process
from heapcast.trace.raw import LocationAssigner, frames_key
from heapcast.trace.writer import ProcessFileWriter


def K(*frames) -> bytes:
    """A location's frames as the conversion keeps them (heapcast.trace.raw.frames_key)."""
    return frames_key(frames)


def _block(a: LocationAssigner, raw_ids) -> dict:
    """A loc column as the decoder gives it (remap[raw id])."""
    return {"loc": a.remap[np.array(raw_ids, np.int64)].copy()}


def test_the_log_gives_the_last_complete_checkpoint(tmp_path):
    trace = tmp_path / "1.hct"
    a = LocationAssigner()
    a.add_definitions({1: K(0x10), 2: K(0x20, 0x21)})
    a.number(_block(a, [2, 1]))
    log = checkpoint.CheckpointLog(trace)
    log.append(4096, 4000, 1234, 4095, 77, a, len(a))
    a.add_definitions({5: K(1 << 63 | 3)})          # a Python frame: bit 63 set
    a.number(_block(a, [5]))
    log.append(8192, 8000, 2345, 8191, 99, a, len(a) - 1)   # id 3 given past the window
    log.close()
    good = checkpoint.path_for(trace).read_bytes()
    with open(checkpoint.path_for(trace), "ab") as f:   # a third record, cut short by a kill
        f.write(checkpoint.RECORD.pack(checkpoint.MAGIC, 100, 0) + b"{")
    ck = checkpoint.load(trace)
    assert (ck.next_lo, ck.emitted, ck.hct_bytes, ck.prev_seq, ck.last_ts) == \
        (8192, 8000, 2345, 8191, 99)
    assert ck.frames == {1: K(0x10), 2: K(0x20, 0x21), 5: K(1 << 63 | 3)}
    assert ck.ids == [K(0x20, 0x21), K(0x10)]        # the third id was not certain yet
    assert ck.resume() == (2345, 8000, 8191, 99)
    checkpoint.path_for(trace).write_bytes(good[:10])
    assert checkpoint.load(trace) is None
    assert checkpoint.load(tmp_path / "none.hct") is None
    assert oct(checkpoint.path_for(trace).stat().st_mode & 0o777) == "0o600"


def test_a_damaged_record_is_named(tmp_path):
    trace = tmp_path / "2.hct"
    payload = json.dumps({"next_lo": 1}).encode()      # complete, checksummed, fields missing
    checkpoint.path_for(trace).write_bytes(
        checkpoint.RECORD.pack(checkpoint.MAGIC, len(payload), zlib.crc32(payload)) + payload)
    with pytest.raises(ValueError, match=r"2\.hct\.ckpt, offset 0: checkpoint record"):
        checkpoint.load(trace)


def test_numbering_goes_on_from_a_checkpoint_as_unbroken():
    a = LocationAssigner()
    a.add_definitions({1: K(0x10), 2: K(0x20), 3: K(0x30), 7: K(0x20), 9: K(0x90)})
    a.number(_block(a, [3, 3, 0, 2]))
    ck = checkpoint.Checkpoint(frames={k: a.raw_frames(k) for k in a.defined},
                               ids=[a.frames_of(i) for i in range(1, len(a))],
                               id_raw=list(a.first_raw[1:]))
    b = ck.assigner()
    a.add_definitions({12: K(0x120)})
    b.add_definitions({12: K(0x120), 1: K(0x10)})     # a definition read again is harmless
    for raw_ids in ([9, 7, 1, 3], [12, 2, 9]):
        x, y = _block(a, raw_ids), _block(b, raw_ids)
        a.number(x)
        b.number(y)
        assert x["loc"].tolist() == y["loc"].tolist()
    assert assigner_table(a).flat.tolist() == assigner_table(b).flat.tolist()
    assert assigner_table(a).offsets.tolist() == assigner_table(b).offsets.tolist()


def _events(lo: int, n: int) -> np.ndarray:
    ev = np.zeros(n, EVENT_DTYPE)
    ev["seq"] = np.arange(lo, lo + n)
    ev["ts"] = 1000 + ev["seq"]
    ev["addr"] = 0x10000 + 32 * ev["seq"]
    ev["size"] = 24
    return ev


def test_a_trace_file_goes_on_from_a_checkpoint(tmp_path):
    """Blocks 1 and 2 written, the file left at block 1's end (the checkpoint), block 3 added
    after a resume: the trace holds blocks 1 and 3, and nothing of block 2."""
    out = tmp_path / "3.hct"
    w = ProcessFileWriter(out)
    w.add(_events(1, 1000))
    after_first = (w.count, w.prev_seq, w.last_ts)
    w.add(_events(1001, 500))
    w._w.drain()
    ends = w.written()
    assert [e for e, _ in ends] == [1000, 1500]
    w.abort(remove=False)
    assert w.tmp.exists()
    with pytest.raises(ValueError, match="3.hct.tmp.*at least"):
        ProcessFileWriter(out, resume=(ends[1][1] + 1, *after_first))
    r = ProcessFileWriter(out, resume=(ends[0][1], *after_first))
    with pytest.raises(ValueError, match="increasing seq"):
        r.add(_events(1000, 2))                       # before the checkpoint's last seq
    r.add(_events(2001, 300))
    r.finish(Process(index=0, pid=3))
    p, = heapcast.load(tmp_path).processes
    assert p.event_count == 1300
    assert p.events["seq"].tolist() == list(range(1, 1001)) + list(range(2001, 2301))
    assert p.end_ns == 1000 + 2300
