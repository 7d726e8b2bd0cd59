"""What the helpers draw, checked against the input and against seaborn on a plain Axes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import seaborn as sns
from matplotlib import colors as mcolors
from matplotlib.collections import QuadMesh
from matplotlib.figure import Figure

import theseus.plot as tp

RNG = np.random.default_rng(0)
GROUPS = np.repeat(np.array(["a", "b", "c"]), 4)
VALUES = RNG.normal(size=12) + np.repeat([1.0, 2.0, 3.0], 4)

CALLS: dict[str, Callable[[], Figure]] = {
    "heatmap": lambda: tp.heatmap(RNG.normal(size=(4, 6)), title="T", xlabel="X", ylabel="Y"),
    "bar": lambda: tp.bar(x=GROUPS, y=VALUES, errorbar=None, title="T", xlabel="X", ylabel="Y"),
    "line": lambda: tp.line(x=np.arange(12), y=VALUES, title="T", xlabel="X", ylabel="Y"),
    "scatter": lambda: tp.scatter(x=np.arange(12), y=VALUES, title="T", xlabel="X", ylabel="Y"),
}


def _mesh(fig: Figure) -> np.ndarray:
    meshes = [c for c in fig.axes[0].collections if isinstance(c, QuadMesh)]
    assert len(meshes) == 1
    rows, columns = np.asarray(meshes[0].get_coordinates().shape[:2]) - 1  # cell corners
    return np.ma.getdata(meshes[0].get_array()).reshape(rows, columns)


def _reference_axes() -> Any:
    fig = Figure()
    return fig.add_subplot()


@pytest.mark.parametrize("name", sorted(CALLS))
def test_returns_a_new_figure_with_labels(name: str):
    fig = CALLS[name]()
    assert isinstance(fig, Figure) and callable(fig._repr_png_)  # shows itself in Jupyter
    assert fig.canvas.manager is None  # not registered with pyplot
    ax = fig.axes[0]
    assert (ax.get_title(), ax.get_xlabel(), ax.get_ylabel()) == ("T", "X", "Y")
    assert CALLS[name]() is not fig


@pytest.mark.parametrize("name", sorted(CALLS))
def test_rcparams_identical_before_and_after(name: str):
    before = dict(mpl.rcParams)
    CALLS[name]()
    assert dict(mpl.rcParams) == before


@pytest.mark.parametrize("name", sorted(CALLS))
def test_pyplot_current_figure_untouched(name: str):
    current = plt.figure()
    try:
        numbers = plt.get_fignums()
        fig = CALLS[name]()
        assert plt.gcf() is current
        assert plt.get_fignums() == numbers
        assert fig is not current
    finally:
        plt.close(current)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_figsize(name: str):
    call = CALLS[name]
    fig = {
        "heatmap": lambda: tp.heatmap(np.eye(3), figsize=(3.5, 2.5)),
        "bar": lambda: tp.bar(x=["a"], y=[1.0], figsize=(3.5, 2.5)),
        "line": lambda: tp.line(x=[0, 1], y=[1.0, 2.0], figsize=(3.5, 2.5)),
        "scatter": lambda: tp.scatter(x=[0, 1], y=[1.0, 2.0], figsize=(3.5, 2.5)),
    }[name]()
    np.testing.assert_array_equal(fig.get_size_inches(), [3.5, 2.5])
    numpy_sized = tp.scatter(x=[0, 1], y=[1.0, 2.0], figsize=np.array([3, 2]))
    np.testing.assert_array_equal(numpy_sized.get_size_inches(), [3.0, 2.0])
    np.testing.assert_array_equal(call().get_size_inches(), [6.0, 4.0])  # theme default


def test_heatmap_mesh_equals_input():
    values = RNG.normal(size=(7, 5))
    fig = tp.heatmap(values)
    np.testing.assert_array_equal(_mesh(fig), values)
    assert fig.axes[0].collections[0].get_clim() == (values.min(), values.max())
    assert len(fig.axes) == 2  # heatmap and colour bar
    assert not any(line.get_visible() for line in fig.axes[0].xaxis.get_gridlines())


def test_heatmap_masked_cells_are_masked():
    values = np.arange(6.0).reshape(2, 3)
    mask = values > 3
    mesh = tp.heatmap(values, mask=mask).axes[0].collections[0]
    np.testing.assert_array_equal(np.ma.getmaskarray(mesh.get_array()).reshape(2, 3), mask)


def test_heatmap_dataframe_labels_axes():
    frame = pd.DataFrame(
        np.arange(6.0).reshape(2, 3),
        index=pd.Index(["r0", "r1"], name="row"),
        columns=pd.Index(["c0", "c1", "c2"], name="col"),
    )
    ax = tp.heatmap(frame).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["c0", "c1", "c2"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["r0", "r1"]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("col", "row")
    np.testing.assert_array_equal(ax.collections[0].get_array().reshape(2, 3), frame.to_numpy())


def test_heatmap_list_input():
    fig = tp.heatmap([[1.0, 2.0], [3.0, 4.0]])
    np.testing.assert_array_equal(_mesh(fig), [[1.0, 2.0], [3.0, 4.0]])


def test_bar_heights_are_group_means_like_seaborn():
    fig = tp.bar(x=GROUPS, y=VALUES, errorbar=None)
    heights = [p.get_height() for p in fig.axes[0].patches]
    expected = [VALUES[g == GROUPS].mean() for g in ("a", "b", "c")]
    np.testing.assert_allclose(heights, expected, rtol=1e-12)
    reference = _reference_axes()
    sns.barplot(x=GROUPS, y=VALUES, errorbar=None, ax=reference)
    np.testing.assert_allclose(heights, [p.get_height() for p in reference.patches], rtol=0)


def test_bar_error_bars_match_seaborn_with_same_seed():
    fig = tp.bar(x=GROUPS, y=VALUES, seed=3)
    reference = _reference_axes()
    sns.barplot(x=GROUPS, y=VALUES, seed=3, ax=reference)
    ours = [line.get_ydata() for line in fig.axes[0].lines]
    theirs = [line.get_ydata() for line in reference.lines]
    assert len(ours) == 3
    np.testing.assert_allclose(ours, theirs, rtol=0)


def test_bar_colour_and_grid():
    ax = tp.bar(x=GROUPS, y=VALUES, errorbar=None).axes[0]
    expected = mcolors.to_rgba(sns.desaturate(tp.PALETTE[0], 0.75))
    for patch in ax.patches:
        np.testing.assert_allclose(patch.get_facecolor(), expected, atol=1e-12)
    assert not any(line.get_visible() for line in ax.xaxis.get_gridlines())
    assert all(line.get_visible() for line in ax.yaxis.get_gridlines())


def test_horizontal_bar_keeps_grid_on_value_axis():
    ax = tp.bar(x=VALUES, y=GROUPS, orient="h", errorbar=None).axes[0]
    widths = [p.get_width() for p in ax.patches]
    np.testing.assert_allclose(widths, [VALUES[g == GROUPS].mean() for g in "abc"], rtol=1e-12)
    assert all(line.get_visible() for line in ax.xaxis.get_gridlines())
    assert not any(line.get_visible() for line in ax.yaxis.get_gridlines())


def test_bar_dict_and_dataframe_give_the_same_bars():
    rows = {"group": GROUPS.tolist(), "value": VALUES.tolist()}
    from_dict = tp.bar(rows, x="group", y="value", errorbar=None).axes[0]
    from_frame = tp.bar(pd.DataFrame(rows), x="group", y="value", errorbar=None).axes[0]
    assert [p.get_height() for p in from_dict.patches] == [
        p.get_height() for p in from_frame.patches
    ]
    assert (from_dict.get_xlabel(), from_dict.get_ylabel()) == ("group", "value")


def test_line_data_and_hue_colours():
    x = np.arange(6.0)
    ys = {"a": x**2, "b": 3 * x, "c": -x}
    rows = {
        "x": np.tile(x, 3),
        "y": np.concatenate(list(ys.values())),
        "run": np.repeat(list(ys), 6),
    }
    ax = tp.line(rows, x="x", y="y", hue="run").axes[0]
    lines = ax.get_lines()[:3]
    for line, (run, y), colour in zip(lines, ys.items(), tp.PALETTE[:3], strict=True):
        np.testing.assert_array_equal(line.get_xdata(), x)
        np.testing.assert_array_equal(line.get_ydata(), y)
        assert mcolors.to_hex(line.get_color()) == colour, run


def test_line_estimates_mean_over_repeats_like_seaborn():
    x = np.repeat(np.arange(5.0), 3)
    y = RNG.normal(size=15)
    line = tp.line(x=x, y=y, errorbar=None).axes[0].get_lines()[0]
    np.testing.assert_allclose(line.get_ydata(), y.reshape(5, 3).mean(axis=1), rtol=1e-12)
    reference = _reference_axes()
    sns.lineplot(x=x, y=y, errorbar=None, ax=reference)
    np.testing.assert_array_equal(line.get_ydata(), reference.get_lines()[0].get_ydata())


def test_line_wide_form_array_one_line_per_column():
    values = RNG.normal(size=(10, 2))
    lines = tp.line(values).axes[0].get_lines()[:2]
    for column, line in enumerate(lines):
        np.testing.assert_array_equal(line.get_xdata(), np.arange(10))
        np.testing.assert_array_equal(line.get_ydata(), values[:, column])


def test_scatter_offsets_and_colour():
    x, y = RNG.normal(size=20), RNG.normal(size=20)
    collection = tp.scatter(x=x, y=y).axes[0].collections[0]
    np.testing.assert_array_equal(collection.get_offsets(), np.column_stack([x, y]))
    np.testing.assert_allclose(collection.get_facecolors()[0], mcolors.to_rgba(tp.PALETTE[0]))


def test_scatter_hue_uses_palette_in_order():
    x = np.arange(6.0)
    hue = np.array(["p", "q", "r"] * 2)
    collection = tp.scatter(x=x, y=x, hue=hue).axes[0].collections[0]
    expected = [mcolors.to_rgba(tp.PALETTE["pqr".index(h)]) for h in hue]
    np.testing.assert_allclose(collection.get_facecolors(), expected)


def test_ax_draws_into_the_given_axes_and_returns_its_figure():
    fig = Figure()
    left, right = fig.subplots(1, 2)
    returned = tp.line(x=[0, 1, 2], y=[1.0, 0.0, 1.0], ax=right, xlabel="Step")
    assert returned is fig
    assert len(right.get_lines()) == 1 and len(left.get_lines()) == 0
    assert right.get_xlabel() == "Step"
    assert not right.spines["top"].get_visible()


def test_ax_inside_subfigure_returns_root_figure():
    fig = Figure()
    ax = fig.subfigures(1, 2)[1].add_subplot()
    assert tp.heatmap(np.eye(2), ax=ax) is fig


def test_ax_on_a_pyplot_figure_leaves_pyplot_alone():
    fig, ax = plt.subplots()
    try:
        numbers = plt.get_fignums()
        assert tp.scatter(x=[0, 1], y=[2.0, 3.0], ax=ax) is fig
        assert plt.get_fignums() == numbers and plt.gcf() is fig
    finally:
        plt.close(fig)


def test_empty_label_clears_and_none_keeps_seaborn_label():
    rows = {"step": [0, 1], "loss": [2.0, 1.0]}
    ax = tp.line(rows, x="step", y="loss", ylabel="").axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("step", "")
