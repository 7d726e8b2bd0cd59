"""What a store's database is to the store: one base for both backends, and their shared skeleton.

:class:`AbstractDatabase` is everything :class:`~theseus.store.Store` asks of the place its
rows live, and the part both backends share, written once:

- one connection per process, shared by its threads under :attr:`~AbstractDatabase.lock`,
  opened lazily; a forked child opens its own on first use and never touches the one it
  inherited (a connection must not cross a fork: closing the inherited copy would end
  the parent's session, so it is parked, never closed, in the child). The connection is
  closed by :meth:`~AbstractDatabase.close`, or when the object is collected, or at exit;
- the transactions: ``write`` (one write transaction, writers serialized, retried while
  another process holds the write lock or the server is away), ``read`` (one snapshot),
  ``read_one`` (one statement) and ``batch`` (one write transaction across many writes,
  which every blob folder in :attr:`~AbstractDatabase.unsynced` is fsynced before it
  commits, so no committed row names a blob whose rename is not durable);
- the store's life: ``create`` (the schema, and what the store's marker records),
  ``open`` (refuse a database that is not this folder's, read its format and inline size),
  ``upgrade`` (an older format's rows migrated).

A backend implements the abstract methods and nothing else: how to connect, how a
transaction begins and commits, which failures are transient and how its errors read,
and its :class:`~theseus.store._dialect.Dialect`. ``_backends.open_database`` picks the
backend for a store folder; nothing above the backends asks which one it has.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

from theseus.store._blobs import fsync_dir
from theseus.store._dialect import Connection, Dialect

__all__ = ["AbstractDatabase", "Opened"]

T = TypeVar("T")
C = TypeVar("C", bound=Connection)

# Connections a forked child inherited: kept referenced, never closed, never used there.
_INHERITED: list[Any] = []


def _release(conn: Any, pid: int) -> None:
    """Close ``conn`` if this process opened it; otherwise leave it untouched.

    Closing an inherited connection would run the library's shutdown (SQLite's, or
    libpq's goodbye on the parent's socket) in a process that does not own it, and
    deallocating one closes it, so a fork's copy is parked in :data:`_INHERITED` instead.
    """
    if os.getpid() == pid:
        with contextlib.suppress(Exception):
            conn.close()
    else:
        _INHERITED.append(conn)


@dataclasses.dataclass(frozen=True)
class Opened:
    """What opening a store's database found.

    Attributes:
        identity: what tells this store from every other, however it was named: its
            database file, or the id a PostgreSQL store's database holds.
        format: the store format its rows are in (``_schema.FORMAT`` or older).
        inline_max: artifacts of at most this many bytes live in the database.
        marker: what the store's marker should record for this backend, where it differs
            from what it records (a binding an older version wrote); None: as it is.
    """

    identity: str
    format: int
    inline_max: int
    marker: Mapping[str, str] | None = None


class AbstractDatabase(abc.ABC, Generic[C]):
    """A store's database, opened lazily per process; the shared skeleton of both backends.

    Args:
        readonly: refuse every write (the backend's own read-only mode).

    Attributes:
        shown: where the rows are, as messages name it (the SQLite file, or the URL
            without a password).
        dialect: the SQL the backend speaks where the backends differ.
        lock: serializes this process's threads on the one connection.
        in_batch: whether a ``batch`` holds the write transaction.
        unsynced: blob folders whose renames the batch fsyncs before it commits.
    """

    shown: str
    dialect: Dialect

    def __init__(self, readonly: bool = False) -> None:
        self.readonly = readonly
        self.lock = threading.RLock()
        self._conn: C | None = None
        self._pid = os.getpid()
        # Closes the connection when called, when this object is collected, or at exit.
        self._closer: weakref.finalize[Any, Any] | None = None
        self.in_batch = False
        self.unsynced: set[Path] = set()

    # -- what a backend says -----------------------------------------------------------------

    @abc.abstractmethod
    def _connect(self) -> C:
        """A new connection with the store's settings (autocommit; transactions explicit)."""

    @abc.abstractmethod
    def _begin(self, conn: C, write: bool) -> None:
        """Open a transaction: a write one that holds the store's write lock, or a snapshot."""

    @abc.abstractmethod
    def _receipt(self, conn: C) -> Any:
        """Mark the open write transaction so that a retry can tell it committed (or None)."""

    @abc.abstractmethod
    def _commit(self, conn: C, receipt: Any) -> None:
        """Commit; a commit whose answer was lost counts as done where ``receipt`` was
        committed with it."""

    @abc.abstractmethod
    def _retrying(self, attempt: Callable[[], T]) -> T:
        """Call ``attempt`` until it does not fail for a transient reason; the backend's
        errors become the store's (naming the database)."""

    @abc.abstractmethod
    def _translated(self, attempt: Callable[[], T]) -> T:
        """Call ``attempt`` once; the backend's errors become the store's."""

    @abc.abstractmethod
    def warn_if_unsafe(self) -> None:
        """Warn once where the database's place is not safe for it (SQLite on NFS)."""

    @abc.abstractmethod
    def create(self, folder: Path) -> dict[str, str]:
        """Create the store's tables for the store folder ``folder`` (under its creation
        lock); return what its marker records beside the format."""

    @abc.abstractmethod
    def open(self, folder: Path, entry: Mapping[str, Any], created: bool) -> Opened:
        """Check that the database is the store the marker ``entry`` of ``folder`` names,
        and read its format and inline size (``created``: this object just made it)."""

    @abc.abstractmethod
    def upgrade(self, canonical: Callable[[str, int, tuple[str, ...]], tuple[str, int]]) -> None:
        """Migrate rows of an older format to ``_schema.FORMAT`` (see ``_schema.migrate``)."""

    # -- one connection per process ------------------------------------------------------------

    def connection(self) -> C:
        """This process's connection, opened if needed (a fork opens its own)."""
        if self._conn is None or self._pid != os.getpid():
            conn = self._connect()
            if self._closer is not None:  # a fork's inherited connection: park it
                self._closer()
            self._conn, self._pid = conn, os.getpid()
            self._closer = weakref.finalize(self, _release, conn, self._pid)
        return self._conn

    def close(self) -> None:
        """Close this process's connection (idempotent; a fork's inherited one is left alone).

        A later read or write opens a new connection, which is closed in turn by the next
        ``close()``, or when this object is collected.
        """
        with self.lock:
            closer, self._closer, self._conn = self._closer, None, None
            if closer is not None:
                closer()

    def _drop(self) -> None:
        """Forget a connection that failed (the next use opens a new one)."""
        self.close()

    # -- transactions ----------------------------------------------------------------------------

    def write(self, fn: Callable[[C], T]) -> T:
        """Run ``fn(conn)`` inside one write transaction (writers serialized), retried.

        Inside a batch, ``fn`` joins the batch's transaction.
        """

        def attempt() -> T:
            conn = self.connection()
            try:
                self._begin(conn, write=True)
                result = fn(conn)
                self._commit(conn, self._receipt(conn))
            except BaseException:
                _rollback(conn)
                raise
            return result

        with self.lock:
            if self.in_batch:
                return self._translated(lambda: fn(self.connection()))
            return self._retrying(attempt)

    def read(self, fn: Callable[[C], T]) -> T:
        """Run ``fn(conn)`` inside one read transaction (one consistent snapshot).

        Inside a batch, ``fn`` reads the batch's own uncommitted writes.
        """

        def attempt() -> T:
            conn = self.connection()
            self._begin(conn, write=False)
            try:
                return fn(conn)
            finally:
                if conn.in_transaction:
                    conn.execute("COMMIT")

        with self.lock:
            if self.in_batch:
                return self._translated(lambda: fn(self.connection()))
            return self._retrying(attempt)

    def read_one(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        """Run one SELECT statement (a statement is its own consistent snapshot)."""
        with self.lock:
            if self.in_batch:
                return self._translated(lambda: self.connection().execute(sql, params).fetchall())
            return self._retrying(lambda: self.connection().execute(sql, params).fetchall())

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Hold one write transaction for the block; commit at its end, roll back on error.

        Before the commit, every blob folder in :attr:`unsynced` is fsynced, so no
        committed row names a blob whose rename is not durable. Nested blocks join the
        outer one.
        """
        with self.lock:
            if self.in_batch:
                yield
                return

            def begin() -> C:
                conn = self.connection()
                try:
                    self._begin(conn, write=True)
                except BaseException:
                    _rollback(conn)
                    raise
                return conn

            conn = self._retrying(begin)
            self.in_batch = True
            try:
                yield
                for folder in sorted(self.unsynced):
                    fsync_dir(folder)
                self._translated(lambda: self._commit(conn, None))
            except BaseException:
                _rollback(conn)
                raise
            finally:
                self.in_batch = False
                self.unsynced.clear()


def _rollback(conn: Connection) -> None:
    """End a failed transaction (a connection the server dropped has none to end)."""
    with contextlib.suppress(Exception):
        if conn.in_transaction:
            conn.execute("ROLLBACK")
