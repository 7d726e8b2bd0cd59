"""``bar``: seaborn.barplot's exact signature, drawn on a new themed Figure.

The parameters before ``title`` are seaborn.barplot's, in its order with its
defaults, including the deprecated ``ci``/``errcolor``/``errwidth`` (passed on
so seaborn can warn about them as it would). Only the value axis keeps grid
lines; the category axis has none. ``seed=None`` draws the bootstrap interval with
``BOOTSTRAP_SEED`` (seaborn would draw a fresh one at every call), so the same data give
the same figure and the same file bytes; pass a seed to draw another.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.container import BarContainer
from matplotlib.figure import Figure
from seaborn._core.typing import deprecated

from theseus.plot._figure import BOOTSTRAP_SEED, finish, target_axes, unexpected_keywords
from theseus.plot._inputs import check_vectors, to_host
from theseus.plot._theme import theme


def bar(
    data: Any = None,
    *,
    x: Any = None,
    y: Any = None,
    hue: Any = None,
    order: Any = None,
    hue_order: Any = None,
    estimator: Any = "mean",
    errorbar: Any = ("ci", 95),
    n_boot: int = 1000,
    seed: Any = None,
    units: Any = None,
    weights: Any = None,
    orient: Any = None,
    color: Any = None,
    palette: Any = None,
    saturation: float = 0.75,
    fill: bool = True,
    hue_norm: Any = None,
    width: float = 0.8,
    dodge: Any = "auto",
    gap: float = 0,
    log_scale: Any = None,
    native_scale: bool = False,
    formatter: Any = None,
    legend: Any = "auto",
    capsize: float = 0,
    err_kws: Any = None,
    ci: Any = deprecated,
    errcolor: Any = deprecated,
    errwidth: Any = deprecated,
    ax: Axes | None = None,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    figsize: Sequence[float] | None = None,
    **kwargs: Any,
) -> Figure:
    """Plot a point estimate (mean by default) per category as bars; seaborn.barplot, themed.

    Args:
        data: Long-form data frame or dict of columns, or wide-form array,
            list or dict; NumPy or JAX arrays are both fine.
        x, y, hue, order, hue_order, estimator, errorbar, n_boot, seed, units,
            weights, orient, color, palette, saturation, fill, hue_norm, width,
            dodge, gap, log_scale, native_scale, formatter, legend, capsize,
            err_kws, ci, errcolor, errwidth, **kwargs: As in ``seaborn.barplot``.
        ax: Draw into this Axes instead of a new figure; the Figure holding it
            is returned.
        title: Axes title.
        xlabel: x-axis label; None keeps seaborn's (e.g. the column name).
        ylabel: y-axis label; None keeps seaborn's.
        figsize: ``(width, height)`` in inches of the new figure; not with ``ax``.

    Returns:
        The Figure holding the bar chart.

    Raises:
        PlotValueError: nothing to plot, empty input, ``x``/``y`` all NaN,
            vectors of different lengths, or ``ax`` with ``figsize``.
        PlotTypeError: ``ax`` is not an Axes, or a keyword in ``**kwargs`` is one
            neither seaborn nor matplotlib takes (a misspelling: ``titel=``).

    Example:
        >>> fig = bar(x=["a", "a", "b"], y=[1.0, 3.0, 5.0], errorbar=None)
        >>> [float(p.get_height()) for p in fig.axes[0].patches]
        [2.0, 5.0]
    """
    data = to_host(data)
    variables = {
        name: to_host(value)
        for name, value in dict(x=x, y=y, hue=hue, units=units, weights=weights).items()
    }
    check_vectors(data, variables, "bar")
    with theme():
        target = target_axes(ax, figsize, "bar")
        with unexpected_keywords(bar, kwargs):
            sns.barplot(
                data,
                **variables,
                order=order,
                hue_order=hue_order,
                estimator=estimator,
                errorbar=errorbar,
                n_boot=n_boot,
                seed=BOOTSTRAP_SEED if seed is None else seed,
                orient=orient,
                color=color,
                palette=palette,
                saturation=saturation,
                fill=fill,
                hue_norm=hue_norm,
                width=width,
                dodge=dodge,
                gap=gap,
                log_scale=log_scale,
                native_scale=native_scale,
                formatter=formatter,
                legend=legend,
                capsize=capsize,
                err_kws=err_kws,
                ci=ci,
                errcolor=errcolor,
                errwidth=errwidth,
                ax=target,
                **kwargs,
            )
        horizontal = any(
            isinstance(c, BarContainer) and c.orientation == "horizontal" for c in target.containers
        )
        (target.yaxis if horizontal else target.xaxis).grid(False)
        return finish(target, title=title, xlabel=xlabel, ylabel=ylabel)
