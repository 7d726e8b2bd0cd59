"""Which folders belong to a root: the one place that decides.

A Theseus root is a folder with two parts: ``ROOT/store`` (the store: marker,
database, blobs) and ``ROOT/checkpoints`` (the checkpoint tree, one folder per
lineage at ``checkpoints/<project>/<group>/<run>/<nonce>``, its steps inside). A
bare store (a store folder not named ``store``) has no checkpoint tree.

:class:`RootFolders` answers every question about that territory; the store's
rows, fsck, a resuming trainer's set-aside, copies and migrations ask it, and
nothing else decides:

* how a checkpoint row holds a path (relative to the store, relative to the root,
  or absolute) and which path a row names (:meth:`RootFolders.row`,
  :meth:`RootFolders.path`, :meth:`RootFolders.migrated_row`);
* whether a path lies inside the root (:meth:`RootFolders.inside`): fsck reports
  a registered checkpoint outside it and never touches it;
* which lineage folders are this root's (:meth:`RootFolders.owns`), so that fsck
  and resume move nothing of another root's, even where two roots see one folder
  (a ``checkpoints/`` symlinked to a shared place, a root copied with its symlinks).

Ownership is written down where it is decided: when a run takes a lineage folder
to write checkpoints (:meth:`RootFolders.take`), it leaves a *claim* there
(``.theseus-root``): the store's path, the inode of the store's folder and the
inode of the lineage folder itself. Inodes tell the cases apart that paths
cannot: a root moved with ``mv`` keeps its store folder's inode (still the
claimant); a copy (``cp -a``, a partial copy, a move to another disk) gets new
inodes for the lineage folders it copied, so a claim that travelled with a copy
names another folder than the one it sits in and is stale (the copy's own, if
its store knows the lineage); a lineage folder that two roots see through a
shared ``checkpoints/`` keeps its inode, so the claim names the root that took it
and every other root leaves it alone. A lineage folder without a valid claim
(written before claims existed, or copied) is the root's only when its store knows
the lineage: a folder nobody can place is reported and never touched.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from theseus.store._errors import StorePermissionError
from theseus.store._paths import canonical_path

__all__ = ["CLAIM", "MARKER", "ROOT_FOLDERS", "STORE_FOLDER", "Lineage", "RootFolders"]

MARKER = "theseus-store.json"
#: The store's folder under a Theseus root, and under a PostgreSQL store's files folder.
STORE_FOLDER = "store"
#: What a Theseus root holds for its runs besides the store and the checkpoint tree, and
#: a copy of the root brings along: the prepared datasets (``ROOT/data/<name>``, which a
#: resumed run, an analysis and a model without ``architecture/tokenizer`` read) and the
#: tokenizers (``ROOT/tokenizers/<name>``), each entry whole (theseus-core's
#: ``dataset_dir`` and ``tokenizer_dir`` name the same folders).
ROOT_FOLDERS = ("data", "tokenizers")
CLAIM = ".theseus-root"
#: ``(project, group, run, nonce)``: a lineage's folder below ``ROOT/checkpoints``.
Lineage = tuple[str, str, str, str]
_LAYOUT_DEPTH = 4


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


class RootFolders:
    """The territory of the root whose store lives at ``store``.

    Args:
        store: the store's folder, canonical (``Store.root``).
        lineages: returns the lineages the store knows (``(project, group, run,
            nonce)`` of its nodes); asked only for lineage folders without a
            valid claim. None: where only the places are asked for (no lineage known).
    """

    def __init__(
        self, store: Path, lineages: Callable[[], Iterable[Lineage]] | None = None
    ) -> None:
        self.store = store
        self._lineages = lineages or (lambda: ())

    # -- the places ------------------------------------------------------------------------

    @property
    def spelled_tree(self) -> Path | None:
        """``ROOT/checkpoints`` as reached from the store's folder (a symlink kept), or None."""
        root = self.theseus_root
        return None if root is None else root / "checkpoints"

    @property
    def theseus_root(self) -> Path | None:
        """The Theseus root that holds the store folder (as reached from it), or None for a
        store of its own."""
        return self.store.parent if self.store.name == STORE_FOLDER else None

    @property
    def tree(self) -> Path | None:
        """The canonical checkpoint tree of a Theseus root (a symlink resolved), else None."""
        spelled = self.spelled_tree
        return None if spelled is None else canonical_path(spelled)

    def lineage_folder(self, lineage: Lineage) -> Path | None:
        """``ROOT/checkpoints/<project>/<group>/<run>/<nonce>``, canonical; None for a bare store."""
        tree = self.tree
        return None if tree is None else tree.joinpath(*lineage)

    def inside(self, path: Path) -> bool:
        """Whether canonical ``path`` lies in this root: its store folder or its checkpoint tree."""
        tree = self.tree
        return self.store in path.parents or (tree is not None and tree in path.parents)

    def layout(self, folder: Path) -> Lineage | None:
        """The lineage whose folder canonical ``folder`` is, if it is one of the tree's."""
        tree = self.tree
        if tree is None or tree not in folder.parents:
            return None
        parts = folder.relative_to(tree).parts
        return (parts[0], parts[1], parts[2], parts[3]) if len(parts) == _LAYOUT_DEPTH else None

    # -- rows ------------------------------------------------------------------------------

    def row(self, full: Path) -> tuple[str, int]:
        """``(path, relative)`` as a checkpoint row holds the canonical path ``full``.

        ``relative`` says what the stored path is relative to, so that a root moved
        or copied as a whole still finds its own checkpoints: 1, the store's folder;
        2, the folder that holds the store (a path in the checkpoint tree of a
        Theseus root, kept as ``checkpoints/...`` even where that tree is a symlink);
        0, nothing (any other path, kept absolute).
        """
        if self.store in full.parents:
            return str(full.relative_to(self.store)), 1
        tree = self.tree
        if tree is not None and tree in full.parents:
            return str(Path("checkpoints") / full.relative_to(tree)), 2
        return str(full), 0

    def path(self, stored: str, relative: int) -> Path:
        """The path a row's stored ``(path, relative)`` names (see :meth:`row`)."""
        if relative == 1:
            return self.store / stored
        if relative == 2:
            return self.store.parent / stored
        return Path(stored)

    def migrated_row(self, stored: str, relative: int, layout: tuple[str, ...]) -> tuple[str, int]:
        """A row's ``(path, relative)`` in this version's form (for rows earlier versions wrote).

        Earlier versions kept a checkpoint below ``ROOT/checkpoints`` absolute. Such
        a row is rewritten relative to the root when it lies in this root's tree,
        and also when the root has been moved or copied since: the row's path ends
        in ``checkpoints/<layout>`` (``layout`` = the node's project, group, run and
        nonce, and the row's step) and that folder exists in this root's tree. A
        row that names another root's folder and has no counterpart here stays as it
        is (fsck reports it as outside the root).
        """
        full = canonical_path(self.path(stored, relative))
        tree = self.tree
        if relative == 0 and tree is not None and tree not in full.parents:
            tail = full.parts[-len(layout) - 1 :]
            here = tree.joinpath(*layout)
            if tail == ("checkpoints", *layout) and here.exists():
                full = canonical_path(here)
        return self.row(full)

    # -- ownership -------------------------------------------------------------------------

    def claimant(self, folder: Path) -> str | None:
        """Who holds lineage folder ``folder`` if not this root: a phrase naming the root.

        None when the folder is this root's: its claim names this store's folder (by
        inode; the path may have changed with ``mv``), or it has no valid claim
        (none, damaged, or one that travelled with a copy) and the store knows its
        lineage. Otherwise the phrase says whose it is, for a message.
        """
        if self.layout(folder) is None:
            return "a folder outside this root's checkpoint tree"
        claim = _read_claim(folder)
        if claim is not None and claim.get("folder") == _inode(folder):
            if claim.get("store") == _inode(self.store):
                return None
            return f"claimed by the root whose store was at {claim.get('path', '?')}"
        if self.layout(folder) in set(self._lineages()):
            return None
        return "no lineage of this store, and no claim of this root"

    def owns(self, folder: Path) -> bool:
        """Whether lineage folder ``folder`` (canonical) is this root's (see :meth:`claimant`)."""
        return self.claimant(folder) is None

    def refuse_foreign(self, folder: Path) -> None:
        """Refuse, before anything there is touched, a lineage folder another root has claimed.

        Raises:
            StorePermissionError: naming the root that holds ``folder`` and how to take it
                back if that root is gone.
        """
        folder = canonical_path(folder)
        claim = _read_claim(folder)
        if claim is None or claim.get("folder") != _inode(folder):
            return
        if claim.get("store") == _inode(self.store):
            return
        raise StorePermissionError(
            f"The checkpoint folder {folder} belongs to the root whose store was at "
            f"{claim.get('path', '?')}: this root's checkpoints/ reaches the same folder "
            "(a shared or symlinked checkpoints/, or a copy made with its symlinks). Continue "
            "that lineage from its own root, or branch it into a new lineage here; if that "
            f"root no longer exists (deleted, or moved to another disk), delete {folder / CLAIM} "
            "and this root takes the folder."
        )

    def take(self, folder: Path) -> None:
        """Claim lineage folder ``folder`` for this root before writing checkpoints there.

        Called with the folder's writer lock held (``FolderLock``), after
        :meth:`refuse_foreign` was asked before taking the lock. A folder that a copy
        brought along, or that has no claim yet, becomes this root's; one that another
        root holds is refused.

        Raises:
            StorePermissionError: ``folder`` is not in this root's checkpoint tree, or
                another root holds it (the message names that root).
        """
        folder = canonical_path(folder)
        if self.layout(folder) is None:
            raise StorePermissionError(
                f"{folder} is not a lineage folder of the root {self.store.parent} (expected "
                f"{self.spelled_tree or self.store.parent / 'checkpoints'}/PROJECT/GROUP/RUN/NONCE); "
                "checkpoints of this store are written only there."
            )
        self.refuse_foreign(folder)
        folder.mkdir(parents=True, exist_ok=True)
        claim = _read_claim(folder)
        mine = {"path": str(self.store), "store": _inode(self.store), "folder": _inode(folder)}
        if claim != mine:
            _write_claim(folder, mine)

    def lineage_folders(self) -> tuple[list[Path], list[tuple[Path, str]]]:
        """The tree's lineage folders that hold steps: ``(this root's, [(other, whose)])``.

        Only folders at ``checkpoints/<project>/<group>/<run>/<nonce>`` (exactly that
        depth) that hold step or temporary folders count; all canonical, sorted.
        """
        tree = self.tree
        own: list[Path] = []
        others: list[tuple[Path, str]] = []
        if tree is None or not tree.is_dir():
            return own, others
        for folder in sorted(tree.glob("*/*/*/*")):
            try:
                if not folder.is_dir() or not any(_holds_steps(e) for e in folder.iterdir()):
                    continue
            except OSError:
                continue
            folder = canonical_path(folder)
            whose = self.claimant(folder)
            if whose is None:
                own.append(folder)
            else:
                others.append((folder, whose))
        return own, others


def _holds_steps(entry: Path) -> bool:
    name = entry.name.partition(".orbax-checkpoint-tmp")[0]
    return name.isdigit() and entry.is_dir()


def _read_claim(folder: Path) -> dict[str, object] | None:
    try:
        claim = json.loads((folder / CLAIM).read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return claim if isinstance(claim, dict) else None


def _write_claim(folder: Path, claim: Mapping[str, object]) -> None:
    """Write the claim atomically: a file of this process's own, renamed into place."""
    tmp = folder / f"{CLAIM}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
    try:
        tmp.write_text(json.dumps(claim) + "\n")
        os.replace(tmp, folder / CLAIM)
    finally:
        tmp.unlink(missing_ok=True)
