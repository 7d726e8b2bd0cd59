"""The SQLite backend: a store's rows in one file beside its blobs, and SQLite's dialect.

The database ``STORE/store.sqlite`` runs in WAL mode with ``synchronous=FULL``, so that a
committed write survives a crash of the process or the machine, and readers never wait
for the writer. A write transaction is ``BEGIN IMMEDIATE``; a writer that finds the write
lock taken waits (``busy_timeout``) and then retries with a back-off, so no caller ever
sees "database is locked"; after ``PATIENCE_S`` it gives up with
:class:`~theseus.store.StoreBusyError`. A store opened ``readonly`` is opened as the URI
``file:...?mode=ro``: SQLite refuses every write, and it reads beside a live writer.

:class:`SqliteDialect` says SQLite's side of every fragment the shared statements cannot
share (``_dialect``): ``vals.value`` is untyped (``typeof()``), a name pattern is a
``GLOB``, the commit counter is ``PRAGMA data_version``, the last row of a group is the
bare columns beside ``MAX()``, and the planner takes hints (``INDEXED BY``, ``CROSS JOIN``).
"""

from __future__ import annotations

import contextlib
import random
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from theseus.store._backend import AbstractDatabase, Opened
from theseus.store._dialect import Connection, Dialect
from theseus.store._errors import (
    CorruptStoreError,
    StoreBusyError,
    StoreError,
    StorePermissionError,
)
from theseus.store._netfs import warn_if_network
from theseus.store._opening import DATABASE
from theseus.store._root import MARKER
from theseus.store._schema import FORMAT, INLINE_MAX, LATER_INDEXES, PATIENCE_S, SCHEMA, migrate

__all__ = ["SQLITE", "SqliteDatabase", "SqliteDialect", "check_header"]

T = TypeVar("T")

_BUSY_TIMEOUT_MS = 5_000


class SqliteDialect(Dialect):
    """SQLite's fragments (see ``_dialect.Dialect``)."""

    name = "sqlite"
    data_version = "PRAGMA data_version"

    def typeof(self, column: str) -> str:
        return f"typeof({column})"

    def numeric(self, column: str) -> str:
        return f"typeof({column}) IN ('integer', 'real')"

    def textual(self, column: str) -> str:
        return f"typeof({column}) = 'text'"

    def numbers(self, column: str) -> str:
        return f"{column} < ''"  # SQLite orders every number before any text

    def value(self, stored: Any) -> Any:
        return stored

    def row(self, stored: Any, kind: str) -> tuple[Any, str]:
        return stored, kind

    def glob(self, column: str, pattern: str) -> tuple[str, str]:
        return f"{column} GLOB ?", pattern

    def indexed_by(self, index: str) -> str:
        return f"INDEXED BY {index}"

    def ordered_join(self) -> str:
        return "CROSS JOIN"

    def differs(self, left: str, right: str) -> str:
        return f"{left} IS NOT {right}"

    def last_columns(self, group: str, columns: str, latest: str) -> str:
        # SQLite takes the bare columns beside MAX() from the row that holds the maximum
        return f"{columns}, MAX({latest})"

    def last_tail(self, group: str, latest: str, ordered: bool = False) -> str:
        return f" GROUP BY {group}" + (f" ORDER BY {group}" if ordered else "")

    def integrity_problems(self, conn: Connection) -> list[str]:
        rows = [str(r[0]) for r in conn.execute("PRAGMA integrity_check")]
        return [] if rows == ["ok"] else [f"SQLite integrity check: {r}" for r in rows]

    def has_index(self, conn: Connection, index: str) -> bool:
        found = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = ?", (index,)
        ).fetchone()
        return found is not None


SQLITE = SqliteDialect()


class SqliteConnection(sqlite3.Connection):
    """SQLite's connection, carrying its dialect (``_dialect.dialect(conn)``)."""

    dialect = SQLITE


