"""Exception types raised by theseus.plot.

Every bad-input path in the package raises one of these. They subclass the
built-in exception a caller would expect (``ValueError`` for a bad value,
``TypeError`` for a bad type), so ``except ValueError`` keeps working, and they
share :class:`PlotError` so ``except PlotError`` catches everything from here.

`PlotError` derives from `theseus.errors.TheseusError`, the root of every Theseus error,
which theseus-store defines (standard library only). theseus-plot does not depend on the
store: installed alone, it has no other Theseus error to share a root with, and
`PlotError` derives from `Exception` directly (no second `TheseusError` is defined).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from theseus.errors import TheseusError as _Root
else:
    try:
        from theseus.errors import TheseusError as _Root
    except ModuleNotFoundError as missing:  # theseus-plot installed without theseus-store
        if missing.name not in ("theseus.errors", "theseus"):
            raise
        _Root = Exception


class PlotError(_Root):
    """Base class of every error raised by theseus.plot (a `theseus.errors.TheseusError`)."""


class PlotValueError(PlotError, ValueError):
    """The input has the right type but a value the helper cannot draw.

    Raised for a heatmap that is not 2-D, an empty input, an input that is NaN
    everywhere, vectors of mismatched lengths, conflicting options such as
    ``ax=`` with ``figsize=``, and an unknown file suffix in :func:`save`.
    """


class PlotTypeError(PlotError, TypeError):
    """The input is of a type the helper cannot turn into numbers."""
