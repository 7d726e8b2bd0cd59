"""SQL over one node and its neighbours: ids, edges, folded values, jobs, summaries.

These functions take an open connection inside a transaction (the Store opens
it) and speak in Nodes and plain rows.
"""

from __future__ import annotations

import difflib
from typing import Any

from theseus.store._dialect import Connection, Dialect
from theseus.store._errors import InvalidNodeError, UnknownNodeError
from theseus.store._node import Node
from theseus.store._records import Scalar, decode_value

__all__ = [
    "ancestors",
    "artifact_history",
    "checkpoint_layouts",
    "checkpoint_rows",
    "current_artifacts",
    "folded_values",
    "job_record",
    "lineages",
    "lookup",
    "neighbours",
    "node_id",
    "reparent",
    "run_summaries",
]


def node_id(conn: Connection, node: Node, now: float) -> int:
    """Return ``node``'s row id, creating it (and its parent and edge) if needed.

    Marks the node as written at ``now``. Must run inside a write transaction.
    """
    parent_id = None
    if node.parent is not None:
        parent_id = node_id(conn, node.parent, now)
    row = conn.execute(
        "SELECT id FROM nodes WHERE name = ? AND nonce = ? AND seq = ?",
        (node.name, node.nonce, node.seq),
    ).fetchone()
    if row is None:
        project, group, run = node.name.split(".")
        nid = conn.execute(
            "INSERT INTO nodes(name, nonce, seq, project, grp, run, created, written) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (node.name, node.nonce, node.seq, project, group, run, now, now),
        ).lastrowid
        assert nid is not None
    else:
        nid = row[0]
        conn.execute("UPDATE nodes SET written = ? WHERE id = ?", (now, nid))
    if parent_id is not None:
        if row is not None and _reaches(conn, int(nid), parent_id):
            raise InvalidNodeError(
                f"Node {node.serialize()} cannot have parent {node.parent.serialize()}: "  # type: ignore[union-attr]
                "the parent is the node itself or one of its descendants, and the lineage "
                "would become a cycle. Branch with Node.new(run, parent=...) instead."
            )
        conn.execute("INSERT OR IGNORE INTO edges(child, parent) VALUES (?, ?)", (nid, parent_id))
    return int(nid)


def reparent(conn: Connection, child: Node, parent: Node | None) -> bool:
    """Make ``parent`` ``child``'s parent within their lineage; return whether it changed.

    ``child``'s edges to nodes of its own lineage are replaced by the one edge to
    ``parent`` (None: no parent in the lineage); an edge to another lineage (a branch's
    base) stays. Must run inside a write transaction.

    Raises:
        UnknownNodeError: if either node was never recorded.
        InvalidNodeError: if ``parent`` is of another lineage or not before ``child``.
    """
    child_id = lookup(conn, child)
    parent_id = None
    if parent is not None:
        if (parent.name, parent.nonce) != (child.name, child.nonce) or parent.seq >= child.seq:
            raise InvalidNodeError(
                f"reparent takes a parent earlier in the child's own lineage; got "
                f"{parent.serialize()} for {child.serialize()}. Branch into another lineage "
                "with Node.new(run, parent=...) instead."
            )
        parent_id = lookup(conn, parent)
    same = [
        row[0]
        for row in conn.execute(
            "SELECT e.parent FROM edges e JOIN nodes p ON p.id = e.parent "
            "WHERE e.child = ? AND p.name = ? AND p.nonce = ?",
            (child_id, child.name, child.nonce),
        )
    ]
    if same == ([] if parent_id is None else [parent_id]):
        return False
    conn.executemany(
        "DELETE FROM edges WHERE child = ? AND parent = ?", [(child_id, old) for old in same]
    )
    if parent_id is not None:
        conn.execute("INSERT INTO edges(child, parent) VALUES (?, ?)", (child_id, parent_id))
    return True


