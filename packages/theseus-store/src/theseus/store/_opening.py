"""Making and finding a store's files: the marker, creation under a lock, clean removal.

A store's folder holds the marker ``theseus-store.json`` (its format), the
database and ``blobs/``. Creation is safe from any number of processes at once:
creators take an exclusive ``flock`` on ``.create.lock``, look for the marker
again under it, and exactly one writes the schema and renames its marker (written
under a name of its own, fsynced) into place. A folder that holds anything else
and no marker is never taken for a store.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from theseus.store._errors import CorruptStoreError, NotAStoreError
from theseus.store._root import MARKER
from theseus.store._schema import FORMAT, FORMATS_READ

try:
    import fcntl
except ImportError:  # pragma: no cover - no fcntl on Windows: creation is not serialized there
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "CREATE_LOCK",
    "DATABASE",
    "OWN_FILES",
    "exclusive",
    "inner_hint",
    "read_marker",
    "read_marker_entry",
    "refuse_foreign",
    "remove_files",
    "write_marker",
]

DATABASE = "store.sqlite"
CREATE_LOCK = ".create.lock"
OWN_FILES = frozenset(
    {
        MARKER,
        DATABASE,
        f"{DATABASE}-wal",
        f"{DATABASE}-shm",
        f"{DATABASE}-journal",
        "blobs",
        CREATE_LOCK,
    }
)


def _own_file(name: str) -> bool:
    """A file the store itself makes (a creator's marker temp file included)."""
    return name in OWN_FILES or (name.startswith(f"{MARKER}.") and name.endswith(".tmp"))


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if absent) inside the block."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def read_marker(root: Path) -> int:
    """Return the format in ``root``'s marker (one this version reads).

    Raises:
        CorruptStoreError: the marker is damaged or names a format this version
            does not read.
    """
    return int(read_marker_entry(root)["format"])


def read_marker_entry(root: Path) -> dict[str, Any]:
    """Return ``root``'s marker: its format, and for a PostgreSQL store its ``database``
    (a URL that reaches it, without a password) and the store's ``id``.

    Raises:
        CorruptStoreError: the marker is damaged or names a format this version
            does not read.
    """
    marker = root / MARKER
    try:
        fmt = json.loads(marker.read_text())["format"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
        raise CorruptStoreError(
            f"The store marker {marker} is damaged (expected JSON with a 'format' key): "
            f"{err}. Rewrite it as {json.dumps({'format': FORMAT})}."
        ) from err
    if fmt not in FORMATS_READ or isinstance(fmt, bool):
        raise CorruptStoreError(
            f"The store at {root} has format {fmt!r}; this theseus-store reads "
            f"formats {', '.join(map(str, FORMATS_READ))}. Install the theseus-store "
            "version that wrote it."
        )
    entry = json.loads(marker.read_text())
    if not isinstance(entry, dict) or (
        "database" in entry
        and not (isinstance(entry["database"], str) and isinstance(entry.get("id"), str))
    ):
        raise CorruptStoreError(
            f"The store marker {marker} is damaged: a PostgreSQL store's marker holds the "
            "strings 'database' and 'id'. Restore it from a backup."
        )
    return dict(entry)


def write_marker(root: Path, database: Mapping[str, str] | None = None) -> None:
    """Write the marker atomically (a file of this process's own, fsynced, renamed).

    Args:
        root: the store's folder.
        database: for a PostgreSQL store, its ``database`` (URL without a password)
            and ``id``; the marker of a store that has them keeps them.
    """
    marker = root / MARKER
    entry: dict[str, Any] = {"format": FORMAT}
    if database is None and marker.exists():
        with contextlib.suppress(ValueError, OSError):
            kept = json.loads(marker.read_text())
            database = {k: kept[k] for k in ("database", "id") if k in kept} or None
    entry.update(database or {})
    text = json.dumps(entry) + "\n"
    if marker.exists() and marker.read_text() == text:
        return
    tmp = root / f"{MARKER}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
    try:
        tmp.write_text(text)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, marker)
    finally:
        tmp.unlink(missing_ok=True)


def refuse_foreign(root: Path) -> None:
    """Refuse to create a store in a folder that holds files of something else.

    Raises:
        NotAStoreError: ``root`` holds a file the store does not make.
    """
    if not root.is_dir():
        return
    foreign = sorted(p.name for p in root.iterdir() if not _own_file(p.name))
    if foreign:
        shown = ", ".join(foreign[:5]) + (" ..." if len(foreign) > 5 else "")
        raise NotAStoreError(
            f"{root} is not empty ({shown}) and has no {MARKER}, so it is not a "
            f"theseus-store root.{inner_hint(root)} Pass an existing store root, "
            "or a new or empty folder (for example a 'store' subfolder) to create one."
        )


def remove_files(root: Path, blobs: Path) -> None:
    """Delete a store's own files and folders (an empty store's; nothing else)."""
    for name in sorted(OWN_FILES - {"blobs"}):
        (root / name).unlink(missing_ok=True)
    for folder in sorted(blobs.glob("*"), reverse=True):
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    with contextlib.suppress(OSError):
        blobs.rmdir()
        root.rmdir()


def inner_hint(root: Path) -> str:
    """A Theseus root keeps its store in `store/`: say so when that is what was meant."""
    inner = root / "store" / MARKER
    return f" It has a store in {root / 'store'}: pass that folder." if inner.exists() else ""
