"""``line`` and ``scatter``: seaborn.lineplot's and seaborn.scatterplot's exact signatures.

The parameters before ``title`` are seaborn's, in its order with its defaults
(a test checks both against the installed seaborn), passed through unchanged
but one: ``line``'s ``seed=None`` draws the bootstrap interval with ``BOOTSTRAP_SEED``
(seaborn would draw a fresh one at every call), so the same data give the same figure
and the same file bytes. The figure is new and themed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from theseus.plot._figure import BOOTSTRAP_SEED, finish, target_axes, unexpected_keywords
from theseus.plot._inputs import check_vectors, to_host
from theseus.plot._theme import theme


def line(
    data: Any = None,
    *,
    x: Any = None,
    y: Any = None,
    hue: Any = None,
    size: Any = None,
    style: Any = None,
    units: Any = None,
    weights: Any = None,
    palette: Any = None,
    hue_order: Any = None,
    hue_norm: Any = None,
    sizes: Any = None,
    size_order: Any = None,
    size_norm: Any = None,
    dashes: Any = True,
    markers: Any = None,
    style_order: Any = None,
    estimator: Any = "mean",
    errorbar: Any = ("ci", 95),
    n_boot: int = 1000,
    seed: Any = None,
    orient: str = "x",
    sort: bool = True,
    err_style: str = "band",
    err_kws: Any = None,
    legend: Any = "auto",
    ci: Any = "deprecated",
    ax: Axes | None = None,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    figsize: Sequence[float] | None = None,
    **kwargs: Any,
) -> Figure:
    """Plot ``y`` against ``x`` as lines; seaborn.lineplot, themed, returning a Figure.

    Args:
        data: Long-form data frame or dict of columns, or wide-form array
            (one line per column), list or dict; NumPy or JAX arrays.
        x, y, hue, size, style, units, weights, palette, hue_order, hue_norm,
            sizes, size_order, size_norm, dashes, markers, style_order,
            estimator, errorbar, n_boot, seed, orient, sort, err_style, err_kws,
            legend, ci, **kwargs: As in ``seaborn.lineplot``.
        ax: Draw into this Axes instead of a new figure; the Figure holding it
            is returned.
        title: Axes title.
        xlabel: x-axis label; None keeps seaborn's (e.g. the column name).
        ylabel: y-axis label; None keeps seaborn's.
        figsize: ``(width, height)`` in inches of the new figure; not with ``ax``.

    Returns:
        The Figure holding the line chart.

    Raises:
        PlotValueError: nothing to plot, empty input, ``x``/``y`` all NaN,
            vectors of different lengths, or ``ax`` with ``figsize``.
        PlotTypeError: ``ax`` is not an Axes, or a keyword in ``**kwargs`` is one
            neither seaborn nor matplotlib takes (a misspelling: ``titel=``).

    Example:
        >>> fig = line(x=[0, 1, 2], y=[3.0, 1.0, 2.0], xlabel="Step", ylabel="Loss")
        >>> fig.axes[0].lines[0].get_ydata().tolist()
        [3.0, 1.0, 2.0]
    """
    data = to_host(data)
    variables = {
        name: to_host(value)
        for name, value in dict(
            x=x, y=y, hue=hue, size=size, style=style, units=units, weights=weights
        ).items()
    }
    check_vectors(data, variables, "line")
    y_alone = data is None and variables["x"] is None and variables["y"] is not None
    if y_alone and hasattr(variables["y"], "__len__"):  # against its index, as plt.plot(y)
        variables["x"] = np.arange(len(variables["y"]))
    with theme():
        target = target_axes(ax, figsize, "line")
        with unexpected_keywords(line, kwargs):
            sns.lineplot(
                data,
                **variables,
                palette=palette,
                hue_order=hue_order,
                hue_norm=hue_norm,
                sizes=sizes,
                size_order=size_order,
                size_norm=size_norm,
                dashes=dashes,
                markers=markers,
                style_order=style_order,
                estimator=estimator,
                errorbar=errorbar,
                n_boot=n_boot,
                seed=BOOTSTRAP_SEED if seed is None else seed,
                orient=orient,
                sort=sort,
                err_style=err_style,
                err_kws=err_kws,
                legend=legend,
                ci=ci,
                ax=target,
                **kwargs,
            )
        return finish(target, title=title, xlabel=xlabel, ylabel=ylabel)


def scatter(
    data: Any = None,
    *,
    x: Any = None,
    y: Any = None,
    hue: Any = None,
    size: Any = None,
    style: Any = None,
    palette: Any = None,
    hue_order: Any = None,
    hue_norm: Any = None,
    sizes: Any = None,
    size_order: Any = None,
    size_norm: Any = None,
    markers: Any = True,
    style_order: Any = None,
    legend: Any = "auto",
    ax: Axes | None = None,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    figsize: Sequence[float] | None = None,
    **kwargs: Any,
) -> Figure:
    """Plot points at ``(x, y)``; seaborn.scatterplot, themed, returning a Figure.

    Args:
        data: Long-form data frame or dict of columns, or wide-form array,
            list or dict; NumPy or JAX arrays.
        x, y, hue, size, style, palette, hue_order, hue_norm, sizes,
            size_order, size_norm, markers, style_order, legend, **kwargs: As
            in ``seaborn.scatterplot``.
        ax: Draw into this Axes instead of a new figure; the Figure holding it
            is returned.
        title: Axes title.
        xlabel: x-axis label; None keeps seaborn's (e.g. the column name).
        ylabel: y-axis label; None keeps seaborn's.
        figsize: ``(width, height)`` in inches of the new figure; not with ``ax``.

    Returns:
        The Figure holding the scatter plot.

    Raises:
        PlotValueError: nothing to plot, empty input, ``x``/``y`` all NaN,
            vectors of different lengths, or ``ax`` with ``figsize``.
        PlotTypeError: ``ax`` is not an Axes, or a keyword in ``**kwargs`` is one
            neither seaborn nor matplotlib takes (a misspelling: ``titel=``).

    Example:
        >>> fig = scatter(x=[0.0, 1.0], y=[2.0, 3.0])
        >>> fig.axes[0].collections[0].get_offsets().tolist()
        [[0.0, 2.0], [1.0, 3.0]]
    """
    data = to_host(data)
    variables = {
        name: to_host(value)
        for name, value in dict(x=x, y=y, hue=hue, size=size, style=style).items()
    }
    check_vectors(data, variables, "scatter")
    with theme():
        target = target_axes(ax, figsize, "scatter")
        with unexpected_keywords(scatter, kwargs):
            sns.scatterplot(
                data,
                **variables,
                palette=palette,
                hue_order=hue_order,
                hue_norm=hue_norm,
                sizes=sizes,
                size_order=size_order,
                size_norm=size_norm,
                markers=markers,
                style_order=style_order,
                legend=legend,
                ax=target,
                **kwargs,
            )
        return finish(target, title=title, xlabel=xlabel, ylabel=ylabel)
