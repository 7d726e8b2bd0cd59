"""A PostgreSQL store's folder is bound to its database's identity, never to the URL's text.

The reference is the server itself: a second role made on it, the same server reached as
``localhost`` and as ``127.0.0.1``, a database asked directly (psycopg, not the store)
whether the store wrote tables into it. Every way of naming the one database opens the
one store (its node reads back what was written through another name); every other
database is refused in one line and left as it was. A marker written by an earlier
version (the URL as spelled, possibly with no user) keeps opening, and a writer brings
it up to date. Run with ``pytest --postgres`` (nox -s postgres).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from theseus.store import MARKER, Node, NotAStoreError, Store

pytestmark = pytest.mark.postgres


def _sql(pg_server: Any, database: str, statement: str) -> list[tuple[Any, ...]]:
    """Run one statement on ``database`` as the server's superuser (not through the store)."""
    import psycopg

    with psycopg.connect(pg_server.url(database), autocommit=True) as conn:
        cursor = conn.execute(statement)
        return list(cursor.fetchall()) if cursor.description else []


def _second_user(pg_server: Any) -> str:
    """A new login role on the server (a superuser, as ``postgres`` is beside ``root``)."""
    name = f"second_{uuid.uuid4().hex[:8]}"
    _sql(pg_server, "postgres", f"CREATE ROLE {name} LOGIN SUPERUSER")
    return name


def _marker(folder: Path) -> dict[str, Any]:
    return dict(json.loads((folder / "store" / MARKER).read_text()))


def test_another_user_and_another_spelling_of_the_host_open_the_same_store(
    pg_server: Any, tmp_path: Path
) -> None:
    database = pg_server.create_database()
    files, port = tmp_path / "shared", pg_server.port
    first = f"postgresql://{pg_server.user}@127.0.0.1:{port}/{database}?files={files}"
    node = Node.new("r", project="p", group="g")
    with Store(first) as store:
        store.log(node, {"loss": 1.5})
    made = _marker(files)
    second = _second_user(pg_server)
    for spelled in (
        f"postgresql://{second}@127.0.0.1:{port}/{database}?files={files}",
        f"postgresql://{pg_server.user}@localhost:{port}/{database}?files={files}",
        f"postgres://{second}@localhost:{port}/{database}?files={files}&connect_timeout=5",
    ):
        with Store(spelled) as store:
            assert store.values(node)["loss"] == 1.5
            store.log(node, {spelled: 1})  # and writes
        assert _marker(files) == made  # the binding is not rewritten by another spelling
    assert (
        _sql(pg_server, database, "SELECT current_user")[0][0] == pg_server.user
    )  # (the server's own answer, for the record below)
    with Store(files / "store", create=False) as alone:  # the folder alone: as the maker
        assert len(alone.values(node)) == 4
        assert alone.database == f"postgresql://{pg_server.user}@127.0.0.1:{port}/{database}"


def test_a_url_without_a_user_records_the_user_it_connected_as(
    pg_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGUSER", pg_server.user)  # what libpq takes for a URL without a user
    database = pg_server.create_database()
    files = tmp_path / "shared"
    with Store(f"postgresql://@127.0.0.1:{pg_server.port}/{database}?files={files}") as store:
        store.log(Node.new("r"), {"x": 1})
    recorded = _marker(files)["database"]
    assert recorded == f"postgresql://{pg_server.user}@127.0.0.1:{pg_server.port}/{database}"
    monkeypatch.delenv("PGUSER")  # the folder alone still reaches it: the user is recorded
    with Store(files / "store", create=False) as alone:
        assert alone.query().count() == 1


def test_a_binding_an_earlier_version_wrote_opens_and_is_brought_up_to_date(
    pg_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    database = pg_server.create_database()
    files, port = tmp_path / "shared", pg_server.port
    node = Node.new("r")
    with Store(f"postgresql://{pg_server.user}@127.0.0.1:{port}/{database}?files={files}") as s:
        s.log(node, {"x": 1})
    store_id = _marker(files)["id"]
    # what an earlier version wrote for an empty $USER: the URL as spelled, and the id
    older = {"format": 4, "database": f"postgresql://@127.0.0.1:{port}/{database}", "id": store_id}
    (files / "store" / MARKER).write_text(json.dumps(older) + "\n")
    second = _second_user(pg_server)
    with Store(f"postgresql://{second}@localhost:{port}/{database}?files={files}") as store:
        assert store.values(node) == {"x": 1}  # an earlier version refused this spelling
    assert _marker(files) == older  # a URL with a user says nothing about the empty one
    monkeypatch.setenv("PGUSER", pg_server.user)
    with Store(files / "store", readonly=True) as reader:  # a reader writes nothing
        assert reader.values(node) == {"x": 1}
    assert _marker(files) == older
    with Store(files / "store") as writer:
        assert writer.values(node) == {"x": 1}
    assert _marker(files) == {
        "format": 4,
        "database": f"postgresql://{pg_server.user}@127.0.0.1:{port}/{database}",
        "id": store_id,
    }


def test_a_database_that_is_not_the_folders_is_refused_and_left_as_it_was(
    pg_server: Any, tmp_path: Path
) -> None:
    files, port = tmp_path / "shared", pg_server.port
    ours, empty, other = (pg_server.create_database() for _ in range(3))
    with Store(f"{pg_server.url(ours)}?files={files}") as store:
        store.log(Node.new("r"), {"x": 1})
    with Store(f"{pg_server.url(other)}?files={tmp_path / 'other'}") as store:
        store.log(Node.new("s"), {"y": 2})
    for database, said in ((empty, "holds no theseus store"), (other, "holds another store")):
        with pytest.raises(NotAStoreError) as caught:
            Store(f"postgresql://{pg_server.user}@localhost:{port}/{database}?files={files}")
        message = str(caught.value)
        assert said in message and "\n" not in message, message
        assert f"{files / 'store'} belongs to the store in {pg_server.url(ours)}" in message
    assert _sql(pg_server, empty, "SELECT to_regclass('public.meta')") == [(None,)]
    assert _sql(pg_server, other, "SELECT COUNT(*) FROM nodes") == [(1,)]
    with Store(files / "store", create=False) as store:
        assert store.query().count() == 1
