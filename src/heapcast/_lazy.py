"""Names a package imports on first use (PEP 562), so that importing it costs nothing heavy."""
import importlib


def lazy_getattr(namespace: dict, api: dict):
    """A module `__getattr__` for the package whose globals are `namespace`: name -> the value
    of that name in api[name] (a module path relative to the package), imported on first use and
    then kept in the namespace."""
    package = namespace["__name__"]

    def __getattr__(name):
        if name not in api:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(api[name], package), name)
        namespace[name] = value
        return value

    return __getattr__
