"""SQL the store browser reads through: summaries, write marks, curves, trees and frames.

Each function takes a connection inside one read snapshot (``Store.read``) and
returns plain rows, tuples and dicts; :class:`~theseus.store.Store` exposes each as
a public read method, so the browser (``theseus.store.ui``) holds no SQL and
another backend can serve it by offering the same methods. Node ids are the
store's row ids: opaque, stable keys of a node for the life of the store.

Incremental reads: every write marks its node (``nodes.written``, the writer's
clock) and node, checkpoint and artifact ids only grow, so a reader that keeps a
mark (the newest ``written`` seen, the highest id seen) asks for what changed
since it. :func:`write_mark` is None for a store made before the ``nodes_written``
index (a read-only reader cannot add it): such a store cannot say which nodes
were written since a mark.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from theseus.store._dialect import Connection, dialect
from theseus.store._errors import QueryError
from theseus.store._node import Node
from theseus.store._records import Scalar, decode_value

__all__ = [
    "HOLDINGS",
    "LineageGrowth",
    "WrittenNode",
    "artifact_frames",
    "artifact_names",
    "branch_point",
    "chain",
    "data_version",
    "held_keys",
    "holding_totals",
    "holdings_by_lineage",
    "job_in_lineage",
    "last_statuses",
    "last_value",
    "lineage_end",
    "lineage_growth",
    "lineage_outline",
    "numeric_keys",
    "numeric_series",
    "numeric_values",
    "status_values",
    "write_mark",
    "written_since",
]

# The tables whose rows a lineage summary counts (``holding_totals``, ``holdings_by_lineage``).
HOLDINGS = ("checkpoints", "artifacts")


def _numeric(conn: Any) -> str:
    """SQL true for a plain number in ``vals v`` (not a boolean, NaN, text or None)."""
    return f"v.kind IN ('v', 'z') AND {dialect(conn).numeric('v.value')}"


class WrittenNode(NamedTuple):
    """A node written since a mark (see :func:`written_since`)."""

    id: int
    name: str
    nonce: str
    seq: int
    written: float  # the writer's clock at the node's last write
    has_status: bool  # whether the node holds a ``job/status`` value
    status: Scalar | None  # that value (None without one)
    branches: bool  # whether the node has a parent in another lineage (a branch point)


class LineageGrowth(NamedTuple):
    """A lineage's nodes past an id (see :func:`lineage_growth`)."""

    name: str
    nonce: str
    nodes: int  # how many
    last_seq: int
    started: float  # the earliest creation time among them
    first_id: int
    last_id: int


def data_version(conn: Connection) -> int:
    """A number that changes whenever another connection commits (the dialect's ``data_version``)."""
    return int(conn.execute(dialect(conn).data_version).fetchone()[0])


def write_mark(conn: Connection) -> float | None:
    """The newest write mark of any node (-inf: no node), or None: the store keeps no marks.

    None for a store made before the ``nodes_written`` index, which only a writer adds.
    """
    if not dialect(conn).has_index(conn, "nodes_written"):
        return None
    (top,) = conn.execute("SELECT MAX(written) FROM nodes").fetchone()
    return float(top) if top is not None else -math.inf


def written_since(conn: Connection, since: float) -> list[WrittenNode]:
    """The nodes whose write mark is ``since`` or later (needs :func:`write_mark` not None)."""
    hint = dialect(conn).indexed_by("nodes_written")
    rows = conn.execute(
        "SELECT n.id, n.name, n.nonce, n.seq, n.written, v.value, v.kind, "
        "EXISTS (SELECT 1 FROM edges e JOIN nodes p ON p.id = e.parent WHERE e.child = n.id "
        "AND NOT (p.name = n.name AND p.nonce = n.nonce)) "
        f"FROM nodes n {hint} LEFT JOIN vals v ON v.node = n.id "
        "AND v.key = 'job/status' WHERE n.written >= ?",
        (since,),
    ).fetchall()
    return [
        WrittenNode(
            int(nid),
            name,
            nonce,
            int(seq),
            float(written),
            value is not None,
            None if value is None else decode_value(value, kind),
            bool(cross),
        )
        for nid, name, nonce, seq, written, value, kind, cross in rows
    ]


def lineage_growth(conn: Connection, after: int) -> list[LineageGrowth]:
    """Per lineage, its nodes whose id is past ``after`` (0: every node)."""
    return [
        LineageGrowth(name, nonce, int(n), int(last), float(started), int(first), int(top))
        for name, nonce, n, last, started, first, top in conn.execute(
            "SELECT name, nonce, COUNT(*), MAX(seq), MIN(created), MIN(id), MAX(id) FROM nodes "
            "WHERE id > ? GROUP BY name, nonce",
            (after,),
        )
    ]


