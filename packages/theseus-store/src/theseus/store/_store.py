"""The store: open a root, write records durably, read them back.

A store's folder holds ``theseus-store.json`` (the marker), ``blobs/`` and, on SQLite,
``store.sqlite`` (WAL mode); a PostgreSQL store keeps its rows in the database its
marker names. The store holds one ``_backend.AbstractDatabase`` (``_backends`` picks
it) and never asks which backend it is. Every write runs in one write transaction: for
an artifact, the blob is written, fsynced and renamed into place *before* the row that
names it is inserted, so a reader in any process never sees a row whose bytes are
incomplete, and a crash leaves at worst an orphan temporary file or an unreferenced
blob, never a dangling row.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from theseus.store import _lineage, _writes
from theseus.store._backends import open_database, store_folder
from theseus.store._blobs import BlobFolder
from theseus.store._dialect import Connection
from theseus.store._errors import (
    CheckpointNotFoundError,
    NotAStoreError,
    StorePermissionError,
    ValueTypeError,
)
from theseus.store._fsck import FsckReport, fsck
from theseus.store._node import Node
from theseus.store._opening import (
    CREATE_LOCK,
    DATABASE,
    exclusive,
    inner_hint,
    read_marker,
    read_marker_entry,
    refuse_foreign,
    remove_files,
    write_marker,
)
from theseus.store._paths import canonical_path
from theseus.store._reading import StoreReader, check_node
from theseus.store._records import (
    Artifact,
    Checkpoint,
    Scalar,
    artifact_bytes,
    encode_meta,
    encode_value,
)
from theseus.store._root import MARKER, RootFolders
from theseus.store._schema import FORMAT, INLINE_MAX

__all__ = ["MARKER", "Store"]

T = TypeVar("T")


class Store(StoreReader):
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
        spelled = root
        self.root = canonical_path(store_folder(root))
        self.db_path = self.root / DATABASE
        self.blobs = BlobFolder(self.root)
        self.readonly = readonly
        create = create and not readonly
        self.inline_max = INLINE_MAX
        #: The one owner of the question which folders are this root's (see ``_root``).
        self.folders = RootFolders(self.root, lambda: self.read(_lineage.lineages))
        marker = self.root / MARKER
        if self.root.exists() and not self.root.is_dir():
            raise NotAStoreError(
                f"{self.root} is a file, not a store folder. Pass the folder that contains "
                f"{MARKER}, or a new or empty folder to create a store in."
            )
        entry = read_marker_entry(self.root) if marker.exists() else None
        #: Where the rows are; the one object that knows its backend (``_backend``).
        self._db = open_database(self.root, spelled, entry, readonly)
        #: Where the rows are: the SQLite file, or the PostgreSQL URL (without a password).
        self.database = self._db.shown
        self.dialect = self._db.dialect
        #: Whether this object created the store (a new root, or an empty folder).
        self.created = False
        if entry is None and not create:
            raise NotAStoreError(
                f"{self.root} is not a theseus-store root (no {MARKER}).{inner_hint(self.root)} "
                "Check the path, or open it with create=True to start a new store there."
            )
        self._db.warn_if_unsafe()
        try:
            if entry is None:
                self._create(marker)
            self._open()
        except BaseException:
            self.close()
            raise

    def _open(self) -> None:
        """Open the database the marker names: refused where it is another store's; an
        earlier version's rows (or binding) brought up to date where this object writes."""
        marked = read_marker(self.root)
        opened = self._db.open(self.root, read_marker_entry(self.root), self.created)
        #: What tells this store from every other, however it was named (its database
        #: file, or the id its PostgreSQL database holds): two names of one store share it.
        self.identity = opened.identity
        self.inline_max = opened.inline_max
        if self.readonly:
            return
        with contextlib.suppress(StorePermissionError, PermissionError):
            if opened.format < FORMAT or marked < FORMAT:
                self._db.upgrade(self.folders.migrated_row)
            if opened.format < FORMAT or marked < FORMAT or opened.marker is not None:
                write_marker(self.root, opened.marker)

    def _create(self, marker: Path) -> None:
        """Create the store unless a concurrent process did; safe from any number at once.

        Creators take an exclusive lock on ``ROOT/.create.lock`` and look for the
        marker again under it, so exactly one creates the schema and renames its
        marker (written under a name of its own) into place; the rest open. The backend
        makes its tables (on PostgreSQL under the database's own advisory lock, and bound
        to this folder: both record the store's id) and says what the marker records.
        """
        refuse_foreign(self.root)
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
        with exclusive(self.root / CREATE_LOCK):
            if marker.exists():
                return
            refuse_foreign(self.root)
            write_marker(self.root, self._db.create(self.root))
            self.created = True

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

        def unused(conn: Connection) -> bool:
            (nodes,) = conn.execute("SELECT COUNT(*) FROM nodes").fetchone()
            return int(nodes) == 0

        empty = self.read(unused) and not any(True for _ in self.blobs.stored())
        self.close()
        if not empty:
            return False
        remove_files(self.root, self.blobs.dir)
        return True

    def close(self) -> None:
        """Close the database connection (idempotent).

        The store stays usable: its next call opens a connection again, as a forked
        process does with a store it inherited. Close it to release the database file
        (or the PostgreSQL connection) between uses, not to forbid them.
        """
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

    def write(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn(conn)`` in one write transaction (low level; used by fsck and tools)."""
        return self._db.write(fn)

    def read(self, fn: Callable[[Connection], T]) -> T:
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
        check_node(node)
        self.write(lambda conn: _lineage.node_id(conn, node, time.time()))

    def reparent(self, child: Node, parent: Node | None) -> bool:
        """Make ``parent`` ``child``'s parent within their lineage (idempotent).

        A node recorded later between two nodes of a lineage (an imported revision whose
        step falls between two imported ones) takes its place: its successor's parent
        edge moves to it. An edge to another lineage (a branch's base) stays.

        Args:
            child: a recorded node.
            parent: a recorded node of the same lineage with a smaller seq, or None
                for no parent in the lineage (the lineage's first node).

        Returns:
            Whether the edge changed.

        Raises:
            UnknownNodeError: if either node was never recorded.
            InvalidNodeError: if ``parent`` is of another lineage or not before ``child``.
        """
        check_node(child)
        if parent is not None:
            check_node(parent)
        return self.write(lambda conn: _lineage.reparent(conn, child, parent))

    def log(self, node: Node, values: Mapping[str, Scalar]) -> None:
        """Record scalar values on ``node``; later writes of a key win, others are kept.

        Args:
            node: where the values belong.
            values: key to scalar (int, float, str, bool or None; NaN is kept).

        Raises:
            ValueTypeError: if a key is not a non-empty string or a value is not a scalar.
        """
        check_node(node)
        if not isinstance(values, Mapping):
            raise ValueTypeError(f"log() takes a mapping of key to scalar; got {type(values)}.")
        rows = []
        for key, value in values.items():
            if not isinstance(key, str) or not key:
                raise ValueTypeError(f"Value keys must be non-empty strings; got {key!r}.")
            rows.append((key, *encode_value(key, value)))

        self.write(lambda conn: _writes.insert_values(conn, node, rows, time.time()))

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
        check_node(node)
        if self.readonly:  # refuse before a large artifact's bytes reach the blob folder
            raise StorePermissionError(
                f"The store {self.root} is open read-only; cannot put {name!r} on "
                f"{node.serialize()}. Open it with Store(root) to write."
            )
        data = artifact_bytes(name, filename, content)
        digest = hashlib.sha256(data).hexdigest()

        def insert(conn: Connection) -> Artifact:
            now = time.time()
            if len(data) <= self.inline_max:
                _writes.insert_inline(conn, digest, data)
            else:
                self.blobs.write(data, digest, self._db.unsynced if self._db.in_batch else None)
            version = _writes.insert_artifact(conn, node, name, filename, digest, len(data), now)
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
        (step, path) (a path relative to the store and the same text relative to the
        root are two paths): indexing the same checkpoint again adds nothing and returns
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
        check_node(node)
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
        stored = self.folders.row(full)
        kept, created = self.write(
            lambda conn: _writes.insert_checkpoint(conn, node, stored, step, meta_text, time.time())
        )  # registered before: the first entry stands
        return Checkpoint(node.identity(), str(full), step, json.loads(kept), created)

    def record_job(self, node: Node, job: str, config: str) -> None:
        """Record that a run of ``job`` started at ``node`` with this YAML configuration.

        Args:
            node: the node the job starts at.
            job: the registry key (e.g. ``gpt/train/pretrain``).
            config: the composed configuration as YAML text.

        Raises:
            ValueTypeError: if ``job`` or ``config`` is not a string.
        """
        check_node(node)
        if not isinstance(job, str) or not job or not isinstance(config, str):
            raise ValueTypeError(
                f"record_job takes a non-empty job key and YAML text; got {job!r}, "
                f"{type(config).__name__}."
            )

        self.write(lambda conn: _writes.insert_job(conn, node, job, config, time.time()))

    def fsck(self, repair: bool = False) -> FsckReport:
        """Check every row against its blob and the database's integrity.

        Args:
            repair: remove orphan temporary files and unreferenced blobs.

        Returns:
            The report (``report.clean`` is True when nothing is wrong).
        """
        return fsck(self, repair)
