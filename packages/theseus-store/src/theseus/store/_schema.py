"""What both backends share about the store's rows: the tables, the format, its migration.

The statements are written once, in the SQL both SQLite and PostgreSQL take; a backend
turns :data:`SCHEMA` into its own types (``_postgres``) and says what the statements
cannot share through its dialect (``_dialect``). :func:`migrate` brings the rows of an
older format to :data:`FORMAT` inside the caller's write transaction, on either backend.
"""

from __future__ import annotations

from collections.abc import Callable

from theseus.store._dialect import Connection, dialect

__all__ = [
    "COPY_UNFINISHED",
    "FORMAT",
    "FORMATS_READ",
    "INLINE_MAX",
    "LATER_INDEXES",
    "PATIENCE_S",
    "SCHEMA",
    "migrate",
]

# Format 2: checkpoint paths canonical (``_paths.canonical_path``), one row per
# (node, step, path). Format 3: a checkpoint below ``ROOT/checkpoints`` of a Theseus
# root is stored relative to ROOT (``relative = 2``), so a moved or copied root keeps
# its checkpoints. Format 4: a checkpoint row is one per (node, step, relative, path), so
# ``store/checkpoints/a`` (relative to the store) and ``checkpoints/a`` (relative to the
# root) are two rows, not one. Stores of earlier formats are migrated when opened with
# write access.
FORMAT = 4
FORMATS_READ = (1, 2, 3, 4)
# Artifacts of at most this many bytes live in the database's ``inline`` table
# (content-addressed like the blob folder): one fsync per write instead of three.
INLINE_MAX = 64 * 1024
PATIENCE_S = 600.0
# The ``meta`` key a copy's destination holds while the copy is under way (its source, as
# a command names it): a copy stopped half-way is never taken for a whole one (``_copy``;
# fsck reports it).
COPY_UNFINISHED = "copy/unfinished"

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS nodes(
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL, nonce TEXT NOT NULL, seq INTEGER NOT NULL,
    project TEXT NOT NULL, grp TEXT NOT NULL, run TEXT NOT NULL,
    created REAL NOT NULL, written REAL NOT NULL,
    ckpt INTEGER,  -- id of the node's most recently recorded checkpoint (NULL: none)
    UNIQUE(name, nonce, seq));
CREATE INDEX IF NOT EXISTS nodes_run ON nodes(run, ckpt);
CREATE INDEX IF NOT EXISTS nodes_project ON nodes(project, grp, ckpt);
CREATE INDEX IF NOT EXISTS nodes_ckpt ON nodes(ckpt);
CREATE INDEX IF NOT EXISTS nodes_written ON nodes(written);
CREATE TABLE IF NOT EXISTS edges(
    child INTEGER NOT NULL, parent INTEGER NOT NULL,
    PRIMARY KEY(child, parent)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS edges_parent ON edges(parent, child);
CREATE TABLE IF NOT EXISTS vals(
    node INTEGER NOT NULL, key TEXT NOT NULL, value, kind TEXT NOT NULL,
    PRIMARY KEY(node, key)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS vals_key ON vals(key, value);
CREATE TABLE IF NOT EXISTS checkpoints(
    id INTEGER PRIMARY KEY, node INTEGER NOT NULL, path TEXT NOT NULL,
    relative INTEGER NOT NULL, step INTEGER NOT NULL, meta TEXT NOT NULL,
    created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS checkpoints_node ON checkpoints(node, id);
CREATE UNIQUE INDEX IF NOT EXISTS checkpoints_unique ON checkpoints(node, step, relative, path);
CREATE TABLE IF NOT EXISTS artifacts(
    id INTEGER PRIMARY KEY, node INTEGER NOT NULL, name TEXT NOT NULL,
    filename TEXT NOT NULL, hash TEXT NOT NULL, size INTEGER NOT NULL,
    version INTEGER NOT NULL, created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS artifacts_node ON artifacts(node, name, id);
CREATE INDEX IF NOT EXISTS artifacts_hash ON artifacts(hash);
CREATE TABLE IF NOT EXISTS jobs(
    id INTEGER PRIMARY KEY, node INTEGER NOT NULL, job TEXT NOT NULL,
    config TEXT NOT NULL, created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS jobs_node ON jobs(node, id);
CREATE INDEX IF NOT EXISTS jobs_job ON jobs(job);
CREATE TABLE IF NOT EXISTS inline(hash TEXT PRIMARY KEY, content BLOB NOT NULL);
"""

# Indexes added to :data:`SCHEMA` after a format was fixed: a writer adds them to a store
# made before them when it connects (code that predates them ignores an extra index, so
# they need no format of their own). ``nodes_written``: the nodes written since a time,
# which the browser reads to bring what it remembers up to date (``ui/_memory.py``).
LATER_INDEXES = {"nodes_written": "CREATE INDEX IF NOT EXISTS nodes_written ON nodes(written)"}


def migrate(
    conn: Connection, canonical: Callable[[str, int, tuple[str, ...]], tuple[str, int]]
) -> bool:
    """Bring a database of an earlier format to :data:`FORMAT`, inside the caller's write
    transaction.

    Format 1 kept checkpoint paths as spelled (``..`` and symlinks included) and
    let one checkpoint be registered many times; formats 1 and 2 kept the
    checkpoints of a Theseus root absolute; format 3 kept one row per
    ``(node, step, path)`` whatever the path was relative to. This rewrites every
    checkpoint row's ``(path, relative)`` as ``canonical(path, relative, layout)``
    returns it (``layout``: the node's project, group, run and nonce, and the row's
    step), deletes all but the earliest row of each ``(node, step, relative, path)``
    (two rows that name two places stay two), points each node's latest-checkpoint
    pointer at its latest remaining row, and replaces format 3's unique index by the
    one that keeps it so. Idempotent: a database at :data:`FORMAT` is
    left alone.

    Args:
        conn: a connection inside a write transaction (``Store.write``).
        canonical: maps a row's stored ``(path, relative)`` and layout to this format's form.

    Returns:
        Whether anything was migrated (False: already at :data:`FORMAT`).
    """
    row = conn.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()
    if row is not None and int(row[0]) >= FORMAT:
        return False
    # format 3's index would refuse two rows that differ in ``relative`` alone
    conn.execute("DROP INDEX IF EXISTS checkpoints_once")
    changed = []
    rows = conn.execute(
        "SELECT c.id, c.path, c.relative, n.project, n.grp, n.run, n.nonce, c.step "
        "FROM checkpoints c JOIN nodes n ON n.id = c.node"
    )
    for cid, path, relative, *layout in rows:
        now = canonical(path, relative, tuple(map(str, layout)))
        if now != (path, relative):
            changed.append((*now, cid))
    conn.executemany("UPDATE checkpoints SET path = ?, relative = ? WHERE id = ?", changed)
    conn.execute(
        "DELETE FROM checkpoints WHERE id NOT IN "
        "(SELECT MIN(id) FROM checkpoints GROUP BY node, step, relative, path)"
    )
    latest = "(SELECT MAX(c.id) FROM checkpoints c WHERE c.node = nodes.id)"
    conn.execute(f"UPDATE nodes SET ckpt = {latest} WHERE {dialect(conn).differs('ckpt', latest)}")
    conn.execute(
        "CREATE UNIQUE INDEX IF NOT EXISTS checkpoints_unique "
        "ON checkpoints(node, step, relative, path)"
    )
    conn.execute(
        "INSERT INTO meta(key, value) VALUES ('format', ?) "
        "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        (str(FORMAT),),
    )
    return True
