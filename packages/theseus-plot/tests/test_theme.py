"""The theme: what it sets, that it never leaks, and that its fonts exist everywhere."""

from __future__ import annotations

from pathlib import Path

import matplotlib as mpl
import numpy as np
import pytest
import seaborn as sns
from matplotlib import colors as mcolors
from matplotlib import font_manager

import theseus.plot as tp


def test_theme_sets_and_restores_rcparams():
    before = dict(mpl.rcParams)
    with tp.theme():
        assert mpl.rcParams["axes.spines.top"] is False
        assert mpl.rcParams["axes.spines.right"] is False
        assert mpl.rcParams["grid.linestyle"] == "--"
        assert mpl.rcParams["pdf.fonttype"] == 42
        assert mpl.rcParams["font.family"] == list(tp.SERIF_FONTS)
        assert dict(mpl.rcParams) != before
    assert dict(mpl.rcParams) == before


def test_theme_restores_after_an_exception():
    before = dict(mpl.rcParams)
    with pytest.raises(RuntimeError, match="boom"), tp.theme():
        raise RuntimeError("boom")
    assert dict(mpl.rcParams) == before


def test_apply_theme_is_global():
    with mpl.rc_context():  # the autouse fixture checks this is undone
        tp.apply_theme()
        for key, value in tp.theme_rc().items():
            assert mpl.rcParams[key] == mpl.rcParams.validate[key](value), key


def test_palette_is_seaborn_muted_and_is_the_colour_cycle():
    assert list(tp.PALETTE) == sns.color_palette("muted").as_hex()
    with tp.theme():
        cycle = [entry["color"] for entry in mpl.rcParams["axes.prop_cycle"]]
    assert cycle == list(tp.PALETTE)


def test_theme_rc_returns_a_fresh_dict():
    rc = tp.theme_rc()
    rc["grid.linestyle"] = ":"
    assert tp.theme_rc()["grid.linestyle"] == "--"


@pytest.mark.parametrize("family", tp.SERIF_FONTS)
def test_every_serif_font_ships_with_matplotlib(family: str):
    path = font_manager.findfont(
        font_manager.FontProperties(family=family), fallback_to_default=False
    )
    assert Path(path).is_relative_to(Path(mpl.get_data_path()))


def test_text_resolves_to_stix_whatever_rcparams_hold_when_drawn():
    fig = tp.line(x=[0, 1], y=[0.0, 1.0], title="Title")
    title = fig.axes[0].title
    with mpl.rc_context({"font.family": "sans-serif"}):
        path = font_manager.findfont(title.get_fontproperties())
    assert Path(path).name == "STIXGeneral.ttf"


def test_helper_axes_are_styled():
    fig = tp.scatter(x=np.arange(5.0), y=np.arange(5.0) ** 2)
    ax = fig.axes[0]
    assert not ax.spines["top"].get_visible()
    assert not ax.spines["right"].get_visible()
    assert ax.spines["left"].get_visible()
    assert ax.spines["bottom"].get_visible()
    for axis in (ax.xaxis, ax.yaxis):
        lines = axis.get_gridlines()
        assert lines and all(line.get_visible() for line in lines)
        assert {line.get_linestyle() for line in lines} == {"--"}
        assert mcolors.to_hex(lines[0].get_color()) == "#d9d9d9"
    assert ax.get_axisbelow() is True
    assert fig.get_layout_engine().__class__.__name__ == "ConstrainedLayoutEngine"
