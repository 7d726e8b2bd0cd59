"""``heatmap``: seaborn.heatmap's exact signature, drawn on a new themed Figure.

The parameters before ``title`` are seaborn.heatmap's, in its order with its
defaults (a test checks this against the installed seaborn); they are passed
through unchanged. The heatmap takes no grid; cells keep seaborn's colour map
unless ``cmap`` says otherwise.

Past ``RASTERIZE_CELLS`` cells the cells are one raster image inside a vector PDF (axes,
ticks, labels and colour bar stay vector): thousands of vector rectangles make a PDF
slow to write and to open for no visible gain. ``rasterized=False`` keeps them vector.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from theseus.plot._figure import finish, target_axes, unexpected_keywords
from theseus.plot._inputs import check_matrix, to_host
from theseus.plot._theme import theme

#: Cells above which the heatmap's cells are rasterized (64 x 64).
RASTERIZE_CELLS = 4096

_SEABORN_DRAW = threading.Lock()


@contextlib.contextmanager
def _without_seaborns_draw() -> Iterator[None]:
    """seaborn.heatmap draws the whole figure once to see whether its tick labels
    overlap, then turns them; `heatmap` levels them again and `declutter` measures
    them itself, so that draw (a third of a small heatmap's cost, and in a figure of
    several panels a draw of them all) is skipped. Where seaborn has no such step,
    nothing is changed."""
    matrix = getattr(sns, "matrix", None)
    draw = getattr(matrix, "_draw_figure", None)
    if draw is None:
        yield
        return
    with _SEABORN_DRAW:
        matrix._draw_figure = lambda fig: None  # type: ignore[union-attr]
        try:
            yield
        finally:
            matrix._draw_figure = draw  # type: ignore[union-attr]


def heatmap(
    data: Any,
    *,
    vmin: Any = None,
    vmax: Any = None,
    cmap: Any = None,
    center: Any = None,
    robust: bool = False,
    annot: Any = None,
    fmt: str = ".2g",
    annot_kws: Any = None,
    linewidths: float = 0,
    linecolor: Any = "white",
    cbar: bool = True,
    cbar_kws: Any = None,
    cbar_ax: Any = None,
    square: bool = False,
    xticklabels: Any = "auto",
    yticklabels: Any = "auto",
    mask: Any = None,
    ax: Axes | None = None,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    figsize: Sequence[float] | None = None,
    **kwargs: Any,
) -> Figure:
    """Plot a 2-D matrix as colour-coded cells; seaborn.heatmap, themed, returning a Figure.

    Args:
        data: ``[rows, columns]`` values: a NumPy or JAX array, a nested list or a
            pandas DataFrame (its index and columns label the axes).
        vmin, vmax, cmap, center, robust, annot, fmt, annot_kws, linewidths,
            linecolor, cbar, cbar_kws, cbar_ax, square, xticklabels, yticklabels,
            mask, **kwargs: As in ``seaborn.heatmap`` (``rasterized`` overrides the
            automatic choice; see ``RASTERIZE_CELLS``).
        ax: Draw into this Axes instead of a new figure; the Figure holding it
            is returned.
        title: Axes title.
        xlabel: x-axis label (columns); None keeps seaborn's.
        ylabel: y-axis label (rows); None keeps seaborn's.
        figsize: ``(width, height)`` in inches of the new figure; not with ``ax``.

    Returns:
        The Figure, with one heatmap Axes and (by default) a colour bar.

    Raises:
        PlotValueError: ``data`` is not 2-D, is empty or is NaN everywhere;
            ``ax`` and ``figsize`` were both given.
        PlotTypeError: ``data`` is not numeric, ``ax`` is not an Axes, or a keyword in
            ``**kwargs`` is one neither seaborn nor matplotlib takes (``titel=``).

    Example:
        >>> import numpy as np
        >>> fig = heatmap(np.eye(3), xlabel="Feature", ylabel="Token")
        >>> fig.axes[0].get_xlabel()
        'Feature'
    """
    data = check_matrix(to_host(data), "heatmap")
    kwargs.setdefault("rasterized", int(np.prod(np.shape(data))) > RASTERIZE_CELLS)
    with theme():
        target = target_axes(ax, figsize, "heatmap")
        with warnings.catch_warnings():
            # seaborn 0.13 calls Colormap.set_bad when center= is given; matplotlib
            # >= 3.11 flags that as pending deprecation. The caller cannot act on it.
            warnings.filterwarnings(
                "ignore", message="The set_bad function", category=PendingDeprecationWarning
            )
            with _without_seaborns_draw(), unexpected_keywords(heatmap, kwargs):
                sns.heatmap(
                    data,
                    vmin=vmin,
                    vmax=vmax,
                    cmap=cmap,
                    center=center,
                    robust=robust,
                    annot=to_host(annot),
                    fmt=fmt,
                    annot_kws=annot_kws,
                    linewidths=linewidths,
                    linecolor=linecolor,
                    cbar=cbar,
                    cbar_kws=cbar_kws,
                    cbar_ax=cbar_ax,
                    square=square,
                    xticklabels=xticklabels,
                    yticklabels=yticklabels,
                    mask=to_host(mask),
                    ax=target,
                    **kwargs,
                )
        target.grid(False)
        # seaborn stands row labels on end; read them level (declutter thins them).
        for label in target.get_yticklabels():
            label.set_rotation(0)
        for label in target.get_xticklabels():
            label.set_rotation(0)
        return finish(target, title=title, xlabel=xlabel, ylabel=ylabel)
