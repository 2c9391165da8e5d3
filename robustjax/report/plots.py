"""The figures of ``report.html``, drawn with matplotlib (``Figure`` objects, no pyplot and so
no global state) and returned as inline SVG, or as PNG data URIs for images."""

from __future__ import annotations

import base64
import io
import math

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.image import imsave

WIDTH = 6.4  # inches; the page scales every figure to its column
MIN_IMAGE_PIXELS = 96  # small images (8x8 digits) are enlarged by whole pixels to at least this


def svg(fig: Figure, name: str) -> str:
    """``fig`` as an ``<svg>`` element. Its text stays text, and its ids are salted with
    ``name`` so that several figures share one page and the same figure renders the same."""
    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": name}):
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    return text[text.index("<svg"):]


def _figure(height: float) -> Figure:
    return Figure(figsize=(WIDTH, height), layout="constrained")


def robust_accuracy(curves: dict[str, list[tuple[str, list[float], list[float]]]],
                    clean_accuracy: float | None) -> str:
    """Robust accuracy against epsilon, one panel per norm (``curves``: norm -> (label, eps,
    accuracy) per line; a label starting with "worst case" is drawn as a wide grey band beneath
    the attacks' lines, so an attack whose line it equals stays visible, and one starting with
    "certified" as a dashed black line, the lower bound beneath them all). Each line starts
    from the clean accuracy at eps 0 when it is known."""
    fig = _figure(3.2)
    axes = fig.subplots(1, len(curves), squeeze=False)[0]
    for ax, (norm, lines) in zip(axes, curves.items()):
        for label, eps, accuracy in lines:
            if clean_accuracy is not None:
                eps, accuracy = [0.0, *eps], [clean_accuracy, *accuracy]
            style = ({"color": "0.55", "linewidth": 7, "alpha": 0.45, "zorder": 1, "solid_capstyle": "round"}
                     if label.startswith("worst case") else
                     {"color": "black", "linestyle": "--", "marker": "v", "zorder": 3} if label.startswith("certified")
                     else {"marker": "o", "zorder": 2})
            ax.plot(eps, accuracy, label=label, **style)
        ax.set(xlabel=f"epsilon ({norm})", ylabel="robust accuracy", ylim=(-0.02, 1.02), title=norm)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    return svg(fig, "robust-accuracy")


def heatmap(values: np.ndarray, rows: list[str], columns: list[str], *, xlabel: str, ylabel: str,
            colorbar: str, name: str) -> str:
    """An annotated heatmap of accuracies in [0, 1] (NaN cells: not measured, shown as '-')."""
    fig = _figure(max(2.4, 0.38 * len(rows) + 1.6))
    ax = fig.subplots()
    image = ax.imshow(np.ma.masked_invalid(values), cmap="viridis", vmin=0, vmax=1, aspect="auto")
    for (i, j), value in np.ndenumerate(values):
        ax.text(j, i, "-" if math.isnan(value) else f"{100 * value:.0f}", ha="center", va="center",
                fontsize="small", color="white" if math.isnan(value) or value < 0.6 else "black")
    crowded = len(columns) > 6 or max(map(len, columns)) > 8
    ax.set_xticks(range(len(columns)), columns, rotation=45 if crowded else 0, ha="right" if crowded else "center")
    ax.set_yticks(range(len(rows)), rows)
    ax.set(xlabel=xlabel, ylabel=ylabel)
    fig.colorbar(image, ax=ax, label=colorbar)
    return svg(fig, name)


def bars(labels: list[str], values: list[float], *, xlabel: str, name: str) -> str:
    """Horizontal bars, one per label, with the value written beside each."""
    fig = _figure(max(1.8, 0.35 * len(labels) + 1.0))
    ax = fig.subplots()
    positions = np.arange(len(labels))
    ax.barh(positions, values, color="C1")
    for position, value in zip(positions, values):
        ax.text(value, position, f" {value:.3f}", va="center", fontsize="small")
    ax.set_yticks(positions, labels)
    ax.invert_yaxis()
    ax.set(xlabel=xlabel, xlim=(0, max(0.01, *values) * 1.25))
    return svg(fig, name)


def reliability(count: list[int], confidence: list[float | None], accuracy: list[float | None]) -> str:
    """The reliability diagram: accuracy and mean confidence per equal-width confidence bin
    against the diagonal of perfect calibration, and the share of examples in each bin."""
    num_bins = len(count)
    edges = np.linspace(0, 1, num_bins + 1)
    centres, width = (edges[:-1] + edges[1:]) / 2, 1 / num_bins
    filled = [i for i in range(num_bins) if count[i]]
    fig = _figure(4.2)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 1))
    top.bar(centres[filled], [accuracy[i] for i in filled], width=width, edgecolor="black", label="accuracy")
    top.scatter(centres[filled], [confidence[i] for i in filled], color="C3", zorder=3, label="mean confidence")
    top.plot([0, 1], [0, 1], color="gray", linestyle="--", label="perfect calibration")
    top.set(ylabel="accuracy", xlim=(0, 1), ylim=(0, 1.03))
    top.legend(fontsize="small", loc="upper left")
    bottom.bar(centres, np.asarray(count) / max(sum(count), 1), width=width, color="gray", edgecolor="black")
    bottom.set(xlabel="confidence (top softmax probability)", ylabel="share")
    return svg(fig, "reliability")


def png_data_uri(image: np.ndarray) -> str:
    """An HxWxC image in [0, 1] (C = 1 or 3) as a ``data:image/png`` URI, enlarged by whole
    pixels when it is small."""
    image = np.clip(np.asarray(image, dtype=np.float32), 0, 1)
    scale = max(1, math.ceil(MIN_IMAGE_PIXELS / max(image.shape[:2])))
    image = image.repeat(scale, axis=0).repeat(scale, axis=1)
    buffer = io.BytesIO()
    if image.shape[-1] == 1:
        imsave(buffer, image[..., 0], format="png", cmap="gray", vmin=0, vmax=1)
    else:
        imsave(buffer, image, format="png")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
