"""Fixtures for the theseus-store tests: a fresh store per test.

The tests run in pytest's importlib mode, which puts no test folder on ``sys.path``;
this folder goes there so that the tests' helper modules (``_ui_store``, the demo-like
store the browser's tests read) import by name.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from theseus.store import Store

if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A new, empty store under the test's temporary folder."""
    with Store(tmp_path / "store") as opened:
        yield opened


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The browser tests' store (``_ui_store.build``), once per module: its root and nodes."""
    import _ui_store

    root = tmp_path_factory.mktemp("ui") / "store"
    return root, _ui_store.build(root)


@pytest.fixture(scope="module")
def client(built: tuple[Path, dict[str, Any]]) -> Iterator[Any]:
    """Starlette's test client on the browser over ``built``'s store, opened read-only."""
    from starlette.testclient import TestClient

    from theseus.store.ui import create_app, open_readonly

    store = open_readonly(built[0])
    with TestClient(create_app(store)) as test_client:
        yield test_client
    store.close()
