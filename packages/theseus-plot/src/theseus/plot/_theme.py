"""The theseus look: one set of matplotlib rcParams, applied locally or globally.

Serif type (STIX, a Times-like face that matplotlib itself ships, falling back
to DejaVu Serif, also shipped, so no machine ever lacks the font), seaborn's
"muted" palette, a light dashed grid drawn below the data, no top or right
spines, constrained layout and TrueType (Type 42) fonts in PDF and PostScript
output. :func:`theme` applies it inside a ``with`` block and restores
matplotlib's global rcParams on exit; :func:`apply_theme` sets it for the rest
of a notebook session.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import matplotlib as mpl
from matplotlib.rcsetup import cycler

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

#: Seaborn's "muted" palette (``seaborn.color_palette("muted").as_hex()``).
PALETTE: tuple[str, ...] = (
    "#4878d0",
    "#ee854a",
    "#6acc64",
    "#d65f5f",
    "#956cb4",
    "#8c613c",
    "#dc7ec0",
    "#797979",
    "#d5bb67",
    "#82c6e2",
)

#: Serif faces in order of preference; both ship inside matplotlib's mpl-data.
SERIF_FONTS: tuple[str, ...] = ("STIXGeneral", "DejaVu Serif")

_INK = "#262626"
_FRAME = "#4d4d4d"
_GRID = "#d9d9d9"

# Settings read when a file is written; :mod:`theseus.plot._export` applies
# these (and only these) around every save so exports are byte-stable.
EXPORT_RC: dict[RcKeyType, Any] = {
    "pdf.fonttype": 42,
    "ps.fonttype": 42,
    "svg.fonttype": "path",
    "svg.hashsalt": "theseus-plot",
    "savefig.dpi": 200,
    "savefig.facecolor": "white",
    "savefig.edgecolor": "white",
}


def theme_rc() -> dict[RcKeyType, Any]:
    """Return the theme as a fresh dict of matplotlib rcParams.

    Returns:
        A new dict each call; mutating it does not change the theme.

    Example:
        >>> theme_rc()["grid.linestyle"]
        '--'
    """
    return {
        # Concrete names, not the generic "serif": a Text resolves its family when
        # it is drawn, so a generic would follow whatever rcParams hold at save time.
        "font.family": list(SERIF_FONTS),
        "font.serif": list(SERIF_FONTS),
        "mathtext.fontset": "stix",
        "font.size": 10.0,
        "axes.titlesize": 11.0,
        "axes.labelsize": 10.0,
        "xtick.labelsize": 9.0,
        "ytick.labelsize": 9.0,
        "legend.fontsize": 9.0,
        "legend.title_fontsize": 9.0,
        "figure.titlesize": 12.0,
        "text.color": _INK,
        "axes.labelcolor": _INK,
        "axes.titlecolor": _INK,
        "axes.edgecolor": _FRAME,
        "xtick.color": _FRAME,
        "ytick.color": _FRAME,
        "axes.linewidth": 0.8,
        "xtick.major.width": 0.8,
        "ytick.major.width": 0.8,
        "xtick.major.size": 3.5,
        "ytick.major.size": 3.5,
        "axes.prop_cycle": cycler(color=list(PALETTE)),
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.grid": True,
        "axes.grid.axis": "both",
        "axes.axisbelow": True,
        "grid.linestyle": "--",
        "grid.linewidth": 0.6,
        "grid.color": _GRID,
        "grid.alpha": 1.0,
        "axes.titlepad": 8.0,
        "axes.labelpad": 5.0,
        "lines.linewidth": 1.75,
        "lines.markersize": 5.0,
        "patch.linewidth": 0.0,
        "legend.frameon": False,
        "figure.figsize": (6.0, 4.0),
        "figure.dpi": 100.0,
        "figure.facecolor": "white",
        "axes.facecolor": "white",
        "figure.constrained_layout.use": True,
        **EXPORT_RC,
    }


@contextmanager
def theme() -> Iterator[None]:
    """Apply the theseus theme inside a ``with`` block.

    Figures created inside the block take the theme; on exit every matplotlib
    rcParam is restored to what it was before, even if the block raised.

    Yields:
        Nothing; use it as ``with theme(): ...``.

    Example:
        >>> import matplotlib as mpl
        >>> with theme():
        ...     mpl.rcParams["axes.spines.top"]
        False
    """
    with mpl.rc_context(theme_rc()):
        yield


def apply_theme() -> None:
    """Set the theseus theme globally, for the rest of the session (notebooks).

    Unlike :func:`theme` this changes matplotlib's global rcParams and does not
    undo it; ``matplotlib.rcdefaults()`` brings back matplotlib's defaults.
    """
    mpl.rcParams.update(theme_rc())
