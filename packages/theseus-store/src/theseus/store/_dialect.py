"""Where the SQL of the two backends differs: every fragment the shared queries cannot share.

The store's statements are written once, in the SQL both SQLite and PostgreSQL take.
What they cannot say alike is asked of the connection's :class:`Dialect`:

- a value's type. SQLite keeps ``vals.value`` untyped and answers ``typeof()``
  (``integer``, ``real``, ``text``, ``null``); PostgreSQL keeps it as ``jsonb``, whose
  numbers compare exactly (integers and decimals alike), and a number written with a
  decimal point is a ``real``. A float is written in positional notation with a point
  (``1e300`` as its 301 digits and ``.0``), so it reads back as a float, and the
  infinities as a number of 400 digits, larger than every finite double and read back
  as ``inf`` by Python's ``float``; ``-0.0``, which a ``jsonb`` number cannot hold, is
  ``0.0`` with the kind ``z``;
- a name pattern (``GLOB`` against ``LIKE`` with ``*`` as ``%``);
- the number that moves when another connection commits;
- query-planner hints that only SQLite takes (``INDEXED BY``, ``CROSS JOIN`` order).

``dialect(conn)`` gives the connection's dialect: :data:`POSTGRES` for the
PostgreSQL adapter (``_postgres.PgConnection``), :data:`SQLITE` for everything else.
"""

from __future__ import annotations

import decimal
import math
from typing import Any

from theseus.store._records import KIND_NEGATIVE_ZERO

__all__ = ["POSTGRES", "SQLITE", "Dialect", "dialect", "json_number"]


class Dialect:
    """SQLite's fragments; :class:`_Postgres` overrides what differs."""

    name = "sqlite"
    #: ``SELECT`` that returns one number which changes when another connection commits.
    data_version = "PRAGMA data_version"

    def typeof(self, column: str) -> str:
        """SQL naming ``column``'s type as SQLite's ``typeof`` does."""
        return f"typeof({column})"

    def numeric(self, column: str) -> str:
        """SQL true when ``column`` holds a number."""
        return f"typeof({column}) IN ('integer', 'real')"

    def textual(self, column: str) -> str:
        """SQL true when ``column`` holds text."""
        return f"typeof({column}) = 'text'"

    def numbers(self, column: str) -> str:
        """A range of ``column`` that holds every number and nothing else: what an index on
        the column narrows to (SQLite orders every number before any text)."""
        return f"{column} < ''"

    def value(self, stored: Any) -> Any:
        """The parameter that stands for a stored value (``_records.encode_value``'s form)."""
        return stored

    def row(self, stored: Any, kind: str) -> tuple[Any, str]:
        """The ``(value, kind)`` parameters of a value row (``_records.encode_value``'s pair)."""
        return self.value(stored), kind

    def glob(self, column: str, pattern: str) -> tuple[str, str]:
        """SQL and its parameter matching ``column`` against ``pattern`` (``*``: any run)."""
        return f"{column} GLOB ?", pattern

    def indexed_by(self, index: str) -> str:
        """A hint to use ``index`` (SQLite's ``INDEXED BY``; nothing elsewhere)."""
        return f"INDEXED BY {index}"

    def ordered_join(self) -> str:
        """A join that keeps its left table outermost (SQLite's ``CROSS JOIN``)."""
        return "CROSS JOIN"

    def differs(self, left: str, right: str) -> str:
        """SQL true when ``left`` and ``right`` differ, NULL being a value like any other."""
        return f"{left} IS NOT {right}"

    #: The database's own check of its files (SQLite's; None: the server keeps its own).
    integrity_check: str | None = "PRAGMA integrity_check"

    def last_columns(self, group: str, columns: str, latest: str) -> str:
        """The select list of the row with the largest ``latest`` in each ``group``.

        SQLite takes the bare columns beside ``MAX()`` from the row that holds the
        maximum; PostgreSQL says it with ``DISTINCT ON`` and :meth:`last_tail`'s order.
        """
        return f"{columns}, MAX({latest})"

    def last_tail(self, group: str, latest: str, ordered: bool = False) -> str:
        """What ends the statement :meth:`last_columns` began (``ordered``: by ``group``)."""
        return f" GROUP BY {group}" + (f" ORDER BY {group}" if ordered else "")


class _Postgres(Dialect):
    name = "postgresql"
    data_version = "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint"

    def typeof(self, column: str) -> str:
        return (
            f"(CASE jsonb_typeof({column}) WHEN 'string' THEN 'text' "
            f"WHEN 'number' THEN (CASE WHEN {column}::text LIKE '%.%' THEN 'real' "
            "ELSE 'integer' END) ELSE 'null' END)"
        )

    def numeric(self, column: str) -> str:
        return f"jsonb_typeof({column}) = 'number'"

    def textual(self, column: str) -> str:
        return f"jsonb_typeof({column}) = 'string'"

    def numbers(self, column: str) -> str:
        # jsonb orders numbers after every string and null (the store keeps no other JSON
        # type), and no stored number is below minus the infinity's 400 digits
        return f"{column} >= '-{_INFINITE}'::jsonb"

    def value(self, stored: Any) -> Any:
        from theseus.store._postgres import JsonText

        if stored is None:
            return None
        if isinstance(stored, str) and "\x00" in stored:
            from theseus.store._errors import ValueTypeError

            raise ValueTypeError(
                f"The text {stored[:40]!r} holds a NUL character, which PostgreSQL cannot "
                "store; remove it, or keep such bytes in an artifact (put())."
            )
        return JsonText(json_number(stored))

    def row(self, stored: Any, kind: str) -> tuple[Any, str]:
        # jsonb's numbers have no negative zero: the kind keeps the sign
        if isinstance(stored, float) and stored == 0.0 and math.copysign(1.0, stored) < 0:
            return self.value(0.0), KIND_NEGATIVE_ZERO
        return self.value(stored), kind

    def glob(self, column: str, pattern: str) -> tuple[str, str]:
        escaped = pattern.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        return f"{column} LIKE ?", escaped.replace("*", "%")

    def indexed_by(self, index: str) -> str:
        return ""

    def ordered_join(self) -> str:
        return "JOIN"

    def differs(self, left: str, right: str) -> str:
        return f"{left} IS DISTINCT FROM {right}"

    integrity_check = None

    def last_columns(self, group: str, columns: str, latest: str) -> str:
        return f"DISTINCT ON ({group}) {columns}, {latest}"

    def last_tail(self, group: str, latest: str, ordered: bool = False) -> str:
        return f" ORDER BY {group}, {latest} DESC"


SQLITE = Dialect()
POSTGRES = _Postgres()

# Larger than every finite double (about 1.8e308), and ``float`` of it is inf.
_INFINITE = "1" + "0" * 400 + ".0"


def json_number(stored: Any) -> str:
    """The JSON text of a stored scalar, floats always with a decimal point (see above)."""
    if isinstance(stored, str):
        import json

        return json.dumps(stored)
    if isinstance(stored, bool):  # pragma: no cover - encode_value stores booleans as ints
        return str(int(stored))
    if isinstance(stored, int):
        return str(stored)
    if math.isinf(stored):
        return _INFINITE if stored > 0 else "-" + _INFINITE
    text = repr(float(stored))
    if "e" in text or "E" in text:
        text = format(decimal.Decimal(text), "f")
    return text if "." in text else text + ".0"


def dialect(conn: Any) -> Dialect:
    """The dialect of a connection a transaction function was given."""
    return getattr(conn, "dialect", SQLITE)
