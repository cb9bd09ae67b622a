"""The oracle file of `--policy oracle:TRACE`: the true lifetime class of every allocation of
each process of a recording, in its order (format: native/alloc/oracle.c)."""
from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path

import numpy as np

MAGIC = b"HCORACL1"
VERSION = 2


def argv_hash(argv) -> int:
    """FNV-1a 64 of a command line as /proc/PID/cmdline holds it (each argument NUL-ended), the
    program's directory left out (./prog and /path/to/prog are the same program)."""
    args = [os.path.basename(argv[0]), *argv[1:]] if argv else []
    h = 0xcbf29ce484222325
    for byte in b"".join(os.fsencode(a) + b"\0" for a in args):
        h = ((h ^ byte) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def allocation_classes(process) -> np.ndarray:
    """The lifetime class (uint8, 0-5) of each allocation of `process`, in its seq order."""
    from ..forecast.lifetime import lifetime_labels
    from ..trace.blocks import match
    ev = process.events
    cls = lifetime_labels(ev, match(ev))["cls"]
    return cls[cls >= 0].astype(np.uint8)


def write_oracle(trace, path) -> Path:
    """Writes the oracle file of `trace` (a loaded Trace) at `path` (0600); returns the path.

    A command line that several processes share (a program that forks) keeps the first one's
    classes: the allocator matches a process by its command line, or by its program name where
    only one section has that name (native/alloc/oracle.c)."""
    sections, seen = [], set()
    for proc in trace.processes:
        key = argv_hash(proc.argv)
        if key in seen:
            continue
        seen.add(key)
        sections.append((key, argv_hash(proc.argv[:1]), allocation_classes(proc)))
    path = Path(path)
    offset = 16 + 32 * len(sections)
    header = bytearray(MAGIC + struct.pack("<II", VERSION, len(sections)))
    for key, name, cls in sections:
        header += struct.pack("<QQQQ", key, name, offset, len(cls))
        offset += len(cls)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(header)
        for _, _, cls in sections:
            f.write(cls.tobytes())
    return path


def cached_oracle(trace_path) -> Path:
    """The oracle file of the trace at `trace_path`, built once and kept under the user's cache
    directory (keyed by the trace's path and its files' sizes and times): `--env` must name a
    file that outlives `heapcast run`, and the bench runs the oracle many times."""
    from ..trace.reader import load
    trace_path = Path(trace_path).resolve()
    files = sorted(trace_path.rglob("*")) if trace_path.is_dir() else [trace_path]
    key = hashlib.sha256(str(trace_path).encode())
    for f in files:
        st = f.stat()
        key.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns};".encode())
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "heapcast"
    cache.mkdir(parents=True, exist_ok=True)
    out = cache / f"oracle-{key.hexdigest()[:24]}.bin"
    if not out.exists():
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        write_oracle(load(trace_path), tmp)
        os.replace(tmp, out)
    return out
