"""One process's connection to the database: thread-safe, fork-aware, retried transactions.

A :class:`Database` holds a single SQLite connection per process, shared by its
threads under a lock. The connection is closed by :meth:`Database.close`, or else
when the :class:`Database` is garbage-collected or the interpreter exits, so an
object that reopens a closed store on its next use (a job, a trainer, a query)
never leaves a connection behind. A forked child opens its own connection on
first use and never touches the one it inherited (a connection must not cross a
fork). Writes run in ``BEGIN IMMEDIATE`` transactions retried while another
process holds the write lock; reads run in one snapshot; a *batch* holds one
write transaction across many writes.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from theseus.store._blobs import fsync_dir
from theseus.store._db import connect, retrying, translate

__all__ = ["Database"]

T = TypeVar("T")

# Connections a forked child inherited: kept referenced, never closed, never used there.
_INHERITED: list[sqlite3.Connection] = []


def _release(conn: sqlite3.Connection, pid: int) -> None:
    """Close ``conn`` if this process opened it; otherwise leave it untouched.

    Closing an inherited connection would run SQLite's shutdown (and deallocating
    one closes it) in a process that does not own its locks, so a fork's copy is
    parked in :data:`_INHERITED` instead.
    """
    if os.getpid() == pid:
        conn.close()
    else:
        _INHERITED.append(conn)


class Database:
    """The store's database file, opened lazily per process.

    Args:
        path: the SQLite file (``ROOT/store.sqlite``).
        readonly: open it read-only (``mode=ro``): every write is refused by SQLite.
    """

    def __init__(self, path: Path, readonly: bool = False) -> None:
        self.path = path
        self.readonly = readonly
        self.lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()
        # Closes the connection when called, when this object is collected, or at exit.
        self._closer: weakref.finalize[Any, Any] | None = None
        self.in_batch = False
        # Blob folders whose renames a batch must fsync before it commits.
        self.unsynced: set[Path] = set()

    def connection(self) -> sqlite3.Connection:
        """Return this process's connection, opening it if needed."""
        if self._conn is None or self._pid != os.getpid():
            with translate(self.path):
                conn = connect(self.path, self.readonly)
            if self._closer is not None:  # a fork's inherited connection: park it
                self._closer()
            self._conn, self._pid = conn, os.getpid()
            self._closer = weakref.finalize(self, _release, conn, self._pid)
        return self._conn

    def close(self) -> None:
        """Close this process's connection (idempotent; a fork's inherited one is left alone).

        A later read or write opens a new connection, which is closed in turn by
        the next ``close()``, or when this object is collected.
        """
        with self.lock:
            closer, self._closer, self._conn = self._closer, None, None
            if closer is not None:
                closer()

    def write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(conn)`` inside one write transaction, retried while the lock is taken.

        Inside a batch, ``fn`` joins the batch's transaction.
        """

        def attempt() -> T:
            conn = self.connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(conn)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return result

        with self.lock, translate(self.path):
            if self.in_batch:
                return fn(self.connection())
            return retrying(self.path, attempt)

    def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(conn)`` inside one read transaction (one consistent snapshot).

        Inside a batch, ``fn`` reads the batch's own uncommitted writes.
        """

        def attempt() -> T:
            conn = self.connection()
            conn.execute("BEGIN")
            try:
                return fn(conn)
            finally:
                if conn.in_transaction:
                    conn.execute("COMMIT")

        with self.lock, translate(self.path):
            if self.in_batch:
                return fn(self.connection())
            return retrying(self.path, attempt)

    def read_one(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        """Run one SELECT statement (a statement is its own consistent snapshot)."""
        with self.lock:
            try:  # the common case, kept short: reads are the store's hot path
                return self.connection().execute(sql, params).fetchall()
            except sqlite3.Error:
                pass  # busy, or a real error: take the careful path, which names the file
            with translate(self.path):
                conn = self.connection()
                return retrying(self.path, lambda: conn.execute(sql, params).fetchall())

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Hold one write transaction for the block; commit at its end, roll back on error.

        Before the commit, every blob folder in :attr:`unsynced` is fsynced, so no
        committed row names a blob whose rename is not durable. Nested blocks join
        the outer one.
        """
        with self.lock:
            if self.in_batch:
                yield
                return

            def begin() -> None:
                self.connection().execute("BEGIN IMMEDIATE")

            with translate(self.path):
                retrying(self.path, begin)
            conn = self.connection()
            self.in_batch = True
            try:
                yield
                for folder in sorted(self.unsynced):
                    fsync_dir(folder)
                with translate(self.path):
                    conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            finally:
                self.in_batch = False
                self.unsynced.clear()
