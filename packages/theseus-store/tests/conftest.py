"""Fixtures for the theseus-store tests: a fresh store per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from theseus.store import Store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A new, empty store under the test's temporary folder."""
    with Store(tmp_path / "store") as opened:
        yield opened
