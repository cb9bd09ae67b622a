"""Checkpoints of the conversion while the program runs: what lets it free the raw file's copies.

The drainer copies every full chunk to the end of the raw file (heapcast.recorder.drain), so
without more the raw file grows by 32 bytes per event for the whole run (640 MB for 20 million
events), in page-cache pages that the kernel must find fresh; in a virtual machine that has
given its free memory back to the host, a fresh page costs several times its copy. Once the
converter (heapcast.recorder.live) has written the windows below seq L into `<pid>.hct.tmp`, the
copies whose events all lie below L are redundant: it punches them out of the file
(fallocate PUNCH_HOLE), and their pages go back to the kernel for the next copies.

Punched copies must never be needed again, so before punching, the converter appends a
checkpoint to `<pid>.hct.ckpt`: L, the events and bytes of `<pid>.hct.tmp` below it, and the
location numbering at that point (heapcast.trace.raw.LocationAssigner: the definitions read so
far, some of them only in the copies about to go, and the ids given). A conversion that cannot
go on from where the converter stopped (a failed check at the end, `heapcast record` killed,
a full disk) goes on from the last checkpoint instead of from the raw file's start
(heapcast.recorder.session). Only windows that are certain are checkpointed: the converter's
guess about idle threads (heapcast.recorder.live) can be wrong, but a window whose every seq
number is accounted for by a converted event cannot have missed one.

The file is a log of records, each a header (magic, payload length, CRC-32 of the payload) and
a payload holding what changed since the record before: a u32 length and a JSON object (the
numbers, and the counts of the arrays after it), then little-endian arrays: the new
definitions' raw ids (u32), their frame counts (u32) and frames (u64, concatenated), and for
each new location id the raw id of a definition with its frames (u32). A record that a kill cut
short fails its length or CRC and ends the log. The file is created 0600 (it holds addresses).
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..trace.raw import LocationAssigner

SUFFIX = ".ckpt"                     # <pid>.hct.ckpt beside <pid>.hct.tmp
RECORD = struct.Struct("<4sII")      # magic, payload length, crc32 of the payload
MAGIC = b"HCKP"


def path_for(trace: Path) -> Path:
    """The checkpoint log of the trace file `trace` (<pid>.hct)."""
    return trace.with_name(trace.name + SUFFIX)


@dataclass
class Checkpoint:
    """The state of a conversion at a window boundary: `next_lo` (every event below it is in the
    first `hct_bytes` bytes of `<pid>.hct.tmp`, `emitted` of them, the last with seq `prev_seq`
    and the latest time `last_ts`), and the location numbering (`frames`: raw id -> frames_key,
    `ids`: the frames_keys of location ids 1, 2, ... given so far)."""

    next_lo: int = 0
    emitted: int = 0
    hct_bytes: int = 0
    prev_seq: int = -1
    last_ts: int = 0
    frames: dict = field(default_factory=dict)
    ids: list = field(default_factory=list)       # location id - 1 -> its frames_key
    id_raw: list = field(default_factory=list)    # location id - 1 -> a raw id of them

    def assigner(self) -> LocationAssigner:
        """A LocationAssigner that numbers the events from next_lo on as the converter would."""
        a = LocationAssigner()
        a.add_definitions(self.frames)
        for frames, raw in zip(self.ids, self.id_raw, strict=True):
            a.give(frames, raw)
        for k, frames in self.frames.items():   # a raw id whose frames have an id maps to it
            got = a.lookup(frames)
            if got is not None:
                a.remap[k] = got
                del a.frames[k]
        return a

    def resume(self) -> tuple:
        """ProcessFileWriter's `resume` argument."""
        return self.hct_bytes, self.emitted, self.prev_seq, self.last_ts


