"""The PostgreSQL side of the store: the URL, the schema, the connection and its transactions.

A store on PostgreSQL keeps its rows in one database and its files (blobs larger than
``INLINE_MAX``, checkpoints, everything a run writes) in a folder every host sees, named
by the URL's ``files`` parameter::

    postgresql://USER@HOST:PORT/DB?files=/shared/folder

The store's folder is ``/shared/folder/store``: its marker names the database (without
a password) and the store's id, and the database names the same id, so the folder and
the database are bound to each other and ``Store("/shared/folder/store")`` (or the root
``/shared/folder`` wherever a root is taken) opens the same store. A password comes from
``PGPASSWORD`` or ``~/.pgpass`` (libpq reads both); one written in the URL is used to
connect and never written or printed.

:class:`PostgresDatabase` gives the store the same four operations as SQLite's
:class:`~theseus.store._connection.Database` (``write``, ``read``, ``read_one``,
``batch``), with the same meaning:

- a write transaction takes a transaction-level advisory lock first, so writers are
  serialized as SQLite's ``BEGIN IMMEDIATE`` serializes them (a node's id, an artifact's
  next version: read then written, never raced);
- a read is one ``REPEATABLE READ`` snapshot;
- a lost connection (a server restarted, a network hiccup), a serialization failure or
  a deadlock is retried with a bounded back-off on a new connection. A write whose
  ``COMMIT`` got no answer is looked up by its token (``txns``) before it is retried, so
  a retry never applies a transaction twice.

The statements are the shared ones; :class:`PgConnection` turns SQLite's ``?`` into
psycopg's ``%s``, ``INSERT OR IGNORE`` into ``ON CONFLICT DO NOTHING`` and gives an
``INSERT`` into a table with an ``id`` its ``lastrowid`` through ``RETURNING id``. What
the statements cannot share is in ``_dialect``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import re
import threading
import time
import urllib.parse
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from theseus.store._db import FORMAT, INLINE_MAX, PATIENCE_S, SCHEMA
from theseus.store._dialect import POSTGRES
from theseus.store._errors import (
    CorruptStoreError,
    StoreBusyError,
    StoreError,
    StorePermissionError,
)

__all__ = [
    "SCHEMES",
    "DatabaseURL",
    "JsonText",
    "PgConnection",
    "PostgresDatabase",
    "is_database_url",
]

T = TypeVar("T")

SCHEMES = ("postgresql://", "postgres://")
# Every write transaction holds this transaction-level advisory lock (any fixed number:
# advisory locks are per database); migrations hold the session-level one below.
_WRITE_LOCK = 0x7468_6573_6575_7301
_MIGRATE_LOCK = 0x7468_6573_6575_7302
_CONNECT_TIMEOUT_S = 10
_MAX_DELAY_S = 2.0


def is_database_url(root: object) -> bool:
    """Whether ``root`` is a database URL (``postgresql://...``) rather than a folder."""
    return isinstance(root, str) and root.lower().startswith(SCHEMES)


@dataclass(frozen=True)
class DatabaseURL:
    """A parsed ``postgresql://`` URL.

    Attributes:
        conninfo: what psycopg connects with (the URL without ``files``; a password kept).
        shown: the URL without its password and without ``files``: what is printed
            and what the store's marker records.
        files: the folder of the store's files (absolute), or None where the URL has none.
    """

    conninfo: str
    shown: str
    files: Path | None

    @classmethod
    def parse(cls, text: str, *, need_files: bool = True) -> DatabaseURL:
        """Parse ``text``; a missing database name or ``files`` folder is a one-line error.

        Raises:
            StoreError: naming what is missing and the expected form.
        """
        form = "postgresql://USER@HOST:PORT/DB?files=/shared/folder"
        parts = urllib.parse.urlsplit(text)
        query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        files = [v for k, v in query if k == "files"]
        rest = [(k, v) for k, v in query if k != "files"]
        netloc = parts.netloc
        hidden = netloc
        if "@" in netloc:
            userinfo, host = netloc.rsplit("@", 1)
            user = userinfo.split(":", 1)[0]
            hidden = f"{user}@{host}"
        shown_query = urllib.parse.urlencode(rest)
        shown = urllib.parse.urlunsplit(("postgresql", hidden, parts.path, shown_query, ""))
        if not parts.path.strip("/"):
            raise StoreError(f"The store URL {shown} names no database; expected {form}.")
        if need_files and (not files or not files[-1]):
            raise StoreError(
                f"The store URL {shown} has no files folder; expected {form} (a folder "
                "every host sees, for checkpoints and large artifacts)."
            )
        folder = None
        if files and files[-1]:
            folder = Path(os.path.expanduser(files[-1]))
            if not folder.is_absolute():
                raise StoreError(
                    f"The files folder of {shown} is {files[-1]!r}, a relative path; give an "
                    f"absolute one ({form})."
                )
        conninfo = urllib.parse.urlunsplit(
            ("postgresql", netloc, parts.path, urllib.parse.urlencode(rest), "")
        )
        return cls(conninfo, shown, folder)


class JsonText(str):
    """A value's JSON text, sent as ``jsonb`` (``_dialect.json_number`` makes it)."""


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as err:
        raise StoreError(
            "A PostgreSQL store needs psycopg 3: pip install 'theseus-store[postgres]'."
        ) from err
    return psycopg


@functools.cache
def _adapters() -> Any:
    """psycopg's adapters with :class:`JsonText` dumped as ``jsonb`` text, as it is."""
    psycopg = _psycopg()
    from psycopg.adapt import AdaptersMap, Dumper

    class _JsonTextDumper(Dumper):
        oid = psycopg.adapters.types["jsonb"].oid

        def dump(self, obj: Any) -> bytes:
            return str(obj).encode()

    adapters = AdaptersMap(psycopg.adapters)
    adapters.register_dumper(JsonText, _JsonTextDumper)
    return adapters


@functools.lru_cache(maxsize=1024)
def _translate_sql(sql: str) -> tuple[str, bool]:
    """SQLite's statement in psycopg's form, and whether it returns the new row's id."""
    text = sql.replace("%", "%%").replace("?", "%s")
    stripped = text.lstrip()
    if stripped.upper().startswith("INSERT OR IGNORE INTO"):
        text = "INSERT INTO" + stripped[len("INSERT OR IGNORE INTO") :] + " ON CONFLICT DO NOTHING"
    returning = (
        bool(re.match(r"\s*INSERT INTO (nodes|checkpoints|artifacts|jobs)\b", text))
        and "RETURNING" not in text.upper()
    )
    if returning:
        text += " RETURNING id"
    return text, returning


class _Cursor:
    """The parts of ``sqlite3.Cursor`` the store uses, over a psycopg cursor."""

    def __init__(self, cursor: Any, returning: bool) -> None:
        self._cursor = cursor
        self.lastrowid: int | None = None
        self.rowcount: int = cursor.rowcount
        if returning:
            row = cursor.fetchone()
            self.lastrowid = None if row is None else int(row[0])

    def fetchone(self) -> Any:
        return self._cursor.fetchone()

    def fetchall(self) -> list[Any]:
        return list(self._cursor.fetchall())

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cursor)