@contextlib.contextmanager
def translate(db: Path) -> Iterator[None]:
    """Turn SQLite's exceptions into the store's, naming the database file."""
    try:
        yield
    except sqlite3.OperationalError as err:
        msg = str(err)
        if "readonly" in msg or "unable to open" in msg or "permission" in msg.lower():
            raise StorePermissionError(
                f"Cannot write the database file {db} ({msg}). Make {db.parent} and the "
                "files in it writable by this user."
            ) from err
        if "malformed" in msg or "not a database" in msg:
            raise _corrupt(db, err) from err
        raise StoreError(f"SQLite failed on {db}: {msg}.") from err
    except sqlite3.DatabaseError as err:
        raise _corrupt(db, err) from err


def _corrupt(db: Path, err: Exception) -> CorruptStoreError:
    return CorruptStoreError(
        f"The database file {db} is damaged or is not a theseus-store database ({err}). "
        "Restore it from a backup; `theseus-store fsck ROOT` reports what it can read."
    )


def _busy(err: sqlite3.OperationalError) -> bool:
    msg = str(err)
    return "locked" in msg or "busy" in msg


def retrying(db: Path, attempt: Callable[[], T], patience: float = PATIENCE_S) -> T:
    """Call ``attempt`` until it does not fail with a busy/locked error.

    Args:
        db: the database file, for the message.
        attempt: a function that runs (and on failure rolls back) one transaction.
        patience: seconds to keep trying.

    Raises:
        StoreBusyError: if the lock stayed taken for ``patience`` seconds.
    """
    deadline = time.monotonic() + patience
    delay = 0.001
    while True:
        try:
            return attempt()
        except sqlite3.OperationalError as err:
            if not _busy(err):
                raise
            if time.monotonic() > deadline:
                raise StoreBusyError(
                    f"The database {db} stayed locked for {patience:.0f} s. Another process "
                    "holds its write lock; stop it or wait, then retry."
                ) from err
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 0.1)


def connect(db: Path, readonly: bool = False) -> SqliteConnection:
    """Open ``db`` with the store's settings (autocommit; transactions are explicit).

    With ``readonly``, the file is opened as the URI ``file:...?mode=ro``.
    """
    target: str | Path = db
    if readonly:
        target = f"{db.absolute().as_uri()}?mode=ro"
    conn = sqlite3.connect(
        target,
        isolation_level=None,
        check_same_thread=False,
        timeout=_BUSY_TIMEOUT_MS / 1000,
        uri=readonly,
        factory=SqliteConnection,
    )
    conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
    if not readonly:
        conn.execute("PRAGMA synchronous = FULL")
        add_indexes(conn)
    return conn


def add_indexes(conn: sqlite3.Connection) -> None:
    """Create the ``_schema.LATER_INDEXES`` a store lacks (no-op for a new or current one).

    An index only speeds reads up, so a store that cannot take it now (its write lock
    held past the busy timeout, or the file not writable) is opened all the same: the
    next writer to connect adds it.
    """
    have = {
        str(r[0])
        for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type IN ('table', 'index') "
            "AND name IN ('nodes', " + ", ".join("?" * len(LATER_INDEXES)) + ")",
            tuple(LATER_INDEXES),
        )
    }
    if "nodes" not in have:  # a new database: create_schema makes everything
        return
    for name, statement in LATER_INDEXES.items():
        if name not in have:
            with contextlib.suppress(sqlite3.OperationalError):
                conn.execute(statement)


