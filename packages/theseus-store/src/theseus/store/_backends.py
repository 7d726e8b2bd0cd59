"""Which backend keeps a store's rows: the one place that chooses.

A store folder's marker, or the name the caller gave, decides:

- a ``postgresql://`` URL, or a marker that records a database: the PostgreSQL backend
  (``_postgres``), the URL's files folder holding the store's folder;
- anything else: the SQLite backend (``_sqlite``), ``STORE/store.sqlite``.

Everything above this module holds an ``_backend.AbstractDatabase`` and never asks which
backend it is.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from theseus.store._backend import AbstractDatabase
from theseus.store._postgres import (
    DatabaseURL,
    PostgresDatabase,
    bound_url,
    is_database_url,
    refuse_sqlite_store,
)
from theseus.store._root import STORE_FOLDER
from theseus.store._sqlite import SqliteDatabase

__all__ = ["open_database", "store_folder"]


def store_folder(spelled: str | os.PathLike[str]) -> str | os.PathLike[str]:
    """The store folder a name gives ``Store``: a URL's ``FILES/store``, else the name itself.

    Raises:
        StoreError: a malformed URL (one line).
    """
    if is_database_url(spelled):
        url = DatabaseURL.parse(str(spelled))
        assert url.files is not None  # parse() insists on it
        return url.files / STORE_FOLDER
    return spelled


def open_database(
    folder: Path, spelled: str | os.PathLike[str], entry: Mapping[str, Any] | None, readonly: bool
) -> AbstractDatabase[Any]:
    """The database of the store folder ``folder``, named ``spelled``, whose marker is
    ``entry`` (None: no store there yet); nothing is connected yet.

    Raises:
        NotAStoreError: a URL whose files folder holds a SQLite store.
    """
    url = DatabaseURL.parse(str(spelled)) if is_database_url(spelled) else None
    if url is not None:
        refuse_sqlite_store(folder, entry, url)
        return PostgresDatabase(url, readonly, given=True)
    recorded = bound_url(folder, entry)
    if recorded is not None:
        return PostgresDatabase(recorded, readonly, given=False)
    return SqliteDatabase(folder, readonly)
