"""Fixtures for the theseus-store tests: a fresh store per test, on SQLite or PostgreSQL.

``pytest --postgres`` (nox's ``postgres`` session) runs the tests that take a
``backend`` (the ``store`` and ``built`` fixtures, so every test over them) on a
private PostgreSQL server this session starts and stops (``_postgres_server``), and the
tests marked ``postgres``; the other tests are left out of that run. Without it the
same tests run on SQLite and the ``postgres`` ones are left out.

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


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--postgres",
        action="store_true",
        default=False,
        help="run the store's tests on a private PostgreSQL server (Debian's postgresql)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "postgres: needs a PostgreSQL server (pytest --postgres)")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        chosen = "postgres" if metafunc.config.getoption("--postgres") else "sqlite"
        metafunc.parametrize("backend", [chosen], scope="module")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    on_postgres = config.getoption("--postgres")
    kept, left = [], []
    for item in items:
        uses = "backend" in getattr(item, "fixturenames", ()) or item.get_closest_marker("postgres")
        if (on_postgres and not uses) or (not on_postgres and item.get_closest_marker("postgres")):
            left.append(item)
        else:
            kept.append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Any]:
    """A private PostgreSQL server for the session (``_postgres_server``)."""
    from _postgres_server import running_server

    with running_server() as server:
        yield server


@pytest.fixture(scope="session")
def pg_url(pg_server: Any) -> Any:
    """``pg_url(files)``: the URL of a new, empty database whose files go to ``files``."""

    def make(files: Path) -> str:
        return f"{pg_server.url(pg_server.create_database())}?files={files}"

    return make


def open_new(backend: str, folder: Path, request: pytest.FixtureRequest) -> Store:
    """A new store in ``folder`` (a store folder ``.../store``) on ``backend``."""
    if backend == "sqlite":
        return Store(folder)
    assert folder.name == "store", folder
    return Store(request.getfixturevalue("pg_url")(folder.parent))


@pytest.fixture
def store(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Store]:
    """A new, empty store under the test's temporary folder."""
    with open_new(backend, tmp_path / "store", request) as opened:
        yield opened


@pytest.fixture(scope="module")
def built(
    backend: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> tuple[Path, dict[str, Any]]:
    """The browser tests' store (``_ui_store.build``), once per module: its root and nodes."""
    import _ui_store

    root = tmp_path_factory.mktemp("ui") / "store"
    open_new(backend, root, request).close()
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
