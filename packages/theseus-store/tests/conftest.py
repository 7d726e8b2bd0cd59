"""Fixtures for the theseus-store tests: a fresh store per test.

The tests run in pytest's importlib mode, which puts no test folder on ``sys.path``;
this folder goes there so that the tests' helper modules (``_ui_store``, the demo-like
store the browser's tests read) import by name.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from theseus.store import Store

if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A new, empty store under the test's temporary folder."""
    with Store(tmp_path / "store") as opened:
        yield opened
