"""Tick labels never overlap, checked with exact geometry of the (possibly turned) label boxes."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from matplotlib.axis import Axis
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.ticker import MaxNLocator

import theseus.plot as tp
from theseus.plot._ticks import declutter


def _rectangle(label: Text) -> np.ndarray:
    """The four display-space corners of a label's text box, rotation included."""
    angle = label.get_rotation()
    turned = label.get_window_extent()
    label.set_rotation(0)
    level = label.get_window_extent()
    label.set_rotation(angle)
    # A rotated rectangle and its axis-aligned bounding box share their centre.
    centre = np.array([(turned.x0 + turned.x1) / 2, (turned.y0 + turned.y1) / 2])
    half = np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]]) * [level.width / 2, level.height / 2]
    c, s = math.cos(math.radians(angle)), math.sin(math.radians(angle))
    return centre + half @ np.array([[c, s], [-s, c]])


def _separated(a: np.ndarray, b: np.ndarray) -> bool:
    """Separating-axis test for two convex quadrilaterals."""
    for poly in (a, b):
        for i in range(4):
            edge = poly[(i + 1) % 4] - poly[i]
            normal = np.array([-edge[1], edge[0]])
            pa, pb = a @ normal, b @ normal
            if pa.max() <= pb.min() or pb.max() <= pa.min():
                return True
    return False


def _visible(axis: Axis) -> list[Text]:
    lo, hi = sorted(axis.get_view_interval())
    return [
        tick.label1
        for tick in axis.get_major_ticks()
        if tick.label1.get_visible() and tick.label1.get_text() and lo <= tick.get_loc() <= hi
    ]


def _assert_no_overlap(fig: Figure, axis: Axis) -> list[Text]:
    FigureCanvasAgg(fig).draw()  # a real render, at the figure's size
    labels = _visible(axis)
    boxes = [_rectangle(label) for label in labels]
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            assert _separated(boxes[i], boxes[j]), (labels[i].get_text(), labels[j].get_text())
    return labels


def test_geometry_detects_an_overlap():
    fig = Figure()
    ax = fig.add_subplot()
    ax.set_xticks([0.0, 0.01], ["a long overlapping label", "another long label"])
    FigureCanvasAgg(fig).draw()
    a, b = (_rectangle(label) for label in ax.get_xticklabels())
    assert not _separated(a, b)


def test_long_category_names_are_turned_not_dropped():
    names = [f"checkpoint step {1000 * i}" for i in range(12)]
    fig = tp.bar(x=names, y=np.arange(12.0), errorbar=None)
    labels = _assert_no_overlap(fig, fig.axes[0].xaxis)
    assert len(labels) == 12  # every name still shown
    assert {label.get_rotation() for label in labels} <= {45.0, 90.0}
    assert {label.get_rotation() for label in labels} != {0.0}


def test_hundreds_of_categories_are_thinned():
    names = [f"token_{i:03d}" for i in range(300)]
    fig = tp.bar(x=names, y=np.ones(300), errorbar=None)
    labels = _assert_no_overlap(fig, fig.axes[0].xaxis)
    assert 1 < len(labels) < 300
    marks = [t for t in fig.axes[0].xaxis.get_major_ticks() if t.tick1line.get_visible()]
    assert [t.label1 for t in marks] == labels  # a hidden label takes its tick mark with it


def test_many_categories_on_the_y_axis_are_thinned():
    names = [f"layer {i}" for i in range(120)]
    fig = tp.bar(x=np.ones(120), y=names, orient="h", errorbar=None, figsize=(4, 3))
    labels = _assert_no_overlap(fig, fig.axes[0].yaxis)
    assert 1 < len(labels) < 120


def test_heatmap_indices_stay_level():
    fig = tp.heatmap(np.random.default_rng(0).normal(size=(64, 128)))
    for axis in (fig.axes[0].xaxis, fig.axes[0].yaxis):
        labels = _assert_no_overlap(fig, axis)
        assert len(labels) > 5
        assert {label.get_rotation() for label in labels} == {0.0}


@pytest.mark.parametrize("figsize", [(1.6, 1.6), (6.0, 4.0)])
def test_numeric_axes_of_helpers_do_not_overlap(figsize: tuple[float, float]):
    fig = tp.line(x=np.arange(0, 1_000_001, 1000), y=np.linspace(1e5, 9e5, 1001), figsize=figsize)
    for axis in (fig.axes[0].xaxis, fig.axes[0].yaxis):
        assert len(_assert_no_overlap(fig, axis)) >= 2


@pytest.mark.parametrize("layout", ["constrained", None])
def test_crowded_numeric_axis_gets_fewer_ticks(layout: str | None):
    """Also on a figure without a layout engine, where declutter measures by drawing."""
    fig = Figure(figsize=(3, 2), layout=layout)
    ax = fig.add_subplot()
    ax.plot([0, 1_000_000], [0, 1])
    ax.xaxis.set_major_locator(MaxNLocator(nbins=40))
    FigureCanvasAgg(fig).draw()
    crowded = _visible(ax.xaxis)
    assert not all(  # precondition: the labels really do collide before decluttering
        _separated(_rectangle(a), _rectangle(b)) for a, b in itertools.pairwise(crowded)
    )
    declutter(fig, ax)
    labels = _assert_no_overlap(fig, ax.xaxis)
    assert 2 <= len(labels) < len(crowded)
    assert {label.get_rotation() for label in labels} == {0.0}


def test_short_names_are_left_alone():
    fig = tp.bar(x=["a", "b", "c"], y=[1.0, 2.0, 3.0], errorbar=None)
    labels = _assert_no_overlap(fig, fig.axes[0].xaxis)
    assert [label.get_text() for label in labels] == ["a", "b", "c"]
    assert {label.get_rotation() for label in labels} == {0.0}
