"""Notebooks 01-06: the course's pictures, drawn with matplotlib (sample grids, class histograms, batch layouts).

Every function returns the ``Figure`` it drew: a notebook's stored output is the picture and a ``<Figure ...>`` line.
"""

from __future__ import annotations

from typing import Any, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from PIL import Image

__all__ = ["class_histogram", "show_batch_order", "show_images", "show_padded_batch"]


def _to_display(img: Any) -> np.ndarray:
    """PIL image, CHW tensor (uint8 or float in [0, 1]) or HWC array -> HWC array for ``imshow``."""
    if isinstance(img, Image.Image):
        return np.asarray(img)
    if isinstance(img, torch.Tensor):
        t = img.detach().cpu()
        if t.dim() == 3 and t.shape[0] in (1, 3):
            t = t.permute(1, 2, 0)
        if t.is_floating_point():
            t = t.clamp(0, 1)
        arr = t.numpy()
    else:
        arr = np.asarray(img)
    if arr.ndim == 3 and arr.shape[-1] == 1:
        arr = arr[..., 0]
    return arr


def show_images(
    images: Sequence[Any],
    titles: Sequence[str] | None = None,
    ncols: int = 8,
    size: float = 1.3,
    suptitle: str | None = None,
) -> Figure:
    """Notebook 01, section 2: draw images in a grid, one optional title under each."""
    n = len(images)
    if n == 0:
        raise ValueError("show_images needs at least one image")
    ncols = min(ncols, n)
    nrows = (n + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(ncols * size, nrows * (size + 0.25)), squeeze=False)
    for k, ax in enumerate(axes.flat):
        ax.axis("off")
        if k < n:
            ax.imshow(_to_display(images[k]), cmap="gray" if _to_display(images[k]).ndim == 2 else None)
            if titles is not None:
                ax.set_title(str(titles[k]), fontsize=8)
    if suptitle:
        fig.suptitle(suptitle)
    fig.tight_layout()
    return fig


def class_histogram(
    counts: dict[str, Sequence[int]] | Sequence[int], classes: Sequence[str], title: str = "Samples per class"
) -> Figure:
    """Notebook 01, section 4: bar chart of samples per class; ``counts`` may map a label (e.g. a split) to counts."""
    series = counts if isinstance(counts, dict) else {"samples": counts}
    fig, ax = plt.subplots(figsize=(8, 2.8))
    width, x = 0.8 / len(series), np.arange(len(classes))
    for k, (name, values) in enumerate(series.items()):
        ax.bar(x + (k - (len(series) - 1) / 2) * width, list(values), width, label=name)
    ax.set_xticks(x, list(classes), rotation=30)
    ax.set(ylabel="samples", title=title)
    if len(series) > 1:  # above the bars, in room of its own: it covers none of them
        ax.set_ylim(top=1.3 * max(max(v) for v in series.values()))
        ax.legend(loc="upper center", ncol=len(series), frameon=False)
    fig.tight_layout()
    return fig


def show_padded_batch(padded: torch.Tensor, lengths: torch.Tensor, title: str = "A padded batch") -> Figure:
    """Notebook 03, section 4: draw a ``[batch, time]`` padded batch: real tokens blue, padding grey."""
    b, t = padded.shape
    real = torch.arange(t)[None, :] < lengths[:, None]
    fig, ax = plt.subplots(figsize=(min(12, 1 + t * 0.35), 0.6 + b * 0.3))
    ax.imshow(real.numpy(), cmap=ListedColormap(["#d9d9d9", "#2b6cb0"]), vmin=0, vmax=1, aspect="auto")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="position in sequence (blue: real tokens, grey: padding)", ylabel="sample in batch", yticks=range(b))
    share = 1 - float(real.float().mean())
    ax.set_title(f"{title}: {b} sequences padded to {t}, {share:.0%} of the tensor is padding")
    fig.tight_layout()
    return fig


def show_batch_order(batches: Sequence[Sequence[int]], title: str = "Which samples land in which batch") -> Figure:
    """Notebook 03, section 3: draw sample indices per batch: one row per batch, one cell per position."""
    width = max(len(b) for b in batches)
    grid = np.full((len(batches), width), np.nan)
    for r, b in enumerate(batches):
        grid[r, : len(b)] = b
    fig, ax = plt.subplots(figsize=(min(12, 1 + width * 0.5), 0.6 + len(batches) * 0.35))
    ax.imshow(grid, cmap="viridis", aspect="auto")
    for r, b in enumerate(batches):
        for c, idx in enumerate(b):
            ax.text(c, r, str(int(idx)), ha="center", va="center", fontsize=7, color="white")
    ax.set(xlabel="position in batch", ylabel="batch", yticks=range(len(batches)), title=title)
    fig.tight_layout()
    return fig


def relative_bars(
    values: dict[str, float],
    xlabel: str,
    title: str,
    colors: Sequence[str],
    ax: Any = None,
    width: float = 6,
    pad: float = 0.6,
) -> Figure:
    """Horizontal bars of ``values``, each divided by the first one (drawn at 1.0 as a line): a ratio to a reference
    measured in the same run means the same on every machine, where absolute rates do not."""
    names = list(values)
    if ax is None:
        _, ax = plt.subplots(figsize=(width, pad + 0.45 * len(names)), dpi=80)
    ax.barh(range(len(names)), [values[n] / values[names[0]] for n in names], color=list(colors))
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set(xlabel=xlabel, title=title)
    return ax.figure
