"""Policies: forecasting models compiled into native, deterministic code (docs/policy-format.md).

`compile_policy(model, output, kind=...)` writes a POLICY file; `native.Policy(path)` loads one
into the native runtime (native/policy/); `evaluate.evaluate_policy(policy, traces, protocol)`
scores it the way `heapcast evaluate` scores a model; `online` reads what `heapcast record
--policy` logged; `finetune` continues a model on feature logs; `onnx_export` exports a step.
"""
__all__ = ["PolicyError", "compile_policy", "is_policy", "read_spec"]
_WHERE = {"compile_policy": "compile", "PolicyError": "fileformat", "is_policy": "fileformat",
          "read_spec": "fileformat"}


def __getattr__(name):
    # imported on first use: `heapcast --help` builds its parsers without numpy
    if name in _WHERE:
        import importlib
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
