"""A PostgreSQL store's folder and database, bound to each other by the store's id.

The rows of a PostgreSQL store live in its database, its files (large blobs,
checkpoints, a run's data and analyses) under the URL's ``files`` folder. When the store
is made, its database's ``meta`` table receives a new id (a UUID) and the files folder;
the store's folder ``FILES/store`` holds the marker, which records the same id and a URL
that reaches the database (without a password; the user the store was made as, also
where the URL named none). So:

- the folder alone opens the store (``Store("/shared/folder/store")``, or a Theseus root
  ``/shared/folder``): the marker says where the rows are;
- any URL that reaches the database whose id is the marker's opens the store, however
  it is spelled: another user, ``localhost`` for ``127.0.0.1``, a port or option written
  out. The binding is the database's identity (the id it holds), never the URL's text;
- a URL whose files folder holds a SQLite store, or a store whose id another database
  holds (or none), is refused, as is a database that already holds the nodes of another
  files folder: no store ever writes into another store's files.

A marker written by an earlier version records the URL as it was spelled, possibly with
no user (``postgresql://@host/db``, from an empty ``$USER``); a writer that opens such a
store without naming a user either records the user that connection was given (the id,
which every version recorded, stays: it was always the binding's identity, and is now
its only test).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from theseus.store._backend import AbstractDatabase, Opened
from theseus.store._errors import CorruptStoreError, NotAStoreError
from theseus.store._postgres._url import DatabaseURL
from theseus.store._root import MARKER
from theseus.store._schema import FORMAT

__all__ = ["bound_url", "checked", "claim", "refuse_sqlite_store"]


def bound_url(folder: Path, entry: Mapping[str, Any] | None) -> DatabaseURL | None:
    """The database a store folder's marker names (None: a SQLite store, or no store yet)."""
    if entry is None or "database" not in entry:
        return None
    parsed = DatabaseURL.parse(str(entry["database"]), need_files=False)
    return DatabaseURL(parsed.conninfo, parsed.shown, folder.parent)


def refuse_sqlite_store(folder: Path, entry: Mapping[str, Any] | None, url: DatabaseURL) -> None:
    """Refuse a URL whose files folder holds a SQLite store.

    Raises:
        NotAStoreError: naming the folder, what it holds and what to pass instead.
    """
    if entry is not None and "database" not in entry:
        raise NotAStoreError(
            f"{folder} holds a SQLite store, not the store of {url.shown}. Open it as the "
            f"folder {folder.parent}, or copy it into PostgreSQL with `theseus-store copy "
            f"{folder.parent} URL?files=OTHER_FOLDER`."
        )


def _reaching(url: DatabaseURL, user: str) -> str:
    """The URL a marker records: as given, with the connected user where it named none."""
    return url.shown if url.user else url.as_user(user)


def claim(
    db: AbstractDatabase[Any], url: DatabaseURL, folder: Path, store_id: str
) -> dict[str, str]:
    """Bind the database (its tables made, its id ``store_id``) to the store folder ``folder``.

    Returns:
        What the folder's marker records: the ``database`` (a URL that reaches it) and ``id``.

    Raises:
        NotAStoreError: if the database holds nodes made with another files folder.
    """
    files = folder.parent

    def take(conn: Any) -> tuple[str | None, str]:
        (user,) = conn.execute("SELECT current_user").fetchone()
        (held,) = conn.execute("SELECT value FROM meta WHERE key = 'files'").fetchone()
        if held == str(files):
            return None, str(user)
        if conn.execute("SELECT 1 FROM nodes LIMIT 1").fetchone() is not None:
            return str(held), str(user)
        conn.execute("UPDATE meta SET value = ? WHERE key = 'files'", (str(files),))
        return None, str(user)

    other, user = db.write(take)
    if other is not None:
        raise NotAStoreError(
            f"The database {url.shown} already holds the store whose files are in {other}; "
            f"it cannot also keep the files of {files}. Pass ?files={other}, or use another "
            "database for a second store."
        )
    return {"database": _reaching(url, user), "id": store_id}


def checked(
    db: AbstractDatabase[Any], url: DatabaseURL, given: bool, folder: Path, entry: Mapping[str, Any]
) -> Opened:
    """Open a bound store: the database must hold the id the folder's marker records.

    Args:
        db: the database, reached through ``url``.
        url: the URL given (``given``), or the one the marker records.
        given: whether the caller named the database (else the folder alone did).
        folder: the store's folder; ``entry`` its marker.

    Returns:
        The store's format and inline size, and the marker to record where an earlier
        version's binding is to be brought up to date (else None).

    Raises:
        NotAStoreError: the database holds no store, or another one, than the folder's.
        CorruptStoreError: the database's format is newer than this version reads.
    """
    held = str(entry.get("database"))
    elsewhere = (
        f"{folder} belongs to the store in {held} (id {entry.get('id')}). Pass that "
        f"database's URL with ?files={folder.parent} (or the folder {folder.parent}), or "
        "another files folder"
    )
    try:
        meta = dict(
            db.read_one(
                "SELECT key, value FROM meta WHERE key IN ('format', 'inline_max', 'id', 'files')",
                (),
            )
        )
    except CorruptStoreError as err:  # the database has no store's tables
        if not given:
            raise
        raise NotAStoreError(
            f"The database {url.shown} holds no theseus store, but {elsewhere} for a new "
            f"store in {url.shown}."
        ) from err
    if meta.get("id") != entry.get("id"):
        raise NotAStoreError(
            f"The database {url.shown} holds another store (id {meta.get('id')}, files "
            f"{meta.get('files')}) than the one {folder / MARKER} names. {elsewhere}."
        )
    fmt = int(meta.get("format", FORMAT))
    if fmt > FORMAT:
        raise CorruptStoreError(
            f"The database {url.shown} has store format {fmt}; this theseus-store reads "
            f"formats up to {FORMAT}. Install the theseus-store version that wrote it."
        )
    marker = None
    recorded = DatabaseURL.parse(held, need_files=False)
    if not recorded.user and not url.user:
        # an earlier version recorded a URL without a user: the one it means here is the
        # user this connection (made without one too) was given
        [(user,)] = db.read_one("SELECT current_user", ())
        marker = {"database": _reaching(recorded, str(user)), "id": str(entry["id"])}
    return Opened(f"postgresql store {meta['id']}", fmt, int(meta.get("inline_max", 0)), marker)
