"""The SQLite side of the store: schema, connection settings, retries, error translation.

The database runs in WAL mode with ``synchronous=FULL`` so that a committed
write survives a crash of the process or the machine, and readers never wait
for the writer. A writer that finds the write lock taken waits
(``busy_timeout``) and then retries with backoff, so no caller ever sees
"database is locked"; after ``PATIENCE_S`` it gives up with :class:`StoreBusyError`.
"""

from __future__ import annotations

import contextlib
import random
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from theseus.store._errors import (
    CorruptStoreError,
    StoreBusyError,
    StoreError,
    StorePermissionError,
)

__all__ = [
    "FORMAT",
    "FORMATS_READ",
    "INLINE_MAX",
    "PATIENCE_S",
    "check_header",
    "connect",
    "create_schema",
    "migrate",
    "retrying",
    "translate",
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
_BUSY_TIMEOUT_MS = 5_000

T = TypeVar("T")

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


@contextlib.contextmanager
def translate(db: Path) -> Iterator[None]:
    """Turn SQLite's exceptions into the store's, naming the database file."""
    try:
        yield
    except sqlite3.OperationalError as err:
        msg = str(err)
        if "readonly" in msg or "unable to open" in msg or "permission" in msg.lower():
            raise StorePermissionError(
                f"Cannot write the database file {db} ({msg}). Make {db.parent} and the "
                "files in it writable by this user."
            ) from err
        if "malformed" in msg or "not a database" in msg:
            raise _corrupt(db, err) from err
        raise StoreError(f"SQLite failed on {db}: {msg}.") from err
    except sqlite3.DatabaseError as err:
        raise _corrupt(db, err) from err


def _corrupt(db: Path, err: Exception) -> CorruptStoreError:
    return CorruptStoreError(
        f"The database file {db} is damaged or is not a theseus-store database ({err}). "
        "Restore it from a backup; `theseus-store fsck ROOT` reports what it can read."
    )


def _busy(err: sqlite3.OperationalError) -> bool:
    msg = str(err)
    return "locked" in msg or "busy" in msg


def retrying(db: Path, attempt: Callable[[], T], patience: float = PATIENCE_S) -> T:
    """Call ``attempt`` until it does not fail with a busy/locked error.

    Args:
        db: the database file, for the message.
        attempt: a function that runs (and on failure rolls back) one transaction.
        patience: seconds to keep trying.

    Returns:
        What ``attempt`` returned.

    Raises:
        StoreBusyError: if the lock stayed taken for ``patience`` seconds.
    """
    deadline = time.monotonic() + patience
    delay = 0.001
    while True:
        try:
            return attempt()
        except sqlite3.OperationalError as err:
            if not _busy(err):
                raise
            if time.monotonic() > deadline:
                raise StoreBusyError(
                    f"The database {db} stayed locked for {patience:.0f} s. Another process "
                    "holds its write lock; stop it or wait, then retry."
                ) from err
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 0.1)


def connect(db: Path, readonly: bool = False) -> sqlite3.Connection:
    """Open ``db`` with the store's settings (autocommit; transactions are explicit).

    With ``readonly``, the file is opened as the URI ``file:...?mode=ro``: SQLite
    refuses every write on that connection, and it reads beside a live writer (WAL).
    """
    target: str | Path = db
    if readonly:
        target = f"{db.absolute().as_uri()}?mode=ro"
    conn = sqlite3.connect(
        target,
        isolation_level=None,
        check_same_thread=False,
        timeout=_BUSY_TIMEOUT_MS / 1000,
        uri=readonly,
    )
    conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
    if not readonly:
        conn.execute("PRAGMA synchronous = FULL")
        add_indexes(conn)
    return conn


# Indexes added to :data:`SCHEMA` after a format was fixed: a writer adds them to a store
# made before them when it connects (code that predates them ignores an extra index, so
# they need no format of their own). ``nodes_written``: the nodes written since a time,
# which the browser reads to bring what it remembers up to date (``ui/_memory.py``).
LATER_INDEXES = {"nodes_written": "CREATE INDEX IF NOT EXISTS nodes_written ON nodes(written)"}


def add_indexes(conn: sqlite3.Connection) -> None:
    """Create the :data:`LATER_INDEXES` a store lacks (no-op for a new or current one).

    An index only speeds reads up, so a store that cannot take it now (its write lock
    held past the busy timeout, or the file not writable) is opened all the same: the
    next writer to connect adds it.
    """
    have = {
        str(r[0])
        for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type IN ('table', 'index') "
            "AND name IN ('nodes', " + ", ".join("?" * len(LATER_INDEXES)) + ")",
            tuple(LATER_INDEXES),
        )
    }
    if "nodes" not in have:  # a new database: create_schema makes everything
        return
    for name, statement in LATER_INDEXES.items():
        if name not in have:
            with contextlib.suppress(sqlite3.OperationalError):
                conn.execute(statement)


def create_schema(conn: sqlite3.Connection) -> None:
    """Switch to WAL mode and create the tables (idempotent)."""
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        raise StoreError(
            f"SQLite refused WAL mode (got {mode!r}); the file system may not "
            "support shared memory. Put the store on a local disk."
        )
    conn.execute("BEGIN IMMEDIATE")
    try:
        for statement in SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('format', ?)", (str(FORMAT),))
        conn.execute(
            "INSERT OR IGNORE INTO meta(key, value) VALUES ('inline_max', ?)", (str(INLINE_MAX),)
        )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def migrate(
    conn: sqlite3.Connection, canonical: Callable[[str, int, tuple[str, ...]], tuple[str, int]]
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
        conn: a connection inside a write (``BEGIN IMMEDIATE``) transaction.
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
    conn.execute(f"UPDATE nodes SET ckpt = {latest} WHERE ckpt IS NOT {latest}")
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


def check_header(db: Path) -> None:
    """Refuse a database file that is not SQLite or is shorter than its header says.

    SQLite itself notices both only when a query reaches a damaged page; checking
    the 100-byte header at open time turns a truncated file into an immediate,
    clear error. The size check is skipped while a write-ahead log exists (its
    frames may legitimately hold pages beyond the end of the main file).

    Raises:
        CorruptStoreError: naming the file, what was expected and what was found.
    """
    try:
        with open(db, "rb") as handle:
            header = handle.read(100)
        size = db.stat().st_size
    except FileNotFoundError:
        return
    if not header:
        return
    if len(header) < 100 or not header.startswith(b"SQLite format 3\x00"):
        raise CorruptStoreError(
            f"The database file {db} is not an SQLite database (its first bytes are "
            f"{header[:16]!r}, expected b'SQLite format 3\\x00'). Restore it from a backup."
        )
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    valid = header[24:28] == header[92:96]
    wal = db.with_name(db.name + "-wal")
    if valid and size < pages * page_size and not (wal.exists() and wal.stat().st_size):
        raise CorruptStoreError(
            f"The database file {db} is truncated: its header says {pages} pages of "
            f"{page_size} bytes ({pages * page_size} bytes), but the file has {size} bytes. "
            "Restore it from a backup."
        )
