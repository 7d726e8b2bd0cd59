"""The consistency check: every row has its blob with the right hash.

Findings come in two classes:

* **problems** (the store may give a wrong or no answer): SQLite's
  ``integrity_check`` fails; a row names a blob that is missing; a blob's bytes
  do not hash to its name; a row points at a node that does not exist; a
  registered checkpoint is missing on disk or is an orbax step folder that never
  committed (see ``_folders.incomplete``). Blobs
  are checked wherever they live: small ones in the database's ``inline``
  table, larger ones in the blob folder.
* **leftovers** (harmless, the residue of an interrupted write): *orphan
  temporary files* in ``blobs/tmp`` whose writer process is gone, and
  *unreferenced blobs*, complete blob files that no row names (the writer died
  after the rename and before its row committed). Temporary files of a live
  writer are listed as in progress and never touched.

Checkpoint folders (see ``_folders``; which ones are this root's, ``_root`` alone
decides) have leftovers of their own: *unregistered
checkpoints*, complete step folders the store never indexed (the writer died
between orbax's commit and the registration), and *interrupted checkpoints*,
orbax temporary folders of a save that never finished. A folder whose writer
lock a live process holds is listed as busy and not looked into. Only this root's
own ``ROOT/checkpoints/<project>/<group>/<run>/<nonce>`` folders (and folders
inside the store's folder that hold registered checkpoints) are looked into; a
digit-named run or nonce is never mistaken for a step. A registered checkpoint
outside the root is checked (missing, incomplete) and reported as outside; a
lineage folder of another root, reached through a shared ``checkpoints/``, is
reported and never looked into.

A store is *clean* when there are no problems. ``repair=True`` removes the blob
leftovers while holding the write lock (so no write is in flight), and moves
checkpoint leftovers into their folder's ``unregistered/`` subfolder while
holding that folder's writer lock; it never deletes a checkpoint and never
touches rows or referenced blobs. It never moves a registered checkpoint, even a
missing or incomplete one (that is a problem for a person to look at).
"""

from __future__ import annotations

import dataclasses
import hashlib
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

from theseus.store._blobs import BlobFolder
from theseus.store._dialect import Connection, dialect
from theseus.store._folders import (
    FolderLock,
    RootStore,
    checkpoint_folders,
    incomplete,
    named_checkpoints,
    set_aside,
    strays,
)
from theseus.store._lineage import checkpoint_layouts
from theseus.store._paths import canonical_path
from theseus.store._schema import COPY_UNFINISHED

__all__ = ["CheckedStore", "FsckReport", "fsck", "unfinished_copy"]

T = TypeVar("T")


