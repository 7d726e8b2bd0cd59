"""The store's reads: a node's values, artifacts, checkpoints, neighbours and job; names.

:class:`StoreReader` is the half of :class:`~theseus.store.Store` that only reads,
over the ``read``/``read_one`` transactions the Store opens; every method speaks in
Nodes and records, and the SQL behind it lives in ``_lineage``.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from theseus.store import _browse, _lineage, _resolve
from theseus.store._blobs import BlobFolder, verified
from theseus.store._dialect import Dialect
from theseus.store._errors import MissingBlobError, ValueTypeError
from theseus.store._node import Node
from theseus.store._query import Query
from theseus.store._records import Artifact, Checkpoint, Scalar
from theseus.store._root import RootFolders

__all__ = ["StoreReader", "check_node"]

T = TypeVar("T")


class StoreReader(abc.ABC):
    """What a store answers; :class:`~theseus.store.Store` opens it and adds the writes.

    Attributes:
        root: the store's folder, canonical.
        db_path: its database file (SQLite).
        database: where its rows are: the SQLite file, or the URL without a password.
        dialect: the SQL its backend speaks where the backends differ (``_dialect``).
        blobs: its blob folder.
        folders: the owner of the question which folders are this root's.
        inline_max: artifacts of at most this many bytes live in the database.
    """

    root: Path
    db_path: Path
    database: str
    dialect: Dialect
    blobs: BlobFolder
    folders: RootFolders
    inline_max: int

    @abc.abstractmethod
    def read(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(conn)`` in one read snapshot (the Store's transaction)."""

    @abc.abstractmethod
    def read_one(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        """Run one SELECT statement (the Store's connection)."""

    def checkpoint_path(self, path: str, relative: int) -> Path:
        """The checkpoint path a row's stored ``(path, relative)`` names (``RootFolders.path``)."""
        return self.folders.path(path, relative)

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
            CorruptStoreError: if they do not hash to ``digest``.
        """
        if size > self.inline_max:
            return self.blobs.read(digest, size)
        where = f"The inline blob {digest} in {self.database}"
        if fetched is not None:
            return verified(fetched, digest, size, where)
        row = self.read(
            lambda conn: conn.execute(
                "SELECT content FROM inline WHERE hash = ?", (digest,)
            ).fetchone()
        )
        if row is None:
            raise MissingBlobError(
                f"{where} is missing (expected {size} bytes). Restore {self.database} from "
                "a backup; `theseus-store fsck ROOT` lists every missing blob."
            )
        return verified(bytes(row[0]), digest, size, where)

    def get(self, node: Node) -> dict[str, Artifact]:
        """Return ``node``'s current artifacts by name.

        Raises:
            UnknownNodeError: if the store never recorded ``node``.
        """
        check_node(node)
        rows = self.read_one(
            _lineage.current_artifacts(self.dialect), (node.name, node.nonce, node.seq)
        )
        if not rows:  # no artifacts, or no such node: tell the two apart
            self.read(lambda conn: _lineage.lookup(conn, node))
        me = node.identity()
        return {row[0]: Artifact.from_row(me, row, self.load) for row in rows}

    def history(self, node: Node, name: str) -> list[Artifact]:
        """Return every version of artifact ``name`` on ``node``, oldest first.

        Raises:
            UnknownNodeError: if the store never recorded ``node``.
        """
        check_node(node)
        rows = self.read(lambda conn: _lineage.artifact_history(conn, node, name))
        return [self.artifact_from_row(node.identity(), row) for row in rows]

    def values(self, node: Node) -> dict[str, Scalar]:
        """Return ``node``'s folded values (one mapping, later writes of a key win).

        Raises:
            UnknownNodeError: if the store never recorded ``node``.
        """
        check_node(node)
        return self.read(lambda conn: _lineage.folded_values(conn, node))

    def checkpoints(self, node: Node) -> list[Checkpoint]:
        """Return ``node``'s checkpoint entries in the order they were recorded.

        Raises:
            UnknownNodeError: if the store never recorded ``node``.
        """
        check_node(node)
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
        check_node(node)
        return self.read(lambda conn: _lineage.neighbours(conn, node, up=True))

    def children(self, node: Node) -> list[Node]:
        """Return the nodes that have a parent edge to ``node``, in creation order.

        Raises:
            UnknownNodeError: if the store never recorded ``node``.
        """
        check_node(node)
        return self.read(lambda conn: _lineage.neighbours(conn, node, up=False))

    def ancestors(self, node: Node) -> list[Node]:
        """Return every node reachable through parent edges, nearest first.

        Raises:
            UnknownNodeError: if the store never recorded ``node``.
        """
        check_node(node)
        return self.read(lambda conn: _lineage.ancestors(conn, node))

    def job_config(self, node: Node) -> str | None:
        """Return the YAML recorded by the job in effect at ``node``, or None.

        The job in effect is the latest record at the closest node at or before
        ``node`` in its lineage (same name and nonce, largest seq <= node.seq),
        else, through the branch parent edge, in the lineage it branched from.
        """
        check_node(node)
        found = self.read(lambda conn: _lineage.job_record(conn, node))
        return None if found is None else found[1]

    def job_of(self, node: Node) -> str | None:
        """Return the registry key of the job in effect at ``node`` (see job_config)."""
        check_node(node)
        found = self.read(lambda conn: _lineage.job_record(conn, node))
        return None if found is None else found[0]

    def resolve(self, text: str) -> Node:
        """The node a user wrote: ``project.group.run~nonce~seq``, ``...~nonce`` for the
        last node of that lineage (the form ``theseus-store runs`` prints; the run's name
        alone may stand for ``project.group.run``), or a run alone (``run`` or
        ``project.group.run``) for the last node of its one lineage.

        Raises:
            InvalidNodeError: ``text`` is none of these forms.
            InvalidNodeError: a run alone that has several lineages.
            UnknownNodeError: the store has no such run, lineage or node in it; the
                message names what it does have.
        """
        return _resolve.resolve(self, text)

    def never_started(self, run: Mapping[str, Any]) -> str | None:
        """Why a lineage's job never started (failed or killed while setting up), else None.

        ``run`` is one of :meth:`runs`' summaries (see ``_resolve.never_started``).
        """
        return _resolve.never_started(self, run)

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
        check_node(node)
        return self.read(lambda conn: _browse.job_in_lineage(conn, node))

    def lineage_outline(self, name: str, nonce: str) -> dict[str, Any]:
        """A lineage's seqs, its checkpoint/artifact/job/branch-point seqs, where it branched
        from and the lineages that branch from it (see ``_browse.lineage_outline``)."""
        return self.read(lambda conn: _browse.lineage_outline(conn, name, nonce))

    def artifact_frames(self, name: str, nonce: str, artifact: str) -> list[dict[str, Any]]:
        """Every node along the stitched lineage holding ``artifact``: node, seq, versions
        ``[(version, filename)]``, train/step and val/loss (see ``_browse.artifact_frames``)."""
        return self.read(lambda conn: _browse.artifact_frames(conn, name, nonce, artifact))

    def artifact_files(self, name: str, nonce: str) -> dict[str, list[str]]:
        """Each artifact name along the stitched lineage, with its versions' filenames."""
        return self.read(lambda conn: _browse.artifact_files(conn, name, nonce))

    def artifact_names(self, name: str, nonce: str) -> list[str]:
        """The artifact names anywhere along the stitched lineage, sorted."""
        return self.read(lambda conn: _browse.artifact_names(conn, name, nonce))


def check_node(node: object) -> None:
    """Refuse anything but a Node where a Node is expected.

    Raises:
        ValueTypeError: naming what arrived and how to build a Node.
    """
    if not isinstance(node, Node):
        raise ValueTypeError(
            f"Expected a theseus.store.Node; got {type(node).__name__}. Build one with "
            "Node.new(run) or Node.deserialize(text)."
        )
