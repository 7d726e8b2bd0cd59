"""The content-addressed blob folder: bytes stored once, under their SHA-256.

Layout: ``blobs/<first two hex digits>/<sha256 hex>``, plus ``blobs/tmp/`` for
writes in progress. A write goes to a temporary file named after the writing
host and process, is fsynced, renamed to its hash name and the directory is
fsynced; only then may a database row point at it. A temporary file whose
writer process is gone is an *orphan*: the leftover of a write that never
finished, never referenced by any row, harmless, and removed by ``fsck --repair``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import secrets
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from theseus.store._errors import CorruptStoreError, MissingBlobError, StorePermissionError

__all__ = ["BlobFolder", "TempFile", "fsync_dir", "verified"]

_FOREIGN_HOST_GRACE_S = 24 * 3600.0


def fsync_dir(path: Path) -> None:
    """Flush a directory's entries (a rename or a new file) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclasses.dataclass(frozen=True)
class TempFile:
    """A temporary file in ``blobs/tmp`` and whether its writer may still be running."""

    path: Path
    host: str
    pid: int
    orphan: bool


class BlobFolder:
    """Reads and writes blobs under ``root/blobs``.

    Args:
        root: the store's root folder.
    """

    def __init__(self, root: Path) -> None:
        self.dir = root / "blobs"
        self.tmp = self.dir / "tmp"
        self._host = socket.gethostname().replace("-", "_") or "host"

    def create(self) -> None:
        """Create the blob folder and its ``tmp/`` (idempotent) and flush their entries.

        A fan-out folder (``blobs/<two hex digits>``) is made by the first write that
        needs it (one ``mkdir`` and one directory fsync, at most 256 times in a
        store's life), so a new store costs two folders, not 258, and a scan of the
        blobs (fsck) reads only the folders that hold any.
        """
        self.tmp.mkdir(parents=True, exist_ok=True)
        fsync_dir(self.dir)
        fsync_dir(self.dir.parent)

    def path(self, digest: str) -> Path:
        """Return the file that holds the blob ``digest``."""
        return self.dir / digest[:2] / digest

    def temp_path(self, pid: int) -> Path:
        """Return a fresh temporary file name for a writer process ``pid`` on this host."""
        return self.tmp / f"{self._host}-{pid}-{secrets.token_hex(6)}.tmp"

    def write(self, content: bytes, digest: str, defer: set[Path] | None = None) -> bool:
        """Store ``content`` under ``digest`` durably; return False if it was already there.

        Args:
            content: the bytes.
            digest: their SHA-256 in hex (the caller computed it).
            defer: if given, the renamed file's directory is added to this set instead
                of being fsynced now; the caller must fsync those directories before it
                commits a row that names the blob (a batch does so once per directory).

        Returns:
            True if a new blob file was written.

        Raises:
            StorePermissionError: if the blob folder cannot be written.
        """
        final = self.path(digest)
        if final.exists() and final.stat().st_size == len(content):
            return False
        temp = self.temp_path(os.getpid())
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                view = memoryview(content)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.chmod(temp, 0o444)
            if not final.parent.is_dir():
                final.parent.mkdir(exist_ok=True)
                fsync_dir(self.dir)
            os.replace(temp, final)
            if defer is None:
                fsync_dir(final.parent)
            else:
                defer.add(final.parent)
        except PermissionError as err:
            raise StorePermissionError(
                f"Cannot write the blob file {err.filename or temp}: {err.strerror}. "
                f"Make {self.dir} writable by this user, or open the store read-only."
            ) from err
        finally:
            if temp.exists():
                temp.unlink()
        return True

    def read(self, digest: str, size: int) -> bytes:
        """Return the bytes of blob ``digest``, checked against the digest.

        Raises:
            CorruptStoreError: if the file is absent.
            CorruptStoreError: if its bytes do not hash to ``digest``.
        """
        path = self.path(digest)
        try:
            data = path.read_bytes()
        except FileNotFoundError as err:
            raise MissingBlobError(
                f"The blob file {path} is missing (expected {size} bytes with SHA-256 "
                f"{digest}). Restore it from a backup; `theseus-store fsck ROOT` lists "
                "every missing blob."
            ) from err
        return verified(data, digest, size, f"The blob file {path}")

    def check(self, digest: str, size: int) -> str | None:
        """Return a description of what is wrong with blob ``digest``, or None if it is sound."""
        try:
            self.read(digest, size)
        except CorruptStoreError as err:
            return str(err)
        return None

    def stored(self) -> Iterator[tuple[str, Path]]:
        """Yield ``(digest, path)`` for every blob file (not the temporary ones)."""
        try:
            with os.scandir(self.dir) as top:  # d_type: no stat per entry
                subs = sorted(e.name for e in top if e.name != "tmp" and e.is_dir())
        except (FileNotFoundError, NotADirectoryError):
            return
        for sub in subs:
            with os.scandir(self.dir / sub) as entries:
                names = sorted(e.name for e in entries)
            for name in names:
                yield name, self.dir / sub / name

    def temp_files(self) -> list[TempFile]:
        """List the temporary files and decide which are orphans.

        A temporary file is an orphan when its writer (host and pid are in its
        name) is this host and the process no longer exists, or another host and
        the file is older than a day, or its name is not one this module makes.
        """
        if not self.tmp.is_dir():
            return []
        found = []
        for path in sorted(self.tmp.iterdir()):
            host, pid = "", -1
            parts = path.name.split("-")
            if len(parts) == 3 and parts[1].isdigit() and path.suffix == ".tmp":
                host, pid = parts[0], int(parts[1])
            if pid < 0:
                orphan = True
            elif host == self._host:
                orphan = not _alive(pid)
            else:
                orphan = time.time() - path.stat().st_mtime > _FOREIGN_HOST_GRACE_S
            found.append(TempFile(path, host, pid, orphan))
        return found


def verified(data: bytes, digest: str, size: int, where: str) -> bytes:
    """Return ``data`` if it hashes to ``digest``.

    Args:
        data: the bytes read.
        digest: the SHA-256 the store recorded.
        size: the size the store recorded.
        where: what was read (``The blob file PATH``), for the message.

    Raises:
        CorruptStoreError: if the bytes do not match.
    """
    actual = hashlib.sha256(data).hexdigest()
    if actual != digest:
        raise CorruptStoreError(
            f"{where} is corrupt: its bytes ({len(data)}) hash to {actual}, but the store "
            f"recorded {digest} ({size} bytes). Restore it from a backup; "
            "`theseus-store fsck ROOT` lists every damaged blob."
        )
    return data


def _alive(pid: int) -> bool:
    """Return whether a process with this id exists on this host."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
