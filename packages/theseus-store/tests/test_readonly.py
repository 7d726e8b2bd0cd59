"""``Store(root, readonly=True)``: SQLite ``mode=ro``; reads beside a writer, writes nothing.

Reference: the same reads through a normal (read-write) Store, and the bytes of every
file under the root before and after.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from theseus.store import Node, Store
from theseus.store._errors import NotAStoreError, StorePermissionError


def _hashes(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.name.endswith(("-wal", "-shm"))
    }


def test_a_readonly_store_reads_what_a_live_writer_commits(tmp_path: Path) -> None:
    root = tmp_path / "store"
    node = Node.new("train")
    with Store(root) as writer:
        writer.log(node, {"loss": 2.0})
        writer.put(node, "notes", "notes.txt", b"hello")
        with Store(root, readonly=True) as reader:
            assert reader.values(node) == writer.values(node)
            assert reader.get(node)["notes"].content == b"hello"
            writer.log(node.next(), {"loss": 1.5})  # committed while the reader is open
            assert reader.values(node.next()) == {"loss": 1.5}
            assert reader.runs() == writer.runs()


def test_a_readonly_store_refuses_every_write_and_changes_no_byte(tmp_path: Path) -> None:
    root = tmp_path / "store"
    node = Node.new("train")
    with Store(root) as writer:
        writer.log(node, {"loss": 2.0})
    before = _hashes(root)
    with Store(root, readonly=True) as reader:
        for write in (
            lambda: reader.log(node, {"loss": 1.0}),
            lambda: reader.touch(node.next()),
            lambda: reader.put(node, "x", "x.txt", b"x"),
            lambda: reader.put(node, "big", "big.bin", b"y" * (reader.inline_max + 1)),
            lambda: reader.record_job(node, "job", "a: 1\n"),
        ):
            with pytest.raises(StorePermissionError):
                write()
        assert reader.values(node) == {"loss": 2.0}
    assert _hashes(root) == before
    assert not list((root / "blobs").rglob("*.tmp")) and not [
        p for p in (root / "blobs").rglob("*") if p.is_file()
    ]


def test_a_readonly_store_never_creates_one(tmp_path: Path) -> None:
    with pytest.raises(NotAStoreError):
        Store(tmp_path / "none", readonly=True)
    assert not (tmp_path / "none").exists()