def holding_totals(conn: Connection) -> dict[str, tuple[int, int]]:
    """``(rows, highest id)`` of each table in :data:`HOLDINGS` (a fall says a row was deleted)."""
    totals = {}
    for table in HOLDINGS:
        rows, top = conn.execute(f"SELECT COUNT(*), COALESCE(MAX(id), 0) FROM {table}").fetchone()
        totals[table] = (int(rows), int(top))
    return totals


def holdings_by_lineage(
    conn: Connection, table: str, after: int
) -> tuple[int, int, dict[tuple[str, str], int]]:
    """``(rows, highest id, per lineage its rows past id after)`` of ``table`` (one of
    :data:`HOLDINGS`), all from one snapshot."""
    if table not in HOLDINGS:
        raise QueryError(f"table must be one of {', '.join(HOLDINGS)}; got {table!r}.")
    rows, top = conn.execute(f"SELECT COUNT(*), COALESCE(MAX(id), 0) FROM {table}").fetchone()
    added = {
        (name, nonce): int(count)
        for name, nonce, count in conn.execute(
            f"SELECT n.name, n.nonce, COUNT(*) FROM {table} t JOIN nodes n ON n.id = t.node "
            "WHERE t.id > ? GROUP BY n.name, n.nonce",
            (after,),
        )
    }
    return int(rows), int(top), added


def last_statuses(conn: Connection) -> dict[tuple[str, str], tuple[int, Scalar]]:
    """Per lineage, ``(seq, value)`` of its last ``job/status``."""
    d = dialect(conn)
    columns = d.last_columns("n.name, n.nonce", "n.name, n.nonce, v.value, v.kind", "n.seq")
    return {
        (name, nonce): (int(seq), decode_value(value, kind))
        for name, nonce, value, kind, seq in conn.execute(
            f"SELECT {columns} FROM vals v JOIN nodes n ON n.id = v.node "
            "WHERE v.key = 'job/status'" + d.last_tail("n.name, n.nonce", "n.seq")
        )
    }


def status_values(conn: Connection) -> list[str]:
    """Every ``job/status`` value the store holds, sorted."""
    return sorted(
        str(r[0]) for r in conn.execute("SELECT DISTINCT value FROM vals WHERE key = 'job/status'")
    )


def numeric_keys(conn: Connection) -> list[str]:
    """Every value key with a numeric value somewhere, sorted.

    Steps from key to key through the ``vals_key`` index (one probe each) and asks each
    whether its range of numbers holds a plain one: a store of 45 million values and 50
    keys answers in milliseconds, where reading every value took seconds.
    """
    numbers = dialect(conn).numbers("v.value")
    rows = conn.execute(
        "WITH RECURSIVE k(key) AS (SELECT MIN(key) FROM vals UNION ALL "
        "SELECT (SELECT MIN(v.key) FROM vals v WHERE v.key > k.key) FROM k "
        "WHERE k.key IS NOT NULL) "
        "SELECT k.key FROM k WHERE k.key IS NOT NULL AND EXISTS (SELECT 1 FROM vals v "
        f"WHERE v.key = k.key AND {numbers} AND {_numeric(conn)})"
    )
    return sorted(str(r[0]) for r in rows)


def held_keys(conn: Connection, keys: Sequence[str]) -> list[str]:
    """The ``keys`` some node holds a value of, in the order given (one index probe each)."""
    return [
        k for k in keys if conn.execute("SELECT 1 FROM vals WHERE key = ? LIMIT 1", (k,)).fetchone()
    ]


def last_value(
    conn: Connection, name: str, nonce: str, key: str, since: int = 0
) -> tuple[int, Scalar] | None:
    """``(seq, value)`` of ``key`` at the lineage's last node from seq ``since`` on that has it."""
    row = conn.execute(
        "SELECT n.seq, v.value, v.kind FROM nodes n JOIN vals v ON v.node = n.id AND v.key = ? "
        "WHERE n.name = ? AND n.nonce = ? AND n.seq >= ? ORDER BY n.seq DESC LIMIT 1",
        (key, name, nonce, since),
    ).fetchone()
    return None if row is None else (int(row[0]), decode_value(row[1], row[2]))


def branch_point(
    conn: Connection, name: str, nonce: str, since: int = 0
) -> tuple[int, Node] | None:
    """``(seq, parent)`` where the lineage left another one, or None for a fresh lineage.

    ``since``: look at the lineage's nodes from that seq on only.
    """
    row = conn.execute(
        "SELECT n.seq, p.name, p.nonce, p.seq FROM nodes n JOIN edges e ON e.child = n.id "
        "JOIN nodes p ON p.id = e.parent WHERE n.name = ? AND n.nonce = ? AND n.seq >= ? "
        "AND NOT (p.name = n.name AND p.nonce = n.nonce) ORDER BY n.seq LIMIT 1",
        (name, nonce, since),
    ).fetchone()
    return None if row is None else (int(row[0]), Node(row[1], row[2], int(row[3])))


