"""`heapcast stats --plot FILE`: live requested bytes and RSS over time, and the size classes.

matplotlib is optional (pip install 'heapcast[plot]'): it is imported only here, only when a plot
is asked for, and its absence gives a clear error instead of a traceback.
"""
from __future__ import annotations

from pathlib import Path


class PlotError(RuntimeError):
    """A plot was asked for but cannot be drawn (matplotlib missing)."""


def require_matplotlib():
    """The matplotlib.pyplot module on the non-interactive Agg backend; PlotError if missing."""
    try:
        import matplotlib
    except ImportError:
        raise PlotError("plotting needs matplotlib: pip install 'heapcast[plot]' "
                        "(or pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def check_plot_file(path: str | Path) -> Path:
    """Readies `path` for a figure before the work that draws it: matplotlib is there, it can
    write the file's format (its suffix; none: PNG) and the file's directory is made and
    writable (heapcast._outputs). PlotError or OSError naming the file otherwise."""
    require_matplotlib()
    from matplotlib.backend_bases import FigureCanvasBase
    path = Path(path)
    fmt = path.suffix[1:].lower()
    formats = FigureCanvasBase.get_supported_filetypes()
    if fmt and fmt not in formats:
        raise PlotError(f"{path}: cannot draw a figure as .{fmt} (formats: "
                        f"{', '.join(sorted(formats))})")
    from .._outputs import prepare_output
    return prepare_output(path)


def plot_stats(trace, out_png: str | Path, top: int = 10) -> dict:
    """Computes the statistics of `trace` (a Trace or a path) and draws them into `out_png`.

    Returns the statistics (stats.stats's dict), so a caller never computes them twice.
    """
    from . import stats
    return stats(trace, top=top, plot=out_png)


def draw_stats(series: list, summary: dict, out_png: str | Path) -> None:
    """Draws the figure: per process, live requested bytes (step line) and RSS samples on one
    time axis in seconds since the trace began; below, the size-class histogram.

    `series`: [{"pid", "live": (seconds, bytes), "rss": (seconds, bytes)}] as stats() builds it.
    """
    plt = require_matplotlib()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 8), gridspec_kw={"height_ratios": [3, 2]})
    peak = max(summary["peak_live_bytes"], summary["peak_rss_bytes"], 1)
    unit, scale = next((u, float(1 << k)) for u, k in (("GiB", 30), ("MiB", 20), ("KiB", 10), ("B", 0))
                       if peak >= (1 << k))
    many = len(series) > 1
    for s in series:
        suffix = f" (pid {s['pid']})" if many else ""
        (x, y), (rx, ry) = s["live"], s["rss"]
        if len(x):
            top.step(x, y / scale, where="post", label="live requested" + suffix, linewidth=1.2)
        if len(rx):
            top.plot(rx, ry / scale, label="RSS" + suffix, linewidth=1.2, alpha=0.85)
    top.set_xlabel("seconds since start")
    top.set_ylabel(unit)
    top.set_title(f"heap of {summary['trace']}: peak live {summary['peak_live_bytes'] / scale:.1f} "
                  f"{unit}, peak RSS {summary['peak_rss_bytes'] / scale:.1f} {unit}")
    top.grid(alpha=0.3)
    if series:
        top.legend(loc="best", fontsize="small")

    classes = summary["size_classes"]
    bottom.bar([c["class"] for c in classes], [c["count"] for c in classes], color="tab:green")
    bottom.xaxis.get_major_locator().set_params(integer=True)
    bottom.yaxis.get_major_locator().set_params(integer=True)
    bottom.set_xlabel("size class (requested size.bit_length(): class k holds 2^(k-1) .. 2^k - 1 bytes)")
    bottom.set_ylabel("allocations")
    bottom.set_yscale("log" if classes and max(c["count"] for c in classes) > 1000 else "linear")
    bottom.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
