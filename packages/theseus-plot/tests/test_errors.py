"""Bad input gets a package error that says what was expected, what arrived and what to do."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
import seaborn as sns
from matplotlib.figure import Figure

import theseus.plot as tp


def test_error_types_subclass_builtins():
    assert issubclass(tp.PlotValueError, ValueError) and issubclass(tp.PlotValueError, tp.PlotError)
    assert issubclass(tp.PlotTypeError, TypeError) and issubclass(tp.PlotTypeError, tp.PlotError)


def test_plot_error_shares_the_theseus_root_when_the_store_is_installed():
    """With theseus-store beside it, PlotError is a theseus.errors.TheseusError; installed
    alone (the `isolated` nox session), it derives from Exception directly."""
    try:
        from theseus.errors import TheseusError
    except ModuleNotFoundError:
        assert tp.PlotError.__mro__[1:] == (Exception, BaseException, object)
    else:
        assert tp.PlotError.__mro__[1:] == (TheseusError, Exception, BaseException, object)


@pytest.mark.parametrize(
    ("data", "pattern"),
    [
        (
            np.zeros((2, 3, 4)),
            r"2-D array \[rows, columns\], got 3-D data of shape \(2, 3, 4\); index it",
        ),
        (np.zeros(5), r"got 1-D data of shape \(5,\); reshape it"),
        (np.float64(1.0), r"got 0-D data"),
        (np.zeros((0, 4)), r"empty array of shape \(0, 4\)"),
        (np.full((3, 3), np.nan), r"shape \(3, 3\) whose values are all NaN"),
        (pd.DataFrame(np.full((2, 2), np.nan)), r"all NaN"),
        (None, r"got None"),
        (
            np.array([[1e308, -1e308], [0.0, 1.0]]),
            r"got values from -1e\+308 to 1e\+308, a range wider than a float64 holds",
        ),
    ],
    ids=["3d", "1d", "0d", "empty", "nan", "nan-frame", "none", "overflowing-range"],
)
def test_heatmap_rejects(data, pattern):
    with pytest.raises(tp.PlotValueError, match=pattern):
        tp.heatmap(data)


def test_heatmap_rejects_text():
    with pytest.raises(tp.PlotTypeError, match="needs numbers for data"):
        tp.heatmap([["a", "b"], ["c", "d"]])


def test_heatmap_rejects_complex_numbers_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ComplexWarning on the way
        with pytest.raises(tp.PlotTypeError, match=r"needs real numbers for data, got complex"):
            tp.heatmap(np.ones((2, 2), dtype=complex))


def test_a_none_in_a_nested_list_is_a_missing_cell():
    mesh = tp.heatmap([[1, None], [2, 3]]).axes[0].collections[0]
    assert np.ma.getmaskarray(mesh.get_array()).reshape(2, 2).tolist() == [
        [False, True],
        [False, False],
    ]


@pytest.mark.parametrize("helper", [tp.line, tp.scatter, tp.bar])
def test_a_name_that_is_not_a_column_of_the_data_is_one_line(helper):
    with pytest.raises(
        tp.PlotValueError,
        match=r"got x='step', which is not a column of data; its columns are 'a', 'loss'\. ",
    ):
        helper({"a": [1, 2], "loss": [0.5, 0.4]}, x="step", y="loss")


def test_heatmap_with_some_nan_is_fine():
    values = np.array([[np.nan, 1.0], [2.0, 3.0]])
    mesh = tp.heatmap(values).axes[0].collections[0]
    assert np.ma.getmaskarray(mesh.get_array()).reshape(2, 2)[0, 0]


@pytest.mark.parametrize("helper", [tp.line, tp.scatter, tp.bar])
def test_mismatched_lengths(helper):
    with pytest.raises(tp.PlotValueError, match=r"x has 3, y has 4\. Align them"):
        helper(x=[0, 1, 2], y=[1.0, 2.0, 3.0, 4.0])


def test_mismatched_hue_length():
    with pytest.raises(tp.PlotValueError, match=r"x has 2, y has 2, hue has 3"):
        tp.scatter(x=[0, 1], y=[1.0, 2.0], hue=["a", "b", "c"])


def test_mismatched_columns_of_a_dict():
    with pytest.raises(tp.PlotValueError, match=r"x has 2, y has 3"):
        tp.line({"step": [0, 1], "loss": [1.0, 2.0, 3.0]}, x="step", y="loss")


@pytest.mark.parametrize("helper", [tp.line, tp.scatter, tp.bar])
def test_empty_vectors(helper):
    with pytest.raises(tp.PlotValueError, match=r"empty x \(length 0\)"):
        helper(x=[], y=[])


@pytest.mark.parametrize("helper", [tp.line, tp.scatter, tp.bar])
def test_empty_data(helper):
    with pytest.raises(tp.PlotValueError, match="empty data"):
        helper(np.zeros((0, 3)))


def test_empty_dataframe_with_keys():
    with pytest.raises(tp.PlotValueError, match="empty data"):
        tp.line(pd.DataFrame({"step": [], "loss": []}), x="step", y="loss")


@pytest.mark.parametrize("helper", [tp.line, tp.scatter, tp.bar])
def test_nan_only_y(helper):
    with pytest.raises(tp.PlotValueError, match=r"y whose 3 values are all NaN"):
        helper(x=[0, 1, 2], y=[np.nan, np.nan, np.nan])


def test_nan_only_wide_data():
    with pytest.raises(tp.PlotValueError, match=r"data whose 4 values are all NaN"):
        tp.line(np.full((2, 2), np.nan))


def test_nothing_to_plot():
    with pytest.raises(tp.PlotValueError, match="nothing to plot"):
        tp.scatter()


def test_ax_and_figsize_conflict():
    ax = Figure().add_subplot()
    with pytest.raises(tp.PlotValueError, match="both ax= and figsize="):
        tp.line(x=[0, 1], y=[0.0, 1.0], ax=ax, figsize=(3, 2))


@pytest.mark.parametrize("figsize", [(3,), (0, 2), ("3", 2), (True, 2)])
def test_bad_figsize(figsize):
    with pytest.raises(tp.PlotValueError, match=r"figsize=\(width, height\)"):
        tp.line(x=[0, 1], y=[0.0, 1.0], figsize=figsize)


def test_ax_that_is_not_an_axes():
    with pytest.raises(tp.PlotTypeError, match="ax= to be a matplotlib Axes or None, got Figure"):
        tp.scatter(x=[0, 1], y=[0.0, 1.0], ax=Figure())


def test_y_alone_is_drawn_against_its_index():
    [drawn] = tp.line(y=[3.0, 1.0, 2.0]).axes[0].lines
    assert drawn.get_xdata().tolist() == [0, 1, 2] and drawn.get_ydata().tolist() == [3.0, 1.0, 2.0]


_HELPERS = {
    "line": lambda **kw: tp.line(x=[0, 1, 2], y=[1.0, 2.0, 3.0], **kw),
    "scatter": lambda **kw: tp.scatter(x=[0, 1, 2], y=[1.0, 2.0, 3.0], **kw),
    "bar": lambda **kw: tp.bar(x=["a", "b"], y=[1.0, 2.0], **kw),
    "heatmap": lambda **kw: tp.heatmap(np.eye(3), **kw),
}
_ARTISTS = {
    "line": "Line2D",
    "scatter": "PathCollection",
    "bar": "Rectangle",
    "heatmap": "QuadMesh",
}


@pytest.mark.parametrize("helper", sorted(_HELPERS))
def test_a_misspelled_keyword_is_one_line_with_the_closest_name(helper):
    """seaborn hands keywords it does not know to matplotlib, whose AttributeError
    (`Line2D.set() got an unexpected keyword argument 'titel'`) becomes a PlotTypeError."""
    with pytest.raises(tp.PlotTypeError) as error:
        _HELPERS[helper](titel="Loss")
    assert str(error.value) == (
        f"{helper}() got an unexpected keyword argument 'titel', which neither it nor "
        f"matplotlib's {_ARTISTS[helper]} takes; did you mean title=?"
    )
    assert isinstance(error.value.__cause__, AttributeError)


@pytest.mark.parametrize(
    ("keyword", "meant"), [("colr", "color"), ("xlable", "xlabel"), ("figsze", "figsize")]
)
def test_a_misspelled_keyword_is_matched_to_parameters_and_artist_properties(keyword, meant):
    with pytest.raises(tp.PlotTypeError, match=rf"'{keyword}', .*; did you mean {meant}=\?$"):
        tp.line(x=[0, 1], y=[1.0, 2.0], **{keyword: 1})


def test_a_keyword_like_no_other_points_at_the_help():
    with pytest.raises(
        tp.PlotTypeError,
        match=r"matplotlib's PathCollection takes; check its spelling against "
        r"help\(theseus\.plot\.scatter\) and PathCollection's properties\.$",
    ):
        tp.scatter(x=[0, 1], y=[1.0, 2.0], qqq=1)


@pytest.mark.parametrize(
    "message",
    [
        "Line2D.set() got an unexpected keyword argument 'other'",  # not the caller's keyword
        "'NoneType' object has no attribute 'get_lines'",  # a failure of another kind
    ],
)
def test_other_attribute_errors_go_through(monkeypatch: pytest.MonkeyPatch, message: str):
    def failing(*args, **kwargs):
        raise AttributeError(message)

    monkeypatch.setattr(sns, "lineplot", failing)
    with pytest.raises(AttributeError) as error:
        tp.line(x=[0, 1], y=[1.0, 2.0], colour="red")
    assert type(error.value) is AttributeError and str(error.value) == message
