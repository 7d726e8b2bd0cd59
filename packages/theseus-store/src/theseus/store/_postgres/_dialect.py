"""PostgreSQL's side of every fragment the shared statements cannot share (``_dialect``).

A value is kept as ``jsonb``, whose numbers compare exactly (integers and decimals
alike); a number written with a decimal point is a ``real``. A float is written in
positional notation with a point (``1e300`` as its 301 digits and ``.0``), so it reads
back as a float, and the infinities as a number of 400 digits, larger than every finite
double and read back as ``inf`` by Python's ``float``; ``-0.0``, which a ``jsonb`` number
cannot hold, is ``0.0`` with the kind ``z``. A name pattern is a ``LIKE`` (``*`` as
``%``); the commit counter is the snapshot's ``xmax``; the last row of each group is a
``DISTINCT ON``; the planner takes no hints, and the server checks its own files.
"""

from __future__ import annotations

import decimal
import json
import math
from typing import Any

from theseus.store._dialect import Connection, Dialect
from theseus.store._errors import ValueTypeError
from theseus.store._records import KIND_NEGATIVE_ZERO

__all__ = ["POSTGRES", "JsonText", "PostgresDialect", "json_number"]

# Larger than every finite double (about 1.8e308), and ``float`` of it is inf.
_INFINITE = "1" + "0" * 400 + ".0"


class JsonText(str):
    """A value's JSON text, sent as ``jsonb`` (:func:`json_number` makes it)."""


def json_number(stored: Any) -> str:
    """The JSON text of a stored scalar, floats always with a decimal point (see above)."""
    if isinstance(stored, str):
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


class PostgresDialect(Dialect):
    """PostgreSQL's fragments (see ``_dialect.Dialect``)."""

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
        if stored is None:
            return None
        if isinstance(stored, str) and "\x00" in stored:
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

    def last_columns(self, group: str, columns: str, latest: str) -> str:
        return f"DISTINCT ON ({group}) {columns}, {latest}"

    def last_tail(self, group: str, latest: str, ordered: bool = False) -> str:
        return f" ORDER BY {group}, {latest} DESC"

    def integrity_problems(self, conn: Connection) -> list[str]:
        return []  # the server keeps its own files

    def has_index(self, conn: Connection, index: str) -> bool:
        found = conn.execute(
            "SELECT 1 FROM pg_indexes WHERE schemaname = current_schema() AND indexname = ?",
            (index,),
        ).fetchone()
        return found is not None


POSTGRES = PostgresDialect()
