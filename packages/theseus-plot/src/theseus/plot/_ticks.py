"""Tick labels that never overlap.

After a helper has drawn, :func:`declutter` lays the figure out and measures
the tick labels in display space. A numeric axis whose labels collide gets
fewer ticks (its locator's ``nbins`` shrinks). A categorical axis (fixed tick
positions: bars, heatmap cells) keeps its tick positions. Numeric labels there (a
heatmap's row and column indices) stay level and only every k-th is shown, the
smallest k that separates them; names on the x axis are turned 45 degrees, or
90 degrees (thinned if even that is too tight), because dropping a name loses
information. Names on the y axis can only be thinned. A tick whose label is
hidden loses its mark too, so a thinned axis does not become a comb.
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.ticker import MaxNLocator

# Labels closer than this fraction of their line height count as touching.
_GAP = 0.15
_MAX_THINNING_ROUNDS = 6


def _lay_out(fig: Figure) -> None:
    """Place the axes and measure every tick label: the figure's layout engine alone where
    it has one (it measures each label to find the margins), else a draw with no output."""
    engine = fig.get_layout_engine()
    if engine is None:
        fig.draw_without_rendering()
    else:
        engine.execute(fig)


def _visible_labels(axis: Axis) -> list[Text]:
    lo, hi = sorted(axis.get_view_interval())
    labels = []
    for tick in axis.get_major_ticks():
        label = tick.label1
        if not (label.get_visible() and label.get_text()):
            continue
        if lo - 1e-9 * abs(hi - lo) <= tick.get_loc() <= hi + 1e-9 * abs(hi - lo):
            labels.append(label)
    return labels


def _extents(labels: list[Text], along_x: bool) -> tuple[np.ndarray, np.ndarray]:
    """Centres and lengths of the labels' boxes along the axis, sorted by centre."""
    boxes = [label.get_window_extent() for label in labels]
    if along_x:
        centres = np.array([(box.x0 + box.x1) / 2 for box in boxes])
        lengths = np.array([box.width for box in boxes])
    else:
        centres = np.array([(box.y0 + box.y1) / 2 for box in boxes])
        lengths = np.array([box.height for box in boxes])
    order = np.argsort(centres)
    return centres[order], lengths[order]


def _line_height(fig: Figure, labels: list[Text]) -> float:
    """Height in pixels of one line of the largest label."""
    size = max(label.get_fontproperties().get_size_in_points() for label in labels)
    return size * fig.dpi / 72.0 * 1.2


def _collide(fig: Figure, labels: list[Text], along_x: bool) -> bool:
    if len(labels) < 2:
        return False
    centres, lengths = _extents(labels, along_x)
    gaps = np.diff(centres) - (lengths[1:] + lengths[:-1]) / 2
    return bool((gaps < _GAP * _line_height(fig, labels)).any())


def _thin_numeric(fig: Figure, axis: Axis, along_x: bool) -> None:
    locator = axis.get_major_locator()
    if not isinstance(locator, MaxNLocator):
        return
    for _ in range(_MAX_THINNING_ROUNDS):
        labels = _visible_labels(axis)
        if len(labels) <= 2 or not _collide(fig, labels, along_x):
            return
        locator.set_params(nbins=max(1, len(labels) // 2))
        _lay_out(fig)


def _is_index(labels: list[Text]) -> bool:
    """Whether every label is a number (a heatmap's row/column index, numeric bins)."""
    try:
        for label in labels:
            float(label.get_text().replace("\N{MINUS SIGN}", "-"))
    except ValueError:
        return False
    return True


def _spread_categorical(fig: Figure, axis: Axis, along_x: bool) -> None:
    labels = _visible_labels(axis)
    if not _collide(fig, labels, along_x):
        return
    room = _line_height(fig, labels) * (1 + _GAP)
    centres, lengths = _extents(labels, along_x)
    pitch = float(np.min(np.diff(centres)))
    # Every k-th label, level: enough room for the longest label plus a gap.
    step = max(1, math.ceil((float(lengths.max()) + _GAP * room) / pitch))
    if along_x and not _is_index(labels):
        # Names are worth keeping: turn them rather than drop them. A label turned
        # by an angle a needs pitch * sin(a) of room perpendicular to its baseline.
        angle = 45.0 if pitch * math.sin(math.radians(45.0)) >= room else 90.0
        step = 1 if angle == 45.0 else max(1, math.ceil(room / pitch))
        for label in axis.get_ticklabels():
            label.set_rotation(angle)
            label.set_rotation_mode("anchor")
            label.set_horizontalalignment("right")
            label.set_verticalalignment("center")
    if step > 1:
        marks = {id(tick.label1): tick.tick1line for tick in axis.get_major_ticks()}
        for index, label in enumerate(labels):
            label.set_visible(index % step == 0)
            marks[id(label)].set_visible(index % step == 0)  # no mark without a label
    _lay_out(fig)


def declutter(fig: Figure, ax: Axes) -> None:
    """Lay out ``fig`` and make sure no two tick labels of ``ax`` overlap.

    Args:
        fig: The root figure holding ``ax``; it is laid out (not rendered).
        ax: The Axes whose x and y tick labels are checked and, if needed,
            rotated, thinned or reduced.
    """
    _lay_out(fig)
    for axis, along_x in ((ax.xaxis, True), (ax.yaxis, False)):
        if isinstance(axis.get_major_locator(), MaxNLocator):
            _thin_numeric(fig, axis, along_x)
        else:
            _spread_categorical(fig, axis, along_x)
