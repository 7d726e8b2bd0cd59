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

The process that writes checkpoints holds a :class:`FolderLock` on the folder
for as long as it writes, so ``fsck --repair`` leaves a live run's folder alone
and two processes cannot write one lineage at once.
"""

from __future__ import annotations

import os
import socket
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

from theseus.store._errors import StoreError

if TYPE_CHECKING:
    from theseus.store._store import Store

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows has no fcntl; locks become no-ops there
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "SET_ASIDE",
    "WRITER_LOCK",
    "FolderBusyError",
    "FolderLock",
    "checkpoint_folders",
    "registered_checkpoints",
    "set_aside",
    "strays",
]

SET_ASIDE = "unregistered"
WRITER_LOCK = ".writer.lock"
TEMP_MARK = ".orbax-checkpoint-tmp"


class FolderBusyError(StoreError):
    """Another live process holds the checkpoint folder's writer lock."""


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
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                return False
        os.ftruncate(fd, 0)
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
        """Whether another live process holds the lock (probes without keeping it)."""
        if self._fd is not None or not self.path.exists():
            return False
        if not self.acquire():
            return True
        self.release()
        return False


def registered_checkpoints(store: Store) -> set[Path]:
    """Every checkpoint path the store lists, as absolute paths."""

    def read(conn: sqlite3.Connection) -> list[tuple[str, int]]:
        return list(conn.execute("SELECT path, relative FROM checkpoints"))

    return {(store.root / path) if relative else Path(path) for path, relative in store.read(read)}


def _is_step(entry: Path) -> bool:
    return entry.is_dir() and entry.name.isdigit()


def _is_temp(entry: Path) -> bool:
    step, mark, _ = entry.name.partition(TEMP_MARK)
    return bool(mark) and step.isdigit() and entry.is_dir()


def strays(folder: Path, registered: set[Path]) -> tuple[list[Path], list[Path]]:
    """The step folders in ``folder`` that the store does not list.

    Args:
        folder: a checkpoint folder.
        registered: the store's checkpoint paths (:func:`registered_checkpoints`).

    Returns:
        ``(unregistered, interrupted)``: complete step folders no row names, and
        temporary folders of saves that never finished. Both sorted by step.
    """
    if not folder.is_dir():
        return [], []
    unregistered = [p for p in folder.iterdir() if _is_step(p) and p.absolute() not in registered]
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


def checkpoint_folders(store: Store) -> list[Path]:
    """The checkpoint folders fsck looks at.

    The folders that hold the store's checkpoints, and, for a Theseus root (the
    store at ``ROOT/store``), every folder under ``ROOT/checkpoints`` that holds
    step folders, so a lineage that crashed before its first registration is
    found too.
    """
    folders = {path.parent for path in registered_checkpoints(store)}
    tree = store.root.parent / "checkpoints"
    if store.root.name == "store" and tree.is_dir():
        for where, subdirs, _files in os.walk(tree):
            here = Path(where)
            steps = [d for d in subdirs if d.isdigit() or TEMP_MARK in d]
            if steps:
                folders.add(here)
            # never descend into step folders (orbax's many files) or set-aside ones
            subdirs[:] = [d for d in subdirs if d not in steps and d != SET_ASIDE]
    return sorted(folders)
