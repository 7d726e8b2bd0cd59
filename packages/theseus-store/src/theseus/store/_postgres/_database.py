"""The PostgreSQL database of a store: connecting, its transactions, retries and errors.

:class:`PostgresDatabase` is the PostgreSQL implementation of ``_backend.AbstractDatabase``
(the skeleton of ``write``, ``read``, ``read_one`` and ``batch`` is the shared one):

- a write transaction takes a transaction-level advisory lock first, so writers are
  serialized as SQLite's ``BEGIN IMMEDIATE`` serializes them (a node's id, an artifact's
  next version: read then written, never raced);
- a read is one ``REPEATABLE READ`` snapshot;
- a lost connection (a server restarted, a network hiccup), a serialization failure or
  a deadlock is retried with a bounded back-off on a new connection. A write leaves a
  receipt (a token in ``txns``) in its own transaction, so a ``COMMIT`` that got no
  answer is looked up before the write is retried: a retry never applies it twice;
- a server that does not answer when the store is first opened is one error at once;
  one that goes away later is waited for (a restart under load).

The tables are made once, under a session-level advisory lock, so that any number of
processes can create one store at once; binding the database to the store's folder, and
checking that binding when the store is opened, is ``_binding``'s.
"""

from __future__ import annotations

import contextlib
import random
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from theseus.store._backend import AbstractDatabase, Opened
from theseus.store._errors import (
    CorruptStoreError,
    StoreBusyError,
    StoreError,
    StorePermissionError,
)
from theseus.store._postgres import _binding
from theseus.store._postgres._connection import PgConnection, adapters, driver, schema
from theseus.store._postgres._dialect import POSTGRES, JsonText
from theseus.store._postgres._url import DatabaseURL
from theseus.store._schema import FORMAT, INLINE_MAX, PATIENCE_S, migrate

__all__ = ["PostgresDatabase", "Unreachable"]

T = TypeVar("T")

# Every write transaction holds this transaction-level advisory lock (any fixed number:
# advisory locks are per database); making the tables holds the session-level one below.
_WRITE_LOCK = 0x7468_6573_6575_7301
_MAKE_LOCK = 0x7468_6573_6575_7302
_CONNECT_TIMEOUT_S = 10
_MAX_DELAY_S = 2.0