def lineage_end(conn: Connection, name: str, nonce: str) -> int | None:
    """The lineage's last seq, or None: the store has no such lineage."""
    (last,) = conn.execute(
        "SELECT MAX(seq) FROM nodes WHERE name = ? AND nonce = ?", (name, nonce)
    ).fetchone()
    return None if last is None else int(last)


def chain(conn: Connection, name: str, nonce: str) -> list[tuple[str, str, int]]:
    """The stretches a lineage stitches: ``(name, nonce, last seq taken)``, oldest first.

    A branch continues its parent's lineage from the node it left: the parent's nodes
    up to the branch point, then the branch's own. Empty for an unknown lineage.
    """
    last = lineage_end(conn, name, nonce)
    if last is None:
        return []
    found = [(name, nonce, last)]
    seen = {(name, nonce)}
    while (up := branch_point(conn, *found[-1][:2])) is not None:
        parent = up[1]
        if (parent.name, parent.nonce) in seen:
            break
        seen.add((parent.name, parent.nonce))
        found.append((parent.name, parent.nonce, parent.seq))
    return found[::-1]


def numeric_series(
    conn: Connection, name: str, nonce: str, key: str, first: int, last: int
) -> list[tuple[int, float]]:
    """``(seq, value)`` of the lineage's finite numeric values of ``key`` from seq ``first``
    to ``last``, in seq order."""
    rows = conn.execute(
        "SELECT n.seq, v.value FROM vals v JOIN nodes n ON n.id = v.node "
        "WHERE n.name = ? AND n.nonce = ? AND n.seq >= ? AND n.seq <= ? AND v.key = ? "
        f"AND {_numeric(conn)} ORDER BY n.seq",
        (name, nonce, first, last, key),
    ).fetchall()
    isfinite = math.isfinite
    return [(seq, float(value)) for seq, value in rows if isfinite(value)]


def numeric_values(conn: Connection, key: str, ids: Sequence[int]) -> dict[int, float]:
    """node id -> the finite numeric value of ``key`` at it, for the nodes ``ids`` that have one."""
    values: dict[int, float] = {}
    listed = list(ids)
    for lo in range(0, len(listed), 500):
        chunk = listed[lo : lo + 500]
        for nid, value in conn.execute(
            f"SELECT v.node, v.value FROM vals v WHERE v.key = ? AND {_numeric(conn)} "
            f"AND v.node IN ({', '.join('?' * len(chunk))})",
            (key, *chunk),
        ):
            if math.isfinite(value):
                values[int(nid)] = float(value)
    return values


def job_in_lineage(conn: Connection, node: Node) -> tuple[str, str] | None:
    """``(job, config)`` of the latest job record at or before ``node`` in its own lineage."""
    (jobs,) = conn.execute("SELECT COALESCE(MAX(id), 0) FROM jobs").fetchone()
    # CROSS JOIN keeps the jobs table outermost (SQLite never reorders it): the cheaper
    # walk when the table holds fewer rows than the lineage has nodes up to ``node``.
    join = dialect(conn).ordered_join() if int(jobs) <= node.seq else "JOIN"
    row = conn.execute(
        f"SELECT j.job, j.config FROM jobs j {join} nodes n ON n.id = j.node "
        "WHERE n.name = ? AND n.nonce = ? AND n.seq <= ? "
        "ORDER BY n.seq DESC, j.id DESC LIMIT 1",
        (node.name, node.nonce, node.seq),
    ).fetchone()
    return None if row is None else (str(row[0]), str(row[1]))


