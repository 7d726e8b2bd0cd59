"""The statements that record: values, an artifact's row, a checkpoint's row, a job.

Each function runs inside the caller's write transaction (``Store.write``), makes
the node (and its parent edge) if needed, and speaks in plain values. The Store
checks its arguments before it opens the transaction.
"""

from __future__ import annotations

from collections.abc import Sequence

from theseus.store._dialect import Connection, dialect
from theseus.store._lineage import node_id
from theseus.store._node import Node
from theseus.store._records import Scalar

__all__ = ["insert_artifact", "insert_checkpoint", "insert_inline", "insert_job", "insert_values"]


def insert_values(
    conn: Connection, node: Node, rows: Sequence[tuple[str, Scalar, str]], now: float
) -> None:
    """Set ``(key, value, kind)`` rows on ``node``; a key written again takes the new value."""
    nid = node_id(conn, node, now)
    row = dialect(conn).row
    conn.executemany(
        "INSERT INTO vals(node, key, value, kind) VALUES (?, ?, ?, ?) "
        "ON CONFLICT(node, key) DO UPDATE SET value = excluded.value, kind = excluded.kind",
        [(nid, key, *row(stored, kind)) for key, stored, kind in rows],
    )


def insert_inline(conn: Connection, digest: str, data: bytes) -> None:
    """Keep a small blob in the database's ``inline`` table (once per hash)."""
    conn.execute("INSERT OR IGNORE INTO inline(hash, content) VALUES (?, ?)", (digest, data))


def insert_artifact(
    conn: Connection,
    node: Node,
    name: str,
    filename: str,
    digest: str,
    size: int,
    now: float,
) -> int:
    """Add the next version of artifact ``name`` on ``node``; return its version."""
    nid = node_id(conn, node, now)
    (version,) = conn.execute(
        "SELECT COALESCE(MAX(version), 0) + 1 FROM artifacts WHERE node = ? AND name = ?",
        (nid, name),
    ).fetchone()
    conn.execute(
        "INSERT INTO artifacts(node, name, filename, hash, size, version, created) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (nid, name, filename, digest, size, version, now),
    )
    return int(version)


def insert_checkpoint(
    conn: Connection,
    node: Node,
    stored: tuple[str, int],
    step: int,
    meta: str,
    now: float,
) -> tuple[str, float]:
    """Register a checkpoint row ``stored = (path, relative)`` at ``step`` on ``node``.

    A row is one per ``(node, step, relative, path)``: registering it again adds
    nothing. Returns the ``(meta, created)`` of the row that stands (the first).
    """
    nid = node_id(conn, node, now)
    path, relative = stored
    added = conn.execute(
        "INSERT INTO checkpoints(node, path, relative, step, meta, created) "
        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(node, step, relative, path) DO NOTHING",
        (nid, path, relative, step, meta, now),
    )
    if added.rowcount:
        conn.execute("UPDATE nodes SET ckpt = ? WHERE id = ?", (added.lastrowid, nid))
        return meta, now
    kept, created = conn.execute(
        "SELECT meta, created FROM checkpoints "
        "WHERE node = ? AND step = ? AND relative = ? AND path = ?",
        (nid, step, relative, path),
    ).fetchone()
    return str(kept), float(created)


def insert_job(conn: Connection, node: Node, job: str, config: str, now: float) -> None:
    """Record that a run of ``job`` started at ``node`` with this configuration."""
    nid = node_id(conn, node, now)
    conn.execute(
        "INSERT INTO jobs(node, job, config, created) VALUES (?, ?, ?, ?)",
        (nid, job, config, now),
    )