def _reaches(conn: Connection, start: int, target: int) -> bool:
    """Return whether ``target`` is ``start`` or one of its descendants."""
    if start == target:
        return True
    row = conn.execute(
        "WITH RECURSIVE down(id) AS (SELECT ? UNION SELECT e.child FROM edges e "
        "JOIN down ON e.parent = down.id) SELECT 1 FROM down WHERE id = ? LIMIT 1",
        (start, target),
    ).fetchone()
    return row is not None


def lookup(conn: Connection, node: Node) -> int:
    """Return ``node``'s row id.

    Raises:
        UnknownNodeError: if the store never recorded it (lists close nodes).
    """
    row = conn.execute(
        "SELECT id FROM nodes WHERE name = ? AND nonce = ? AND seq = ?",
        (node.name, node.nonce, node.seq),
    ).fetchone()
    if row is not None:
        return int(row[0])
    same = conn.execute(
        "SELECT name, nonce, MAX(seq) FROM nodes WHERE name = ? GROUP BY name, nonce",
        (node.name,),
    ).fetchall()
    if same:
        hint = "Lineages with that name: " + ", ".join(
            f"{n}~{nonce} (seq 0..{last})" for n, nonce, last in same
        )
    else:
        names = [r[0] for r in conn.execute("SELECT DISTINCT name FROM nodes")]
        close = difflib.get_close_matches(node.name, names, n=5, cutoff=0.5)
        hint = (
            f"Close names: {', '.join(close)}"
            if close
            else "List them with `theseus-store runs ROOT`"
        )
    raise UnknownNodeError(f"The store has no node {node.serialize()}. {hint}.")


def current_artifacts(d: Dialect) -> str:
    """``(name, filename, hash, size, created, version, id)`` of each current artifact of
    the node ``(name, nonce, seq)``: the latest version of each name."""
    columns = d.last_columns(
        "a.name", "a.name, a.filename, a.hash, a.size, a.created, a.version", "a.id"
    )
    return (
        f"SELECT {columns} FROM nodes n JOIN artifacts a ON a.node = n.id "
        "WHERE n.name = ? AND n.nonce = ? AND n.seq = ?" + d.last_tail("a.name", "a.id", True)
    )


def artifact_history(conn: Connection, node: Node, name: str) -> list[tuple[Any, ...]]:
    """Return every version of one artifact, oldest first (same columns as above)."""
    nid = lookup(conn, node)
    return conn.execute(
        "SELECT name, filename, hash, size, created, version FROM artifacts "
        "WHERE node = ? AND name = ? ORDER BY id",
        (nid, name),
    ).fetchall()


def folded_values(conn: Connection, node: Node) -> dict[str, Scalar]:
    """Return the node's values as one mapping."""
    nid = lookup(conn, node)
    rows = conn.execute("SELECT key, value, kind FROM vals WHERE node = ? ORDER BY key", (nid,))
    return {key: decode_value(value, kind) for key, value, kind in rows}


def checkpoint_rows(conn: Connection, node: Node) -> list[tuple[Any, ...]]:
    """Return ``(path, relative, step, meta, created)`` of each checkpoint, oldest first."""
    nid = lookup(conn, node)
    return conn.execute(
        "SELECT path, relative, step, meta, created FROM checkpoints WHERE node = ? ORDER BY id",
        (nid,),
    ).fetchall()


def neighbours(conn: Connection, node: Node, up: bool) -> list[Node]:
    """Return the parents (``up``) or the children of ``node``, in creation order."""
    nid = lookup(conn, node)
    mine, other = ("child", "parent") if up else ("parent", "child")
    rows = conn.execute(
        f"SELECT n.name, n.nonce, n.seq FROM edges e JOIN nodes n ON n.id = e.{other} "
        f"WHERE e.{mine} = ? ORDER BY n.id",
        (nid,),
    )
    return [Node(*row) for row in rows]


def ancestors(conn: Connection, node: Node) -> list[Node]:
    """Return every node reachable through parent edges, nearest first."""
    nid = lookup(conn, node)
    rows = conn.execute(
        "WITH RECURSIVE up(id, depth) AS (SELECT ?, 0 UNION "
        "SELECT e.parent, up.depth + 1 FROM edges e JOIN up ON e.child = up.id) "
        "SELECT n.name, n.nonce, n.seq, MIN(up.depth) AS d FROM up JOIN nodes n ON n.id = up.id "
        "WHERE up.id != ? GROUP BY n.id ORDER BY d, n.id",
        (nid, nid),
    )
    return [Node(name, nonce, seq) for name, nonce, seq, _ in rows]


