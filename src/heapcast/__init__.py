"""heapcast: record every heap operation of a Linux program, forecast it, and measure policies.

The Python API mirrors the command line: `record`, `load`, `stats`, ...
Its names are imported on first use (PEP 562), so that `heapcast record` and `heapcast --help`
start without numpy.
"""
import sys
import types

from ._lazy import lazy_getattr

_API = {
    "EVENT_DTYPE": ".trace.format", "OPS": ".trace.format", "TraceError": ".trace.base",
    "Process": ".trace.model", "Trace": ".trace.model", "finalize": ".recorder.session",
    "record": ".recorder.session", "stats": ".stats", "load": ".trace.reader", "report": ".report",
}
__all__ = sorted(_API)
__version__ = "0.1.0"


__getattr__ = lazy_getattr(globals(), _API)


class _Package(types.ModuleType):
    """Keeps `heapcast.stats` the function: importing the submodule of the same name would
    otherwise replace the package's attribute with the module."""

    def __setattr__(self, name, value):
        if name in _API and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __dir__():
    return sorted(list(globals()) + __all__)
