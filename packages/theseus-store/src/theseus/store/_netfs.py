"""Whether a store's database sits on a network filesystem, and the warning when it does.

SQLite relies on POSIX locks and, in WAL mode, on shared memory (``-shm``) that every
process maps: NFS, Lustre and their kind break the first and cannot share the second
across machines, so a database there can be corrupted or lose commits. Opening a
SQLite store on such a filesystem warns once per process and database path
(:class:`NetworkFilesystemWarning`); ``THESEUS_STORE_NETWORK_FS=ok`` silences it.

The filesystem type comes from ``/proc/self/mountinfo`` (the mount with the longest
mount point that holds the path), which names it precisely (``nfs4``,
``fuse.sshfs``); ``statfs(2)`` through ctypes is the fallback, which knows only a
magic number (``nfs`` for every NFS version, ``fuse`` for every FUSE filesystem).
Plain ``fuse`` is not taken for a network filesystem: it is as often local (rootless
containers run on fuse-overlayfs), and where mountinfo is readable, which is everywhere
on Linux but in the rarest sandboxes, the network FUSE filesystems are named by their
subtype. Elsewhere than Linux the type is unknown and nothing is said.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from pathlib import Path

__all__ = [
    "ENV",
    "MAGIC",
    "NETWORK_TYPES",
    "NetworkFilesystemWarning",
    "filesystem_type",
    "mountinfo_type",
    "statfs_type",
    "type_from_mountinfo",
    "warn_if_network",
]

#: The environment variable that silences the warning when set to ``ok``.
ENV = "THESEUS_STORE_NETWORK_FS"

#: The names under which a network or cluster filesystem is mounted (mountinfo's type
#: field), and the names :data:`MAGIC` gives the network ones among statfs's numbers.
NETWORK_TYPES = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb",
        "smb2",
        "smb3",
        "smbfs",
        "ncpfs",
        "coda",
        "lustre",
        "gpfs",
        "ceph",
        "glusterfs",
        "beegfs",
        "afs",
        "9p",
        "panfs",
        "ocfs2",
        "gfs2",
        "orangefs",
        "pvfs2",
        "wekafs",
        "davfs",
        "fuse.glusterfs",
        "fuse.sshfs",
        "fuse.s3fs",
        "fuse.gcsfuse",
        "fuse.rclone",
        "fuse.juicefs",
        "fuse.ceph-fuse",
        "fuse.mfs",
        "fuse.lizardfs",
        "fuse.davfs",
        "fuse.goofys",
        "fuse.blobfuse",
        "fuse.blobfuse2",
    }
)

#: statfs's ``f_type`` magic numbers (``linux/magic.h`` and the filesystems' own
#: headers) and their names: the network filesystems, and a few local ones so that a
#: local filesystem has a name too (ext2, ext3 and ext4 share one number).
MAGIC = {
    0x6969: "nfs",
    0x517B: "smb",
    0xFF534D42: "cifs",
    0xFE534D42: "smb2",
    0x0BD00BD0: "lustre",
    0x47504653: "gpfs",
    0x65735546: "fuse",
    0x00C36400: "ceph",
    0x5346414F: "afs",
    0x01021997: "9p",
    0x19830326: "beegfs",
    0xAAD7AAEA: "panfs",
    0x7461636F: "ocfs2",
    0x01161970: "gfs2",
    0xEF53: "ext4",
    0x58465342: "xfs",
    0x9123683E: "btrfs",
    0x2FC12FC1: "zfs",
    0x01021994: "tmpfs",
    0x794C7630: "overlay",
    0x9FA0: "proc",
    0x62656572: "sysfs",
}

_MOUNTINFO = Path("/proc/self/mountinfo")
_ESCAPE = re.compile(r"\\([0-7]{3})")

# The database paths warned about in this process: each at most once.
_WARNED: set[str] = set()


class NetworkFilesystemWarning(UserWarning):
    """A SQLite store is opened on a network filesystem, where SQLite is not safe."""


def _existing(path: Path) -> Path:
    """``path`` made absolute and resolved, or its nearest ancestor that exists."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path.resolve()


