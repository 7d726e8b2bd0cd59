"""The network filesystem warning: detection, the mountinfo parser, once per path, the silencer.

No test can mount NFS here, so the warning's tests make the detector
(``_netfs.filesystem_type``) name ``nfs4``; the detector itself is checked on this
machine's own mounts.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import pytest

from theseus.store import NetworkFilesystemWarning, Store, _netfs

MOUNTINFO = "\n".join(
    [
        "22 27 0:21 / /proc rw,relatime - proc proc rw",
        "27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard",
        "40 27 0:40 / /shared rw,relatime shared:7 master:2 - nfs4 srv:/export rw,vers=4.2",
        "41 40 0:41 / /shared/lustre rw - lustre 10.0.0.1@tcp:/fs rw,flock",
        r"42 27 0:42 / /data/my\040disk rw,relatime - fuse.sshfs user@host:/d rw",
        "43 27 0:43 / /scratch rw - tmpfs tmpfs rw",
        "44 27 0:44 / /scratch rw - gpfs gpfs0 rw",
    ]
)


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """No path warned about yet in this process, and the silencer unset."""
    monkeypatch.setattr(_netfs, "_WARNED", set())
    monkeypatch.delenv(_netfs.ENV, raising=False)


@pytest.fixture
def on_nfs(fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The detector says every path is on NFS version 4."""
    monkeypatch.setattr(_netfs, "filesystem_type", lambda path: "nfs4")


def _opened(root: Path, **kwargs: bool) -> list[warnings.WarningMessage]:
    """The network filesystem warnings that opening (and closing) a store at ``root`` gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Store(root, **kwargs).close()
    return [w for w in caught if issubclass(w.category, NetworkFilesystemWarning)]


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/", "ext4"),
        ("/home/user/run", "ext4"),
        ("/proc/self", "proc"),
        ("/shared", "nfs4"),
        ("/shared/store/store.sqlite", "nfs4"),
        ("/sharedother/x", "ext4"),
        ("/shared/lustre", "lustre"),
        ("/shared/lustre/a/b", "lustre"),
        ("/shared/lustrex", "nfs4"),
        ("/data/my disk/store", "fuse.sshfs"),
        ("/data/my", "ext4"),
        ("/scratch/x", "gpfs"),
    ],
)
def test_mountinfo_longest_prefix(path: str, expected: str) -> None:
    assert _netfs.type_from_mountinfo(MOUNTINFO, path) == expected


def test_mountinfo_without_root_mount() -> None:
    assert _netfs.type_from_mountinfo("", "/x") is None
    assert _netfs.type_from_mountinfo("garbage line\n", "/x") is None
    assert _netfs.type_from_mountinfo(MOUNTINFO.splitlines()[2], "/elsewhere") is None


@pytest.mark.parametrize(
    ("magic", "name"),
    [(0x6969, "nfs"), (0x0BD00BD0, "lustre"), (0xFF534D42, "cifs"), (0x47504653, "gpfs")],
)
def test_magic_numbers(magic: int, name: str) -> None:
    assert _netfs.MAGIC[magic] == name
    assert name in _netfs.NETWORK_TYPES


def test_plain_fuse_and_local_types_are_not_network() -> None:
    for name in ("fuse", "ext4", "xfs", "tmpfs", "overlay", "proc", "fuse.fuse-overlayfs"):
        assert name not in _netfs.NETWORK_TYPES
    for name in ("nfs4", "fuse.sshfs", "fuse.glusterfs", "lustre", "beegfs", "9p"):
        assert name in _netfs.NETWORK_TYPES


def _family(name: str) -> str:
    """The name statfs gives the filesystem mountinfo calls ``name``."""
    if name in ("ext2", "ext3", "ext4"):
        return "ext4"
    if name.startswith("nfs"):
        return "nfs"
    if name == "fuseblk" or name.startswith("fuse."):
        return "fuse"
    return name


def test_real_detector_here(fresh: None, tmp_path: Path) -> None:
    kind = _netfs.filesystem_type(tmp_path)
    if kind is None:
        pytest.skip("no filesystem type on this platform")
    assert kind not in _netfs.NETWORK_TYPES, f"the test's temporary folder is on {kind}"
    assert _netfs.filesystem_type(tmp_path / "not" / "yet" / "there") == kind
    assert _opened(tmp_path / "store") == []


def test_statfs_agrees_with_mountinfo() -> None:
    if _netfs.mountinfo_type(Path("/proc")) is None or _netfs.statfs_type(Path("/proc")) is None:
        pytest.skip("needs both /proc/self/mountinfo and statfs")
    assert _netfs.mountinfo_type(Path("/proc")) == "proc"
    assert _netfs.statfs_type(Path("/proc")) == "proc"
    tmp = Path(tempfile.gettempdir())
    mounted = _netfs.mountinfo_type(tmp)
    assert mounted is not None
    assert _netfs.statfs_type(tmp) == _family(mounted)


def test_warns_once_per_path_on_nfs(on_nfs: None, tmp_path: Path) -> None:
    root = tmp_path / "store"
    caught = _opened(root)
    assert len(caught) == 1
    text = str(caught[0].message)
    assert "\n" not in text
    for part in (
        str(root / "store.sqlite"),
        "nfs4",
        "postgresql://",
        "THESEUS_STORE_NETWORK_FS=ok",
    ):
        assert part in text
    assert caught[0].filename == __file__  # attributed to the line that opened the store
    assert _opened(root) == []
    assert _opened(root, readonly=True) == []
    assert len(_opened(tmp_path / "other")) == 1  # another path warns in turn


def test_readonly_open_warns(on_nfs: None, tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Store(tmp_path / "store").close()  # created (and warned about) first
    _netfs._WARNED.clear()  # as in a new process
    assert len(_opened(tmp_path / "store", readonly=True)) == 1


def test_silenced_by_environment(
    on_nfs: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(_netfs.ENV, "ok")
    assert _opened(tmp_path / "store") == []
    monkeypatch.setenv(_netfs.ENV, "no")
    assert len(_opened(tmp_path / "store")) == 1


def test_fstype_passed_in(fresh: None, tmp_path: Path) -> None:
    with pytest.warns(NetworkFilesystemWarning, match="lustre"):
        _netfs.warn_if_network(tmp_path / "a.sqlite", fstype="lustre")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _netfs.warn_if_network(tmp_path / "b.sqlite", fstype="ext4")
        _netfs.warn_if_network(tmp_path / "c.sqlite", fstype="fuse")
