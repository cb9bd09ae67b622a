"""`heapcast report`: one self-contained interactive HTML page per trace (page.py), built from one
streaming pass over the trace (data.py), with optional forecast, lab and diff sections."""
from __future__ import annotations

import os
from pathlib import Path

from .page import ReportError, render

__all__ = ["ReportError", "report"]


def report(trace, output=None, model=None, lab: bool = False, diff=None,
           progress: bool = False) -> Path:
    """Writes the report of `trace` (a Trace or a path) to `output` (default: report.html beside
    the trace directory, named after it) and returns its path.

    `model`: a forecasting model file (.safetensors) or a compiled POLICY, or a list of them, to
    score on the trace (heapcast evaluate's metrics, over time, per class); `lab`: replay the
    trace through every allocator-lab policy; `diff`: another trace to compare with.
    """
    from ..trace.reader import load
    from .data import build
    from .sections import diff_section, lab_section
    if not hasattr(trace, "processes"):
        trace = load(trace)
    # Bad inputs fail before the long pass: the other trace and the model files are opened first.
    other = diff if diff is None or hasattr(diff, "processes") else load(diff)
    models = [] if not model else list(model) if isinstance(model, (list, tuple)) else [model]
    if models:
        from ..forecast.models import check_model_file
        from ..policy.fileformat import is_policy, read_spec
        from .forecast import protocol_for
        for path in models:
            if is_policy(path):
                read_spec(path)
            else:
                check_model_file(path)   # (its header: the model is loaded once, to predict)
            protocol_for(path, trace)   # a model the report's protocol refuses, refused here
    data = build(trace, progress=progress)
    if other is not None:
        data["diff"] = diff_section(data, build(other, progress=progress), str(other.path))
    if lab:
        data["lab"] = lab_section(trace)
    if models:
        from .forecast import model_section
        data["model"] = model_section(models, trace)
    title = data["summary"]["program"] or str(trace.path)
    page = render(data, f"{title} — {trace.path}")
    out = Path(output) if output is not None else Path(str(trace.path).rstrip("/") + ".report.html")
    tmp = out.with_name(out.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)   # it holds addresses
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(page)
    os.replace(tmp, out)
    return out
