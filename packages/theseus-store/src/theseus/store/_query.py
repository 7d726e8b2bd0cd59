"""The chainable query cursor: filters build one SQL statement, terminals run it.

Every filter method returns the cursor, so calls chain::

    store.query().spec(run="train-*").checkpoint().latest().first()

Filters combine with AND, whatever their order. ``sort`` keys apply in the
order given (the first is the primary key); nodes without a sort key come last;
ties keep creation order.

``latest()`` keeps one node. With ``.checkpoint()`` in the chain it is the node
whose checkpoint was *recorded* most recently; otherwise it is the node that was
*created* most recently (its first record). Writing an artifact or a value onto
an old node never makes it latest.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, TypeVar

from theseus.store._dialect import Connection, Dialect, dialect
from theseus.store._errors import QueryError, UnknownQueryKeyError, ValueTypeError
from theseus.store._node import Node
from theseus.store._records import (
    KIND_NAN,
    Artifact,
    Checkpoint,
    Scalar,
    decode_value,
    encode_value,
)

__all__ = ["Query", "QuerySource"]

T = TypeVar("T")


class QuerySource(Protocol):
    """What a query reads through: a store's transactions, its dialect and its bytes
    (``StoreReader`` is one)."""

    dialect: Dialect
    inline_max: int

    def read(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn(conn)`` in one read snapshot."""

    def read_one(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        """Run one SELECT statement."""

    def load(self, digest: str, size: int, fetched: bytes | None = None) -> bytes:
        """The bytes stored under ``digest``, verified."""

    def checkpoint_from_row(self, node: Node, row: tuple[Any, ...]) -> Checkpoint:
        """A checkpoint entry from its row."""


_OPS = {"=": "=", "==": "=", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
_SPEC = re.compile(r"[A-Za-z0-9_*-]+")
_ARTIFACT_FIELDS = ("node", "name", "filename", "content", "hash", "size", "created", "version")
_CHUNK = 500
_NODE_COLUMNS = (
    "n.id, n.name, n.nonce, n.seq, p.name, p.nonce, p.seq FROM nodes n LEFT JOIN nodes p ON "
    "p.id = (SELECT e.parent FROM edges e WHERE e.child = n.id ORDER BY e.parent LIMIT 1)"
)


class Query:
    """A chainable filter over the nodes of a store.

    Args:
        store: the store to query (``store.query()`` builds one).
    """

    def __init__(self, store: QuerySource) -> None:
        self.store = store
        self._where: list[tuple[str, tuple[Any, ...]]] = []
        self._order: list[tuple[str, tuple[Any, ...]]] = []
        self._latest = False
        self._checkpoint = False
        self._artifact: tuple[bool, str | None] = (False, None)

    # -- filters ---------------------------------------------------------------------------

    def _add(self, sql: str, *params: Any) -> Query:
        self._where.append((sql, params))
        return self

    def node(self, node: Node) -> Query:
        """Keep only ``node``.

        Raises:
            ValueTypeError: ``node`` is not a Node (the message says how to make one).
        """
        if not isinstance(node, Node):
            raise ValueTypeError(
                f"query().node() expects a theseus.store.Node; got {type(node).__name__} "
                f"{node!r}. Build one with Node.deserialize(text) (the form "
                "`theseus-store show` prints), or use query().name(...).nonce(...).seq(...)."
            )
        return self._add(
            "n.name = ? AND n.nonce = ? AND n.seq = ?", node.name, node.nonce, node.seq
        )

    def name(self, name: str) -> Query:
        """Keep nodes named exactly ``name`` (``project.group.run``)."""
        return self._add("n.name = ?", name)

    def nonce(self, nonce: str) -> Query:
        """Keep nodes of the lineage(s) with this nonce."""
        return self._add("n.nonce = ?", nonce)

    def seq(self, seq: int) -> Query:
        """Keep nodes at this position of their lineage.

        Raises:
            ValueTypeError: ``seq`` is not an int.
        """
        if isinstance(seq, bool) or not isinstance(seq, numbers.Integral):
            raise ValueTypeError(
                f"query().seq() expects an int, a node's position in its lineage (0, 1, "
                f"...); got {type(seq).__name__} {seq!r}"
            )
        return self._add("n.seq = ?", int(seq))

    def spec(
        self, project: str | None = None, group: str | None = None, run: str | None = None
    ) -> Query:
        """Keep nodes whose name parts match; ``*`` matches any run of characters in one part.

        Raises:
            ValueTypeError: if a part has characters other than ASCII letters, digits, ``_-*``.
        """
        for column, pattern, what in (
            ("project", project, "project"),
            ("grp", group, "group"),
            ("run", run, "run"),
        ):
            if pattern is None:
                continue
            if not isinstance(pattern, str) or not _SPEC.fullmatch(pattern):
                raise ValueTypeError(
                    f"spec({what}=...) takes ASCII letters, digits, '_', '-' and '*' wildcards "
                    f"within one dotted part; got {pattern!r}."
                )
            if "*" in pattern:
                self._add(*self.store.dialect.glob(f"n.{column}", pattern))
            else:
                self._add(f"n.{column} = ?", pattern)
        return self

    def job(self, key: str) -> Query:
        """Keep nodes whose lineage (same name and nonce) recorded a run of job ``key``."""
        return self._add(
            "EXISTS (SELECT 1 FROM jobs j JOIN nodes m ON m.id = j.node "
            "WHERE m.name = n.name AND m.nonce = n.nonce AND j.job = ?)",
            key,
        )

    def checkpoint(self) -> Query:
        """Keep nodes with at least one checkpoint (and make ``latest()`` mean latest checkpoint)."""
        self._checkpoint = True
        return self._add("n.ckpt IS NOT NULL")

    def artifact(self, name: str | None = None) -> Query:
        """Keep nodes with an artifact (named ``name`` if given); ``select()`` then lists artifacts."""
        self._artifact = (True, name)
        if name is None:
            return self._add("EXISTS (SELECT 1 FROM artifacts a WHERE a.node = n.id)")
        return self._add(
            "EXISTS (SELECT 1 FROM artifacts a WHERE a.node = n.id AND a.name = ?)", name
        )

    def has(self, key: str) -> Query:
        """Keep nodes that have a value for ``key``."""
        return self._add("EXISTS (SELECT 1 FROM vals v WHERE v.node = n.id AND v.key = ?)", key)

    def where(self, key: str, op: str, value: Scalar) -> Query:
        """Keep nodes whose folded value ``key`` compares true with ``value``.

        Args:
            key: a value key some node has.
            op: one of ``= == != < <= > >=``.
            value: a scalar (``None`` and NaN work with ``=`` and ``!=`` only).

        Raises:
            UnknownQueryKeyError: if no node has ``key`` (the message lists close keys).
            ValueTypeError: if ``op`` or ``value`` is not accepted.
        """
        if op not in _OPS:
            raise QueryError(f"where() operator must be one of {' '.join(_OPS)}; got {op!r}.")
        self._known(key)
        stored, kind = encode_value(key, value)
        d = self.store.dialect
        sql = "EXISTS (SELECT 1 FROM vals v WHERE v.node = n.id AND v.key = ? AND {})"
        if kind == KIND_NAN or stored is None:
            if _OPS[op] not in ("=", "!="):
                raise ValueTypeError(
                    f"where({key!r}, {op!r}, {value!r}): None and NaN "
                    "compare with '=' or '!=' only."
                )
            test = (
                f"v.kind = '{KIND_NAN}'"
                if kind == KIND_NAN
                else (f"v.value IS NULL AND v.kind != '{KIND_NAN}'")
            )
            test = test if _OPS[op] == "=" else f"NOT ({test})"
            return self._add(sql.format(test), key)
        if _OPS[op] in ("<", "<=", ">", ">="):
            # Order numbers with numbers and text with text; SQLite would rank every
            # number below every string and answer a meaningless comparison.
            text = isinstance(stored, str)
            family = "('text')" if text else "('integer', 'real')"
            self._comparable(key, op, value, family)
            same = (d.textual if text else d.numeric)("v.value")
            return self._add(sql.format(f"{same} AND v.value {_OPS[op]} ?"), key, d.value(stored))
        return self._add(sql.format(f"v.value {_OPS[op]} ?"), key, d.value(stored))

    def _comparable(self, key: str, op: str, value: Scalar, family: str) -> None:
        def kinds(conn: Connection) -> list[str]:
            kind = dialect(conn).typeof("value")
            rows = conn.execute(f"SELECT DISTINCT {kind} FROM vals WHERE key = ?", (key,))
            return [row[0] for row in rows]

        found = self.store.read(kinds)
        if not any(kind in family for kind in found):
            held = "text" if "text" in found else "numbers"
            raise QueryError(
                f"where({key!r}, {op!r}, {value!r}): {key!r} holds {held}, so ordering it "
                f"against {type(value).__name__} {value!r} means nothing; compare with "
                f"{'a string' if held == 'text' else 'a number'}."
            )

    def sort(self, key: str, ascending: bool = True) -> Query:
        """Order by value ``key`` (then by earlier sort keys' ties); nodes without it come last.

        Raises:
            UnknownQueryKeyError: if no node has ``key``.
        """
        self._known(key)
        direction = "ASC" if ascending else "DESC"
        self._order.append(
            (
                f"(SELECT v.value FROM vals v WHERE v.node = n.id AND v.key = ?) "
                f"{direction} NULLS LAST",
                (key,),
            )
        )
        return self

    def latest(self) -> Query:
        """Keep one node: the latest checkpoint's (with ``.checkpoint()``), else the newest node."""
        self._latest = True
        return self

    def _known(self, key: str) -> None:
        def check(conn: Connection) -> list[str] | None:
            if conn.execute("SELECT 1 FROM vals WHERE key = ? LIMIT 1", (key,)).fetchone():
                return None
            return [row[0] for row in conn.execute("SELECT DISTINCT key FROM vals")]

        known = self.store.read(check)
        if known is not None:
            raise UnknownQueryKeyError(key, known)

    # -- terminals -------------------------------------------------------------------------

    def _sql(
        self, columns: str, limit: int | None = None, ordered: bool = True
    ) -> tuple[str, list[Any]]:
        params: list[Any] = []
        sql = f"SELECT {columns}"
        if self._where:
            sql += " WHERE " + " AND ".join(f"({w})" for w, _ in self._where)
            for _, p in self._where:
                params.extend(p)
        if not ordered:
            return sql, params
        if self._latest:
            if self._checkpoint:
                sql += " ORDER BY n.ckpt DESC"
            else:
                sql += " ORDER BY n.id DESC"
            limit = 1
        else:
            sql += " ORDER BY " + ", ".join([o for o, _ in self._order] + ["n.id"])
            for _, p in self._order:
                params.extend(p)
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return sql, params

    def _nodes(self, conn: Connection, limit: int | None = None) -> list[tuple[int, Node]]:
        sql, params = self._sql(_NODE_COLUMNS, limit)
        return self._rows_to_nodes(conn.execute(sql, params))

    @staticmethod
    def _rows_to_nodes(rows: Iterable[tuple[Any, ...]]) -> list[tuple[int, Node]]:
        found = []
        for nid, name, nonce, seq, pname, pnonce, pseq in rows:
            parent = None if pname is None else Node.trusted(pname, pnonce, pseq)
            found.append((nid, Node.trusted(name, nonce, seq, parent)))
        return found

    def all(self) -> list[Node]:
        """Return the matching nodes (each with its first parent, if any)."""
        return [node for _, node in self.store.read(self._nodes)]

    def first(self) -> Node | None:
        """Return the first matching node, or None."""
        found = self.store.read(lambda conn: self._nodes(conn, 1))
        return found[0][1] if found else None

    def count(self) -> int:
        """Return how many nodes match."""
        sql, params = self._sql("COUNT(*) FROM nodes n", ordered=False)
        (total,) = self.store.read(lambda conn: conn.execute(sql, params).fetchone())
        return min(int(total), 1) if self._latest else int(total)

    def select(
        self, keys: list[str] | tuple[str, ...] | None = None, return_nodes: bool = False
    ) -> list[Any]:
        """Return the folded values of each matching node, or its artifacts after ``.artifact()``.

        Args:
            keys: value keys to keep (after ``.artifact()``: artifact fields to keep,
                from node, name, filename, content, hash, size, created, version).
            return_nodes: return ``(node, values)`` pairs instead of bare mappings
                (artifact mappings always hold their ``node``).

        Returns:
            One mapping per node, or one per current artifact (with the exact bytes
            under ``content``), in query order.

        Raises:
            UnknownQueryKeyError: if a key in ``keys`` is unknown.
        """
        if self._artifact[0]:
            return self._select_artifacts(keys)
        for key in keys or ():
            self._known(key)
        wanted = None if keys is None else set(keys)

        def run(conn: Connection) -> list[tuple[Node, dict[str, Scalar]]]:
            nodes = self._nodes(conn)
            values: dict[int, dict[str, Scalar]] = {nid: {} for nid, _ in nodes}
            ids = list(values)
            for start in range(0, len(ids), _CHUNK):
                chunk = ids[start : start + _CHUNK]
                rows = conn.execute(
                    f"SELECT node, key, value, kind FROM vals WHERE node IN "
                    f"({','.join('?' * len(chunk))}) ORDER BY node, key",
                    chunk,
                )
                for nid, key, value, kind in rows:
                    if wanted is None or key in wanted:
                        values[nid][key] = decode_value(value, kind)
            return [(node, values[nid]) for nid, node in nodes]

        pairs = self.store.read(run)
        return pairs if return_nodes else [values for _, values in pairs]

    def artifacts(self) -> list[Artifact]:
        """Return the current artifacts of the matching nodes (named one only, if given).

        Two statements, no shared snapshot needed: nodes are never removed and an
        artifact row and its inline bytes come from one statement (the bytes are
        verified against the hash on access).
        """
        name = self._artifact[1]
        if not self._order and not self._latest:
            return self._artifacts_in_creation_order(name)
        nodes = self._rows_to_nodes(self.store.read_one(*self._sql(_NODE_COLUMNS)))
        if not nodes:
            return []
        position = {nid: k for k, (nid, _) in enumerate(nodes)}
        ids = list(position)
        rows: list[tuple[Any, ...]] = []
        d = self.store.dialect
        for start in range(0, len(ids), _CHUNK):
            chunk = ids[start : start + _CHUNK]
            columns = d.last_columns(
                "a.node, a.name",
                "a.name, a.filename, a.hash, a.size, a.created, a.version, i.content, a.node",
                "a.id",
            )
            sql = (
                f"SELECT {columns} FROM artifacts a LEFT JOIN inline i "
                "ON a.size <= ? AND i.hash = a.hash "
                f"WHERE a.node IN ({','.join('?' * len(chunk))})"
            )
            params: tuple[Any, ...] = (self.store.inline_max, *chunk)
            if name is not None:
                sql, params = sql + " AND a.name = ?", (*params, name)
            rows += self.store.read_one(sql + d.last_tail("a.node, a.name", "a.id"), params)
        rows.sort(key=lambda row: (position[row[7]], row[0]))
        bare = {nid: Node.trusted(n.name, n.nonce, n.seq) for nid, n in nodes}
        load = self.store.load
        return [Artifact.from_row(bare[row[7]], row, load, row[6]) for row in rows]

    def _artifacts_in_creation_order(self, name: str | None) -> list[Artifact]:
        """The same as :meth:`artifacts` in one statement, when nodes come in id order."""
        d = self.store.dialect
        columns = d.last_columns(
            "n.id, a.name",
            "a.name, a.filename, a.hash, a.size, a.created, a.version, i.content, "
            "n.name, n.nonce, n.seq",
            "a.id",
        )
        sql, params = self._sql(
            f"{columns} FROM nodes n JOIN artifacts a ON a.node = n.id "
            "LEFT JOIN inline i ON a.size <= ? AND i.hash = a.hash",
            ordered=False,
        )
        params.insert(0, self.store.inline_max)
        if name is not None:
            sql += (" AND " if self._where else " WHERE ") + "a.name = ?"
            params.append(name)
        rows = self.store.read_one(sql + d.last_tail("n.id, a.name", "a.id", True), params)
        load = self.store.load
        found = []
        node: Node | None = None
        for row in rows:
            if node is None or (node.name, node.nonce, node.seq) != row[7:10]:
                node = Node.trusted(row[7], row[8], row[9])
            found.append(Artifact.from_row(node, row, load, row[6]))
        return found

    def _select_artifacts(self, keys: list[str] | tuple[str, ...] | None) -> list[dict[str, Any]]:
        fields = _ARTIFACT_FIELDS if keys is None else tuple(keys)
        for field in fields:
            if field not in _ARTIFACT_FIELDS:
                raise UnknownQueryKeyError(field, _ARTIFACT_FIELDS, what="artifact field")
        return [{f: getattr(a, f) for f in fields} for a in self.artifacts()]

    def checkpoints(self) -> list[Checkpoint]:
        """Return every checkpoint entry of the matching nodes, in the order they were recorded."""

        def run(conn: Connection) -> list[Checkpoint]:
            found: list[tuple[int, Checkpoint]] = []
            for nid, node in self._nodes(conn):
                rows = conn.execute(
                    "SELECT id, path, relative, step, meta, created FROM checkpoints "
                    "WHERE node = ?",
                    (nid,),
                )
                found.extend(
                    (row[0], self.store.checkpoint_from_row(node.identity(), row[1:]))
                    for row in rows
                )
            return [entry for _, entry in sorted(found, key=lambda pair: pair[0])]

        return self.store.read(run)

    def latest_checkpoint(self) -> Checkpoint | None:
        """Return the most recently recorded checkpoint among the matching nodes, or None.

        Equivalent to ``.checkpoint().latest().checkpoints()[-1]`` (and adds those two
        filters to this cursor).
        """
        self.checkpoint().latest()
        found = self.checkpoints()
        return found[-1] if found else None
