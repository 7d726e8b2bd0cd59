"""Fixtures shared by theseus-plot's tests."""

from __future__ import annotations

from collections.abc import Iterator

import matplotlib as mpl
import matplotlib.pyplot as plt
import pytest


@pytest.fixture(autouse=True)
def _unchanged_global_state() -> Iterator[None]:
    """Every test must leave matplotlib's rcParams and pyplot's figures as it found them."""
    before = dict(mpl.rcParams)
    figures = plt.get_fignums()
    yield
    assert dict(mpl.rcParams) == before
    assert plt.get_fignums() == figures
