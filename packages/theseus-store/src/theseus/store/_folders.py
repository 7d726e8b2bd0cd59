"""Checkpoint folders: which step folders the store lists, and who is writing there.

A *checkpoint folder* holds one lineage's checkpoints as step folders (``8/``,
``16/``, ...), the layout orbax's ``CheckpointManager`` writes. A step folder
appears under its final name only once it is complete (orbax writes into
``<step>.orbax-checkpoint-tmp-<n>`` and renames), and the store indexes it after
that. A crash can leave two kinds of strays:

* an **unregistered** step folder: complete on disk, but the process died before
  the store indexed it;
* an **interrupted** save: a temporary folder whose writer died mid-write.

Neither is ever deleted here. ``set_aside`` moves strays into the folder's
``unregistered/`` subfolder, where they no longer block a resumed run from
writing the same step again, and where a person can still look at them.

Under a Theseus root the layout is fixed:
``ROOT/checkpoints/<project>/<group>/<run>/<nonce>/<step>``. Only the folders at
depth 4 below ``ROOT/checkpoints`` are checkpoint folders, and only their direct
all-digit children are step folders; a run named ``2024`` or a nonce
``12345678`` is a plain name. Registered and found paths are compared in their
canonical form (:func:`~theseus.store._paths.canonical_path`: absolute, every
symlink, ``.`` and ``..`` resolved), so a symlinked, relative or ``..`` spelling
of the root never makes a registered checkpoint look unregistered, even in rows
an earlier version stored as spelled.

A registered step folder is *incomplete* (:func:`incomplete`) when it still has
an orbax temporary name, or carries orbax's traces (item subfolders with
orbax's files) without the commit marker ``_CHECKPOINT_METADATA`` that orbax
writes last. Any other registered path (a plain file or folder) is taken as is.

The process that writes checkpoints holds a :class:`FolderLock` on the folder
for as long as it writes, so ``fsck --repair`` leaves a live run's folder alone
and two processes cannot write one lineage at once. ``flock`` must work on the
checkpoint filesystem: any failure other than "held by someone else" is a
:class:`StoreError` that names the folder and its filesystem type.
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

from theseus.store._dialect import Connection
from theseus.store._errors import StoreError
from theseus.store._lineage import checkpoint_layouts
from theseus.store._paths import canonical_path
from theseus.store._root import RootFolders

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows has no fcntl; locks become no-ops there
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "COMMIT_MARKER",
    "SET_ASIDE",
    "WRITER_LOCK",
    "FolderBusyError",
    "FolderLock",
    "checkpoint_folders",
    "incomplete",
    "named_checkpoints",
    "open_lineage_folder",
    "registered_checkpoints",
    "set_aside",
    "strays",
]

T = TypeVar("T")


class RootStore(Protocol):
    """What the checkpoint folders ask of a store (``Store`` is one): its folder, the paths
    its rows name, and the owner of its root's folders."""

    root: Path
    folders: RootFolders

    def read(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn(conn)`` in one read snapshot."""

    def checkpoint_path(self, path: str, relative: int) -> Path:
        """The checkpoint path a row's stored ``(path, relative)`` names."""


SET_ASIDE = "unregistered"
WRITER_LOCK = ".writer.lock"
TEMP_MARK = ".orbax-checkpoint-tmp"
COMMIT_MARKER = "_CHECKPOINT_METADATA"  # orbax writes it last, when a step is committed
# files orbax writes into a step folder or its item subfolders (``state/``, ``meta/``)
_ORBAX_TRACES = frozenset({"_METADATA", "metadata", "commit_success.txt", "manifest.ocdbt"})
_BUSY = frozenset({errno.EWOULDBLOCK, errno.EAGAIN})


class FolderBusyError(StoreError):
    """Another live process holds the checkpoint folder's writer lock."""


def _filesystem(path: Path) -> str:
    """The type of the filesystem ``path`` lives on (``"unknown"`` if not found)."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return "unknown"
    where = canonical_path(path)
    best, kind = -1, "unknown"
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        if (where == Path(point) or Path(point) in where.parents) and len(point) > best:
            best, kind = len(point), fields[2]
    return kind


def _flock(fd: int, lock: Path) -> bool:
    """``flock(LOCK_EX | LOCK_NB)``: True if taken, False if another holder has it."""
    if fcntl is None:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in _BUSY:
            return False
        raise StoreError(
            f"Cannot lock {lock}: flock failed with {errno.errorcode.get(e.errno or 0, e.errno)} "
            f"({e.strerror}) on a {_filesystem(lock.parent)} filesystem; expected a filesystem "
            "with flock. Put the checkpoints on a local disk or a filesystem that supports flock."
        ) from e
    return True


class FolderLock:
    """An exclusive advisory lock (``flock``) on a checkpoint folder's ``.writer.lock``.

    The lock file records the holder's process id and host name, so an error can say
    who holds it. The lock dies with its process: a run killed with SIGKILL leaves
    the file behind but not the lock.

    Args:
        folder: the checkpoint folder (created if absent).
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder / WRITER_LOCK
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Take the lock without waiting; True if taken (or already held by this object)."""
        if self._fd is not None:
            return True
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # no O_TRUNC: the holder's record
        try:
            taken = _flock(fd, self.path)
        except BaseException:
            os.close(fd)
            raise
        if not taken:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)  # only once the lock is ours
        os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
        self._fd = fd
        return True

    def holder(self) -> str:
        """``"pid N on HOST"`` as the holder wrote it ("unknown" if unreadable)."""
        try:
            pid, _, host = self.path.read_text().strip().partition(" ")
        except OSError:
            return "unknown"
        return f"pid {pid} on {host}" if pid else "unknown"

    def release(self) -> None:
        """Release the lock (idempotent); the file stays."""
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def in_use(self) -> bool:
        """Whether another live process holds the lock (probes without keeping it).

        The probe opens the file read-only and never writes it, so a live holder's
        record stays as it wrote it.
        """
        if self._fd is not None:
            return False
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            if not _flock(fd, self.path):
                return True
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        finally:
            os.close(fd)


def registered_checkpoints(store: RootStore) -> set[Path]:
    """Every checkpoint path the store lists, canonical (:func:`canonical_path`)."""
    rows = store.read(checkpoint_layouts)
    return {canonical_path(store.checkpoint_path(row[0], row[1])) for row in rows}


def named_checkpoints(store: RootStore) -> set[Path]:
    """What ``--repair`` and a resuming trainer must never set aside, canonical.

    Every registered checkpoint path (:func:`registered_checkpoints`), and, for a
    Theseus root, the layout folder ``ROOT/checkpoints/<project>/<group>/<run>/<nonce>/<step>``
    of every registered (node, step), wherever its row says the checkpoint is: a
    folder that a row's node and step name is that checkpoint, not a stray.
    """
    named = set()
    for path, relative, _name, _nonce, _seq, project, group, run, step in store.read(
        checkpoint_layouts
    ):
        named.add(canonical_path(store.checkpoint_path(path, relative)))
        folder = store.folders.lineage_folder((str(project), str(group), str(run), str(_nonce)))
        if folder is not None:
            named.add(folder / str(step))
    return named


def open_lineage_folder(store: RootStore, folder: Path) -> list[Path]:
    """Take ``folder`` to write a lineage's checkpoints: claim it, set its strays aside.

    The trainer calls this with the folder's writer lock held, before its first
    save. Only a lineage folder of this root (``store.folders``) is taken: one that
    another root holds is refused before anything in it changes.

    Returns:
        The new paths of the strays set aside (see :func:`set_aside`).

    Raises:
        StorePermissionError: ``folder`` is another root's, or not a lineage folder
            of this root's checkpoint tree.
    """
    folder = canonical_path(folder)
    store.folders.take(folder)
    unregistered, interrupted = strays(folder, named_checkpoints(store))
    return set_aside(unregistered + interrupted)


def _is_step(entry: Path) -> bool:
    return entry.is_dir() and entry.name.isdigit()


def incomplete(path: Path) -> bool:
    """Whether a registered, existing ``path`` is an orbax step folder that never committed.

    True for a folder with an orbax temporary name, and for an all-digit folder that
    bears orbax's traces (``commit_success.txt``, or an item subfolder holding orbax's
    files) but lacks the commit marker ``_CHECKPOINT_METADATA``. Plain files and other
    folders are never incomplete: the store takes any path it was given.
    """
    if not path.is_dir():
        return False
    if TEMP_MARK in path.name:
        return True
    if not path.name.isdigit() or (path / COMMIT_MARKER).exists():
        return False
    try:
        for entry in path.iterdir():
            if entry.name in _ORBAX_TRACES:
                return True
            if entry.is_dir() and any(e.name in _ORBAX_TRACES for e in entry.iterdir()):
                return True
    except OSError:
        return False
    return False


def _is_temp(entry: Path) -> bool:
    step, mark, _ = entry.name.partition(TEMP_MARK)
    return bool(mark) and step.isdigit() and entry.is_dir()


def strays(folder: Path, registered: set[Path]) -> tuple[list[Path], list[Path]]:
    """The step folders in ``folder`` that the store does not list.

    Args:
        folder: a checkpoint folder.
        registered: the paths never to call strays, canonical (:func:`named_checkpoints`).

    Returns:
        ``(unregistered, interrupted)``: complete step folders no row names, and
        temporary folders of saves that never finished. Both sorted by step.
    """
    if not folder.is_dir():
        return [], []
    unregistered = [
        p for p in folder.iterdir() if _is_step(p) and canonical_path(p) not in registered
    ]
    interrupted = [p for p in folder.iterdir() if _is_temp(p)]

    def order(p: Path) -> tuple[int, str]:
        return int(p.name.partition(".")[0]), p.name

    return sorted(unregistered, key=order), sorted(interrupted, key=order)


def set_aside(entries: list[Path]) -> list[Path]:
    """Move each entry into ``<its folder>/unregistered/`` (``<name>-<n>`` if taken).

    Returns:
        The new paths, in the order of ``entries``.
    """
    moved = []
    for entry in entries:
        aside = entry.parent / SET_ASIDE
        aside.mkdir(exist_ok=True)
        target, n = aside / entry.name, 0
        while target.exists():
            n += 1
            target = aside / f"{entry.name}-{n}"
        entry.rename(target)
        moved.append(target)
    return moved


def checkpoint_folders(store: RootStore) -> list[Path]:
    """The checkpoint folders of this root that fsck looks into, canonical and sorted.

    The lineage folders of the root's checkpoint tree that are its own
    (``store.folders.lineage_folders()``), and the folders inside the store's own
    folder that hold registered checkpoints. Never a folder outside the root, never
    a lineage folder another root holds.
    """
    own, _ = store.folders.lineage_folders()
    inner = {
        path.parent for path in registered_checkpoints(store) if store.root in path.parent.parents
    }
    return sorted(set(own) | inner)