class PostgresDatabase(AbstractDatabase[PgConnection]):
    """The store's PostgreSQL database, one connection per process, opened lazily.

    Args:
        url: the parsed URL.
        readonly: refuse every write (``default_transaction_read_only``).
        given: whether the URL was given to open the store (False: read from the store
            folder's marker), for the messages of a database that is not the folder's.
    """

    dialect = POSTGRES

    def __init__(self, url: DatabaseURL, readonly: bool = False, given: bool = True) -> None:
        super().__init__(readonly)
        self.url = url
        self.shown = url.shown
        self.given = given
        # Whether this object ever connected: a server down at the start is one error at
        # once, a server that goes away later is waited for (a restart under load).
        self._reached = False

    # -- connecting ------------------------------------------------------------------------

    def _connect(self) -> PgConnection:
        psycopg = driver()
        # No JIT: the store's statements are index probes and short aggregates, for
        # which compiling a plan (100-200 ms) costs more than running it.
        options = "-c jit=off"
        if self.readonly:
            options += " -c default_transaction_read_only=on"
        try:
            raw = psycopg.connect(
                self.url.conninfo,
                autocommit=True,
                connect_timeout=_CONNECT_TIMEOUT_S,
                options=options,
                application_name="theseus-store",
            )
        except psycopg.OperationalError as err:
            raise Unreachable(self.url, err, self._reached) from err
        self._reached = True
        from psycopg.types.numeric import Int8Dumper

        raw.adapters.register_dumper(JsonText, adapters().get_dumper(JsonText, "t"))
        # every int as bigint (the store's ints are 64-bit), so a parameter's type
        # never depends on its size (``SELECT ? UNION SELECT id``)
        raw.adapters.register_dumper(int, Int8Dumper)
        return PgConnection(raw)

    # -- transactions ----------------------------------------------------------------------

    def _begin(self, conn: PgConnection, write: bool) -> None:
        if write:
            conn.execute("BEGIN")
            conn.execute("SELECT pg_advisory_xact_lock(?)", (_WRITE_LOCK,))
        else:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")

    def _receipt(self, conn: PgConnection) -> str:
        token = uuid.uuid4().hex
        conn.execute("INSERT INTO txns(token, created) VALUES (?, ?)", (token, time.time()))
        return token

    def _commit(self, conn: PgConnection, receipt: Any) -> None:
        psycopg = driver()
        try:
            conn.execute("COMMIT")
        except psycopg.OperationalError:
            self._drop()
            if receipt is not None and self._committed(str(receipt)):
                return
            raise
        if receipt is not None and random.random() < 0.001:  # keep the receipts short
            with contextlib.suppress(Exception):
                conn.execute("DELETE FROM txns WHERE created < ?", (time.time() - 86400,))

    def _committed(self, token: str) -> bool:
        """Whether the transaction of ``token`` committed (asked until the server answers)."""
        rows = self._retrying(
            lambda: (
                self.connection().execute("SELECT 1 FROM txns WHERE token = ?", (token,)).fetchall()
            )
        )
        return bool(rows)

    def _translated(self, attempt: Callable[[], T]) -> T:
        psycopg = driver()
        try:
            return attempt()
        except psycopg.Error as err:
            raise _store_error(self.url, err) from err

    def _retrying(self, attempt: Callable[[], T], patience: float = PATIENCE_S) -> T:
        psycopg = driver()
        deadline = time.monotonic() + patience
        delay = 0.05
        while True:
            try:
                return attempt()
            except Unreachable as err:
                if not err.retry:
                    raise
                failure: Exception = err
            except psycopg.Error as err:
                if not _transient(err):
                    raise _store_error(self.url, err) from err
                failure = err
            self._drop()
            if time.monotonic() > deadline:
                raise StoreBusyError(
                    f"The database {self.url.shown} stayed unavailable for {patience:.0f} s "
                    f"({_first_line(failure)}). Check that the server is up, then retry."
                ) from failure
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, _MAX_DELAY_S)

    # -- the store's life ------------------------------------------------------------------

    def warn_if_unsafe(self) -> None:
        pass  # a server is safe for every host that reaches it

    def create(self, folder: Path) -> dict[str, str]:
        with self.lock:
            store_id = self._retrying(lambda: self._make_tables(folder.parent))
        return _binding.claim(self, self.url, folder, store_id)

    def _make_tables(self, files: Path) -> str:
        """Create the tables if absent and return the store's id (made once, kept after).

        Runs under a session-level advisory lock, so any number of processes that create
        the store at once do it one after another: the first creates, the rest find the
        tables and the id.
        """
        conn = self.connection()
        conn.execute("SELECT pg_advisory_lock(?)", (_MAKE_LOCK,))
        try:
            conn.execute("BEGIN")
            try:
                for statement in schema():
                    conn.execute(statement)
                for key, value in (
                    ("format", str(FORMAT)),
                    ("inline_max", str(INLINE_MAX)),
                    ("id", uuid.uuid4().hex),
                    ("files", str(files)),
                ):
                    conn.execute(
                        "INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT DO NOTHING",
                        (key, value),
                    )
                (found,) = conn.execute("SELECT value FROM meta WHERE key = 'id'").fetchone()
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        finally:
            conn.execute("SELECT pg_advisory_unlock(?)", (_MAKE_LOCK,))
        return str(found)

    def open(self, folder: Path, entry: Mapping[str, Any], created: bool) -> Opened:
        return _binding.checked(self, self.url, self.given, folder, entry)

    def upgrade(self, canonical: Callable[[str, int, tuple[str, ...]], tuple[str, int]]) -> None:
        self.write(lambda conn: migrate(conn, canonical))


def _transient(err: Exception) -> bool:
    """A failure a retry on a new connection can get past."""
    psycopg = driver()
    state = getattr(getattr(err, "diag", None), "sqlstate", None) or ""
    if isinstance(err, psycopg.errors.SerializationFailure | psycopg.errors.DeadlockDetected):
        return True
    if state.startswith(("08", "57P")):  # connection exceptions, operator intervention
        return True
    return isinstance(err, psycopg.OperationalError) and not isinstance(
        err, psycopg.errors.InsufficientPrivilege
    )


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


class Unreachable(StoreError):
    """The server did not take a connection (``retry``: it did earlier, so wait for it)."""

    def __init__(self, url: DatabaseURL, err: Exception, retry: bool) -> None:
        super().__init__(
            f"Cannot connect to the store's database {url.shown}: {_first_line(err)}. Start "
            "the server or correct the URL (a password comes from PGPASSWORD or ~/.pgpass)."
        )
        self.retry = retry


def _store_error(url: DatabaseURL, err: Exception) -> StoreError:
    psycopg = driver()
    if isinstance(
        err, psycopg.errors.ReadOnlySqlTransaction | psycopg.errors.InsufficientPrivilege
    ):
        return StorePermissionError(
            f"Cannot write the database {url.shown} ({_first_line(err)}). Open the store "
            "for writing, or grant this user write access."
        )
    if isinstance(err, psycopg.errors.UndefinedTable):
        return CorruptStoreError(
            f"The database {url.shown} lacks the store's tables ({_first_line(err)}); it is "
            "not a theseus-store database, or its tables were dropped."
        )
    return StoreError(f"PostgreSQL failed on {url.shown}: {_first_line(err)}.")