class CheckedStore(RootStore, Protocol):
    """What the check asks of a store besides its folders (``Store`` is one)."""

    database: str
    blobs: BlobFolder
    inline_max: int

    def write(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn(conn)`` in one write transaction."""


_DANGLING = (
    ("vals", "node"),
    ("artifacts", "node"),
    ("checkpoints", "node"),
    ("jobs", "node"),
    ("edges", "child"),
    ("edges", "parent"),
)


@dataclasses.dataclass
class FsckReport:
    """What ``fsck`` found.

    Attributes:
        root: the store checked.
        problems: one message per defect (each names the file involved).
        orphan_temps: temporary files whose writer is gone.
        unreferenced_blobs: complete blob files no row names.
        in_progress: temporary files of writers that are still running.
        removed: leftovers deleted by ``repair=True``.
        unregistered_checkpoints: complete step folders the store does not list.
        interrupted_checkpoints: temporary folders of checkpoint saves that never finished.
        busy_folders: checkpoint folders a live writer holds (not inspected).
        set_aside: where ``repair=True`` moved checkpoint leftovers (``unregistered/``).
        outside: registered checkpoints outside this root (its store folder and its
            checkpoint tree): checked, never touched.
        foreign_folders: lineage folders in this root's checkpoint tree that are not
            its own (another root's, through a shared ``checkpoints/``), each with
            whose it is: never looked into.
        artifacts: artifact rows checked.
        blobs: distinct blobs checked.
        checkpoints: registered checkpoints checked.
    """

    root: Path
    problems: list[str] = dataclasses.field(default_factory=list)
    orphan_temps: list[Path] = dataclasses.field(default_factory=list)
    unreferenced_blobs: list[Path] = dataclasses.field(default_factory=list)
    in_progress: list[Path] = dataclasses.field(default_factory=list)
    removed: list[Path] = dataclasses.field(default_factory=list)
    unregistered_checkpoints: list[Path] = dataclasses.field(default_factory=list)
    interrupted_checkpoints: list[Path] = dataclasses.field(default_factory=list)
    busy_folders: list[Path] = dataclasses.field(default_factory=list)
    set_aside: list[Path] = dataclasses.field(default_factory=list)
    outside: list[Path] = dataclasses.field(default_factory=list)
    foreign_folders: list[tuple[Path, str]] = dataclasses.field(default_factory=list)
    artifacts: int = 0
    blobs: int = 0
    checkpoints: int = 0

    @property
    def clean(self) -> bool:
        """True when there is no problem (leftovers do not make a store unclean)."""
        return not self.problems

    def render(self) -> str:
        """Return the report as the text ``theseus-store fsck`` prints."""
        lines = [
            f"fsck {self.root}: {self.artifacts} artifact rows, {self.blobs} blobs, "
            f"{self.checkpoints} registered checkpoints checked"
        ]
        lines += [f"PROBLEM {p}" for p in self.problems]
        for label, paths in (
            ("orphan temporary file (interrupted write, safe to remove)", self.orphan_temps),
            ("unreferenced blob (interrupted write, safe to remove)", self.unreferenced_blobs),
            ("in progress (a live writer's temporary file)", self.in_progress),
            ("removed", self.removed),
            (
                "unregistered checkpoint (complete, never indexed; --repair sets it aside)",
                self.unregistered_checkpoints,
            ),
            (
                "interrupted checkpoint (a save that never finished; --repair sets it aside)",
                self.interrupted_checkpoints,
            ),
            ("busy checkpoint folder (a live run writes there; not inspected)", self.busy_folders),
            ("set aside", self.set_aside),
            ("registered outside this root (checked, never moved)", self.outside),
        ):
            lines += [f"{label}: {p}" for p in paths]
        lines += [
            f"not this root's checkpoint folder ({whose}; left alone): {folder}"
            for folder, whose in self.foreign_folders
        ]
        lines.append("clean" if self.clean else f"NOT CLEAN: {len(self.problems)} problem(s)")
        return "\n".join(lines)


def unfinished_copy(store: CheckedStore, source: str) -> str:
    """The line for a store that an interrupted ``theseus-store copy`` from ``source`` left."""
    here = shlex.quote(str(store.folders.theseus_root or store.root))
    return (
        f"{store.database} is an unfinished copy of {source}: it may lack rows, bytes or "
        f"folders of the source. Run `theseus-store copy {shlex.quote(source)} {here}` again "
        "to finish and verify it."
    )


def fsck(store: CheckedStore, repair: bool = False) -> FsckReport:
    """Check ``store`` and optionally remove leftovers.

    Args:
        store: the store to check.
        repair: delete orphan temporary files and unreferenced blobs.

    Returns:
        The report.

    Raises:
        CorruptStoreError: if the database cannot be read at all.
    """
    report = FsckReport(store.root)

    def inspect(conn: Connection) -> dict[str, int]:
        d = dialect(conn)
        report.problems += [f"{store.database}: {p}" for p in d.integrity_problems(conn)]
        copying = conn.execute("SELECT value FROM meta WHERE key = ?", (COPY_UNFINISHED,))
        for (source,) in copying.fetchall():
            report.problems.append(unfinished_copy(store, str(source)))
        for table, column in _DANGLING:
            (count,) = conn.execute(
                f"SELECT COUNT(*) FROM {table} t WHERE NOT EXISTS "
                f"(SELECT 1 FROM nodes n WHERE n.id = t.{column})"
            ).fetchone()
            if count:
                report.problems.append(
                    f"{store.database}: {count} row(s) of table {table} point at missing nodes"
                )
        (stale,) = conn.execute(
            "SELECT COUNT(*) FROM nodes n WHERE "
            + d.differs("n.ckpt", "(SELECT MAX(c.id) FROM checkpoints c WHERE c.node = n.id)")
        ).fetchone()
        if stale:
            report.problems.append(
                f"{store.database}: {stale} node(s) whose latest-checkpoint pointer disagrees "
                "with the checkpoint table"
            )
        (report.artifacts,) = conn.execute("SELECT COUNT(*) FROM artifacts").fetchone()
        inline = conn.execute(
            "SELECT a.hash, a.size, i.content FROM (SELECT hash, MAX(size) AS size FROM "
            "artifacts WHERE size <= ? GROUP BY hash) a LEFT JOIN inline i ON i.hash = a.hash",
            (store.inline_max,),
        )
        for digest, size, content in inline:
            report.blobs += 1
            where = f"The inline blob {digest} in {store.database}"
            if content is None:
                report.problems.append(f"{where} is missing (expected {size} bytes)")
            elif hashlib.sha256(content).hexdigest() != digest:
                report.problems.append(f"{where} is corrupt: its bytes do not hash to {digest}")
        return dict(
            conn.execute(
                "SELECT hash, MAX(size) FROM artifacts WHERE size > ? GROUP BY hash",
                (store.inline_max,),
            )
        )

    referenced = store.read(inspect)
    report.blobs += len(referenced)
    for digest, size in referenced.items():
        trouble = store.blobs.check(digest, size)
        if trouble is not None:
            report.problems.append(trouble)

    def leftovers(conn: Connection | None) -> None:
        refs = (
            referenced
            if conn is None
            else {r[0] for r in conn.execute("SELECT DISTINCT hash FROM artifacts")}
        )
        report.unreferenced_blobs = [p for d, p in store.blobs.stored() if d not in refs]
        report.orphan_temps, report.in_progress = [], []
        for temp in store.blobs.temp_files():
            (report.orphan_temps if temp.orphan else report.in_progress).append(temp.path)
        if conn is not None:
            for path in report.orphan_temps + report.unreferenced_blobs:
                path.unlink(missing_ok=True)
                report.removed.append(path)

    if repair:
        store.write(leftovers)
    else:
        leftovers(None)
    _checkpoint_leftovers(store, report, repair)
    return report


def _registered_rows(store: CheckedStore) -> list[tuple[Path, str, int]]:
    """``(canonical path, node as name~nonce~seq, step)`` of every checkpoint row."""
    return [
        (canonical_path(store.checkpoint_path(path, relative)), f"{name}~{nonce}~{seq}", step)
        for path, relative, name, nonce, seq, *_, step in store.read(checkpoint_layouts)
    ]


def _checkpoint_leftovers(store: CheckedStore, report: FsckReport, repair: bool) -> None:
    for path, node, step in sorted(set(_registered_rows(store))):
        report.checkpoints += 1
        if not store.folders.inside(path):
            report.outside.append(path)
        if not path.exists():
            report.problems.append(
                f"The registered checkpoint {path} (node {node}, step {step}) is missing: "
                "put the folder back there or restore it from a backup (a root moves as a "
                "whole, its store/ and checkpoints/ together); until then that node cannot "
                "be resumed from this step"
            )
        elif incomplete(path):
            report.problems.append(
                f"The registered checkpoint {path} (node {node}, step {step}) is incomplete: "
                "an orbax step folder without its commit marker _CHECKPOINT_METADATA (the "
                "save never finished); restore it from a backup, or resume or branch from "
                "an earlier checkpoint"
            )
    report.foreign_folders = store.folders.lineage_folders()[1]
    for folder in checkpoint_folders(store):
        if not folder.is_dir():  # the folder of a missing checkpoint: reported above
            continue
        lock = FolderLock(folder)
        if repair:
            if not lock.acquire():
                report.busy_folders.append(folder)
                continue
        elif lock.in_use():
            report.busy_folders.append(folder)
            continue
        try:
            registered = named_checkpoints(store)
            unregistered, interrupted = strays(folder, registered)
            # a step folder without orbax's commit marker is a save that never finished
            interrupted += [p for p in unregistered if incomplete(p)]
            unregistered = [p for p in unregistered if p not in interrupted]
            # a registered path is never a stray, whatever its name looks like
            interrupted = [p for p in interrupted if canonical_path(p) not in registered]
            report.unregistered_checkpoints += unregistered
            report.interrupted_checkpoints += interrupted
            if repair:
                report.set_aside += set_aside(unregistered + interrupted)
        finally:
            lock.release()
