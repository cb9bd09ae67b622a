"""Results computed from a trace, kept in its directory (`<trace>/.cache/`), so that a later
command that shows them does not compute them again: `heapcast evaluate` and `heapcast simulate`
leave there what `heapcast report` shows of them (the main job's report took 92 s, 87 of them
computing again what those two commands had just computed).

A result is found only under the key of everything it was computed from: the trace's .hct files
(name, size, modification time), heapcast's own code (every .py and .so file of the package:
name, size, modification time) and what the caller adds (a model file's SHA-256, a protocol).
Any change to any of them gives another key, so a stale result is never returned. Results are
small JSON documents (never pickle), written 0600 through a rename; a trace directory that
cannot be written is simply not used, and an unreadable entry is computed again. The features
of a trace are kept likewise, in a binary entry of their own (heapcast.forecast.feature_cache).
HEAPCAST_CACHE=0 turns every such cache off (nothing is read or written).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .base import TRACE_SUFFIX

CACHE_DIR = ".cache"
_code_identity: str | None = None


def _code() -> str:
    """A digest of heapcast's code as installed (names, sizes, modification times)."""
    global _code_identity
    if _code_identity is None:
        root = Path(__file__).resolve().parent.parent
        entries = []
        for dirpath, dirnames, files in os.walk(root):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for name in files:
                if name.endswith((".py", ".so")):
                    full = os.path.join(dirpath, name)
                    st = os.stat(full)
                    entries.append(f"{os.path.relpath(full, root)}\0{st.st_size}\0{st.st_mtime_ns}")
        _code_identity = hashlib.sha256("\n".join(sorted(entries)).encode()).hexdigest()
    return _code_identity


def file_digest(path) -> str:
    """SHA-256 of a file's bytes (a model or policy file that a result was computed with)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def key(trace_dir, **parts) -> str | None:
    """The key of a result computed from the trace in `trace_dir` and `parts` (JSON-able), or
    None when `trace_dir` is not a trace directory or HEAPCAST_CACHE=0 (a result of it is then
    not kept). Its first part names `parts` alone: a newer result for the same parts replaces
    the older one."""
    if os.environ.get("HEAPCAST_CACHE", "1") == "0":
        return None
    d = Path(trace_dir)
    try:
        files = sorted(d.glob("*" + TRACE_SUFFIX))
        trace = [(f.name, st.st_size, st.st_mtime_ns) for f in files for st in (f.stat(),)]
    except OSError:
        return None
    if not trace:
        return None
    asked = json.dumps(parts, sort_keys=True)
    whole = json.dumps({"trace": trace, "code": _code(), "parts": asked}, sort_keys=True)
    return (hashlib.sha256(asked.encode()).hexdigest()[:16] + "-"
            + hashlib.sha256(whole.encode()).hexdigest()[:32])


def entry_path(trace_dir, kind: str, k: str, suffix: str = ".json") -> Path:
    """Where the entry of `kind` under key `k` lives in the trace's directory."""
    return Path(trace_dir) / CACHE_DIR / f"{kind}-{k}{suffix}"


def load(trace_dir, kind: str, k: str | None) -> dict | None:
    """The result of `kind` kept under key `k` in the trace's directory, or None."""
    if k is None:
        return None
    try:
        doc = json.loads(entry_path(trace_dir, kind, k).read_text())
    except (OSError, ValueError):
        return None
    return doc.get("result") if isinstance(doc, dict) and doc.get("key") == k else None


def save(trace_dir, kind: str, k: str | None, result: dict) -> None:
    """Keeps `result` (JSON-able) of `kind` under key `k` in the trace's directory, in place of
    an older one for the same parts, if it can be written there (0600: results name the
    program's call sites)."""
    if k is None:
        return
    write_entry(trace_dir, kind, k, ".json", [json.dumps({"key": k, "result": result}).encode()])


def write_entry(trace_dir, kind: str, k: str, suffix: str, parts) -> None:
    """Writes the entry of `kind` under key `k` (the concatenation of the bytes `parts`), 0600,
    through a rename, and removes the older entries of the same parts (the key's first part);
    does nothing if the trace's directory cannot be written."""
    path = entry_path(trace_dir, kind, k, suffix)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            for part in parts:
                f.write(part)
        os.replace(tmp, path)
        for old in path.parent.glob(f"{kind}-{k.split('-')[0]}-*{suffix}"):
            if old != path:
                old.unlink()
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass
