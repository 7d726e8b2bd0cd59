"""What a transaction function is given: a connection that speaks the shared SQL, and its dialect.

The store's statements are written once, in the SQL both SQLite and PostgreSQL take,
against a :class:`Connection` (``execute``, ``executemany``, ``in_transaction``). What
they cannot say alike is asked of the connection's :class:`Dialect`, which each backend
implements beside its connection (``_sqlite.SqliteDialect``,
``_postgres._dialect.PostgresDialect``):

- a value's type, and the parameter that stands for a stored value;
- a name pattern (``*`` for any run of characters);
- the number that moves when another connection commits;
- the last row of each group, and NULL-safe inequality;
- query-planner hints that only one backend takes, and the database's own check.

``dialect(conn)`` gives the connection's dialect; code above the backends never asks
which backend it has, only what its dialect says.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

__all__ = ["Connection", "Cursor", "Dialect", "dialect"]


class Cursor(Protocol):
    """What a statement returns: its rows, and an ``INSERT``'s new id."""

    @property
    def lastrowid(self) -> int | None:
        """The id of the row an ``INSERT`` into a table with an ``id`` made."""

    @property
    def rowcount(self) -> int:
        """The rows an ``UPDATE`` or ``DELETE`` touched."""

    def fetchone(self) -> Any:
        """The next row (a tuple), or None."""

    def fetchall(self) -> list[Any]:
        """The remaining rows."""

    def __iter__(self) -> Iterator[Any]:
        """The remaining rows, one by one."""


class Connection(Protocol):
    """A connection inside one of the store's transactions (``Store.write``/``read``).

    ``?`` marks a parameter; ``INSERT OR IGNORE``, ``ON CONFLICT ... DO UPDATE`` and
    ``RETURNING``-free inserts (``lastrowid``) work on both backends.
    """

    @property
    def dialect(self) -> Dialect:
        """The SQL fragments this connection's backend needs where the backends differ."""

    @property
    def in_transaction(self) -> bool:
        """Whether a transaction is open."""

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> Cursor:
        """Run one statement."""

    def executemany(self, sql: str, parameters: Sequence[Sequence[Any]], /) -> Any:
        """Run one statement once per row of parameters."""


class Dialect(abc.ABC):
    """The SQL fragments a backend says its own way (each backend implements every one).

    Attributes:
        name: the backend's name (``sqlite``, ``postgresql``), for messages.
        data_version: a ``SELECT`` of one number that changes when another connection
            commits.
    """

    name: str
    data_version: str

    @abc.abstractmethod
    def typeof(self, column: str) -> str:
        """SQL naming ``column``'s type as SQLite's ``typeof`` does (``integer``, ``real``,
        ``text``, ``null``)."""

    @abc.abstractmethod
    def numeric(self, column: str) -> str:
        """SQL true when ``column`` holds a number."""

    @abc.abstractmethod
    def textual(self, column: str) -> str:
        """SQL true when ``column`` holds text."""

    @abc.abstractmethod
    def numbers(self, column: str) -> str:
        """A range of ``column`` that holds every number and nothing else: what an index
        on the column narrows to."""

    @abc.abstractmethod
    def value(self, stored: Any) -> Any:
        """The parameter that stands for a stored value (``_records.encode_value``'s form)."""

    @abc.abstractmethod
    def row(self, stored: Any, kind: str) -> tuple[Any, str]:
        """The ``(value, kind)`` parameters of a value row (``_records.encode_value``'s pair)."""

    @abc.abstractmethod
    def glob(self, column: str, pattern: str) -> tuple[str, str]:
        """SQL and its parameter matching ``column`` against ``pattern`` (``*``: any run)."""

    @abc.abstractmethod
    def indexed_by(self, index: str) -> str:
        """A hint to use ``index`` (empty where the backend takes no hints)."""

    @abc.abstractmethod
    def ordered_join(self) -> str:
        """A join that keeps its left table outermost."""

    @abc.abstractmethod
    def differs(self, left: str, right: str) -> str:
        """SQL true when ``left`` and ``right`` differ, NULL being a value like any other."""

    @abc.abstractmethod
    def last_columns(self, group: str, columns: str, latest: str) -> str:
        """The select list of the row with the largest ``latest`` in each ``group``."""

    @abc.abstractmethod
    def last_tail(self, group: str, latest: str, ordered: bool = False) -> str:
        """What ends the statement :meth:`last_columns` began (``ordered``: by ``group``)."""

    @abc.abstractmethod
    def integrity_problems(self, conn: Connection) -> list[str]:
        """What the database's own check of its files finds (empty: nothing, or the server
        keeps its own files)."""

    @abc.abstractmethod
    def has_index(self, conn: Connection, index: str) -> bool:
        """Whether the store's database holds ``index`` (an older store may lack a later
        one, ``_schema.LATER_INDEXES``)."""


def dialect(conn: Connection) -> Dialect:
    """The dialect of a connection a transaction function was given."""
    return conn.dialect
