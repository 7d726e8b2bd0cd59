"""Figures to bytes and files, byte-for-byte reproducible.

``to_pdf``/``to_png`` render into memory; ``save`` picks the format from the
file suffix. Every export embeds fonts as TrueType (PDF/PS ``fonttype`` 42),
drops the PDF ``CreationDate`` and the SVG date, and salts SVG ids with a fixed
string, so the same figure gives the same bytes every time and two identically
built figures give identical files. Only the export settings are applied while
saving; the figure's own styling is left as it was drawn.
"""

from __future__ import annotations

import io
import os
import shlex
from pathlib import Path
from typing import Any

import matplotlib as mpl
import numpy as np
from matplotlib.figure import Figure

from theseus.plot._errors import PlotTypeError, PlotValueError
from theseus.plot._theme import EXPORT_RC

#: File suffix -> matplotlib format understood by :func:`save`.
FORMATS: dict[str, str] = {".pdf": "pdf", ".png": "png", ".svg": "svg"}

# Whether a figure needs a discarded draw before its bytes are stable (see `_render`).
_SETTLE_FIRST = tuple(int(x) for x in mpl.__version__.split(".")[:2]) < (3, 11)

_METADATA: dict[str, dict[str, Any]] = {
    "pdf": {"CreationDate": None},
    "png": {},
    "svg": {"Date": None},
}


def _positions(fig: Figure) -> list[tuple[float, ...]]:
    return [tuple(ax.get_position().bounds) for ax in fig.axes]


def _settle(fig: Figure, most: int = 6) -> None:
    """Run the layout engine until it stops moving the axes.

    Constrained layout starts from where the previous draw left the axes and converges
    over a few passes: a heatmap of 16 x 20 cells with its colorbar was exported as three
    different PDFs by its first three exports. At the fixed point every export, and every
    identically built figure, gives the same bytes. The engine measures every label it
    places, so a pass of it alone settles the axes as a whole draw would (the same bytes,
    a third less time than drawing each pass).
    """
    engine = fig.get_layout_engine()
    if engine is None:
        return  # nothing moves the axes between draws
    before = _positions(fig)
    for _ in range(most):
        engine.execute(fig)
        after = _positions(fig)
        # In figure fractions; below what a PDF's coordinates resolve (the layout's last
        # digits may go back and forth between passes without the bytes changing).
        if np.allclose(after, before, rtol=0, atol=1e-9):
            return
        before = after


def _render(fig: Figure, fmt: str) -> bytes:
    if not isinstance(fig, Figure):
        raise PlotTypeError(
            f"expected a matplotlib.figure.Figure (what heatmap/bar/line/scatter return), "
            f"got {type(fig).__name__}. For seaborn Axes pass ax.figure."
        )
    with mpl.rc_context(EXPORT_RC):
        _settle(fig)
        # Constrained layout starts from the positions of the previous draw, and text
        # extents differ slightly between backends and resolutions, so with
        # matplotlib < 3.11 a figure's first PDF differs from its later ones by a few
        # thousandths of a point. There a discarded draw in the same format first makes
        # the bytes independent of what was drawn before (a fifth of a figure's cost).
        if _SETTLE_FIRST:
            fig.savefig(io.BytesIO(), format=fmt, metadata=_METADATA[fmt])
        buffer = io.BytesIO()
        fig.savefig(buffer, format=fmt, metadata=_METADATA[fmt])
    return buffer.getvalue()


def to_pdf(fig: Figure) -> bytes:
    """Render ``fig`` as PDF bytes with embedded TrueType fonts and no timestamp.

    Args:
        fig: The figure to render.

    Returns:
        The PDF file's bytes; identical for identical figures.

    Raises:
        PlotTypeError: ``fig`` is not a matplotlib Figure.
    """
    return _render(fig, "pdf")


def to_png(fig: Figure) -> bytes:
    """Render ``fig`` as PNG bytes at 200 dpi.

    Args:
        fig: The figure to render.

    Returns:
        The PNG file's bytes; identical for identical figures.

    Raises:
        PlotTypeError: ``fig`` is not a matplotlib Figure.
    """
    return _render(fig, "png")


def save(fig: Figure, path: str | os.PathLike[str]) -> Path:
    """Write ``fig`` to ``path`` in the format its suffix names (.pdf, .png or .svg).

    Args:
        fig: The figure to write.
        path: Destination file; its parent directory must exist.

    Returns:
        The path written, as a ``Path``.

    Raises:
        PlotValueError: the suffix is not one of ``FORMATS``, or the parent folder
            does not exist or is a file (it or a folder above it).
        PlotTypeError: ``fig`` is not a matplotlib Figure.
    """
    target = Path(path)
    fmt = FORMATS.get(target.suffix.lower())
    if fmt is None:
        choices = ", ".join(FORMATS)
        raise PlotValueError(
            f"save() cannot tell the format of {str(target)!r} from its suffix "
            f"{target.suffix or '(none)'!r}; use one of {choices}."
        )
    _check_folder(target)
    target.write_bytes(_render(fig, fmt))
    return target


def _check_folder(target: Path) -> None:
    """Raise a one-line PlotValueError unless ``target``'s parent is an existing folder.

    A missing folder gets ``mkdir -p`` advice; a file where the folder, or one above it,
    should be gets none (mkdir -p would fail on it too).
    """
    folder = target.parent
    if folder.is_dir():
        return
    # The folder, or the nearest one above it, that is there: a file there, mkdir -p fails.
    blocker = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise PlotValueError(
            f"save() cannot write {target}: {blocker} is a file, not a folder; choose a path "
            "in another folder."
        )
    raise PlotValueError(
        f"save() cannot write {target}: the folder {folder} does not exist; create it first "
        f"(mkdir -p {shlex.quote(str(folder))})."
    )
