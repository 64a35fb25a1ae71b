"""Plots as inline SVG strings (matplotlib's SVG backend): the page needs no network and no files beside it."""
from __future__ import annotations

import io


def svg(plot: dict) -> str:
    import matplotlib

    matplotlib.use("svg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for s in plot["series"]:
        pts = [(x, y) for x, y in zip(s["x"], s["y"]) if y is not None and x is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3.5, lw=1.6, label=s["name"])
    if plot.get("log_x"):
        ax.set_xscale("log", base=2)
    if plot.get("log_y"):
        ax.set_yscale("log")
    ax.set_title(plot["title"], fontsize=11)
    ax.set_xlabel(plot["x_label"])
    ax.set_ylabel(plot["y_label"])
    ax.grid(True, alpha=0.3)
    if len(plot["series"]) > 1:
        ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    plt.close(fig)
    text = buf.getvalue()
    text = text[text.index("<svg"):]  # drop the XML prolog and DOCTYPE: the SVG sits inside HTML
    return text.replace('width="460.8pt" height="259.2pt"', 'width="100%" preserveAspectRatio="xMidYMid meet"', 1)