def _unescape(field: str) -> str:
    """A mountinfo path field with its octal escapes (``\\040`` a space) decoded."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def type_from_mountinfo(text: str, path: str) -> str | None:
    """The filesystem type of the mount that holds ``path``, read from mountinfo text.

    Args:
        text: the contents of ``/proc/self/mountinfo``: per line the mount id, parent
            id, device, root, mount point, options, optional fields, ``-``, then the
            filesystem type, source and super options.
        path: an absolute, resolved path.

    Returns:
        The type field of the line whose mount point is the longest prefix of
        ``path`` (of two lines with one mount point, the later, which is mounted over
        the earlier), or None where no line holds it.
    """
    best: tuple[int, str] | None = None
    for line in text.splitlines():
        fields = line.split(" ")
        if " - " not in line or len(fields) < 5:
            continue
        point = _unescape(fields[4])
        after = line.split(" - ", 1)[1].split(" ")
        inside = point == "/" or path == point or path.startswith(point.rstrip("/") + "/")
        if inside and after[0] and (best is None or len(point) >= best[0]):
            best = (len(point), after[0])
    return best[1] if best is not None else None


def mountinfo_type(path: Path) -> str | None:
    """The filesystem type of ``path``'s mount from ``/proc/self/mountinfo`` (None: unreadable)."""
    try:
        text = _MOUNTINFO.read_text(errors="surrogateescape")
    except OSError:
        return None
    return type_from_mountinfo(text, str(_existing(path)))


def statfs_type(path: Path) -> str | None:
    """The filesystem type of ``path`` from ``statfs(2)``'s magic number (Linux only).

    Returns:
        The name in :data:`MAGIC`, ``0x...`` for a number it does not list, or None
        where statfs cannot be called (not Linux, no ctypes, the call failed).
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        # struct statfs begins with f_type, a long on x86_64 and aarch64; the buffer is
        # larger than the whole struct on every Linux.
        buffer = (ctypes.c_long * 64)()
        if libc.statfs(os.fsencode(_existing(path)), ctypes.byref(buffer)) != 0:
            return None
    except (ImportError, OSError, AttributeError):
        return None
    magic = buffer[0] & 0xFFFFFFFF
    return MAGIC.get(magic, f"0x{magic:x}")


def filesystem_type(path: Path) -> str | None:
    """The filesystem type of the mount that holds ``path`` (or its nearest existing ancestor).

    mountinfo's name where it is readable (``nfs4``, ``fuse.sshfs``), else statfs's
    (``nfs``, ``fuse``), else None (not Linux).
    """
    return mountinfo_type(path) or statfs_type(path)


def warn_if_network(db_path: Path, fstype: str | None = None, stacklevel: int = 3) -> None:
    """Warn once per process and path if ``db_path`` lies on a network filesystem.

    Args:
        db_path: the SQLite database file (it need not exist yet).
        fstype: the filesystem type, if the caller knows it; else
            :func:`filesystem_type` finds it (looked up at call time, so a test
            may replace it).
        stacklevel: whose line the warning names (``warnings.warn``'s; the default, the
            caller's caller).
    """
    if os.environ.get(ENV, "").strip().lower() == "ok":
        return
    key = str(db_path)
    if key in _WARNED:
        return
    if fstype is None:
        fstype = filesystem_type(db_path)
    if fstype is None or fstype not in NETWORK_TYPES:
        return
    _WARNED.add(key)
    warnings.warn(
        f"The SQLite store database {db_path} is on a network filesystem ({fstype}): "
        "SQLite's locks and WAL mode are not safe there (NFS and Lustre can corrupt the "
        "database or lose commits, and WAL does not work across machines). Use a "
        "PostgreSQL store (ROOT as postgresql://USER@HOST:PORT/DB?files=/shared/folder, "
        f"extra theseus-store[postgres]), or set {ENV}=ok to silence this.",
        NetworkFilesystemWarning,
        stacklevel=stacklevel,
    )
