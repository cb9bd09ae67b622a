"""Policies: forecasting models compiled into native, deterministic code (docs/policy-format.md).

`compile_policy(model, output, kind=...)` writes a POLICY file; `native.Policy(path)` loads one
into the native runtime (native/policy/); `evaluate.evaluate_policy(policy, traces, protocol)`
scores it the way `heapcast evaluate` scores a model; `online` reads what `heapcast record
--policy` logged; `finetune` continues a model on feature logs; `onnx_export` exports a step.
"""
from .compile import compile_policy
from .fileformat import PolicyError, is_policy, read_spec

__all__ = ["PolicyError", "compile_policy", "is_policy", "read_spec"]
