"""The store: open a root, write records durably, read them back.

A root holds ``theseus-store.json`` (the marker), ``store.sqlite`` (WAL mode)
and ``blobs/``. Every write runs in one ``BEGIN IMMEDIATE`` transaction: for an
artifact, the blob is written, fsynced and renamed into place *before* the row
that names it is inserted, so a reader in any process never sees a row whose
bytes are incomplete, and a crash leaves at worst an orphan temporary file or
an unreferenced blob, never a dangling row.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shlex
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from theseus.store import _browse, _lineage

try:
    import fcntl
except ImportError:  # pragma: no cover - no fcntl on Windows: creation is not serialized there
    fcntl = None  # type: ignore[assignment]
from theseus.store._blobs import BlobFolder, verified
from theseus.store._connection import Database
from theseus.store._db import (
    FORMAT,
    FORMATS_READ,
    INLINE_MAX,
    check_header,
    create_schema,
    migrate,
    retrying,
    translate,
)
from theseus.store._errors import (
    AmbiguousNodeError,
    CheckpointNotFoundError,
    CorruptStoreError,
    MissingBlobError,
    NotAStoreError,
    StorePermissionError,
    UnknownNodeError,
    ValueTypeError,
)
from theseus.store._fsck import FsckReport, fsck
from theseus.store._node import Node
from theseus.store._paths import canonical_path
from theseus.store._query import Query
from theseus.store._records import Artifact, Checkpoint, Scalar, encode_meta, encode_value

__all__ = ["MARKER", "Store"]

MARKER = "theseus-store.json"
DATABASE = "store.sqlite"
CREATE_LOCK = ".create.lock"
_OWN_FILES = {
    MARKER,
    DATABASE,
    f"{DATABASE}-wal",
    f"{DATABASE}-shm",
    f"{DATABASE}-journal",
    "blobs",
    CREATE_LOCK,
}


def _own_file(name: str) -> bool:
    """A file the store itself makes (a creator's marker temp file included)."""
    return name in _OWN_FILES or (name.startswith(f"{MARKER}.") and name.endswith(".tmp"))


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if absent) inside the block."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


T = TypeVar("T")