class PgConnection:
    """A psycopg connection that takes the store's SQLite-style statements."""

    dialect = POSTGRES

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def execute(self, sql: str, params: Sequence[Any] = ()) -> _Cursor:
        text, returning = _translate_sql(sql)
        return _Cursor(self.raw.execute(text, tuple(params)), returning)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        rows = list(rows)
        if rows:
            text, _ = _translate_sql(sql)
            with self.raw.cursor() as cursor:
                cursor.executemany(text, rows)

    @property
    def in_transaction(self) -> bool:
        psycopg = _psycopg()
        return bool(self.raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE)

    def close(self) -> None:
        self.raw.close()


def schema() -> list[str]:
    """The shared schema (``_db.SCHEMA``) in PostgreSQL's types, one statement each."""
    text = SCHEMA
    for old, new in (
        ("id INTEGER PRIMARY KEY", "id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"),
        (" WITHOUT ROWID", ""),
        ("INTEGER", "BIGINT"),
        ("REAL", "DOUBLE PRECISION"),
        ("BLOB", "BYTEA"),
        ("TEXT", 'TEXT COLLATE "C"'),
        ("value, kind", "value JSONB, kind"),
    ):
        text = text.replace(old, new)
    statements = [s.strip() for s in text.split(";") if s.strip()]
    statements.append(
        "CREATE TABLE IF NOT EXISTS txns(token TEXT PRIMARY KEY, created DOUBLE PRECISION NOT NULL)"
    )
    return statements


