"""heapcast: record every heap operation of a Linux program, forecast it, and measure policies.

The Python API mirrors the command line: `record`, `load`, `stats`, ...
"""
from .recording import finalize, record
from .report import report
from .stats import stats
from .trace.format import EVENT_DTYPE, OPS, TraceError
from .trace.model import Process, Trace
from .trace.reader import load

__all__ = ["EVENT_DTYPE", "OPS", "Process", "Trace", "TraceError", "finalize", "load", "record",
           "report", "stats"]
__version__ = "0.1.0"

