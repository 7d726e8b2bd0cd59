"""What a heatmap costs: seaborn's own overlap draw is skipped, and only inside `heatmap`."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import seaborn as sns
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.layout_engine import ConstrainedLayoutEngine

from theseus.plot import heatmap, to_png


def _counting_draws(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    drawn: list[int] = []
    original = Figure.draw

    def draw(self: Figure, renderer: Any) -> None:
        drawn.append(1)
        original(self, renderer)

    monkeypatch.setattr(Figure, "draw", draw)
    return drawn


def _counting_layouts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    laid: list[int] = []
    original = ConstrainedLayoutEngine.execute

    def execute(self: ConstrainedLayoutEngine, fig: Any) -> Any:
        laid.append(1)
        return original(self, fig)

    monkeypatch.setattr(ConstrainedLayoutEngine, "execute", execute)
    return laid


def test_a_heatmap_is_laid_out_once_before_it_is_saved(monkeypatch: pytest.MonkeyPatch) -> None:
    """seaborn draws the whole figure to turn overlapping tick labels, which `heatmap`
    levels again and measures itself: one pass of the layout engine (declutter's, which
    measures the labels) is what is left, and no draw. The picture is seaborn's own
    annotation colours and levelled labels all the same."""
    drawn = _counting_draws(monkeypatch)
    laid = _counting_layouts(monkeypatch)
    data = np.arange(12.0).reshape(3, 4) / 11
    fig = heatmap(data, annot=True, fmt=".2f", xlabel="Head", ylabel="Layer")
    assert (len(drawn), len(laid)) == (0, 1)
    ax = fig.axes[0]
    # the annotations as seaborn writes them: the value, dark on light cells, white on dark
    texts = {t.get_text(): t.get_color() for t in ax.texts}
    assert set(texts) == {f"{v:.2f}" for v in data.flat}
    mesh = ax.collections[0]
    for value in data.flat:
        r, g, b, _ = mesh.cmap(mesh.norm(value))
        light = 0.2126 * _linear(r) + 0.7152 * _linear(g) + 0.0722 * _linear(b) > 0.408
        assert texts[f"{value:.2f}"] == (".15" if light else "w")
    assert all(label.get_rotation() == 0 for label in ax.get_yticklabels())
    assert to_png(fig).startswith(b"\x89PNG")


def _linear(channel: float) -> float:
    """sRGB to linear light (the relative luminance's definition, WCAG 2)."""
    return channel / 12.92 if channel <= 0.03928 else ((channel + 0.055) / 1.055) ** 2.4


def test_seaborn_itself_is_left_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside `heatmap`, seaborn.heatmap draws as it always has, also after a heatmap
    that failed."""
    before = sns.matrix._draw_figure
    heatmap(np.eye(3))
    with pytest.raises(ValueError, match="same shape"):
        heatmap(np.eye(3), annot=np.eye(2))
    assert sns.matrix._draw_figure is before
    drawn = _counting_draws(monkeypatch)
    fig = Figure()
    FigureCanvasAgg(fig)
    sns.heatmap(np.eye(3), ax=fig.add_subplot())
    assert len(drawn) == 1  # seaborn's own draw
