"""The report's HTML: one self-contained file (every script, style and datum inlined).

The page is assets/report.html with the CSS, the data as JSON, plotly.js (from the `plotly`
package, which ships it minified) and assets/report.js put in. Its Content-Security-Policy
forbids every network request, so the file shows the same thing anywhere, offline.
"""
from __future__ import annotations

import html
import json
from importlib import resources
from pathlib import Path


class ReportError(ValueError):
    """The report cannot be built (a missing dependency, an unusable option)."""


def plotly_js() -> str:
    """The minified plotly.js that the `plotly` Python package ships."""
    try:
        import plotly
    except ImportError:
        raise ReportError("the report needs the plotly package (it ships plotly.js): "
                          "pip install plotly") from None
    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    if not path.is_file():
        raise ReportError(f"{path}: plotly.min.js is missing from the plotly package")
    return path.read_text(encoding="utf-8")


def _script_safe(text: str) -> str:
    """Text that cannot close the <script> element it sits in."""
    return text.replace("</", "<\\/")


def render(data: dict, title: str) -> str:
    """The page for `data` (report.data.build's dict, plus optional sections)."""
    assets = resources.files(__package__) / "assets"
    nav = "".join(f'<a href="#{sec}">{name}</a>' for key, sec, name in
                  (("model", "model-sec", "Forecast"), ("lab", "lab-sec", "Allocator lab"),
                   ("diff", "diff-sec", "Diff")) if data.get(key))
    parts = {
        "{{TITLE}}": html.escape(title),
        "{{NAV}}": nav,
        "{{CSS}}": (assets / "report.css").read_text(encoding="utf-8"),
        "{{DATA}}": _script_safe(json.dumps(data, separators=(",", ":"), allow_nan=False)),
        "{{PLOTLY}}": _script_safe(plotly_js()),
        "{{JS}}": _script_safe((assets / "report.js").read_text(encoding="utf-8")),
    }
    page = (assets / "report.html").read_text(encoding="utf-8")
    # One pass, so that nothing inserted is searched for placeholders again.
    out, i = [], 0
    while True:
        j = page.find("{{", i)
        if j < 0:
            out.append(page[i:])
            break
        k = page.index("}}", j) + 2
        out += [page[i:j], parts[page[j:k]]]
        i = k
    return "".join(out)