class CheckpointLog:
    """Appends checkpoints to a trace file's log (created on the first)."""

    def __init__(self, trace: Path):
        self.path = path_for(trace)
        self.fd = -1
        self.defs_written = 0              # the assigner's definitions in the log
        self.ids_written = 1               # location ids in the log (0 is no location)
        self.last: Checkpoint | None = None

    def append(self, next_lo: int, emitted: int, hct_bytes: int, prev_seq: int, last_ts: int,
               assigner: LocationAssigner, n_ids: int) -> None:
        """Appends the checkpoint at next_lo: the ids below n_ids were given by then (the
        assigner may have given more since, to windows that are not certain). Only what came
        since the last one is written, and only that is looked at (pydoc -k defines 2.7M)."""
        if self.fd < 0:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND
                              | os.O_CLOEXEC, 0o600)
            os.fchmod(self.fd, 0o600)
        new = assigner.defined[self.defs_written:]
        frames = [assigner.raw_frames(k) for k in new]
        # each id as a raw id defined with its frames: one the log holds (its first user's, or
        # for an unused definition its own; every definition the assigner knows is written)
        ids = assigner.first_raw[self.ids_written:n_ids]
        lens = [len(f) >> 3 for f in frames]   # (frames_keys: their uint64 bytes)
        head = json.dumps({
            "next_lo": next_lo, "emitted": emitted, "hct_bytes": hct_bytes,
            "prev_seq": prev_seq, "last_ts": last_ts, "defs": len(new), "frames": sum(lens),
            "ids": len(ids)}).encode()
        payload = b"".join([struct.pack("<I", len(head)), head,
                            np.array(new, "<u4").tobytes(), np.array(lens, "<u4").tobytes(),
                            *frames, np.array(ids, "<u4").tobytes()])
        record = RECORD.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload
        if os.write(self.fd, record) != len(record):
            raise OSError(errno.ENOSPC, f"{self.path}: short write")
        self.defs_written += len(new)
        self.ids_written = max(self.ids_written, n_ids)
        self.last = Checkpoint(next_lo, emitted, hct_bytes, prev_seq, last_ts)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def load(trace: Path) -> Checkpoint | None:
    """The last complete checkpoint in the log of the trace file `trace`, or None when it has no
    log or no complete record (a record cut short by a kill ends the log)."""
    path = path_for(trace)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    ck, off, frames, ids, id_raw = None, 0, {}, [], []
    while off + RECORD.size <= len(data):
        magic, n, crc = RECORD.unpack_from(data, off)
        payload = data[off + RECORD.size:off + RECORD.size + n]
        if magic != MAGIC or len(payload) < n or zlib.crc32(payload) != crc:
            break
        try:
            hn, = struct.unpack_from("<I", payload, 0)
            r = json.loads(payload[4:4 + hn])
            nd, nf, ni = int(r["defs"]), int(r["frames"]), int(r["ids"])
            at = 4 + hn
            raw = np.frombuffer(payload, "<u4", nd, at).tolist()
            lens = np.frombuffer(payload, "<u4", nd, at + 4 * nd)
            flat = payload[at + 8 * nd:at + 8 * nd + 8 * nf]
            by = np.frombuffer(payload, "<u4", ni, at + 8 * nd + 8 * nf).tolist()
            if int(lens.sum()) != nf or at + 8 * nd + 8 * nf + 4 * ni != n:
                raise ValueError("array lengths do not add up")
            ends = np.cumsum(lens).tolist()
            frames.update((k, flat[8 * (e - m):8 * e])
                          for k, m, e in zip(raw, lens.tolist(), ends))
            ids.extend(frames[k] for k in by)
            id_raw.extend(by)
            ck = Checkpoint(int(r["next_lo"]), int(r["emitted"]), int(r["hct_bytes"]),
                            int(r["prev_seq"]), int(r["last_ts"]))
        except (ValueError, KeyError, TypeError, struct.error) as e:
            # a record with a valid checksum that we cannot read: damage, not a kill
            raise ValueError(f"{path}, offset {off}: checkpoint record unreadable ({e})") from None
        off += RECORD.size + n
    if ck is not None:
        ck.frames, ck.ids, ck.id_raw = frames, ids, id_raw
    return ck


def remove(trace: Path) -> None:
    path_for(trace).unlink(missing_ok=True)


_FALLOC_FL_KEEP_SIZE, _FALLOC_FL_PUNCH_HOLE = 0x01, 0x02
_libc = None


def punch(fd: int, offset: int, size: int) -> bool:
    """Frees a range of a file (it then reads as zeros); False where the file system cannot."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    return _libc.fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, size) == 0