def lineage_outline(conn: Connection, name: str, nonce: str) -> dict[str, Any]:
    """One lineage's shape: what the browser's tree draws of it.

    Returns:
        ``{"seqs", "checkpoints", "artifacts", "jobs"}`` (sorted seqs of its nodes, of
        those that hold a checkpoint, an artifact, a job record), ``"branch"`` (see
        :func:`branch_point`) and ``"children"``: ``(name, nonce)`` of each lineage that
        branches from one of its nodes, by branch point then creation.
    """

    def seqs(sql: str) -> list[int]:
        return sorted({int(r[0]) for r in conn.execute(sql, (name, nonce))})

    mine = "JOIN nodes n ON n.id = t.node WHERE n.name = ? AND n.nonce = ?"
    kids = conn.execute(
        "SELECT n.name, n.nonce, p.seq FROM nodes p JOIN edges e ON e.parent = p.id "
        "JOIN nodes n ON n.id = e.child WHERE p.name = ? AND p.nonce = ? "
        "AND NOT (n.name = p.name AND n.nonce = p.nonce) "
        "GROUP BY n.name, n.nonce, p.seq ORDER BY p.seq, MIN(n.id)",
        (name, nonce),
    ).fetchall()
    children: list[tuple[str, str]] = []
    for kid_name, kid_nonce, _ in kids:
        if (kid_name, kid_nonce) not in children:
            children.append((kid_name, kid_nonce))
    return {
        "seqs": seqs("SELECT seq FROM nodes WHERE name = ? AND nonce = ?"),
        "checkpoints": seqs(f"SELECT n.seq FROM checkpoints t {mine}"),
        "artifacts": seqs(f"SELECT n.seq FROM artifacts t {mine}"),
        "jobs": seqs(f"SELECT n.seq FROM jobs t {mine}"),
        "branch_points": sorted({int(k[2]) for k in kids}),
        "branch": branch_point(conn, name, nonce),
        "children": children,
    }


def artifact_frames(conn: Connection, name: str, nonce: str, artifact: str) -> list[dict[str, Any]]:
    """Every node along the stitched lineage (:func:`chain`) that holds ``artifact``, oldest first.

    Each frame: ``node`` (serialized), ``seq``, ``versions`` (``[(version, filename)]``,
    oldest first), ``step`` (the node's training step: its ``import/step``, an imported
    revision's, else its ``train/step``, else the step of its checkpoint (a validation
    node between two reports holds no ``train/step``), else its seq) and ``val_loss`` (its
    ``val/loss``, None when absent).
    """
    frames = []
    for part_name, part_nonce, upto in chain(conn, name, nonce):
        rows = conn.execute(
            "SELECT n.id, n.seq, a.version, a.filename FROM artifacts a "
            "JOIN nodes n ON n.id = a.node WHERE n.name = ? AND n.nonce = ? "
            "AND n.seq <= ? AND a.name = ? ORDER BY n.seq, a.version",
            (part_name, part_nonce, upto, artifact),
        ).fetchall()
        by_node: dict[int, tuple[int, list[tuple[int, str]]]] = {}
        for nid, seq, version, filename in rows:
            by_node.setdefault(int(nid), (int(seq), []))[1].append((int(version), str(filename)))
        for nid, (seq, versions) in by_node.items():
            values = {
                k: decode_value(v, kind)
                for k, v, kind in conn.execute(
                    "SELECT key, value, kind FROM vals WHERE node = ? "
                    "AND key IN ('import/step', 'train/step', 'val/loss')",
                    (nid,),
                )
            }
            (saved,) = conn.execute(
                "SELECT MAX(step) FROM checkpoints WHERE node = ?", (nid,)
            ).fetchone()
            frames.append(
                {
                    "node": Node(part_name, part_nonce, seq).serialize(),
                    "seq": seq,
                    "versions": versions,
                    "step": _first(values.get("import/step"), values.get("train/step"), saved, seq),
                    "val_loss": values.get("val/loss"),
                }
            )
    return frames


def _first(*found: Any) -> Any:
    """The first of ``found`` that is not None (the last when all are)."""
    return next((value for value in found if value is not None), found[-1])


def artifact_files(conn: Connection, name: str, nonce: str) -> dict[str, list[str]]:
    """Each artifact name anywhere along the stitched lineage (:func:`chain`), sorted, with
    the filenames its versions were stored under (sorted)."""
    found: dict[str, set[str]] = {}
    for part_name, part_nonce, upto in chain(conn, name, nonce):
        for artifact, filename in conn.execute(
            "SELECT DISTINCT a.name, a.filename FROM artifacts a JOIN nodes n ON n.id = a.node "
            "WHERE n.name = ? AND n.nonce = ? AND n.seq <= ?",
            (part_name, part_nonce, upto),
        ):
            found.setdefault(str(artifact), set()).add(str(filename))
    return {artifact: sorted(found[artifact]) for artifact in sorted(found)}


def artifact_names(conn: Connection, name: str, nonce: str) -> list[str]:
    """The artifact names anywhere along the stitched lineage (:func:`chain`), sorted."""
    found: set[str] = set()
    for part_name, part_nonce, upto in chain(conn, name, nonce):
        found.update(
            str(r[0])
            for r in conn.execute(
                "SELECT DISTINCT a.name FROM artifacts a JOIN nodes n ON n.id = a.node "
                "WHERE n.name = ? AND n.nonce = ? AND n.seq <= ?",
                (part_name, part_nonce, upto),
            )
        )
    return sorted(found)