def create_schema(conn: sqlite3.Connection) -> None:
    """Switch to WAL mode and create the tables (idempotent)."""
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        raise StoreError(
            f"SQLite refused WAL mode (got {mode!r}); the file system may not "
            "support shared memory. Put the store on a local disk."
        )
    conn.execute("BEGIN IMMEDIATE")
    try:
        for statement in SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('format', ?)", (str(FORMAT),))
        conn.execute(
            "INSERT OR IGNORE INTO meta(key, value) VALUES ('inline_max', ?)", (str(INLINE_MAX),)
        )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def check_header(db: Path) -> None:
    """Refuse a database file that is not SQLite or is shorter than its header says.

    SQLite itself notices both only when a query reaches a damaged page; checking
    the 100-byte header at open time turns a truncated file into an immediate,
    clear error. The size check is skipped while a write-ahead log exists (its
    frames may legitimately hold pages beyond the end of the main file).

    Raises:
        CorruptStoreError: naming the file, what was expected and what was found.
    """
    try:
        with open(db, "rb") as handle:
            header = handle.read(100)
        size = db.stat().st_size
    except FileNotFoundError:
        return
    if not header:
        return
    if len(header) < 100 or not header.startswith(b"SQLite format 3\x00"):
        raise CorruptStoreError(
            f"The database file {db} is not an SQLite database (its first bytes are "
            f"{header[:16]!r}, expected b'SQLite format 3\\x00'). Restore it from a backup."
        )
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    valid = header[24:28] == header[92:96]
    wal = db.with_name(db.name + "-wal")
    if valid and size < pages * page_size and not (wal.exists() and wal.stat().st_size):
        raise CorruptStoreError(
            f"The database file {db} is truncated: its header says {pages} pages of "
            f"{page_size} bytes ({pages * page_size} bytes), but the file has {size} bytes. "
            "Restore it from a backup."
        )


class SqliteDatabase(AbstractDatabase[SqliteConnection]):
    """The store's SQLite file, one connection per process (see ``_backend``).

    Args:
        folder: the store's folder; the database is ``folder/store.sqlite``.
        readonly: open it read-only (``mode=ro``): every write is refused by SQLite.
    """

    dialect = SQLITE

    def __init__(self, folder: Path, readonly: bool = False) -> None:
        super().__init__(readonly)
        self.path = folder / DATABASE
        self.shown = str(self.path)

    def _connect(self) -> SqliteConnection:
        with translate(self.path):  # a folder that cannot be written is one line
            return connect(self.path, self.readonly)

    def _begin(self, conn: SqliteConnection, write: bool) -> None:
        conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")

    def _receipt(self, conn: SqliteConnection) -> None:
        return None  # a COMMIT SQLite did not answer is one that failed

    def _commit(self, conn: SqliteConnection, receipt: Any) -> None:
        conn.execute("COMMIT")

    def _retrying(self, attempt: Callable[[], T]) -> T:
        try:  # the common case, kept short: reads are the store's hot path
            return attempt()
        except sqlite3.Error:
            pass  # busy, or a real error: take the careful path, which names the file
        with translate(self.path):
            return retrying(self.path, attempt)

    def _translated(self, attempt: Callable[[], T]) -> T:
        with translate(self.path):
            return attempt()

    def warn_if_unsafe(self) -> None:
        # SQLite is not safe on NFS, Lustre and their kind; the warning names the line
        # that opened the store (Store(...) called this)
        warn_if_network(self.path, stacklevel=4)

    def create(self, folder: Path) -> dict[str, str]:
        conn = self.connection()
        with translate(self.path):
            retrying(self.path, lambda: create_schema(conn))
        return {}

    def open(self, folder: Path, entry: Mapping[str, Any], created: bool) -> Opened:
        if not self.path.exists():
            raise CorruptStoreError(
                f"{folder / MARKER} marks a store but its database {self.path} "
                "is missing. Restore store.sqlite from a backup."
            )
        if not created:
            # Only before this process connects: closing any other descriptor of the
            # database file drops every POSIX lock the process holds on it, SQLite's
            # included, and a WAL database whose locks vanish can lose commits.
            check_header(self.path)
        meta = dict(
            self.read_one("SELECT key, value FROM meta WHERE key IN ('format', 'inline_max')", ())
        )
        return Opened(
            f"sqlite {self.path}", int(meta.get("format", 1)), int(meta.get("inline_max", 0))
        )

    def upgrade(self, canonical: Callable[[str, int, tuple[str, ...]], tuple[str, int]]) -> None:
        self.write(lambda conn: migrate(conn, canonical))
