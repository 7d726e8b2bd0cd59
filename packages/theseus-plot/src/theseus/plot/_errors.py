"""Exception types raised by theseus.plot.

Every bad-input path in the package raises one of these. They subclass the
built-in exception a caller would expect (``ValueError`` for a bad value,
``TypeError`` for a bad type), so ``except ValueError`` keeps working, and they
share :class:`PlotError` so ``except PlotError`` catches everything from here.
"""

from __future__ import annotations


class PlotError(Exception):
    """Base class of every error raised by theseus.plot."""


class PlotValueError(PlotError, ValueError):
    """The input has the right type but a value the helper cannot draw.

    Raised for a heatmap that is not 2-D, an empty input, an input that is NaN
    everywhere, vectors of mismatched lengths, conflicting options such as
    ``ax=`` with ``figsize=``, and an unknown file suffix in :func:`save`.
    """


class PlotTypeError(PlotError, TypeError):
    """The input is of a type the helper cannot turn into numbers."""
