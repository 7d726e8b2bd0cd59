"""A bootstrap interval drawn twice is the same interval: the figure's bytes repeat."""

from __future__ import annotations

import numpy as np
import pytest
import seaborn as sns
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from theseus.plot import bar, line, to_pdf
from theseus.plot._figure import BOOTSTRAP_SEED

RNG = np.random.default_rng(5)
LONG = {"x": np.repeat(["a", "b", "c"], 6), "y": RNG.normal(size=18)}
STEPS = {"x": np.repeat(np.arange(4), 5), "y": RNG.normal(size=20)}


def _interval_heights(fig: Figure) -> list[float]:
    """The error bars' vertical extents (one line each) of the figure's Axes."""
    return [
        float(np.ptp(np.asarray(segment.get_ydata(), float))) for segment in fig.axes[0].get_lines()
    ]


def test_bars_with_a_bootstrap_interval_repeat_and_are_seaborns_with_the_seed() -> None:
    first, second = bar(LONG, x="x", y="y"), bar(LONG, x="x", y="y")
    assert to_pdf(first) == to_pdf(second)
    reference = Figure()
    FigureCanvasAgg(reference)
    sns.barplot(LONG, x="x", y="y", seed=BOOTSTRAP_SEED, ax=reference.add_subplot())
    np.testing.assert_allclose(_interval_heights(first), _interval_heights(reference))
    other = bar(LONG, x="x", y="y", seed=BOOTSTRAP_SEED + 1)  # a seed of one's own is kept
    assert _interval_heights(other) != pytest.approx(_interval_heights(first))


def test_a_line_with_a_bootstrap_band_repeats() -> None:
    assert to_pdf(line(STEPS, x="x", y="y")) == to_pdf(line(STEPS, x="x", y="y"))
