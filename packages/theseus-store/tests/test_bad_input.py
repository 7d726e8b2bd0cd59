"""Bad input: each damaged or wrong path is a clear error naming the file, never a wrong answer."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from pathlib import Path

import pytest

from theseus.store import (
    BlobHashError,
    CorruptStoreError,
    MissingBlobError,
    Node,
    NotAStoreError,
    Store,
    StorePermissionError,
    UnknownNodeError,
)
from theseus.store.cli import main


def _filled(root: Path, nodes: int = 200) -> list[Node]:
    """A closed store with enough rows to span many database pages."""
    made = []
    with Store(root) as store:
        node = Node.new("run")
        for i in range(nodes):
            store.log(node, {"train/loss": float(i), "text": "x" * 200})
            made.append(node)
            node = node.next()
        store.put(made[0], "a", "a.bin", b"payload")  # small: inline in the database
        store.put(made[0], "big", "big.bin", BIG)  # large: a file in the blob folder
    return made


BIG = bytes(range(256)) * 400  # 100 KiB, above the inline limit


def test_garbage_database_file(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _filled(root, 3)
    db = root / "store.sqlite"
    db.write_bytes(os.urandom(db.stat().st_size))
    with pytest.raises(CorruptStoreError, match=f"{db}.*not an SQLite database"):
        Store(root)


def test_truncated_database_file(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _filled(root)
    db = root / "store.sqlite"
    size = db.stat().st_size
    assert size > 16 * 4096  # many pages, so a half file loses rows
    with open(db, "r+b") as handle:
        handle.truncate(size // 2)
    with pytest.raises(CorruptStoreError, match=f"{db} is truncated.*{size // 2} bytes"):
        Store(root)


def test_damaged_page_is_reported_not_answered(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _filled(root)
    db = root / "store.sqlite"
    data = bytearray(db.read_bytes())
    page = 4096
    for start in range(2 * page, len(data) - page, page):  # scribble over every b-tree page
        data[start : start + 16] = b"\xff" * 16
    db.write_bytes(bytes(data))
    with pytest.raises(CorruptStoreError, match=str(db)), Store(root) as store:
        store.query().where("train/loss", ">", -1.0).count()


def test_missing_blob(tmp_path: Path) -> None:
    root = tmp_path / "store"
    made = _filled(root, 1)
    with Store(root) as store:
        artifact = store.get(made[0])["big"]
        blob = store.blobs.path(artifact.hash)
        os.remove(blob)
        fresh = store.get(made[0])["big"]
        with pytest.raises(MissingBlobError, match=f"{blob} is missing") as info:
            _ = fresh.content
        assert isinstance(info.value, FileNotFoundError)
        with pytest.raises(MissingBlobError, match=str(blob)):
            store.query().artifact().select()
        report = store.fsck(repair=True)
        assert not report.clean and len(report.problems) == 1 and str(blob) in report.problems[0]


def test_missing_inline_blob(tmp_path: Path) -> None:
    root = tmp_path / "store"
    made = _filled(root, 1)
    with contextlib.closing(sqlite3.connect(root / "store.sqlite")) as conn, conn:
        conn.execute("DELETE FROM inline")
    with Store(root) as store:
        db = root / "store.sqlite"
        with pytest.raises(MissingBlobError, match=f"inline blob .* in {db} is missing"):
            _ = store.get(made[0])["a"].content
        assert store.get(made[0])["big"].content == BIG  # the other artifact is intact
        report = store.fsck()
        assert len(report.problems) == 1 and "is missing (expected 7 bytes)" in report.problems[0]


def test_blob_with_wrong_hash(tmp_path: Path) -> None:
    root = tmp_path / "store"
    made = _filled(root, 1)
    with Store(root) as store:
        artifact = store.get(made[0])["big"]
        blob = store.blobs.path(artifact.hash)
        os.chmod(blob, 0o644)
        blob.write_bytes(BIG[:-1] + b"!")  # same size, different bytes
        with pytest.raises(BlobHashError, match=f"{blob} is corrupt.*recorded {artifact.hash}"):
            _ = store.get(made[0])["big"].content
        assert len(store.fsck().problems) == 1
    with contextlib.closing(sqlite3.connect(root / "store.sqlite")) as conn, conn:
        conn.execute("UPDATE inline SET content = ?", (b"payloaD",))
    with Store(root) as store:
        with pytest.raises(BlobHashError, match=f"in {root / 'store.sqlite'} is corrupt"):
            _ = store.get(made[0])["a"].content
        assert len(store.fsck().problems) == 2


def test_root_that_is_not_a_store(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print()\n")
    with pytest.raises(NotAStoreError, match=rf"{project} is not empty \(train.py\)"):
        Store(project)
    assert sorted(p.name for p in project.iterdir()) == ["train.py"]  # nothing was created
    a_file = project / "train.py"
    with pytest.raises(NotAStoreError, match=f"{a_file} is a file"):
        Store(a_file)
    with pytest.raises(NotAStoreError, match=r"no theseus-store\.json"):
        Store(tmp_path / "absent", create=False)


def test_damaged_marker_and_missing_database(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _filled(root, 1)
    marker = root / "theseus-store.json"
    marker.write_text("{not json")
    with pytest.raises(CorruptStoreError, match=f"{marker} is damaged"):
        Store(root)
    marker.write_text(json.dumps({"format": 99}))
    with pytest.raises(CorruptStoreError, match="format 99"):
        Store(root)
    marker.write_text(json.dumps({"format": 1}))
    (root / "store.sqlite").unlink()
    with pytest.raises(CorruptStoreError, match=f"{root / 'store.sqlite'} is missing"):
        Store(root)


def test_unwritable_paths(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StorePermissionError, match=f"{blocker / 'store'}"):
        Store(blocker / "store")
    with pytest.raises(StorePermissionError, match="/proc/theseus-store-test"):
        Store("/proc/theseus-store-test")


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_read_only_folder(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        with pytest.raises(StorePermissionError, match=str(locked)):
            Store(locked / "store")
    finally:
        locked.chmod(0o755)


def test_cli_names_the_damaged_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "store"
    made = _filled(root, 1)
    with Store(root) as store:
        os.remove(store.blobs.path(store.get(made[0])["big"].hash))
    assert main(["get", str(root), made[0].serialize(), "big"]) == 2
    err = capsys.readouterr().err
    assert "theseus-store: error: The blob file" in err and str(root / "blobs") in err
    with Store(root) as store, pytest.raises(UnknownNodeError):
        store.get(Node("general.default.run", made[0].nonce, 999))


def test_fsck_finds_rows_that_disagree(tmp_path: Path) -> None:
    root = tmp_path / "store"
    made = _filled(root, 2)
    with Store(root) as store:
        path = root / "ckpt"
        path.mkdir()
        store.checkpoint(made[1], path)
        assert store.fsck().clean
    with contextlib.closing(sqlite3.connect(root / "store.sqlite")) as conn, conn:
        conn.execute("UPDATE nodes SET ckpt = NULL")
        conn.execute("INSERT INTO vals(node, key, value, kind) VALUES (999, 'k', 1, 'v')")
    with Store(root) as store:
        problems = store.fsck().problems
    db = root / "store.sqlite"
    assert problems == [
        f"{db}: 1 row(s) of table vals point at missing nodes",
        f"{db}: 1 node(s) whose latest-checkpoint pointer disagrees with the checkpoint table",
    ]
