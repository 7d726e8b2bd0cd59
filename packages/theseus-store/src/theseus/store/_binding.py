"""A PostgreSQL store's folder and database, bound to each other.

The rows of a PostgreSQL store live in its database, its files (large blobs,
checkpoints, a run's data and analyses) under the URL's ``files`` folder. The store's
folder ``FILES/store`` holds the marker, which names the database (the URL without a
password) and the store's id; the database's ``meta`` table holds the same id and the
files folder it was made with. So:

- the folder alone opens the store (``Store("/shared/folder/store")``, or a Theseus root
  ``/shared/folder``): the marker says where the rows are;
- a URL whose files folder holds a SQLite store, or a store of another database, is
  refused, as is a database that already holds the nodes of another files folder:
  no store ever writes into another store's files.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from theseus.store._errors import NotAStoreError
from theseus.store._postgres import DatabaseURL, PgConnection, PostgresDatabase, create_schema

__all__ = ["STORE_FOLDER", "bind_database", "bound_url", "check_binding"]

#: The store's folder under a Theseus root, and under a PostgreSQL store's files folder.
STORE_FOLDER = "store"


def bound_url(folder: Path, entry: Mapping[str, Any] | None) -> DatabaseURL | None:
    """The database a store folder's marker names (None: a SQLite store, or no store yet)."""
    if entry is None or "database" not in entry:
        return None
    parsed = DatabaseURL.parse(str(entry["database"]), need_files=False)
    return DatabaseURL(parsed.conninfo, parsed.shown, folder.parent)


def check_binding(folder: Path, entry: Mapping[str, Any] | None, url: DatabaseURL | None) -> None:
    """Refuse a URL whose files folder holds a SQLite store or another database's store.

    Raises:
        NotAStoreError: naming the folder, what it holds and what to pass instead.
    """
    if url is None or entry is None:
        return
    held = entry.get("database")
    if held is None:
        raise NotAStoreError(
            f"{folder} holds a SQLite store, not the store of {url.shown}. Open it as the "
            f"folder {folder.parent}, or copy it into PostgreSQL with `theseus-store copy "
            f"{folder.parent} URL?files=OTHER_FOLDER`."
        )
    if held != url.shown:
        raise NotAStoreError(
            f"{folder} belongs to the store in {held}, not to {url.shown}. Pass {held}"
            f"?files={folder.parent} (or the folder {folder.parent}), or another files folder."
        )


def bind_database(db: PostgresDatabase, folder: Path) -> str:
    """Create the database's tables if needed, bind it to ``folder``; return the store's id.

    Raises:
        NotAStoreError: if the database holds nodes made with another files folder.
    """
    files = folder.parent
    store_id = create_schema(db, files)

    def claim(conn: PgConnection) -> str | None:
        (held,) = conn.execute("SELECT value FROM meta WHERE key = 'files'").fetchone()
        if held == str(files):
            return None
        if conn.execute("SELECT 1 FROM nodes LIMIT 1").fetchone() is not None:
            return str(held)
        conn.execute("UPDATE meta SET value = ? WHERE key = 'files'", (str(files),))
        return None

    other = db.write(claim)
    if other is not None:
        raise NotAStoreError(
            f"The database {db.url.shown} already holds the store whose files are in {other}; "
            f"it cannot also keep the files of {files}. Pass ?files={other}, or use another "
            "database for a second store."
        )
    return store_id