def job_record(conn: Connection, node: Node) -> tuple[str, str] | None:
    """Return ``(job, config)`` in effect at ``node``, or None.

    The closest record at or before ``node.seq`` in its lineage wins (the latest
    record if a node has several); with none, follow the branch edge of the
    lineage's earliest node that has one into the lineage it came from.
    """
    seen: set[tuple[str, str]] = set()
    current: Node | None = node
    while current is not None and (current.name, current.nonce) not in seen:
        seen.add((current.name, current.nonce))
        row = conn.execute(
            "SELECT j.job, j.config FROM jobs j JOIN nodes n ON n.id = j.node "
            "WHERE n.name = ? AND n.nonce = ? AND n.seq <= ? ORDER BY n.seq DESC, j.id DESC "
            "LIMIT 1",
            (current.name, current.nonce, current.seq),
        ).fetchone()
        if row is not None:
            return str(row[0]), str(row[1])
        base = conn.execute(
            "SELECT p.name, p.nonce, p.seq FROM nodes n JOIN edges e ON e.child = n.id "
            "JOIN nodes p ON p.id = e.parent WHERE n.name = ? AND n.nonce = ? AND n.seq <= ? "
            "AND NOT (p.name = n.name AND p.nonce = n.nonce) ORDER BY n.seq LIMIT 1",
            (current.name, current.nonce, current.seq),
        ).fetchone()
        current = None if base is None else Node(*base)
    return None


def run_summaries(conn: Connection) -> list[dict[str, Any]]:
    """Return one row per lineage: name, nonce, nodes, last seq, checkpoints, artifacts, last write.

    Three grouped reads (the nodes, then the checkpoints and the artifacts per lineage),
    not a count per lineage inside the first: at 30,000 lineages the per-lineage counts
    are 60,000 probes, and PostgreSQL compiles such a plan before running it.
    """
    held: dict[str, dict[tuple[str, str], int]] = {}
    for table in ("checkpoints", "artifacts"):
        held[table] = {
            (str(name), str(nonce)): int(count)
            for name, nonce, count in conn.execute(
                f"SELECT m.name, m.nonce, COUNT(*) FROM {table} t JOIN nodes m ON m.id = t.node "
                "GROUP BY m.name, m.nonce"
            )
        }
    rows = conn.execute(
        "SELECT n.name, n.nonce, COUNT(*), MAX(n.seq), MAX(n.written) "
        "FROM nodes n GROUP BY n.name, n.nonce ORDER BY MIN(n.id)"
    ).fetchall()
    return [
        {
            "name": name,
            "nonce": nonce,
            "nodes": nodes,
            "last_seq": last_seq,
            "last_write": last_write,
            "checkpoints": held["checkpoints"].get((name, nonce), 0),
            "artifacts": held["artifacts"].get((name, nonce), 0),
        }
        for name, nonce, nodes, last_seq, last_write in rows
    ]


def lineages(conn: Connection) -> list[tuple[str, str, str, str]]:
    """``(project, group, run, nonce)`` of every lineage the store has a node of."""
    return [
        (str(p), str(g), str(r), str(n))
        for p, g, r, n in conn.execute("SELECT DISTINCT project, grp, run, nonce FROM nodes")
    ]


def checkpoint_layouts(conn: Connection) -> list[tuple[Any, ...]]:
    """Every checkpoint row with its node, in registration order:
    ``(path, relative, name, nonce, seq, project, group, run, step)``."""
    return list(
        conn.execute(
            "SELECT c.path, c.relative, n.name, n.nonce, n.seq, n.project, n.grp, n.run, c.step "
            "FROM checkpoints c JOIN nodes n ON n.id = c.node ORDER BY c.id"
        )
    )
