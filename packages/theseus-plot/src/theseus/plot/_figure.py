"""Where a helper draws and how it finishes: a fresh themed Figure, or the caller's Axes.

Every helper creates its figure with ``matplotlib.figure.Figure`` and an Agg
canvas, never through pyplot, so pyplot's figure manager and current figure
are untouched and the figure is garbage-collected like any other object. When
the caller passes ``ax=``, the helper draws into that Axes instead and returns
the root Figure that holds it.
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import numbers
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure, SubFigure

from theseus.plot._errors import PlotTypeError, PlotValueError
from theseus.plot._ticks import declutter

#: The seed `bar` and `line` bootstrap their confidence intervals with when the caller
#: passes none: a figure of the same data is the same figure, to the byte.
BOOTSTRAP_SEED = 0


class NotebookFigure(Figure):
    """A matplotlib Figure that shows itself in Jupyter as an image, with or without pyplot.

    Jupyter displays a plain Figure only once pyplot has loaded its inline backend
    (at the first pyplot figure); the helpers never make one through pyplot, so
    their figures carry their own PNG form.
    """

    def _repr_png_(self) -> tuple[bytes, dict[str, float]]:
        """PNG bytes (as :func:`~theseus.plot.to_png` renders them), shown at the figure's
        width in CSS pixels (96 per inch)."""
        from theseus.plot._export import to_png

        return to_png(self), {"width": self.get_figwidth() * 96}


def root_figure(ax: Axes) -> Figure:
    """Return the top-level Figure that holds ``ax`` (through any SubFigures)."""
    figure = ax.figure
    while isinstance(figure, SubFigure):
        figure = figure.figure
    if not isinstance(figure, Figure):
        raise PlotValueError(
            "the Axes passed as ax= belongs to no figure; create it with "
            "fig.add_subplot() or plt.subplots()."
        )
    return figure


def target_axes(ax: Axes | None, figsize: Sequence[float] | None, helper: str) -> Axes:
    """Return the Axes to draw into: ``ax`` itself, or one on a new themed Figure.

    Call it inside :func:`theseus.plot.theme` so a new figure takes the theme.

    Args:
        ax: The caller's Axes, or None for a new figure.
        figsize: ``(width, height)`` in inches for a new figure; None takes
            the theme's default.
        helper: Name of the calling helper, used in messages.

    Raises:
        PlotTypeError: ``ax`` is not a matplotlib Axes.
        PlotValueError: both ``ax`` and ``figsize`` were given, or ``figsize``
            is not two positive numbers.
    """
    if ax is not None:
        if not isinstance(ax, Axes):
            raise PlotTypeError(
                f"{helper}() needs ax= to be a matplotlib Axes or None, got {type(ax).__name__}."
            )
        if figsize is not None:
            raise PlotValueError(
                f"{helper}() got both ax= and figsize=; figsize only sizes a figure the "
                "helper creates. Resize yours with ax.figure.set_size_inches(w, h)."
            )
        return ax
    size: tuple[float, float] | None = None
    if figsize is not None:
        values = tuple(figsize)
        if len(values) != 2 or not all(
            isinstance(v, numbers.Real) and not isinstance(v, bool) and v > 0 for v in values
        ):
            raise PlotValueError(
                f"{helper}() needs figsize=(width, height) in inches, two positive numbers; "
                f"got {figsize!r}."
            )
        size = (float(values[0]), float(values[1]))
    fig = NotebookFigure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    return fig.add_subplot()


def finish(
    ax: Axes,
    *,
    title: str | None,
    xlabel: str | None,
    ylabel: str | None,
) -> Figure:
    """Label ``ax``, hide its top/right spines, separate its tick labels, return its Figure.

    Args:
        ax: The Axes a helper has drawn into.
        title: Axes title; None keeps none.
        xlabel: x-axis label; None keeps the one seaborn set (e.g. a column name),
            ``""`` removes it.
        ylabel: Like ``xlabel``, for the y axis.

    Returns:
        The root Figure holding ``ax``.
    """
    if title is not None:
        ax.set_title(title)
    if xlabel is not None:
        ax.set_xlabel(xlabel)
    if ylabel is not None:
        ax.set_ylabel(ylabel)
    ax.spines[["top", "right"]].set_visible(False)
    fig = root_figure(ax)
    declutter(fig, ax)
    return fig


#: Artist properties a helper's ``**kwargs`` commonly carry to matplotlib (suggested,
#: with the helper's own parameters, for a keyword matplotlib rejects).
ARTIST_PROPERTIES = (
    "alpha", "antialiased", "clip_on", "color", "dash_capstyle", "dash_joinstyle",
    "drawstyle", "edgecolor", "edgecolors", "facecolor", "facecolors", "fillstyle",
    "gid", "hatch", "label", "linestyle", "linewidth", "linewidths", "marker",
    "markeredgecolor", "markeredgewidth", "markerfacecolor", "markersize", "rasterized",
    "solid_capstyle", "solid_joinstyle", "url", "visible", "zorder",
)  # fmt: skip

# The AttributeError of matplotlib's `Artist.set` ("Line2D.set() got an unexpected keyword
# argument 'titel'", as a new artist's keywords get) and `Artist.update` ("'Line2D' object
# has no property 'titel'").
_UNEXPECTED = re.compile(
    r"(?:(?P<artist>\w+)\.set\(\) got an unexpected keyword argument"
    r"|'(?P<updated>\w+)' object has no property) '(?P<name>\w+)'"
)


@contextlib.contextmanager
def unexpected_keywords(helper: Callable[..., Any], kwargs: Mapping[str, Any]) -> Iterator[None]:
    """Turn matplotlib's rejection of a keyword from ``helper``'s ``**kwargs`` into one line.

    seaborn passes the keywords it does not know on to the artists it draws, so a
    misspelled keyword (``titel=``) fails deep in matplotlib with an AttributeError.
    Inside this context that error becomes a :class:`PlotTypeError` that names the
    keyword and the closest of ``helper``'s parameters and :data:`ARTIST_PROPERTIES`.
    Any other error, and one about a keyword the caller did not pass, goes through as is.

    Raises:
        PlotTypeError: a keyword in ``kwargs`` that matplotlib does not take.
    """
    try:
        yield
    except AttributeError as error:
        found = _UNEXPECTED.search(str(error))
        if found is None or found["name"] not in kwargs:
            raise
        keyword, name = found["name"], helper.__name__
        artist = found["artist"] or found["updated"]
        own = [
            p for p, v in inspect.signature(helper).parameters.items() if v.kind != v.VAR_KEYWORD
        ]
        close = difflib.get_close_matches(keyword, [*own, *ARTIST_PROPERTIES], n=1)
        hint = (
            f"did you mean {close[0]}=?"
            if close
            else f"check its spelling against help(theseus.plot.{name}) and {artist}'s properties."
        )
        raise PlotTypeError(
            f"{name}() got an unexpected keyword argument {keyword!r}, which neither it nor "
            f"matplotlib's {artist} takes; {hint}"
        ) from error