class PostgresDatabase:
    """The store's PostgreSQL database, one connection per process, opened lazily.

    Args:
        url: the parsed URL.
        readonly: refuse every write (``default_transaction_read_only``).
    """

    def __init__(self, url: DatabaseURL, readonly: bool = False) -> None:
        self.url = url
        self.path = url.shown
        self.readonly = readonly
        self.lock = threading.RLock()
        self._conn: PgConnection | None = None
        self._pid = os.getpid()
        self._closer: weakref.finalize[Any, Any] | None = None
        self.in_batch = False
        self.unsynced: set[Path] = set()
        # Whether this object ever connected: a server down at the start is one error at
        # once, a server that goes away later is waited for (a restart under load).
        self._reached = False

    # -- connecting ------------------------------------------------------------------------

    def connection(self) -> PgConnection:
        """This process's connection, opened if needed (a fork opens its own)."""
        if self._conn is None or self._pid != os.getpid():
            psycopg = _psycopg()
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

            raw.adapters.register_dumper(JsonText, _adapters().get_dumper(JsonText, "t"))
            # every int as bigint (the store's ints are 64-bit), so a parameter's type
            # never depends on its size (``SELECT ? UNION SELECT id``)
            raw.adapters.register_dumper(int, Int8Dumper)
            conn = PgConnection(raw)
            if self._closer is not None and self._pid == os.getpid():
                self._closer()
            self._conn, self._pid = conn, os.getpid()
            self._closer = weakref.finalize(self, _release, conn, self._pid)
        return self._conn

    def close(self) -> None:
        """Close this process's connection (idempotent)."""
        with self.lock:
            closer, self._closer, self._conn = self._closer, None, None
            if closer is not None:
                closer()

    def _drop(self) -> None:
        """Forget a connection that failed (the next use opens a new one)."""
        conn, self._conn = self._conn, None
        self._closer = None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    # -- transactions ----------------------------------------------------------------------

    def write(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(conn)`` in one write transaction (writers serialized), retried."""
        with self.lock:
            if self.in_batch:
                return self._translated(lambda: fn(self.connection()))
            return self._retrying(lambda: self._transaction(fn))

    def read(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(conn)`` in one read snapshot, retried while the server is away."""

        def attempt() -> T:
            conn = self.connection()
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
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
        """Run one SELECT statement (its own snapshot)."""
        with self.lock:
            if self.in_batch:
                return self._translated(lambda: self.connection().execute(sql, params).fetchall())
            return self._retrying(lambda: self.connection().execute(sql, params).fetchall())

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Hold one write transaction for the block (see ``Database.batch``)."""
        from theseus.store._blobs import fsync_dir

        with self.lock:
            if self.in_batch:
                yield
                return

            def begin() -> PgConnection:
                conn = self.connection()
                conn.execute("BEGIN")
                conn.execute("SELECT pg_advisory_xact_lock(?)", (_WRITE_LOCK,))
                return conn

            conn = self._retrying(begin)
            self.in_batch = True
            try:
                yield
                for folder in sorted(self.unsynced):
                    fsync_dir(folder)
                self._translated(lambda: conn.execute("COMMIT"))
            except BaseException:
                _rollback(conn)
                raise
            finally:
                self.in_batch = False
                self.unsynced.clear()

    def _transaction(self, fn: Callable[[Any], T]) -> T:
        """One write transaction; a COMMIT without an answer is looked up by its token."""
        psycopg = _psycopg()
        conn = self.connection()
        token = uuid.uuid4().hex
        conn.execute("BEGIN")
        try:
            conn.execute("SELECT pg_advisory_xact_lock(?)", (_WRITE_LOCK,))
            result = fn(conn)
            conn.execute("INSERT INTO txns(token, created) VALUES (?, ?)", (token, time.time()))
        except BaseException:
            _rollback(conn)
            raise
        try:
            conn.execute("COMMIT")
        except psycopg.OperationalError:
            self._drop()
            if self._committed(token):
                return result
            raise
        if random.random() < 0.001:  # keep the token table short
            with contextlib.suppress(Exception):
                conn.execute("DELETE FROM txns WHERE created < ?", (time.time() - 86400,))
        return result

    def _committed(self, token: str) -> bool:
        """Whether the transaction of ``token`` committed (asked until the server answers)."""
        rows = self._retrying(
            lambda: (
                self.connection().execute("SELECT 1 FROM txns WHERE token = ?", (token,)).fetchall()
            )
        )
        return bool(rows)

    def _translated(self, attempt: Callable[[], T]) -> T:
        psycopg = _psycopg()
        try:
            return attempt()
        except psycopg.Error as err:
            raise _store_error(self.url, err) from err

    def _retrying(self, attempt: Callable[[], T], patience: float = PATIENCE_S) -> T:
        """Call ``attempt`` until it does not fail for a transient reason (bounded back-off)."""
        psycopg = _psycopg()
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


def _transient(err: Exception) -> bool:
    """A failure a retry on a new connection can get past."""
    psycopg = _psycopg()
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
    psycopg = _psycopg()
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


def _rollback(conn: PgConnection) -> None:
    """End a failed transaction (a connection the server dropped has none to end)."""
    with contextlib.suppress(Exception):
        if conn.in_transaction:
            conn.execute("ROLLBACK")


def _release(conn: PgConnection, pid: int) -> None:
    if os.getpid() == pid:
        with contextlib.suppress(Exception):
            conn.close()


# -- the schema, once ----------------------------------------------------------------------


def create_schema(db: PostgresDatabase, files: Path) -> str:
    """Create the tables if absent and return the store's id (made once, kept after).

    Runs under a session-level advisory lock, so any number of processes that create
    or migrate the store at once do it one after another: the first creates, the rest
    find the tables and the id.
    """

    def attempt() -> str:
        conn = db.connection()
        conn.execute("SELECT pg_advisory_lock(?)", (_MIGRATE_LOCK,))
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
            conn.execute("SELECT pg_advisory_unlock(?)", (_MIGRATE_LOCK,))
        return str(found)

    with db.lock:
        return db._retrying(attempt)
