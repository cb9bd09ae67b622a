"""What the trace modules share that needs no numpy: exceptions, file names and magic numbers,
the native-library loader. The command line and `heapcast record` import these before they know
whether numpy is needed at all (docs/architecture.md, "Fast start")."""
from __future__ import annotations

import ctypes
import threading
from pathlib import Path

TRACE_MAGIC = b"HEAPCAST"
TRACE_VERSION = 4                    # written; 2: EVENTS columns leave their zero byte planes
                                     # out, 3: and store their rows of zeros as presence bits,
                                     # 4: predicted from the op column
TRACE_READ_VERSIONS = (1, 2, 3, 4)   # read
TRACE_SUFFIX = ".hct"
SESSION_FILE = "session.json"
RAW_MAGIC = b"HCRAW\0\0\0"     # native/recorder/raw_format.h
RAW_HEADER_SIZE = 4096


class TraceError(Exception):
    """A trace that cannot be read: the message names the file, the offset and what was expected."""

    def __init__(self, path, offset, message):
        self.path, self.offset = str(path), offset
        where = f"{path}" if offset is None else f"{path}, offset {offset}"
        super().__init__(f"{where}: {message}")


class NativeError(RuntimeError):
    """A native library is missing or does not match this Python code."""


class LoadedOnce:
    """A ctypes library that `load(path)` opens and checks on the first call (thread-safe)."""

    def __init__(self, load, path: Path):
        self._load, self._path = load, path
        self._lib = None
        self._lock = threading.Lock()

    def __call__(self) -> ctypes.CDLL:
        with self._lock:
            if self._lib is None:
                self._lib = self._load(self._path)
            return self._lib


def bind(path: Path, functions: dict, what: str, use_errno: bool = False) -> ctypes.CDLL:
    """Opens the library at `path` and declares `functions` ({name: (restype, [argtypes])}):
    every loader of heapcast's native libraries. NativeError where the library is missing or
    lacks one of them (`what` names the part: for the message)."""
    if not Path(path).exists():
        raise NativeError(f"{path} is missing: build heapcast's native code "
                          f"(pip install -e . in the repository)")
    lib = ctypes.CDLL(str(path), use_errno=use_errno)
    try:
        for name, (restype, argtypes) in functions.items():
            f = getattr(lib, name)
            f.restype, f.argtypes = restype, argtypes
    except AttributeError:
        raise NativeError(f"{path} has no {what}: rebuild it (pip install -e .)") from None
    return lib
