"""One process's connection to the database: thread-safe, fork-aware, retried transactions.

A :class:`Database` holds a single SQLite connection per process, shared by its
threads under a lock. A forked child opens its own connection on first use (a
connection must not cross a fork). Writes run in ``BEGIN IMMEDIATE``
transactions retried while another process holds the write lock; reads run in
one snapshot; a *batch* holds one write transaction across many writes.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from theseus.store._blobs import fsync_dir
from theseus.store._db import connect, retrying, translate

__all__ = ["Database"]

T = TypeVar("T")


class Database:
    """The store's database file, opened lazily per process.

    Args:
        path: the SQLite file (``ROOT/store.sqlite``).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()
        self.in_batch = False
        # Blob folders whose renames a batch must fsync before it commits.
        self.unsynced: set[Path] = set()

    def connection(self) -> sqlite3.Connection:
        """Return this process's connection, opening it if needed."""
        if self._conn is None or self._pid != os.getpid():
            with translate(self.path):
                self._conn, self._pid = connect(self.path), os.getpid()
        return self._conn

    def close(self) -> None:
        """Close this process's connection (idempotent; a fork's inherited one is left alone)."""
        with self.lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None

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