class Store:
    """The lineage, values, checkpoints and artifacts of every run under one root.

    Args:
        root: the store's folder. Created (with its parents) if absent or empty.
            Any spelling of it (a symlink, ``..``, a trailing slash) opens the same
            store: ``store.root`` is its canonical path (:func:`canonical_path`).
        create: if False, refuse to create a store where there is none.
        readonly: open the database read-only (SQLite ``mode=ro``; implies
            ``create=False``): nothing is migrated or written, every write raises
            :class:`StorePermissionError`, and it reads beside a live writer.

    Raises:
        NotAStoreError: if ``root`` is a file, or a non-empty folder without the
            store's marker file, or (``create=False``) has no store.
        CorruptStoreError: if the marker or the database is damaged.
        StorePermissionError: if the store cannot be created or opened for writing.
    """

    def __init__(
        self, root: str | os.PathLike[str], *, create: bool = True, readonly: bool = False
    ) -> None:
        self.root = canonical_path(root)
        self.db_path = self.root / DATABASE
        self.blobs = BlobFolder(self.root)
        self.readonly = readonly
        create = create and not readonly
        self._db = Database(self.db_path, readonly)
        self.inline_max = INLINE_MAX
        marker = self.root / MARKER
        if self.root.exists() and not self.root.is_dir():
            raise NotAStoreError(
                f"{self.root} is a file, not a store folder. Pass the folder that contains "
                f"{MARKER}, or a new or empty folder to create a store in."
            )
        #: Whether this object created the store (a new root, or an empty folder).
        self.created = False
        if not marker.exists() and not create:
            raise NotAStoreError(
                f"{self.root} is not a theseus-store root (no {MARKER}).{_inner_hint(self.root)} "
                "Check the path, or open it with create=True to start a new store there."
            )
        try:
            if not marker.exists():
                self._create(marker)
            self._open(marker)
        except BaseException:
            self.close()
            raise

    def _open(self, marker: Path) -> None:
        marked = self._check_marker(marker)
        if not self.db_path.exists():
            raise CorruptStoreError(
                f"{marker} marks a store but its database {self.db_path} is missing. "
                "Restore store.sqlite from a backup."
            )
        if not self.created:
            # Only before this process connects: closing any other descriptor of the
            # database file drops every POSIX lock the process holds on it, SQLite's
            # included, and a WAL database whose locks vanish can lose commits.
            check_header(self.db_path)
        meta = dict(
            self._db.read_one(
                "SELECT key, value FROM meta WHERE key IN ('format', 'inline_max')", ()
            )
        )
        self.inline_max = int(meta.get("inline_max", 0))
        if (int(meta.get("format", 1)) < FORMAT or marked < FORMAT) and not self.readonly:
            self._upgrade(marker)

    def _upgrade(self, marker: Path) -> None:
        """Migrate a store an earlier version wrote (see ``_db.migrate``), then its marker.

        Without write access the store stays as it is and is read as it is:
        checkpoint paths are compared canonically all the same.
        """
        try:
            self._db.write(lambda conn: migrate(conn, self._stored_row))
            self._write_marker(marker)
        except (StorePermissionError, PermissionError):
            return

    # -- opening ---------------------------------------------------------------------------

    def _check_marker(self, marker: Path) -> int:
        """Return the marker's format (one this version reads)."""
        try:
            fmt = json.loads(marker.read_text())["format"]
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
            raise CorruptStoreError(
                f"The store marker {marker} is damaged (expected JSON with a 'format' key): "
                f"{err}. Rewrite it as {json.dumps({'format': FORMAT})}."
            ) from err
        if fmt not in FORMATS_READ or isinstance(fmt, bool):
            raise CorruptStoreError(
                f"The store at {self.root} has format {fmt!r}; this theseus-store reads "
                f"formats {', '.join(map(str, FORMATS_READ))}. Install the theseus-store "
                "version that wrote it."
            )
        return int(fmt)

    def _write_marker(self, marker: Path) -> None:
        """Write the marker atomically (a file of this process's own, fsynced, renamed)."""
        text = json.dumps({"format": FORMAT}) + "\n"
        if marker.exists() and marker.read_text() == text:
            return
        tmp = self.root / f"{MARKER}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
        try:
            tmp.write_text(text)
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())
            os.replace(tmp, marker)
        finally:
            tmp.unlink(missing_ok=True)

    def _create(self, marker: Path) -> None:
        """Create the store unless a concurrent process did; safe from any number at once.

        Creators take an exclusive lock on ``ROOT/.create.lock`` and look for the
        marker again under it, so exactly one creates the schema and renames its
        marker (written under a name of its own) into place; the rest open.
        """
        self._refuse_foreign()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self.blobs.create()
        except PermissionError as err:
            raise StorePermissionError(
                f"Cannot create the store folder {err.filename or self.root}: {err.strerror}. "
                "Choose a writable location or fix its permissions."
            ) from err
        except OSError as err:
            raise StorePermissionError(
                f"Cannot create the store folder {self.root}: {err}. Choose a writable "
                "location whose parents are folders."
            ) from err
        with _exclusive(self.root / CREATE_LOCK):
            if marker.exists():
                return
            self._refuse_foreign()
            conn = self._db.connection()
            with translate(self.db_path):
                retrying(self.db_path, lambda: create_schema(conn))
            self._write_marker(marker)
            self.created = True

    def _refuse_foreign(self) -> None:
        if not self.root.is_dir():
            return
        foreign = sorted(p.name for p in self.root.iterdir() if not _own_file(p.name))
        if foreign:
            shown = ", ".join(foreign[:5]) + (" ..." if len(foreign) > 5 else "")
            raise NotAStoreError(
                f"{self.root} is not empty ({shown}) and has no {MARKER}, so it is not a "
                f"theseus-store root.{_inner_hint(self.root)} Pass an existing store root, "
                "or a new or empty folder (for example a 'store' subfolder) to create one."
            )

    def discard_if_empty(self) -> bool:
        """Delete the store again if this object created it and nothing was recorded since.

        For a caller that created a store on its way to a failure (a run on a new
        root that stopped at a configuration error) and should leave no trace. A
        store that holds any node, or that this object did not create, is left as
        it is. The store is closed either way.

        Returns:
            Whether the store's files were removed.
        """
        if not self.created:
            self.close()
            return False

        def unused(conn: sqlite3.Connection) -> bool:
            (nodes,) = conn.execute("SELECT COUNT(*) FROM nodes").fetchone()
            return int(nodes) == 0

        empty = self.read(unused) and not any(True for _ in self.blobs.stored())
        self.close()
        if not empty:
            return False
        for name in sorted(_OWN_FILES - {"blobs"}):
            (self.root / name).unlink(missing_ok=True)
        for folder in sorted(self.blobs.dir.glob("*"), reverse=True):
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        with contextlib.suppress(OSError):
            self.blobs.dir.rmdir()
            self.root.rmdir()
        return True

    def close(self) -> None:
        """Close the database connection (idempotent)."""
        self._db.close()

    def __enter__(self) -> Store:
        """Return the store itself."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the store."""
        self.close()

    def __repr__(self) -> str:
        """Show the root."""
        return f"Store({str(self.root)!r})"

    # -- transactions ----------------------------------------------------------------------

    def write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(conn)`` in one write transaction (low level; used by fsck and tools)."""
        return self._db.write(fn)

    def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(conn)`` in one read snapshot (low level; used by the query cursor)."""
        return self._db.read(fn)

    def read_one(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        """Run one SELECT statement (low level; used by the query cursor)."""
        return self._db.read_one(sql, params)

    @contextlib.contextmanager
    def batch(self) -> Iterator[Store]:
        """Group writes into one transaction: all of them become durable together, or none.

        Inside the block every ``log``/``put``/``checkpoint``/``touch`` joins the
        same transaction (one fsync of the log at the end instead of one per
        write); other threads' writes wait for the block to end. Each blob file is
        fsynced as it is written; the blob folders are fsynced once each, before
        the commit. Nested blocks join the outer one.

        Example:
            >>> import tempfile
            >>> store = Store(tempfile.mkdtemp())
            >>> with store.batch():
            ...     for i in range(3):
            ...         store.log(Node.new(f"r{i}"), {"x": i})
            >>> store.query().count()
            3
        """
        with self._db.batch():
            yield self

    # -- writing ---------------------------------------------------------------------------

    def touch(self, node: Node) -> None:
        """Record that ``node`` exists, and its parent edge (idempotent).

        Args:
            node: the node; its parent (if any) is recorded too.
        """
        _check_node(node)
        self.write(lambda conn: _lineage.node_id(conn, node, time.time()))

    def log(self, node: Node, values: Mapping[str, Scalar]) -> None:
        """Record scalar values on ``node``; later writes of a key win, others are kept.

        Args:
            node: where the values belong.
            values: key to scalar (int, float, str, bool or None; NaN is kept).

        Raises:
            ValueTypeError: if a key is not a non-empty string or a value is not a scalar.
        """
        _check_node(node)
        if not isinstance(values, Mapping):
            raise ValueTypeError(f"log() takes a mapping of key to scalar; got {type(values)}.")
        rows = []
        for key, value in values.items():
            if not isinstance(key, str) or not key:
                raise ValueTypeError(f"Value keys must be non-empty strings; got {key!r}.")
            rows.append((key, *encode_value(key, value)))

        def insert(conn: sqlite3.Connection) -> None:
            nid = _lineage.node_id(conn, node, time.time())
            conn.executemany(
                "INSERT INTO vals(node, key, value, kind) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(node, key) DO UPDATE SET value = excluded.value, kind = excluded.kind",
                [(nid, *row) for row in rows],
            )

        self.write(insert)

    def put(
        self, node: Node, name: str, filename: str, content: bytes | bytearray | memoryview
    ) -> Artifact:
        """Record an artifact: its bytes go to the blob folder, then its row.

        Writing ``name`` again on the same node keeps the earlier version and makes
        the new one current.

        Args:
            node: where the artifact belongs.
            name: its name on the node (e.g. ``activations``).
            filename: the file name of the bytes (e.g. ``activations.pdf``).
            content: the exact bytes.

        Returns:
            The recorded artifact.

        Raises:
            ValueTypeError: if ``name``/``filename`` are not non-empty strings or
                ``content`` is not bytes-like.
        """
        _check_node(node)
        if self.readonly:  # refuse before a large artifact's bytes reach the blob folder
            raise StorePermissionError(
                f"The store {self.root} is open read-only; cannot put {name!r} on "
                f"{node.serialize()}. Open it with Store(root) to write."
            )
        for what, text in (("name", name), ("filename", filename)):
            if not isinstance(text, str) or not text or "\x00" in text:
                raise ValueTypeError(
                    f"An artifact {what} must be a non-empty string; got {text!r}."
                )
        if "/" in filename or "\\" in filename:
            raise ValueTypeError(
                f"An artifact filename is a bare file name; got {filename!r}. Pass "
                f"{os.path.basename(filename)!r}."
            )
        if not isinstance(content, bytes | bytearray | memoryview):
            raise ValueTypeError(
                f"Artifact {name!r}: content must be bytes; got {type(content).__name__}. "
                "Encode text with .encode() or serialize the object first."
            )
        data = bytes(content)
        digest = hashlib.sha256(data).hexdigest()

        def insert(conn: sqlite3.Connection) -> Artifact:
            now = time.time()
            if len(data) <= self.inline_max:
                conn.execute(
                    "INSERT OR IGNORE INTO inline(hash, content) VALUES (?, ?)", (digest, data)
                )
            else:
                self.blobs.write(data, digest, self._db.unsynced if self._db.in_batch else None)
            nid = _lineage.node_id(conn, node, now)
            (version,) = conn.execute(
                "SELECT COALESCE(MAX(version), 0) + 1 FROM artifacts WHERE node = ? AND name = ?",
                (nid, name),
            ).fetchone()
            conn.execute(
                "INSERT INTO artifacts(node, name, filename, hash, size, version, created) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (nid, name, filename, digest, len(data), version, now),
            )
            return Artifact(
                node.identity(), name, filename, digest, len(data), now, version, self.load
            )

        return self.write(insert)

    def checkpoint(
        self,
        node: Node,
        path: str | os.PathLike[str],
        meta: Mapping[str, Any] | None = None,
        *,
        step: int | None = None,
    ) -> Checkpoint:
        """Index a checkpoint directory that is complete on disk.

        Call this only after the checkpoint writer has finished (for orbax, after
        ``wait_until_finished``): the store lists exactly what it was told. The path
        is stored canonical (:func:`canonical_path`). A node holds one entry per
        (step, path): indexing the same checkpoint again adds nothing and returns
        the first entry (its meta and time).

        Args:
            node: the node the checkpoint belongs to.
            path: the checkpoint directory (or file); it must exist.
            meta: JSON-serializable metadata (config, RNG state, ...).
            step: the training step; defaults to ``node.seq``.

        Returns:
            The recorded entry.

        Raises:
            CheckpointNotFoundError: if ``path`` does not exist or is still a temporary
                orbax directory.
            ValueTypeError: if ``meta`` is not JSON-serializable.
        """
        _check_node(node)
        full = canonical_path(path)
        if not full.exists() or "orbax-checkpoint-tmp" in full.name:
            raise CheckpointNotFoundError(
                f"Checkpoint path {full} does not exist or is still being written. Index a "
                "checkpoint only after it is complete on disk (orbax: wait_until_finished())."
            )
        if step is None:
            step = node.seq
        if isinstance(step, bool) or not isinstance(step, int):
            raise ValueTypeError(f"Checkpoint step must be an int; got {step!r}.")
        meta_text = encode_meta(meta)
        stored, relative = self._stored(full)

        def insert(conn: sqlite3.Connection) -> Checkpoint:
            now = time.time()
            nid = _lineage.node_id(conn, node, now)
            added = conn.execute(
                "INSERT INTO checkpoints(node, path, relative, step, meta, created) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(node, step, path) DO NOTHING",
                (nid, stored, relative, step, meta_text, now),
            )
            if added.rowcount:
                conn.execute("UPDATE nodes SET ckpt = ? WHERE id = ?", (added.lastrowid, nid))
                return Checkpoint(node.identity(), str(full), step, json.loads(meta_text), now)
            kept_meta, created = conn.execute(  # registered before: that entry stands
                "SELECT meta, created FROM checkpoints WHERE node = ? AND step = ? AND path = ?",
                (nid, step, stored),
            ).fetchone()
            return Checkpoint(node.identity(), str(full), step, json.loads(kept_meta), created)

        return self.write(insert)

    def _checkpoint_tree(self) -> Path | None:
        """``ROOT/checkpoints`` for a store at ``ROOT/store`` (a Theseus root), else None."""
        return self.root.parent / "checkpoints" if self.root.name == "store" else None

    def _stored(self, full: Path) -> tuple[str, int]:
        """``(path, relative)`` as a row holds the canonical path ``full``.

        ``relative`` says what the stored path is relative to, so that a root moved
        or copied as a whole still finds its own checkpoints: 1, the store's folder
        (a path inside it); 2, the folder that holds the store (a path below
        ``ROOT/checkpoints`` of a Theseus root, the store at ``ROOT/store``); 0,
        nothing (any other path, kept absolute).
        """
        try:
            return str(full.relative_to(self.root)), 1
        except ValueError:
            pass
        tree = self._checkpoint_tree()
        if tree is not None and tree in full.parents:
            return str(full.relative_to(self.root.parent)), 2
        return str(full), 0

    def checkpoint_path(self, path: str, relative: int) -> Path:
        """The checkpoint path a row's stored ``(path, relative)`` names (see ``_stored``)."""
        if relative == 1:
            return self.root / path
        if relative == 2:
            return self.root.parent / path
        return Path(path)

    def _stored_row(self, path: str, relative: int, layout: tuple[str, ...]) -> tuple[str, int]:
        """A row's ``(path, relative)`` in this version's form (for rows earlier versions wrote).

        Earlier versions kept a checkpoint below ``ROOT/checkpoints`` absolute. Such
        a row is rewritten relative to the root when it lies below this root's
        ``checkpoints/``, and also when the root has been moved or copied since:
        the row's path ends in ``checkpoints/<layout>`` (``layout`` = the node's
        project, group, run and nonce, and the row's step) and that folder exists
        below this root's ``checkpoints/``.
        """
        full = canonical_path(self.checkpoint_path(path, relative))
        tree = self._checkpoint_tree()
        if relative == 0 and tree is not None and tree not in full.parents:
            tail = full.parts[-len(layout) - 1 :]
            here = tree.joinpath(*layout)
            if tail == ("checkpoints", *layout) and here.exists():
                full = canonical_path(here)
        return self._stored(full)

    def record_job(self, node: Node, job: str, config: str) -> None:
        """Record that a run of ``job`` started at ``node`` with this YAML configuration.

        Args:
            node: the node the job starts at.
            job: the registry key (e.g. ``gpt/train/pretrain``).
            config: the composed configuration as YAML text.

        Raises:
            ValueTypeError: if ``job`` or ``config`` is not a string.
        """
        _check_node(node)
        if not isinstance(job, str) or not job or not isinstance(config, str):
            raise ValueTypeError(
                f"record_job takes a non-empty job key and YAML text; got {job!r}, "
                f"{type(config).__name__}."
            )

        def insert(conn: sqlite3.Connection) -> None:
            now = time.time()
            nid = _lineage.node_id(conn, node, now)
            conn.execute(
                "INSERT INTO jobs(node, job, config, created) VALUES (?, ?, ?, ?)",
                (nid, job, config, now),
            )

        self.write(insert)

    # -- reading ---------------------------------------------------------------------------

    def query(self) -> Query:
        """Return a fresh chainable query cursor over every node."""
        return Query(self)

    def artifact_from_row(self, node: Node, row: tuple[Any, ...]) -> Artifact:
        """Build an Artifact from ``(name, filename, hash, size, created, version[, inline])``."""
        inline = row[6] if len(row) > 6 and isinstance(row[6], bytes) else None
        return Artifact.from_row(node, row, self.load, inline)

    def load(self, digest: str, size: int, fetched: bytes | None = None) -> bytes:
        """Return the bytes stored under ``digest``, verified against it.

        Artifacts of at most ``inline_max`` bytes are in the database's ``inline``
        table, larger ones in the blob folder.

        Args:
            digest: the SHA-256 the store recorded.
            size: the size the store recorded.
            fetched: inline bytes a query already read (verified here all the same).

        Raises:
            MissingBlobError: if the bytes are missing.
            BlobHashError: if they do not hash to ``digest``.
        """
        if size > self.inline_max:
            return self.blobs.read(digest, size)
        where = f"The inline blob {digest} in {self.db_path}"
        if fetched is not None:
            return verified(fetched, digest, size, where)
        row = self.read(
            lambda conn: conn.execute(
                "SELECT content FROM inline WHERE hash = ?", (digest,)
            ).fetchone()
        )
        if row is None:
            raise MissingBlobError(
                f"{where} is missing (expected {size} bytes). Restore {self.db_path} from "
                "a backup; `theseus-store fsck ROOT` lists every missing blob."
            )
        return verified(bytes(row[0]), digest, size, where)

    def get(self, node: Node) -> dict[str, Artifact]:
        """Return ``node``'s current artifacts by name.

        Raises:
            UnknownNodeError: if the store never recorded ``node``.
        """
        _check_node(node)
        rows = self.read_one(_lineage.CURRENT_ARTIFACTS, (node.name, node.nonce, node.seq))
        if not rows:  # no artifacts, or no such node: tell the two apart
            self.read(lambda conn: _lineage.lookup(conn, node))
        me = node.identity()
        return {row[0]: Artifact.from_row(me, row, self.load) for row in rows}

    def history(self, node: Node, name: str) -> list[Artifact]:
        """Return every version of artifact ``name`` on ``node``, oldest first.

        Raises:
            UnknownNodeError: if the store never recorded ``node``.
        """
        _check_node(node)
        rows = self.read(lambda conn: _lineage.artifact_history(conn, node, name))
        return [self.artifact_from_row(node.identity(), row) for row in rows]

    def values(self, node: Node) -> dict[str, Scalar]:
        """Return ``node``'s folded values (one mapping, later writes of a key win).

        Raises:
            UnknownNodeError: if the store never recorded ``node``.
        """
        _check_node(node)
        return self.read(lambda conn: _lineage.folded_values(conn, node))

    def checkpoints(self, node: Node) -> list[Checkpoint]:
        """Return ``node``'s checkpoint entries in the order they were recorded.

        Raises:
            UnknownNodeError: if the store never recorded ``node``.
        """
        _check_node(node)
        rows = self.read(lambda conn: _lineage.checkpoint_rows(conn, node))
        return [self.checkpoint_from_row(node.identity(), row) for row in rows]

    def checkpoint_from_row(self, node: Node, row: tuple[Any, ...]) -> Checkpoint:
        """Build a Checkpoint from ``(path, relative, step, meta, created)``."""
        path = str(self.checkpoint_path(row[0], row[1]))
        return Checkpoint(node, path, row[2], json.loads(row[3]), row[4])

    def parents(self, node: Node) -> list[Node]:
        """Return the nodes ``node`` has a parent edge to (usually one).

        Raises:
            UnknownNodeError: if the store never recorded ``node``.
        """
        _check_node(node)
        return self.read(lambda conn: _lineage.neighbours(conn, node, up=True))

    def children(self, node: Node) -> list[Node]:
        """Return the nodes that have a parent edge to ``node``, in creation order.

        Raises:
            UnknownNodeError: if the store never recorded ``node``.
        """
        _check_node(node)
        return self.read(lambda conn: _lineage.neighbours(conn, node, up=False))

    def ancestors(self, node: Node) -> list[Node]:
        """Return every node reachable through parent edges, nearest first.

        Raises:
            UnknownNodeError: if the store never recorded ``node``.
        """
        _check_node(node)
        return self.read(lambda conn: _lineage.ancestors(conn, node))

    def job_config(self, node: Node) -> str | None:
        """Return the YAML recorded by the job in effect at ``node``, or None.

        The job in effect is the latest record at the closest node at or before
        ``node`` in its lineage (same name and nonce, largest seq <= node.seq),
        else, through the branch parent edge, in the lineage it branched from.
        """
        _check_node(node)
        found = self.read(lambda conn: _lineage.job_record(conn, node))
        return None if found is None else found[1]

    def job_of(self, node: Node) -> str | None:
        """Return the registry key of the job in effect at ``node`` (see job_config)."""
        _check_node(node)
        found = self.read(lambda conn: _lineage.job_record(conn, node))
        return None if found is None else found[0]

    def resolve(self, text: str) -> Node:
        """The node a user wrote: ``project.group.run~nonce~seq``, ``...~nonce`` for the
        last node of that lineage (the form ``theseus-store runs`` prints; the run's name
        alone may stand for ``project.group.run``), or a run alone (``run`` or
        ``project.group.run``) for the last node of its one lineage.

        Raises:
            InvalidNodeError: ``text`` is none of these forms.
            AmbiguousNodeError: a run alone that has several lineages (the message
                lists them, each as ``name~nonce``).
            UnknownNodeError: the store has no such run, lineage or node in it; the
                message names what it does have (the lineage's full name when only its
                nonce matched, the range of its nodes when only the seq is wrong).
        """
        if "~" not in text:
            return self._resolve_run(text)
        name, nonce, *rest = text.split("~")
        seq = None
        if rest:  # checks the form (a run alone is checked as if its project were general)
            node = Node.deserialize(text if "." in name else f"general.default.{text}")
            nonce, seq = node.nonce, node.seq
        nodes = self.query().name(name).nonce(nonce).all()
        if not nodes and "." not in name:  # a run's name alone, with the lineage's nonce
            nodes = [n for n in self.query().nonce(nonce).all() if n.name.split(".")[-1] == name]
            if len({n.name for n in nodes}) == 1:
                name = nodes[0].name
            else:
                nodes = []
        listing = f"List them with `theseus-store runs {shlex.quote(str(self.root))}`."
        if not nodes:
            named = sorted({n.name for n in self.query().nonce(nonce).all()})
            if named:
                hint = f"lineage {nonce} is {' and '.join(f'{n}~{nonce}' for n in named)}"
                raise UnknownNodeError(
                    f"The store has no lineage {name}~{nonce}; {hint}. A node is written "
                    "project.group.run~nonce (~seq for one node); pass that name."
                )
            raise UnknownNodeError(
                f"The store has no lineage {name}~{nonce} (a lineage is written "
                f"project.group.run~nonce, as `theseus-store runs` prints it). {listing}"
            )
        last = max(nodes, key=lambda node: node.seq)
        if seq is None:
            return last
        if not any(node.seq == seq for node in nodes):
            first = min(nodes, key=lambda node: node.seq)
            raise UnknownNodeError(
                f"The lineage {name}~{nonce} has no node {seq}: its nodes are "
                f"{first.seq} to {last.seq}. Pass {name}~{nonce}~SEQ with SEQ in that range, "
                f"or {name}~{nonce} for its last node."
            )
        return Node(name, nonce, seq)

    def _resolve_run(self, text: str) -> Node:
        """The last node of the one lineage of the run ``text`` names (see :meth:`resolve`)."""
        runs = self.runs()
        mine = [r for r in runs if text in (r["name"], r["name"].split(".", 2)[-1])]
        if not mine:
            known = sorted({r["name"] for r in runs})
            shown = ", ".join(known[:8]) + (", ..." if len(known) > 8 else "") or "none"
            raise UnknownNodeError(
                f"The store at {self.root} has no run named {text!r} (its runs: {shown}). "
                "Pass a run name, project.group.run, or a node as `theseus-store runs` "
                "prints it (project.group.run~nonce, or project.group.run~nonce~seq)."
            )
        if len(mine) > 1:  # a lineage that never started does not compete with one that did
            mine = [r for r in mine if self.never_started(r) is None] or mine
        if len(mine) > 1:
            listed = "; ".join(
                f"{r['name']}~{r['nonce']} ({_count(r['nodes'], 'node')}, "
                f"{_count(r['checkpoints'], 'checkpoint')})"
                for r in mine
            )
            raise AmbiguousNodeError(
                f"Run {text!r} has {len(mine)} lineages: {listed}. Pass one of them as "
                "name~nonce (its last node) or name~nonce~seq."
            )
        return Node(mine[0]["name"], mine[0]["nonce"], mine[0]["last_seq"])

    def never_started(self, run: Mapping[str, Any]) -> str | None:
        """The error of a lineage whose job failed while setting up, else None.

        `run` is one of :meth:`runs`' summaries. theseus-core records
        ``job/status = failed`` and ``job/failed_in = setup`` on the one node a failed
        setup chose; such a lineage has that node only and no checkpoint.
        """
        if run["nodes"] != 1 or run["checkpoints"]:
            return None
        values = self.values(Node(run["name"], run["nonce"], run["last_seq"]))
        if values.get("job/status") != "failed" or values.get("job/failed_in") != "setup":
            return None
        return str(values.get("job/error", ""))

    def runs(self) -> list[dict[str, Any]]:
        """Return one summary per lineage, oldest first (what ``theseus-store runs`` prints)."""
        return self.read(_lineage.run_summaries)

    # -- the browser's reads (SQL in theseus.store._browse; each is one read snapshot) -----

    def data_version(self) -> int:
        """A number that changes whenever another connection commits to the store."""
        return self.read(_browse.data_version)

    def write_mark(self) -> float | None:
        """The newest write mark of any node (-inf: none), or None: the store keeps none
        (a store made before the ``nodes_written`` index, opened read-only)."""
        return self.read(_browse.write_mark)

    def written_since(self, since: float) -> list[_browse.WrittenNode]:
        """The nodes whose write mark is ``since`` or later (when ``write_mark()`` is not None)."""
        return self.read(lambda conn: _browse.written_since(conn, since))

    def lineage_growth(self, after: int = 0) -> list[_browse.LineageGrowth]:
        """Per lineage, the count, last seq, first creation and id range of its nodes past id
        ``after`` (0: all)."""
        return self.read(lambda conn: _browse.lineage_growth(conn, after))

    def holding_totals(self) -> dict[str, tuple[int, int]]:
        """``(rows, highest id)`` of the checkpoints and the artifacts tables."""
        return self.read(_browse.holding_totals)

    def holdings_by_lineage(
        self, table: str, after: int = 0
    ) -> tuple[int, int, dict[tuple[str, str], int]]:
        """``(rows, highest id, per lineage its rows past id after)`` of ``table``
        (``checkpoints`` or ``artifacts``), from one snapshot."""
        return self.read(lambda conn: _browse.holdings_by_lineage(conn, table, after))

    def last_statuses(self) -> dict[tuple[str, str], tuple[int, Scalar]]:
        """Per lineage ``(name, nonce)``, ``(seq, value)`` of its last ``job/status``."""
        return self.read(_browse.last_statuses)

    def status_values(self) -> list[str]:
        """Every ``job/status`` value the store holds, sorted."""
        return self.read(_browse.status_values)

    def numeric_keys(self) -> list[str]:
        """Every value key with a numeric value somewhere, sorted."""
        return self.read(_browse.numeric_keys)

    def held_keys(self, keys: Sequence[str]) -> list[str]:
        """The ``keys`` that some node holds a value of, in the order given."""
        return self.read(lambda conn: _browse.held_keys(conn, keys))

    def last_value(
        self, name: str, nonce: str, key: str, since: int = 0
    ) -> tuple[int, Scalar] | None:
        """``(seq, value)`` of ``key`` at the lineage's last node from seq ``since`` on with it."""
        return self.read(lambda conn: _browse.last_value(conn, name, nonce, key, since))

    def branch_point(self, name: str, nonce: str, since: int = 0) -> tuple[int, Node] | None:
        """``(seq, parent)`` where the lineage (from seq ``since`` on) left another one, or None."""
        return self.read(lambda conn: _browse.branch_point(conn, name, nonce, since))

    def lineage_end(self, name: str, nonce: str) -> int | None:
        """The lineage's last seq, or None when the store has no such lineage."""
        return self.read(lambda conn: _browse.lineage_end(conn, name, nonce))

    def lineage_chain(self, name: str, nonce: str) -> list[tuple[str, str, int]]:
        """The stretches the lineage stitches through its branch points: ``(name, nonce,
        last seq taken)``, oldest first (empty for an unknown lineage)."""
        return self.read(lambda conn: _browse.chain(conn, name, nonce))

    def numeric_series(
        self, name: str, nonce: str, key: str, first: int, last: int
    ) -> list[tuple[int, float]]:
        """``(seq, value)`` of the lineage's finite numbers under ``key``, seqs first..last."""
        return self.read(lambda conn: _browse.numeric_series(conn, name, nonce, key, first, last))

    def numeric_values(self, key: str, ids: Sequence[int]) -> dict[int, float]:
        """Node id -> the finite number under ``key`` there, for the node ids that have one."""
        return self.read(lambda conn: _browse.numeric_values(conn, key, ids))

    def job_in_lineage(self, node: Node) -> tuple[str, str] | None:
        """``(job, config)`` of the latest job record at or before ``node`` in its own lineage
        (``job_config`` also follows branch points)."""
        _check_node(node)
        return self.read(lambda conn: _browse.job_in_lineage(conn, node))

    def lineage_outline(self, name: str, nonce: str) -> dict[str, Any]:
        """A lineage's seqs, its checkpoint/artifact/job/branch-point seqs, where it branched
        from and the lineages that branch from it (see ``_browse.lineage_outline``)."""
        return self.read(lambda conn: _browse.lineage_outline(conn, name, nonce))

    def artifact_frames(self, name: str, nonce: str, artifact: str) -> list[dict[str, Any]]:
        """Every node along the stitched lineage holding ``artifact``: node, seq, versions
        ``[(version, filename)]``, train/step and val/loss (see ``_browse.artifact_frames``)."""
        return self.read(lambda conn: _browse.artifact_frames(conn, name, nonce, artifact))

    def artifact_names(self, name: str, nonce: str) -> list[str]:
        """The artifact names anywhere along the stitched lineage, sorted."""
        return self.read(lambda conn: _browse.artifact_names(conn, name, nonce))

    def fsck(self, repair: bool = False) -> FsckReport:
        """Check every row against its blob and the database's integrity.

        Args:
            repair: remove orphan temporary files and unreferenced blobs.

        Returns:
            The report (``report.clean`` is True when nothing is wrong).
        """
        return fsck(self, repair)


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _inner_hint(root: Path) -> str:
    """A Theseus root keeps its store in `store/`: say so when that is what was meant."""
    inner = root / "store" / MARKER
    return f" It has a store in {root / 'store'}: pass that folder." if inner.exists() else ""


def _check_node(node: object) -> None:
    if not isinstance(node, Node):
        raise ValueTypeError(
            f"Expected a theseus.store.Node; got {type(node).__name__}. Build one with "
            "Node.new(run) or Node.deserialize(text)."
        )
